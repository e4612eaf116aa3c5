"""The cpu backend's int8 product: ``QuantizedMatMul`` (MNN's dynamic quantization, seed 004).

Each row of x is quantized to uint8 at run time (``quantize_row``, the contract's arithmetic), the
weight was quantized to int8 per column by the session (``gpumnn.scheduler.precision``) and is
packed here once into panels, and the product sums in int32, which is exact. The epilogue
subtracts the zero point's share (``zero[m] * colsum[n]``), scales by both scales, adds the bias
and applies the activation while the tile is in registers' reach.

The register tile (``_vnni_tile``) is QNNPACK's and MNN's inner loop on x86's integer dot
product: ``vpdpbusd`` multiplies 4 unsigned bytes of x by 4 signed bytes of the weight and adds
the four products to an int32 lane, 64 multiply-adds per 512-bit instruction with no saturation
(AVX2's ``vpmaddubsw`` saturates its 16-bit pair sums at uint8 x int8 extremes). It is written as
LLVM IR through Numba, as ``cpu_tiles``' float tile is, and used where the host has AVX-512 VNNI;
elsewhere a portable loop of Numba's computes the same tile. The weight panels hold NR columns,
4 steps of K interleaved per int32 word: ``panels[p, k4, j, i] = weight[4 k4 + i, p NR + j]``.
"""
from __future__ import annotations

import numpy as np

from ... import atomic as A
from ..base import KernelWork
from . import activations as cpu_activations, jit as cpu_jit, parallel as cpu_parallel
from .reference import _compiled_clamp, _epilogue, strided, typed, view

numba = cpu_jit.numba
if numba is not None:
    from llvmlite import binding as llvm_binding, ir
    from numba import types
    from numba.extending import intrinsic
else:  # never called without Numba
    def intrinsic(fn):
        return fn

#: The register tile: MR rows of x by NR weight columns, two 16-lane int32 vectors per row
MR, NR = 8, 32
_LANES = 16  # int32 lanes of one AVX-512 register
#: steps of K one int32 word of a panel (and of a quantized row) holds
STEP = 4


def _host_has_vnni() -> bool:
    """Whether LLVM may emit 512-bit ``vpdpbusd`` for this host (AVX-512 VNNI)."""
    if numba is None:
        return False
    try:
        features = llvm_binding.get_host_cpu_features()
    except RuntimeError:  # the host's features cannot be read: the portable tile
        return False
    return bool(features.get("avx512vnni") and features.get("avx512f"))


#: True where the int8 tile runs on ``vpdpbusd`` (``gpumnn info`` and the tests say which)
VNNI = _host_has_vnni()
#: what runs QuantizedMatMul's products here, in words
TILE = "AVX-512 VNNI vpdpbusd" if VNNI else "portable int32 loop"


@intrinsic
def _vnni_tile(typingctx, a_address, a_stride, b_address, depth, acc_address):
    """acc[MR, NR] int32 (row-major at ``acc_address``) = sum over ``depth`` steps of the
    4-byte groups of MR uint8 rows (``a_stride`` bytes apart, group s at byte 4 s) with a panel's
    int32 words (step s at word s NR): one ``vpdpbusd`` per row and vector per step."""
    def codegen(context, builder, signature, args):
        i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
        vector = ir.VectorType(i32, _LANES)
        module = builder.module
        dot = module.globals.get("llvm.x86.avx512.vpdpbusd.512") or ir.Function(
            module, ir.FunctionType(vector, [vector, vector, vector]), "llvm.x86.avx512.vpdpbusd.512")
        a = builder.inttoptr(args[0], i8.as_pointer())
        b = builder.inttoptr(args[2], i32.as_pointer())
        acc = builder.inttoptr(args[4], i32.as_pointer())
        a_stride, depth = args[1], args[3]
        vectors = NR // _LANES
        zero = ir.Constant(vector, [0] * _LANES)
        entry = builder.block
        loop, done = builder.append_basic_block("qtile.loop"), builder.append_basic_block("qtile.done")
        builder.cbranch(builder.icmp_signed(">", depth, ir.Constant(i64, 0)), loop, done)

        builder.position_at_end(loop)
        step = builder.phi(i64)
        sums = [builder.phi(vector) for _ in range(MR * vectors)]
        step.add_incoming(ir.Constant(i64, 0), entry)
        for s in sums:
            s.add_incoming(zero, entry)
        b_row = builder.gep(b, [builder.mul(step, ir.Constant(i64, NR))])
        lanes = [builder.load(builder.bitcast(builder.gep(b_row, [ir.Constant(i64, h * _LANES)]), vector.as_pointer()),
                              align=4) for h in range(vectors)]
        a_column = builder.gep(a, [builder.mul(step, ir.Constant(i64, STEP))])
        broadcast = ir.Constant(ir.VectorType(i32, _LANES), [0] * _LANES)
        updated = []
        for r in range(MR):
            word_at = builder.gep(a_column, [builder.mul(a_stride, ir.Constant(i64, r))])
            word = builder.load(builder.bitcast(word_at, i32.as_pointer()), align=1)
            one = builder.insert_element(ir.Constant(vector, ir.Undefined), word, ir.Constant(i32, 0))
            splat = builder.shuffle_vector(one, ir.Constant(vector, ir.Undefined), broadcast)
            for h, lane in enumerate(lanes):
                updated.append(builder.call(dot, [sums[r * vectors + h], splat, lane]))
        following = builder.add(step, ir.Constant(i64, 1))
        tail = builder.block
        step.add_incoming(following, tail)
        for s, u in zip(sums, updated):
            s.add_incoming(u, tail)
        builder.cbranch(builder.icmp_signed("<", following, depth), loop, done)

        builder.position_at_end(done)
        totals = [builder.phi(vector) for _ in updated]
        for j, (total, u) in enumerate(zip(totals, updated)):
            total.add_incoming(zero, entry)
            total.add_incoming(u, tail)
            address = builder.gep(acc, [ir.Constant(i64, j * _LANES)])
            builder.store(total, builder.bitcast(address, vector.as_pointer()), align=4)
        return context.get_dummy_value()
    return types.void(*[types.intp] * 5), codegen


def _tile_vnni(q, row0, panels, p, acc):
    """acc[MR, NR] = q[row0:row0 + MR] . panel p, on ``_vnni_tile``."""
    _vnni_tile(q.ctypes.data + row0 * q.shape[1], q.shape[1], panels.ctypes.data + p * panels.strides[0],
               panels.shape[1], acc.ctypes.data)


def _tile_portable(q, row0, panels, p, acc):
    """acc[MR, NR] = q[row0:row0 + MR] . panel p, in Numba's int32 loops (any host)."""
    for r in range(MR):
        for j in range(NR):
            acc[r * NR + j] = 0
        for s in range(panels.shape[1]):
            for i in range(STEP):
                value = np.int32(q[row0 + r, s * STEP + i])
                for j in range(NR):
                    acc[r * NR + j] += value * np.int32(panels[p, s, j, i])


def quantize_row(x, q, scales, zeros, m):
    """Row m of x into q[m, :K] as the contract's uint8 (``A.QuantizedMatMul``), its scale and zero point."""
    lo = np.float32(0.0)
    hi = np.float32(0.0)
    row = x[m]
    for v in row:
        lo = min(lo, v)
        hi = max(hi, v)
    scale = (hi - lo) / np.float32(255.0)
    if scale == np.float32(0.0):
        scale = np.float32(1.0)
    zero = min(max(np.rint(-lo / scale), np.float32(0.0)), np.float32(255.0))
    out = q[m]
    for k in range(row.shape[0]):
        out[k] = np.uint8(min(max(np.rint(row[k] / scale) + zero, np.float32(0.0)), np.float32(255.0)))
    scales[m] = scale
    zeros[m] = np.int32(zero)


if numba is not None:
    _tile = numba.njit(inline="always")(_tile_vnni if VNNI else _tile_portable)
    _quantize = numba.njit(inline="always")(quantize_row)


def _quantized_product(x, q, scales, zeros, panels, colsum, weight_scale, bias, out, lo, hi, gelu):
    """The whole op: rows quantized, then every (row tile, panel) pair's product and epilogue."""
    m, n = out.shape
    for r in numba.prange(m):
        _quantize(x, q, scales, zeros, r)
    row_tiles = -(-m // MR)
    panel_count = panels.shape[0]
    for t in numba.prange(row_tiles * panel_count):
        p, row_tile = t // row_tiles, t % row_tiles
        row0 = row_tile * MR
        acc = np.empty(MR * NR, np.int32)
        _tile(q, row0, panels, p, acc)
        c0 = p * NR
        for r in range(min(MR, m - row0)):
            row = row0 + r
            zero, scale = zeros[row], scales[row]
            for j in range(min(NR, n - c0)):
                c = c0 + j
                v = np.float32(acc[r * NR + j] - zero * colsum[c]) * (scale * weight_scale[c]) + bias[c]
                if gelu:
                    v = cpu_activations.gelu_value(v)
                out[row, c] = min(max(v, lo), hi)


_COMPILED: dict[bool, object] = {}


def _product_kernel(parallel: bool):
    """``_quantized_product`` as a parallel region (cached on disk) or a one-thread loop, compiled
    on first use."""
    if parallel not in _COMPILED:
        if parallel:
            _COMPILED[parallel] = cpu_parallel.compiled_region(_quantized_product, error_model="numpy", fastmath=False)
        else:  # compiled per process: Numba's disk cache would not tell it from the region
            _COMPILED[parallel] = numba.njit(error_model="numpy", boundscheck=False,
                                             nogil=True)(_quantized_product)
    return _COMPILED[parallel]


def pack_weight(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 ``weight`` [K, N] as the tile's panels [ceil(N / NR), ceil(K / 4), NR, 4] (zeros past
    K and N) and its column sums int32 [N]."""
    k, n = weight.shape
    k4, count = -(-k // STEP), -(-n // NR)
    padded = np.zeros((k4 * STEP, count * NR), np.int8)
    padded[:k, :n] = weight
    panels = np.ascontiguousarray(padded.reshape(k4, STEP, count, NR).transpose(2, 0, 3, 1))
    return panels, weight.sum(axis=0, dtype=np.int32)


def quantize_rows_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The contract's per-row uint8 quantization of x [M, K] in NumPy: (q, scale, zero)."""
    f32 = np.float32
    lo = np.minimum(x.min(axis=1), f32(0))
    hi = np.maximum(x.max(axis=1), f32(0))
    scale = (hi - lo) / f32(255)
    scale[scale == 0] = f32(1)
    zero = np.clip(np.rint(-lo / scale), f32(0), f32(255))
    q = np.clip(np.rint(x / scale[:, None]) + zero[:, None], f32(0), f32(255)).astype(np.uint8)
    return q, scale, zero.astype(np.int32)


def make_quantized_matmul(op: A.QuantizedMatMul, ins, outs, engine, made_once) -> KernelWork:
    """The cpu execution of ``op``: the compiled kernel (a region on several threads) where Numba
    runs, else NumPy's integer product, the reference. ``made_once(handle, recipe, make)`` shares
    packed weights between run states."""
    m, n, k = op.m, op.n, op.k
    x = strided(ins[0], 0, (m, k), (k, 1))
    weight = view(ins[1]).reshape(k, n)
    weight_scale = view(ins[2]).reshape(n)
    bias = strided(ins[3], 0, (n,), (1,)) if op.has_bias else np.zeros(n, np.float32)
    out = view(outs[0]).reshape(m, n)
    if not engine.jit:
        act = _epilogue(op.activation)
        colsum = weight.sum(axis=0, dtype=np.int64)
        wide = weight.astype(np.int64)

        def reference() -> None:
            q, scale, zero = quantize_rows_reference(x)
            acc = q.astype(np.int64) @ wide
            np.add((acc - zero[:, None].astype(np.int64) * colsum).astype(np.float32)
                   * (scale[:, None] * weight_scale), bias, out=out)
            if act:
                act(out)
        return KernelWork((reference,), "int8 NumPy")
    panels, colsum = made_once(ins[1], "int8 panels", lambda: pack_weight(weight))
    lo, hi, after = _compiled_clamp(op.activation)
    gelu = op.activation is not None and op.activation[0] == "gelu"
    if gelu:
        after = None
    rows = -(-m // MR) * MR
    q = np.zeros((rows, panels.shape[1] * STEP), np.uint8)  # padding rows and steps stay 0
    scales, zeros = np.empty(rows, np.float32), np.zeros(rows, np.int32)
    parallel = engine.regions > 1 and m * n * k >= 1 << 16
    kernel = cpu_jit.bind(_product_kernel(parallel), x, q, scales, zeros, panels, colsum, weight_scale, bias, out,
                          lo, hi, gelu)

    def run() -> None:
        kernel(x, q, scales, zeros, panels, colsum, weight_scale, bias, out, lo, hi, gelu)
        if after is not None:
            after(out)
    return KernelWork((run,), f"int8 {TILE}{' region' if parallel else ''}")
