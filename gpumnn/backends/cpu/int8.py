"""The cpu backend's int8 product: ``QuantizedMatMul`` (MNN's dynamic quantization, seed 004).

Each row of x is quantized to uint8 at run time (``quantize_row``, the contract's arithmetic), the
weight was quantized to int8 per column by the session (``gpumnn.scheduler.precision``) and is
packed here once into panels, and the product sums in int32, which is exact. The epilogue
subtracts the zero point's share (``zero[m] * colsum[n]``), scales by both scales, adds the bias
and applies the activation while the tile is in registers' reach. A ``prequantized`` op (a
``quantize_dynamic`` model's MatMulInteger) copies its uint8 rows instead and takes its one scale
and zero point from its inputs.

The register tile (``_vnni_tile``) is QNNPACK's and MNN's inner loop on x86's integer dot
product: ``vpdpbusd`` multiplies 4 unsigned bytes of x by 4 signed bytes of the weight and adds
the four products to an int32 lane, 64 multiply-adds per 512-bit instruction with no saturation.
It is written as LLVM IR through Numba, as ``cpu_tiles``' float tile is. Its weight panels hold NR
columns, 4 steps of K interleaved per int32 word: ``panels[p, k4, j, i] = weight[4 k4 + i, p NR + j]``.
Each tile has a twin that reads its rows through an indirection table (QNNPACK's), tap by tap, for
the int8 convolutions that do not pack their windows (``indirect_tile``).

Hosts without VNNI run ``vpmaddwd`` on int16 (``_tile_codegen``): 512-bit with AVX-512BW, 256-bit
with AVX2. The quantized rows and the weight are held widened to int16, two steps of K per int32
word (``panels[p, k2, j, i] = weight[2 k2 + i, p NR + j]``), and each instruction adds two exact
products to an int32 lane. AVX2's ``vpmaddubsw`` on the bytes would do twice the work per
instruction, but it saturates its int16 pair sums (2 * 255 * 127 does not fit), which QNNPACK and
oneDNN avoid by keeping activations in 7 bits; that would change the contract's uint8 rows, so the
exact route is taken. ``current_path()`` says which tile runs, chosen once from the host's features
(``host_paths``) or by ``GPUMNN_INT8_PATH``; a portable Numba loop runs anywhere.
"""
from __future__ import annotations

import os
import types as types_module

import numpy as np

from ... import atomic as A
from ..base import KernelWork
from . import activations as cpu_activations, jit as cpu_jit, parallel as cpu_parallel
from ...numerics.int4 import unpack_int4
from .reference import _compiled_clamp, _epilogue, strided, typed, view

numba = cpu_jit.numba
if numba is not None:
    from llvmlite import ir
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


#: the product paths, fastest first: 512-bit ``vpdpbusd`` (AVX-512 VNNI), 512-bit ``vpmaddwd`` on
#: int16 pairs (AVX-512BW), 256-bit ``vpmaddwd`` (AVX2), and Numba's plain loop (any host)
PATHS: tuple[str, ...] = ("vnni512", "avx512bw", "avx2", "portable")
#: what each path runs on, in words (the kernel's scheme and ``gpumnn info`` say it)
PATH_NAMES = {"vnni512": "AVX-512 VNNI vpdpbusd", "avx512bw": "AVX-512BW vpmaddwd",
              "avx2": "AVX2 vpmaddwd", "portable": "portable int32 loop"}
#: the LLVM features (``get_host_cpu_features``) each vector path needs
_PATH_FEATURES = {"vnni512": ("avx512f", "avx512vnni"), "avx512bw": ("avx512f", "avx512bw"), "avx2": ("avx2",)}
#: the environment variable that picks a path by name (tests, and measuring one path on a host with a faster one)
PATH_VARIABLE = "GPUMNN_INT8_PATH"


def host_paths() -> tuple[str, ...]:
    """The paths this host can run, fastest first (``portable`` always)."""
    features = cpu_jit.target_features()  # none known: the portable loop only
    return tuple(p for p in PATHS if all(features.get(f) for f in _PATH_FEATURES.get(p, ())))


def _chosen_path() -> str:
    """The host's fastest path, or the one ``GPUMNN_INT8_PATH`` names (ValueError if this host lacks it)."""
    available = host_paths()
    wanted = os.environ.get(PATH_VARIABLE, "").strip()
    if not wanted:
        return available[0]
    if wanted not in available:
        raise ValueError(f"{PATH_VARIABLE}={wanted!r}: this host runs {', '.join(available)}")
    return wanted


#: the path QuantizedMatMul's kernels are made with, once ``current_path`` has chosen it (None
#: until then, so that a wrong ``GPUMNN_INT8_PATH`` fails the first int8 kernel, not the import);
#: tests set it (``use_path``) to run every path this host has
PATH: str | None = None


def current_path() -> str:
    """The path QuantizedMatMul's kernels are made with: chosen once, here (ValueError for a
    ``GPUMNN_INT8_PATH`` this host cannot run)."""
    global PATH
    if PATH is None:
        PATH = _chosen_path()
    return PATH


def use_path(path: str) -> str:
    """Makes later QuantizedMatMul kernels run on ``path`` (one of ``host_paths()``); returns the previous one."""
    global PATH
    if path not in host_paths():
        raise ValueError(f"int8 path {path!r}: this host runs {', '.join(host_paths())}")
    previous, PATH = current_path(), path
    return previous


def tile_name() -> str:
    """What runs QuantizedMatMul's products now, in words."""
    return PATH_NAMES[current_path()]


#: the products the tiles are made of: one instruction per (row, column vector) and step of K
_INSTRUCTIONS = {"vpdpbusd": "llvm.x86.avx512.vpdpbusd.512", "vpmaddwd.512": "llvm.x86.avx512.pmaddw.d.512",
                 "vpmaddwd.256": "llvm.x86.avx2.pmadd.wd"}


def _tile_codegen(instruction: str, lanes: int, row_group: int, column_group: int, indirect: bool = False):
    """The codegen of a tile with int32 vectors of ``lanes`` lanes: acc[MR, NR] int32 (row-major at
    ``acc_address``) = sum over ``depth`` steps of the 4-byte word of each of MR rows (``a_stride``
    bytes apart, step s at byte 4 s) times a panel's int32 words (step s at word s NR), broadcast
    word by word. ``vpdpbusd`` (AVX-512 VNNI) adds the four uint8-by-int8 products of a word into
    an int32 lane; ``vpmaddwd`` (the words two int16 each: AVX-512BW, AVX2) multiplies the pairs
    and adds the two products to an int32 lane. Both are exact: no product or sum of uint8 by int8
    leaves int32 (AVX2's ``vpmaddubsw`` would saturate a pair sum at 16 bits). The tile runs as
    sub-tiles of ``row_group`` rows by ``column_group`` columns, each over the whole depth, so that
    its accumulators fit the path's registers.

    ``indirect`` (QNNPACK's indirection buffer): the rows are not packed; the arguments are
    (``table_address``, ``base_address``, ``taps``, ``tap_steps``, ``b_address``, ``acc_address``),
    and the depth is ``taps`` runs of ``tap_steps`` steps, row r's words of tap t starting at byte
    ``table[t * MR + r]`` (int64) from ``base_address``: a loop over the taps around the loop over
    their steps, the sums in registers through both (``taps`` and ``tap_steps`` at least 1)."""
    name = _INSTRUCTIONS[instruction]
    vnni = instruction == "vpdpbusd"

    def codegen(context, builder, signature, args):
        i8, i16, i32, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
        vector = ir.VectorType(i32, lanes)
        operand = vector if vnni else ir.VectorType(i16, 2 * lanes)  # what the instruction multiplies
        module = builder.module
        product = module.globals.get(name) or ir.Function(
            module, ir.FunctionType(vector, [vector] * 3 if vnni else [operand] * 2), name)
        if indirect:
            table = builder.inttoptr(args[0], i64.as_pointer())
            base = builder.inttoptr(args[1], i8.as_pointer())
            taps, depth, b, acc = args[2], args[3], args[4], args[5]
        else:
            a = builder.inttoptr(args[0], i8.as_pointer())
            a_stride, depth, b, acc = args[1], args[3], args[2], args[4]
        b = builder.inttoptr(b, i32.as_pointer())
        acc = builder.inttoptr(acc, i32.as_pointer())
        vectors = column_group // lanes
        zero = ir.Constant(vector, [0] * lanes)
        broadcast = ir.Constant(vector, [0] * lanes)
        for r0 in range(0, MR, row_group):
            for c0 in range(0, NR, column_group):
                entry = builder.block
                loop = builder.append_basic_block(f"qtile.loop.{r0}.{c0}")
                done = builder.append_basic_block(f"qtile.done.{r0}.{c0}")
                if indirect:  # per tap: its rows' addresses from the table, its panel words from its first step
                    taps_loop = builder.append_basic_block(f"qtile.taps.{r0}.{c0}")
                    taps_next = builder.append_basic_block(f"qtile.taps.next.{r0}.{c0}")
                    builder.branch(taps_loop)
                    builder.position_at_end(taps_loop)
                    tap = builder.phi(i64)
                    tap.add_incoming(ir.Constant(i64, 0), entry)
                    tap_sums = [builder.phi(vector) for _ in range(row_group * vectors)]
                    for s in tap_sums:
                        s.add_incoming(zero, entry)
                    rows = [builder.gep(base, [builder.load(builder.gep(table, [
                        builder.add(builder.mul(tap, ir.Constant(i64, MR)), ir.Constant(i64, r0 + r))]))])
                        for r in range(row_group)]
                    b_first = builder.gep(b, [builder.mul(builder.mul(tap, depth), ir.Constant(i64, NR))])
                    loop_entry, first_sums = taps_loop, tap_sums
                    builder.branch(loop)
                else:
                    rows = [builder.gep(a, [builder.mul(a_stride, ir.Constant(i64, r0 + r))]) for r in range(row_group)]
                    b_first, loop_entry, first_sums = b, entry, [zero] * (row_group * vectors)
                    builder.cbranch(builder.icmp_signed(">", depth, ir.Constant(i64, 0)), loop, done)

                builder.position_at_end(loop)
                step = builder.phi(i64)
                sums = [builder.phi(vector) for _ in range(row_group * vectors)]
                step.add_incoming(ir.Constant(i64, 0), loop_entry)
                for s, first in zip(sums, first_sums):
                    s.add_incoming(first, loop_entry)
                b_row = builder.gep(b_first, [builder.add(builder.mul(step, ir.Constant(i64, NR)),
                                                          ir.Constant(i64, c0))])
                weights = [builder.bitcast(builder.load(builder.bitcast(
                    builder.gep(b_row, [ir.Constant(i64, h * lanes)]), vector.as_pointer()), align=4), operand)
                    for h in range(vectors)]
                offset = builder.mul(step, ir.Constant(i64, STEP))
                updated = []
                for r in range(row_group):
                    word = builder.load(builder.bitcast(builder.gep(rows[r], [offset]), i32.as_pointer()), align=1)
                    one = builder.insert_element(ir.Constant(vector, ir.Undefined), word, ir.Constant(i32, 0))
                    splat = builder.bitcast(builder.shuffle_vector(one, ir.Constant(vector, ir.Undefined), broadcast),
                                            operand)
                    for h, weight in enumerate(weights):
                        total = sums[r * vectors + h]
                        updated.append(builder.call(product, [total, splat, weight]) if vnni
                                       else builder.add(total, builder.call(product, [splat, weight])))
                following = builder.add(step, ir.Constant(i64, 1))
                tail = builder.block
                step.add_incoming(following, tail)
                for s, u in zip(sums, updated):
                    s.add_incoming(u, tail)
                builder.cbranch(builder.icmp_signed("<", following, depth), loop, taps_next if indirect else done)

                if indirect:
                    builder.position_at_end(taps_next)
                    next_tap = builder.add(tap, ir.Constant(i64, 1))
                    tap.add_incoming(next_tap, taps_next)
                    for s, u in zip(tap_sums, updated):
                        s.add_incoming(u, taps_next)
                    builder.cbranch(builder.icmp_signed("<", next_tap, taps), taps_loop, done)
                builder.position_at_end(done)
                if indirect:  # done follows the last tap only
                    totals = updated
                else:
                    totals = [builder.phi(vector) for _ in updated]
                    for total, u in zip(totals, updated):
                        total.add_incoming(zero, entry)
                        total.add_incoming(u, tail)
                for j, total in enumerate(totals):
                    r, h = divmod(j, vectors)
                    address = builder.gep(acc, [ir.Constant(i64, (r0 + r) * NR + c0 + h * lanes)])
                    builder.store(total, builder.bitcast(address, vector.as_pointer()), align=4)
        return context.get_dummy_value()
    return codegen


@intrinsic
def _vnni_tile(typingctx, a_address, a_stride, b_address, depth, acc_address):
    """The tile on 512-bit ``vpdpbusd`` (``_tile_codegen``): one sub-tile of 8 rows by 32 columns."""
    return types.void(*[types.intp] * 5), _tile_codegen("vpdpbusd", _LANES, MR, NR)


@intrinsic
def _avx512bw_tile(typingctx, a_address, a_stride, b_address, depth, acc_address):
    """The tile on 512-bit ``vpmaddwd`` (``_tile_codegen``): 16 accumulators of 8 rows by 32 columns."""
    return types.void(*[types.intp] * 5), _tile_codegen("vpmaddwd.512", _LANES, MR, NR)


@intrinsic
def _avx2_tile(typingctx, a_address, a_stride, b_address, depth, acc_address):
    """The tile on 256-bit ``vpmaddwd`` (``_tile_codegen``): sub-tiles of 4 rows by 16 columns,
    8 of AVX2's 16 registers accumulating."""
    return types.void(*[types.intp] * 5), _tile_codegen("vpmaddwd.256", 8, 4, 16)


@intrinsic
def _vnni_indirect_tile(typingctx, table_address, base_address, taps, tap_steps, b_address, acc_address):
    """``_vnni_tile`` reading its rows tap by tap through an indirection table (``_tile_codegen``'s ``indirect``)."""
    return types.void(*[types.intp] * 6), _tile_codegen("vpdpbusd", _LANES, MR, NR, indirect=True)


@intrinsic
def _avx512bw_indirect_tile(typingctx, table_address, base_address, taps, tap_steps, b_address, acc_address):
    """``_avx512bw_tile`` reading its rows tap by tap through an indirection table."""
    return types.void(*[types.intp] * 6), _tile_codegen("vpmaddwd.512", _LANES, MR, NR, indirect=True)


@intrinsic
def _avx2_indirect_tile(typingctx, table_address, base_address, taps, tap_steps, b_address, acc_address):
    """``_avx2_tile`` reading its rows tap by tap through an indirection table."""
    return types.void(*[types.intp] * 6), _tile_codegen("vpmaddwd.256", 8, 4, 16, indirect=True)


def _tile_vnni(q, row0, panels, p, acc):
    """acc[MR, NR] = q[row0:row0 + MR] . panel p, on ``_vnni_tile``."""
    _vnni_tile(q.ctypes.data + row0 * q.strides[0], q.strides[0], panels.ctypes.data + p * panels.strides[0],
               panels.shape[1], acc.ctypes.data)


def _tile_avx512bw(q, row0, panels, p, acc):
    """acc[MR, NR] = q[row0:row0 + MR] . pair panel p, on ``_avx512bw_tile``."""
    _avx512bw_tile(q.ctypes.data + row0 * q.strides[0], q.strides[0], panels.ctypes.data + p * panels.strides[0],
                   panels.shape[1], acc.ctypes.data)


def _tile_avx2(q, row0, panels, p, acc):
    """acc[MR, NR] = q[row0:row0 + MR] . pair panel p, on ``_avx2_tile``."""
    _avx2_tile(q.ctypes.data + row0 * q.strides[0], q.strides[0], panels.ctypes.data + p * panels.strides[0],
               panels.shape[1], acc.ctypes.data)


def _tile_portable(q, row0, panels, p, acc):
    """acc[MR, NR] = q[row0:row0 + MR] . panel p, in Numba's int32 loops (any host, either layout)."""
    step = panels.shape[3]
    for r in range(MR):
        for j in range(NR):
            acc[r * NR + j] = 0
        for s in range(panels.shape[1]):
            for i in range(step):
                value = np.int32(q[row0 + r, s * step + i])
                for j in range(NR):
                    acc[r * NR + j] += value * np.int32(panels[p, s, j, i])


def _indirect_portable(table, base, panels, p, acc):
    """acc[MR, NR] = the rows ``table`` [taps, MR] points at (byte offsets into ``base``, a contiguous
    array of the panels' type), tap by tap, . panel p, in Numba's int32 loops (any host, either layout)."""
    step, taps = panels.shape[3], table.shape[0]
    tap_steps = panels.shape[1] // taps
    values = base.reshape(-1)
    for i in range(MR * NR):
        acc[i] = 0
    for t in range(taps):
        for r in range(MR):
            start = table[t, r] // values.itemsize
            for s in range(tap_steps):
                for i in range(step):
                    value = np.int32(values[start + s * step + i])
                    for j in range(NR):
                        acc[r * NR + j] += value * np.int32(panels[p, t * tap_steps + s, j, i])


def indirect_tile(path: str):
    """``path``'s tile reading its rows through an indirection table, as the Python function Numba
    inlines: ``tile(table, base, panels, p, acc)``, acc[MR, NR] = the rows ``table`` [taps, MR] points
    at (int64 byte offsets into the contiguous ``base``), each tap's ``panels.shape[1] // taps`` words
    of K in turn, . panel p (K in tap order, no word across two taps)."""
    if path == "portable":
        return _indirect_portable
    product = {"vnni512": _vnni_indirect_tile, "avx512bw": _avx512bw_indirect_tile,
               "avx2": _avx2_indirect_tile}[path]

    def tile(table, base, panels, p, acc):
        taps = table.shape[0]
        product(table.ctypes.data, base.ctypes.data, taps, panels.shape[1] // taps,
                panels.ctypes.data + p * panels.strides[0], acc.ctypes.data)
    return tile


def quantize_row(x, q, scales, zeros, m):
    """Row m of x into q[m, :K] as the contract's uint8 (``A.QuantizedMatMul``; q is uint8, or int16
    for the pair paths), its scale and zero point."""
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


def copy_row(x, q, scales, zeros, m):
    """Row m of the already quantized uint8 x into q[m, :K] (uint8, or int16 for the pair paths);
    the scale and zero point are the op's inputs (``prequantized``), not the row's."""
    out = q[m]
    row = x[m]
    for k in range(row.shape[0]):
        out[k] = row[k]


#: each path's tile (the Python function Numba inlines) and whether it reads int16 pairs
_TILES = {"vnni512": (_tile_vnni, False), "avx512bw": (_tile_avx512bw, True), "avx2": (_tile_avx2, True),
          "portable": (_tile_portable, False)}


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


def _block_product(x, q, scales, zeros, packed, weight_sums, weight_scale, bias, out, lo, hi, gelu, block_steps,
                   groups, scratch):
    """The whole op with int4 weights (``A.QuantizedMatMul``'s ``block``): rows quantized, then per
    (panel, group of row tiles) task each block of the panel's nibbles widened into the task's
    scratch panel once and multiplied by every row tile of the group on the path's tile, each
    block's sums scaled and added in float32, then the zero point's share, the row's scale, the
    bias and the activation."""
    m, n = out.shape
    for r in numba.prange(m):
        _quantize(x, q, scales, zeros, r)
    row_tiles = -(-m // MR)
    per_group = -(-row_tiles // groups)
    step = scratch.shape[3]  # steps of K one word of the path's panel holds
    panel_count, steps = packed.shape[0], 2 * packed.shape[1] // (NR * step)
    for t in numba.prange(panel_count * groups):
        p, g = t // groups, t % groups
        first, last = g * per_group, min(row_tiles, (g + 1) * per_group)
        if first >= last:
            continue
        c0 = p * NR
        columns = min(NR, n - c0)
        panel = scratch[t:t + 1]
        widened = scratch[t].reshape(-1)
        acc = np.empty(MR * NR, np.int32)
        total = np.zeros((last - first) * MR * NR, np.float32)
        for b in range(weight_scale.shape[0]):
            s0 = b * block_steps
            depth = min(steps, s0 + block_steps) - s0
            start, count = s0 * NR * step // 2, depth * NR * step // 2
            # the block's first half in the low nibbles, its second in the high ones; three distinct
            # slices, so that the compiler vectorises the loop
            source, low, high = packed[p, start:start + count], widened[:count], widened[count:2 * count]
            for i in range(count):
                v = np.int32(source[i])
                low[i] = (v & 15) - ((v & 8) << 1)
                high[i] = (v >> 4) - ((v & 128) >> 3)
            for row_tile in range(first, last):
                _tile(q[:, s0 * step:], row_tile * MR, panel[:, :depth], 0, acc)
                base = (row_tile - first) * MR * NR
                for r in range(MR):
                    for j in range(NR):
                        total[base + r * NR + j] += np.float32(acc[r * NR + j]) * weight_scale[b, c0 + j]
        for row in range(first * MR, min(m, last * MR)):
            line = (row - first * MR) * NR
            zero, scale = np.float32(zeros[row]), scales[row]
            for j in range(columns):
                v = (total[line + j] - zero * weight_sums[c0 + j]) * scale + bias[c0 + j]
                if gelu:
                    v = cpu_activations.gelu_value(v)
                out[row, c0 + j] = min(max(v, lo), hi)


_COMPILED: dict[tuple[str, bool, bool, str], object] = {}


def _product_for(path: str, prequantized: bool, product=_quantized_product):
    """``product`` (``_quantized_product`` or ``_block_product``) with ``path``'s tile, its rows
    quantized (``quantize_row``) or copied (``copy_row``, ``prequantized``): a function of its own
    (own name, for Numba's disk cache), as a path's intrinsic cannot even be compiled on a host
    without its instructions."""
    tile = numba.njit(inline="always")(_TILES[path][0])
    rows = numba.njit(inline="always")(copy_row if prequantized else quantize_row)
    scope = dict(globals(), _tile=tile, _quantize=rows)
    name = f"{product.__name__}_{path}{'_prequantized' if prequantized else ''}"
    fn = types_module.FunctionType(product.__code__, scope, name, product.__defaults__, product.__closure__)
    fn.__qualname__ = fn.__name__
    fn.__doc__ = product.__doc__
    return fn


def _product_kernel(path: str, parallel: bool, prequantized: bool = False, product=_quantized_product):
    """``product`` on ``path``'s tile as a parallel region (cached on disk) or a one-thread loop,
    compiled on first use."""
    key = (path, parallel, prequantized, product.__name__)
    if key not in _COMPILED:
        fn = _product_for(path, prequantized, product)
        if parallel:
            _COMPILED[key] = cpu_parallel.compiled_region(fn, error_model="numpy", fastmath=False)
        else:  # compiled per process: Numba's disk cache would not tell it from the region
            _COMPILED[key] = numba.njit(error_model="numpy", boundscheck=False, nogil=True)(fn)
    return _COMPILED[key]


def pack_weight(weight: np.ndarray, pairs: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """int8 ``weight`` [K, N] as the tile's panels (zeros past K and N) and its column sums int32
    [N]: int8 [ceil(N / NR), ceil(K / 4), NR, 4] for ``vpdpbusd``, or with ``pairs`` int16
    [ceil(N / NR), 2 ceil(K / 4), NR, 2] for ``vpmaddwd``."""
    k, n = weight.shape
    step = 2 if pairs else STEP
    k4, count = -(-k // STEP), -(-n // NR)
    padded = np.zeros((k4 * STEP, count * NR), np.int16 if pairs else np.int8)
    padded[:k, :n] = weight
    steps = k4 * STEP // step
    panels = np.ascontiguousarray(padded.reshape(steps, step, count, NR).transpose(2, 0, 3, 1))
    return panels, weight.sum(axis=0, dtype=np.int32)


def pack_int4_weight(packed: np.ndarray, weight_scale: np.ndarray, k: int, block: int,
                     pairs: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``A.QuantizedMatMul``'s int4 weight (uint8 [ceil(K / 2), N]) as the path's panels in nibbles
    (uint8 [panels, bytes]: each block of ``pack_weight``'s panel, flattened, its first half in the
    low nibbles and its second in the high ones, so that two contiguous loops widen it), its scales
    widened to whole panels (float32 [blocks, panels * NR], zeros past N) and ``weight_sums``
    (``block_sums``) float32 [N]."""
    values = unpack_int4(packed, k)
    panels, _ = pack_weight(values, pairs)
    count, steps, step = panels.shape[0], panels.shape[1], panels.shape[3]
    nibbles = panels.astype(np.int8).view(np.uint8) & np.uint8(0x0F)  # int16 pair panels hold int4 values
    packed_panels = np.empty((count, steps * NR * step // 2), np.uint8)
    block_steps = block // step
    for s0 in range(0, steps, block_steps):
        segment = nibbles[:, s0:s0 + block_steps].reshape(count, -1)
        half = segment.shape[1] // 2
        packed_panels[:, s0 * NR * step // 2:][:, :half] = segment[:, :half] | (segment[:, half:] << np.uint8(4))
    scales = np.zeros((weight_scale.shape[0], count * NR), np.float32)
    scales[:, :weight_scale.shape[1]] = weight_scale
    return packed_panels, scales, weight_sums(values, weight_scale, block)


def block_sums(left: np.ndarray, values: np.ndarray, weight_scale: np.ndarray, block: int) -> np.ndarray:
    """The int4 contract's scaled sum over blocks of the exact integer product ``left . values``
    (left [M, K], values [K, N]): ``sum_b float32(left_b . values_b) * weight_scale[b]``, added in
    block order in float32. With ``left`` a row of ones it gives the contract's ``weight_sums``."""
    wide = values.astype(np.int64)
    total = None
    for b in range(weight_scale.shape[0]):
        rows = slice(b * block, (b + 1) * block)
        term = (left[:, rows].astype(np.int64) @ wide[rows]).astype(np.float32) * weight_scale[b]
        total = term if total is None else total + term
    return total


def weight_sums(values: np.ndarray, weight_scale: np.ndarray, block: int) -> np.ndarray:
    """The int4 contract's ``weight_sums`` [N]: ``block_sums`` of a row of ones."""
    return block_sums(np.ones((1, values.shape[0]), np.int64), values, weight_scale, block)[0]


def block_reference(q: np.ndarray, scale: np.ndarray, zero: np.ndarray, values: np.ndarray, weight_scale: np.ndarray,
                    block: int) -> np.ndarray:
    """The int4 contract in NumPy, before the bias: ``(block_sums(q . values) - zero * weight_sums)
    * scale``, each operation rounded to float32."""
    sums = block_sums(q, values, weight_scale, block)
    return (sums - zero[:, None].astype(np.float32) * weight_sums(values, weight_scale, block)) * scale[:, None]


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
    if op.block:
        return _make_block_product(op, ins, outs, engine, made_once)
    x = strided(ins[0], 0, (m, k), (k, 1))
    weight = view(ins[1]).reshape(k, n)
    weight_scale = view(ins[2]).reshape(n)
    bias = strided(ins[op.bias_input()], 0, (n,), (1,)) if op.has_bias else np.zeros(n, np.float32)
    out = view(outs[0]).reshape(m, n)
    if op.prequantized:  # one scale and zero point for every row: stride-0 views of the inputs
        given_scale, given_zero = view(ins[3]).reshape(-1)[:1], view(ins[4]).reshape(-1)[:1]
    if not engine.jit:
        act = _epilogue(op.activation)
        colsum = weight.sum(axis=0, dtype=np.int64)
        wide = weight.astype(np.int64)

        def rows() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            if op.prequantized:
                return x, np.broadcast_to(given_scale, (m,)), np.broadcast_to(given_zero.astype(np.int32), (m,))
            return quantize_rows_reference(x)

        def reference() -> None:
            q, scale, zero = rows()
            acc = q.astype(np.int64) @ wide
            np.add((acc - zero[:, None].astype(np.int64) * colsum).astype(np.float32)
                   * (scale[:, None] * weight_scale), bias, out=out)
            if act:
                act(out)
        return KernelWork((reference,), "int8 NumPy")
    path = current_path()
    pairs = _TILES[path][1]
    panels, colsum = made_once(ins[1], "int16 pair panels" if pairs else "int8 panels",
                               lambda: pack_weight(weight, pairs))
    lo, hi, after = _compiled_clamp(op.activation)
    gelu = op.activation is not None and op.activation[0] == "gelu"
    if gelu:
        after = None
    rows = -(-m // MR) * MR
    # padding rows and steps stay 0; the pair paths read the quantized bytes widened to int16
    q = np.zeros((rows, panels.shape[1] * panels.shape[3]), np.int16 if pairs else np.uint8)
    if op.prequantized:
        scales, zeros = np.broadcast_to(given_scale, (rows,)), np.broadcast_to(given_zero, (rows,))
    else:
        scales, zeros = np.empty(rows, np.float32), np.zeros(rows, np.int32)
    parallel = engine.regions > 1 and m * n * k >= 1 << 16
    kernel = cpu_jit.bind(_product_kernel(path, parallel, op.prequantized), x, q, scales, zeros, panels, colsum, weight_scale, bias,
                          out, lo, hi, gelu)

    def run() -> None:
        kernel(x, q, scales, zeros, panels, colsum, weight_scale, bias, out, lo, hi, gelu)
        if after is not None:
            after(out)
    return KernelWork((run,), f"int8 {PATH_NAMES[path]}{' region' if parallel else ''}")


def _make_block_product(op: A.QuantizedMatMul, ins, outs, engine, made_once) -> KernelWork:
    """``make_quantized_matmul`` for int4 weights in blocks (``op.block``): the compiled kernel
    (``_block_product``) where Numba runs, else ``block_reference``."""
    m, n, k = op.m, op.n, op.k
    x = strided(ins[0], 0, (m, k), (k, 1))
    packed = view(ins[1]).reshape(-1, n)
    weight_scale = view(ins[2]).reshape(-1, n)
    bias = strided(ins[op.bias_input()], 0, (n,), (1,)) if op.has_bias else np.zeros(n, np.float32)
    out = view(outs[0]).reshape(m, n)
    if not engine.jit:
        act = _epilogue(op.activation)
        values = unpack_int4(packed, k)

        def reference() -> None:
            q, scale, zero = quantize_rows_reference(x)
            np.add(block_reference(q, scale, zero, values, weight_scale, op.block), bias, out=out)
            if act:
                act(out)
        return KernelWork((reference,), "int4 NumPy")
    path = current_path()
    pairs = _TILES[path][1]
    nibbles, panel_scales, scaled_sums = made_once(
        ins[1], ("int4 pair panels" if pairs else "int4 panels", op.block),
        lambda: pack_int4_weight(packed, weight_scale, k, op.block, pairs))
    lo, hi, after = _compiled_clamp(op.activation)
    gelu = op.activation is not None and op.activation[0] == "gelu"
    if gelu:
        after = None
    step = 2 if pairs else STEP
    rows = -(-m // MR) * MR
    q = np.zeros((rows, nibbles.shape[1] * step), np.int16 if pairs else np.uint8)
    scales, zeros = np.empty(rows, np.float32), np.zeros(rows, np.int32)
    parallel = engine.regions > 1 and m * n * k >= 1 << 16
    panel_count = nibbles.shape[0]
    # enough tasks for every region thread where the panels are few; each group widens its blocks again
    groups = max(1, min(rows // MR, -(-2 * engine.regions // panel_count))) if parallel else 1
    block_steps = op.block // step
    scratch = np.zeros((panel_count * groups, block_steps, NR, step), np.int16 if pairs else np.int8)
    kernel = cpu_jit.bind(_product_kernel(path, parallel, product=_block_product), x, q, scales, zeros, nibbles,
                          scaled_sums, panel_scales, bias, out, lo, hi, gelu, block_steps, groups, scratch)

    def run() -> None:
        kernel(x, q, scales, zeros, nibbles, scaled_sums, panel_scales, bias, out, lo, hi, gelu, block_steps, groups,
               scratch)
        if after is not None:
            after(out)
    return KernelWork((run,), f"int4 {PATH_NAMES[path]}{' region' if parallel else ''}")
