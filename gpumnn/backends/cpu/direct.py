"""A direct cpu convolution for few input channels (a network's stem: 3 channels of an image).

im2col there copies every window (channels x taps, 27 for a 3x3 over RGB) into columns and hands
BLAS a product whose inner dimension is those few taps, a poor shape for it. Here each output row
is computed from a zero-bordered copy of the input rows it reads: per block of FEW_OUTPUTS output
channels and ROW_WIDTH output columns, the sums sit in vector registers across all taps, each
tap's inputs loaded once and multiplied by each output channel's weight (``_row_block``), with
the bias, a clamp or hard-swish applied before the store. Threads share the output rows.
"""
from __future__ import annotations

import numpy as np

from . import jit as cpu_jit, parallel as cpu_parallel

numba = cpu_jit.numba
if numba is not None:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

#: Output channels ``_row_block`` sums at once: independent multiply-add chains, one vector each
FEW_OUTPUTS = 16
#: Output columns a vector holds
ROW_WIDTH = 16
#: Input channels the kernel takes at most: past a few, im2col's product has an inner dimension
#: BLAS and the register tile use well
MAX_IN_CHANNELS = 4


def _row_block(stride: int):
    """``row_block(dst, dst_step, n, src, offsets, taps, weights, weight_step, bias, count, swish,
    lo, hi)`` as a Numba intrinsic (LLVM IR; addresses as integers, steps and ``offsets`` int64
    counts of floats): for o < count (<= FEW_OUTPUTS) and i < n, dst[o dst_step + i] =
    f(clamp(bias[o] + the sum over t < taps of weights[t weight_step + o] * src[offsets[t] +
    i stride]) to [lo, hi]), f hard-swish where ``swish`` is not 0, else none. ROW_WIDTH columns at
    a time, the last ROW_WIDTH ending at n (n >= ROW_WIDTH). At stride 2 a tap loads 2 ROW_WIDTH
    floats and keeps the even ones (one float past the last read)."""
    @intrinsic
    def kernel(typingctx, dst_address, dst_step, n, src_address, offsets_address, taps, weights_address, weight_step,
               bias_address, count, swish, lo, hi):
        def codegen(context, builder, signature, args):
            f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
            width, outputs = ROW_WIDTH, FEW_OUTPUTS
            vector = ir.VectorType(f32, width)
            dst, src, weights, bias = (builder.inttoptr(args[i], f32.as_pointer()) for i in (0, 3, 6, 8))
            dst_step, n, taps, weight_step, count = (args[i] for i in (1, 2, 5, 7, 9))
            offsets = builder.inttoptr(args[4], i64.as_pointer())
            zeros = ir.Constant(ir.VectorType(i32, width), [0] * width)

            def splat(scalar):
                one = builder.insert_element(ir.Constant(vector, ir.Undefined), scalar, ir.Constant(i32, 0))
                return builder.shuffle_vector(one, ir.Constant(vector, ir.Undefined), zeros)

            def constant(value):
                return ir.Constant(vector, [value] * width)
            lo, hi = splat(args[11]), splat(args[12])
            swish = builder.icmp_signed("!=", args[10], ir.Constant(i64, 0))
            last = builder.sub(n, ir.Constant(i64, width))
            wide = ir.VectorType(f32, width * stride)
            evens = ir.Constant(ir.VectorType(i32, width), [lane * stride for lane in range(width)])
            starts = [splat(builder.load(builder.gep(bias, [ir.Constant(i64, o)]), align=4)) for o in range(outputs)]
            entry = builder.block
            block, taps_loop, stored, done = (builder.append_basic_block(f"direct.{name}")
                                              for name in ("block", "taps", "stored", "done"))
            builder.branch(block)

            builder.position_at_end(block)
            start = builder.phi(i64)
            start.add_incoming(ir.Constant(i64, 0), entry)
            at = builder.select(builder.icmp_signed("<", start, last), start, last)
            at_src = builder.gep(src, [builder.mul(at, ir.Constant(i64, stride))])
            builder.branch(taps_loop)

            builder.position_at_end(taps_loop)
            tap = builder.phi(i64)
            tap.add_incoming(ir.Constant(i64, 0), block)
            totals = [builder.phi(vector) for _ in range(outputs)]
            for total, first in zip(totals, starts):
                total.add_incoming(first, block)
            offset = builder.load(builder.gep(offsets, [tap]), align=8)
            values = builder.load(builder.bitcast(builder.gep(at_src, [offset]), wide.as_pointer()), align=4)
            if stride > 1:
                values = builder.shuffle_vector(values, ir.Constant(wide, ir.Undefined), evens)
            row = builder.gep(weights, [builder.mul(tap, weight_step)])
            updated = []
            for o, total in enumerate(totals):
                weight = splat(builder.load(builder.gep(row, [ir.Constant(i64, o)]), align=4))
                # contract only: LLVM fuses the pair into an FMA where the host has one
                updated.append(builder.fadd(total, builder.fmul(weight, values, flags=("contract",)),
                                            flags=("contract",)))
            following = builder.add(tap, ir.Constant(i64, 1))
            tap.add_incoming(following, taps_loop)
            for total, u in zip(totals, updated):
                total.add_incoming(u, taps_loop)
            builder.cbranch(builder.icmp_signed("<", following, taps), taps_loop, stored)

            builder.position_at_end(stored)
            for o, u in enumerate(updated):
                v = cpu_jit.clamped_ir(builder, u, lo, hi)
                v = builder.select(swish, cpu_jit.hard_swish_ir(builder, v), v)
                with builder.if_then(builder.icmp_signed("<", ir.Constant(i64, o), count)):
                    address = builder.gep(dst, [builder.add(builder.mul(dst_step, ir.Constant(i64, o)), at)])
                    builder.store(v, builder.bitcast(address, vector.as_pointer()), align=4)
            start.add_incoming(builder.add(at, ir.Constant(i64, width)), builder.block)
            builder.cbranch(builder.icmp_signed("<", at, last), block, done)

            builder.position_at_end(done)
            return context.get_dummy_value()
        return types.void(*[types.intp] * 11, types.float32, types.float32), codegen
    return kernel


if numba is not None:
    _row_block_s1, _row_block_s2 = _row_block(1), _row_block(2)


def plane_shape(op) -> tuple[int, int]:
    """(rows, columns) of one input channel's zero-bordered rows for ``op``'s whole output, as
    ``direct_rows`` lays them; a span of output rows uses the first rows of it."""
    (h, w), (oh, ow), (kh, kw) = op.in_hw, op.out_hw, op.kernel
    (sh, sw), (dh, dw), (pt, pl) = op.strides, op.dilations, op.pads[:2]
    return (oh - 1) * sh + (kh - 1) * dh + 1, max(w + pl, (ow - 1) * sw + (kw - 1) * dw + 1) + sw - 1


@cpu_jit.inlined
def direct_rows(x, table, out, plane, rows, width, geometry, pt, pl, lo, hi, swish, r0, r1):
    """Output rows [r0, r1) of a convolution of x [C, H, W] into out [OC, OH, OW]: the input rows
    they read copied into ``plane`` (C planes of ``rows`` x ``width`` floats, zero where the
    padding falls), then per output row and block of FEW_OUTPUTS channels one ``_row_block``.
    ``table`` [C KH KW + 1, >= OC + FEW_OUTPUTS]: each tap's weights along the output channels,
    the bias in its last row (``output_table``). geometry: (kh, kw, sh, sw, dh, dw)."""
    c, h, w = x.shape[0], x.shape[1], x.shape[2]
    oc, oh, ow = out.shape[0], out.shape[1], out.shape[2]
    kh, kw, sh, sw, dh, dw = geometry
    size = rows * width
    first = r0 * sh - pt  # the input row in the span's first plane row
    used = (r1 - 1 - r0) * sh + (kh - 1) * dh + 1
    for ci in range(c):
        for j in range(used):
            iy = first + j
            row = plane[ci * size + j * width:ci * size + (j + 1) * width]
            if 0 <= iy < h:
                cpu_jit.copy_row(row[pl:pl + w], x[ci, iy])
            else:
                row[:] = 0.0
    taps = c * kh * kw
    offsets = np.empty(taps, np.int64)
    for ci in range(c):
        for ky in range(kh):
            for kx in range(kw):
                offsets[(ci * kh + ky) * kw + kx] = ci * size + ky * dh * width + kx * dw
    weight_step = table.shape[1]
    bias = table.ctypes.data + 4 * taps * weight_step
    for oy in range(r0, r1):
        src = plane.ctypes.data + 4 * (oy - r0) * sh * width
        for o0 in range(0, oc, FEW_OUTPUTS):
            dst = out.ctypes.data + 4 * (o0 * oh * ow + oy * ow)
            count = min(FEW_OUTPUTS, oc - o0)
            if sw == 1:
                _row_block_s1(dst, oh * ow, ow, src, offsets.ctypes.data, taps, table.ctypes.data + 4 * o0,
                              weight_step, bias + 4 * o0, count, swish, lo, hi)
            else:
                _row_block_s2(dst, oh * ow, ow, src, offsets.ctypes.data, taps, table.ctypes.data + 4 * o0,
                              weight_step, bias + 4 * o0, count, swish, lo, hi)


@cpu_parallel.compiled_region
def direct_spans(x, table, out, planes, bounds, rows, width, geometry, pt, pl, lo, hi, swish):
    """``direct_rows`` on the output row spans [bounds[i], bounds[i + 1]) of one image, each on
    its thread's scratch planes."""
    for i in numba.prange(bounds.shape[0] - 1):
        t = numba.get_thread_id()
        direct_rows(x, table, out, planes[t], rows, width, geometry, pt, pl, lo, hi, swish, bounds[i], bounds[i + 1])


def output_table(weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``direct_rows``' table for weight [OC, C, KH, KW] and bias [OC]: [C KH KW + 1, OC +
    FEW_OUTPUTS], each tap's weights along the output channels, the bias last, zeros past OC."""
    oc = weight.shape[0]
    table = np.zeros((weight[0].size + 1, oc + FEW_OUTPUTS), np.float32)
    fill_output_table(table, weight, bias)
    return table


def fill_output_table(table: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> None:
    """``weight`` and ``bias`` into ``output_table``'s table (again, for weights fed at run time)."""
    oc = weight.shape[0]
    table[:-1, :oc] = weight.reshape(oc, -1).T
    table[-1, :oc] = bias


def takes(op) -> bool:
    """Whether ``direct_rows`` computes ``op``: one group over at most MAX_IN_CHANNELS input
    channels, a column stride of 1 or 2, output rows of at least ROW_WIDTH."""
    return (op.groups == 1 and op.in_channels <= MAX_IN_CHANNELS and op.strides[1] in (1, 2)
            and op.out_hw[1] >= ROW_WIDTH)
