"""The cpu backend's own matrix-product kernel: a register tile over operands packed in panels.

Why not BLAS here: BLAS packs both operands into its panel layout on every call. A convolution's
weights are constant, and where an image has few pixels they are the larger operand: ResNet's
512-channel 3x3 convolutions at 7x7 pack 9.4 MB of weights per call to multiply them by 49
columns, slower than ONNX Runtime, whose MLAS packs the weights once. Packed once at session
creation (``pack_panels``), with the im2col copy writing its windows straight into the other
operand's panels (``cpu_parallel.pack_windows``), the kernel below runs at MLAS's speed at
ResNet's and Inception's sizes. The panels must be contiguous: with the pixels read where a plain
im2col copy puts them (a row of MR values per cache line) it ran much slower. Measured:
bench/RESULTS.md.

The kernel (``tile_product``) is MNN's and every BLAS's inner loop: acc[MR, NR] = sum over k of
p[k, 0:MR] (outer product) v[k, 0:NR], with the MR x NR sums held in registers for the whole
inner dimension; per k it loads NR values of v, broadcasts each of MR values of p and does
MR * NR / 8 vector multiply-adds. MR = 6, NR = 16 keeps 12 accumulators of 8 floats, the two v
vectors and a broadcast in AVX2's 16 registers. It is written as LLVM IR (Numba's ``intrinsic``)
with 8-float vectors, which LLVM lowers to the host's units (AVX2 and FMA here, two SSE halves
on older x86, NEON on ARM): Numba's loops alone keep such a tile in memory, not in registers.
"""
from __future__ import annotations

import numpy as np

from . import jit as cpu_jit

numba = cpu_jit.numba
if numba is not None:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic
else:  # never called without Numba
    def intrinsic(fn):
        return fn

#: The register tile: MR rows of the broadcast operand (output pixels) by NR columns of the
#: vector operand (output channels)
MR, NR = 6, 16
_LANES = 8  # floats per vector register the IR names (AVX2's ymm)
#: How far ahead (floats) a tile streaming a packed weight panel asks for it: a convolution's weights
#: come from memory once per run where the run's data outgrows the cache, and the tile's steps
#: waited on them (bench/RESULTS.md, s17)
PREFETCH_FLOATS = 1024
#: ... and how far ahead a pointwise tile with pixels in its vectors asks for each input row it reads
#: (the next tiles' lines of the row): it reads as many rows at once as the input has channels, too
#: many for the hardware's stream prefetchers (bench/RESULTS.md, s19)
PIXELS_PREFETCH_FLOATS = 2 * NR


def _emit_products(builder, rows: int, vectors: int, p, p_stride, v, v_stride, depth, v_offsets=None,
                   p_bases=None, p_table=True, prefetch: int = 0, lanes: int = _LANES):
    """The tile's loop in IR: sums[r * vectors + h] = sum over ``depth`` steps of p[step * p_stride
    + r] times the vector v[step * v_stride + h * lanes ...] (v[v_offsets[step] + h * lanes ...] where
    ``v_offsets``, a pointer to int64, is given), held in registers; returns the sums (zero where
    ``depth`` is 0) with the builder placed after the loop. Where ``p_bases`` (a pointer to ``rows``
    int64) is given, rows are read where they lie, each from its own origin: row r's value of step
    k is p[p_bases[r] + offsets[k]] with p_stride a pointer to ``depth`` int64 offsets where
    ``p_table``, else p[p_bases[r] + k * p_stride]. ``prefetch``: each step asks for the line
    that many floats past its v (a packed weight panel, read once per run from memory:
    PREFETCH_FLOATS). ``lanes``: floats per vector."""
    f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
    vector = ir.VectorType(f32, lanes)
    zero = ir.Constant(vector, [0.0] * lanes)
    if p_bases is not None:
        p_origins = [builder.gep(p, [builder.load(builder.gep(p_bases, [ir.Constant(i64, r)]), align=8)])
                     for r in range(rows)]
    entry = builder.block
    loop, done = builder.append_basic_block("tile.loop"), builder.append_basic_block("tile.done")
    builder.cbranch(builder.icmp_signed(">", depth, ir.Constant(i64, 0)), loop, done)

    builder.position_at_end(loop)
    step = builder.phi(i64)
    sums = [builder.phi(vector) for _ in range(rows * vectors)]
    step.add_incoming(ir.Constant(i64, 0), entry)
    for s in sums:
        s.add_incoming(zero, entry)
    if v_offsets is None:
        v_row = builder.gep(v, [builder.mul(step, v_stride)])
    else:
        v_row = builder.gep(v, [builder.load(builder.gep(v_offsets, [step]), align=8)])
    if prefetch:
        _emit_prefetch(builder, builder.gep(v_row, [ir.Constant(i64, prefetch)]))
    loaded = [builder.load(builder.bitcast(builder.gep(v_row, [ir.Constant(i64, h * lanes)]),
                                           vector.as_pointer()), align=4) for h in range(vectors)]
    if p_bases is None:
        p_row = builder.gep(p, [builder.mul(step, p_stride)])
        p_values = [builder.gep(p_row, [ir.Constant(i64, r)]) for r in range(rows)]
    else:
        offset = builder.load(builder.gep(p_stride, [step]), align=8) if p_table else builder.mul(step, p_stride)
        p_values = [builder.gep(origin, [offset]) for origin in p_origins]
    broadcast = ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)
    updated = []
    for r in range(rows):
        scalar = builder.load(p_values[r], align=4)
        one = builder.insert_element(ir.Constant(vector, ir.Undefined), scalar, ir.Constant(i32, 0))
        splat = builder.shuffle_vector(one, ir.Constant(vector, ir.Undefined), broadcast)
        for h, lane in enumerate(loaded):
            # contract only: LLVM fuses the pair into an FMA where the host has one
            product = builder.fmul(splat, lane, flags=("contract",))
            updated.append(builder.fadd(sums[r * vectors + h], product, flags=("contract",)))
    following = builder.add(step, ir.Constant(i64, 1))
    tail = builder.block
    step.add_incoming(following, tail)
    for s, u in zip(sums, updated):
        s.add_incoming(u, tail)
    builder.cbranch(builder.icmp_signed("<", following, depth), loop, done)

    builder.position_at_end(done)
    totals = [builder.phi(vector) for _ in updated]  # every phi first, at the block's top
    for total, u in zip(totals, updated):
        total.add_incoming(zero, entry)
        total.add_incoming(u, tail)
    return totals


def _emit_prefetch(builder, address) -> None:
    """A read prefetch of ``address`` into every cache level (LLVM's ``llvm.prefetch``; a no-op where
    the target has none). Declared by its name without the pointer type's suffix, which LLVM
    renames on reading to its own spelling (``p0i8`` with typed pointers, ``p0`` without)."""
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    module = builder.module
    fn = module.globals.get("llvm.prefetch") or ir.Function(
        module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), name="llvm.prefetch")
    builder.call(fn, [builder.bitcast(address, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])


def _store_sums(builder, totals, acc) -> None:
    """The tile's sums (``_emit_products``' vectors) stored side by side from ``acc`` (float*)."""
    vector = ir.VectorType(ir.FloatType(), _LANES)
    for j, total in enumerate(totals):
        address = builder.gep(acc, [ir.Constant(ir.IntType(64), j * _LANES)])
        builder.store(total, builder.bitcast(address, vector.as_pointer()), align=4)


def _store_columns(builder, totals, rows, vectors, out, row_step, column_step, valid_rows, valid_columns, bias,
                   dummy, finish, lanes: int = _LANES) -> None:
    """The tile's sums (``_emit_products``' vectors: ``rows`` by ``vectors`` * 8 columns) as
    ``finish(sum, bias vector)``, each value stored on its own at out + r * row_step + column *
    column_step floats: a tile of pixel rows by output-channel columns into NCHW, which puts a
    channel's pixels side by side. Columns from ``valid_columns`` on, and rows from ``valid_rows``
    on (None: every row), go to ``dummy``; the bias is read a whole vector at a time."""
    i32, i64 = ir.IntType(32), ir.IntType(64)
    vector = ir.VectorType(ir.FloatType(), lanes)
    for h in range(vectors):
        value = builder.load(builder.bitcast(builder.gep(bias, [ir.Constant(i64, h * lanes)]), vector.as_pointer()),
                             align=4)
        finished = [finish(totals[r * vectors + h], value) for r in range(rows)]
        for lane in range(lanes):
            column = h * lanes + lane
            at = builder.gep(out, [builder.mul(ir.Constant(i64, column), column_step)])
            at = builder.select(builder.icmp_signed("<", ir.Constant(i64, column), valid_columns), at, dummy)
            for r in range(rows):
                scalar = builder.extract_element(finished[r], ir.Constant(i32, lane))
                address = builder.gep(at, [builder.mul(ir.Constant(i64, r), row_step)])
                if valid_rows is not None:
                    address = builder.select(builder.icmp_signed("<", ir.Constant(i64, r), valid_rows), address, dummy)
                builder.store(scalar, address, align=4)


def _tile_kernel(rows: int, columns: int, prefetch: int = 0):
    """The register tile acc[rows, columns] = p^T v as a Numba intrinsic (``tile_product`` is
    MR x NR and ``prefetch``es v, mostly a weight panel; ``square_product`` 8 x 8, the Winograd
    transforms' tile; ``row_product`` 1 x 16)."""
    vectors = columns // _LANES

    @intrinsic
    def kernel(typingctx, p_address, p_stride, v_address, v_stride, depth, acc_address):
        def codegen(context, builder, signature, args):
            f32 = ir.FloatType()
            p, v, acc = (builder.inttoptr(a, f32.as_pointer()) for a in (args[0], args[2], args[5]))
            _store_sums(builder, _emit_products(builder, rows, vectors, p, args[1], v, args[3], args[4],
                                                prefetch=prefetch), acc)
            return context.get_dummy_value()
        return types.void(*[types.intp] * 6), codegen
    return kernel


def _in_place_kernel(rows: int, columns: int, table: bool = True):
    """The register tile acc[rows, columns] as ``_tile_kernel``'s, with the rows read where they lie:
    row r's value of step k at p[bases[r] + offsets[k]] (``bases``: ``rows`` int64, ``offsets``:
    ``depth`` int64, both given by address); without a ``table``, the third argument is a stride
    and the value at p[bases[r] + k * stride]."""
    vectors = columns // _LANES

    @intrinsic
    def kernel(typingctx, p_address, bases_address, offsets_address, v_address, v_stride, depth, acc_address):
        def codegen(context, builder, signature, args):
            f32, i64 = ir.FloatType(), ir.IntType(64)
            p, v, acc = (builder.inttoptr(args[i], f32.as_pointer()) for i in (0, 3, 6))
            bases = builder.inttoptr(args[1], i64.as_pointer())
            offsets = builder.inttoptr(args[2], i64.as_pointer()) if table else args[2]
            _store_sums(builder, _emit_products(builder, rows, vectors, p, offsets, v, args[4], args[5],
                                                p_bases=bases, p_table=table), acc)
            return context.get_dummy_value()
        return types.void(*[types.intp] * 7), codegen
    return kernel


def _storing_kernel(rows: int, columns: int, in_place: bool, lanes: int = _LANES):
    """``_tile_kernel``'s tile (``in_place``: ``_in_place_kernel``'s, its rows read where they lie)
    that stores its outputs itself, clamp(sum + bias) to [lo, hi], as ``_store_columns`` does: rows
    are output pixels, columns output channels, into NCHW planes ``column_step`` floats apart. The
    products' arguments (``tile_product``'s first five; in place, p, bases, offsets, v, v_stride and
    depth as ``_in_place_kernel`` takes them), then out, column_step, valid_rows, valid_columns, the
    bias (a whole tile's columns readable), dummy (a few floats of scratch) and lo, hi. A loop
    storing the tile's sums from memory, value by value, took an eighth of a convolution's time
    (bench/RESULTS.md)."""
    vectors = columns // lanes
    operands = 6 if in_place else 5

    def codegen(context, builder, signature, args):
        f32, i64 = ir.FloatType(), ir.IntType(64)
        if in_place:
            p, v = (builder.inttoptr(args[i], f32.as_pointer()) for i in (0, 3))
            totals = _emit_products(builder, rows, vectors, p, builder.inttoptr(args[2], i64.as_pointer()), v, args[4],
                                    args[5], p_bases=builder.inttoptr(args[1], i64.as_pointer()),
                                    prefetch=PREFETCH_FLOATS, lanes=lanes)
        else:
            p, v = (builder.inttoptr(args[i], f32.as_pointer()) for i in (0, 2))
            totals = _emit_products(builder, rows, vectors, p, args[1], v, args[3], args[4], prefetch=PREFETCH_FLOATS,
                                    lanes=lanes)
        out, column_step, valid_rows, valid_columns, bias, dummy, lo, hi = args[operands:]
        out, bias, dummy = (builder.inttoptr(a, f32.as_pointer()) for a in (out, bias, dummy))
        lo, hi = _splat(builder, lo, lanes), _splat(builder, hi, lanes)
        _store_columns(builder, totals, rows, vectors, out, ir.Constant(i64, 1), column_step, valid_rows,
                       valid_columns, bias, dummy,
                       lambda total, value: cpu_jit.clamped_ir(builder, builder.fadd(total, value), lo, hi), lanes)
        return context.get_dummy_value()

    def signature():  # typed when first called, where Numba is installed
        return types.void(*[types.intp] * (operands + 6), types.float32, types.float32)
    if in_place:
        @intrinsic
        def kernel(typingctx, p_address, bases_address, offsets_address, v_address, v_stride, depth, out_address,
                   column_step, valid_rows, valid_columns, bias_address, dummy_address, lo, hi):
            return signature(), codegen
    else:
        @intrinsic
        def kernel(typingctx, p_address, p_stride, v_address, v_stride, depth, out_address, column_step, valid_rows,
                   valid_columns, bias_address, dummy_address, lo, hi):
            return signature(), codegen
    return kernel


def _splat(builder, scalar, lanes: int = _LANES):
    """``scalar`` (float) in every lane of a vector of ``lanes`` floats."""
    i32 = ir.IntType(32)
    vector = ir.VectorType(ir.FloatType(), lanes)
    one = builder.insert_element(ir.Constant(vector, ir.Undefined), scalar, ir.Constant(i32, 0))
    return builder.shuffle_vector(one, ir.Constant(vector, ir.Undefined),
                                  ir.Constant(ir.VectorType(i32, lanes), [0] * lanes))


def _pointwise_kernel(rows: int, vectors: int, channels_in_rows: bool, tapped: bool = False, lanes: int = _LANES):
    """A register tile of a 1x1 convolution that stores its outputs itself, the bias, a clamp and
    (where ``swish`` is not 0) hard-swish applied in registers: ``rows`` x ``vectors`` * ``lanes``
    sums of p^T v over ``depth`` steps, as ``tile_product`` makes them, then clamp(sum + bias) to
    [lo, hi] written to out. Output (r, column) goes to out + r * row_step + column * column_step
    floats. ``channels_in_rows``: the rows are output channels (p: weights packed in panels of
    ``rows``, v: ``vectors`` * ``lanes`` pixels of an input row), the bias one value per row and
    each row's vectors stored whole (column_step 1); rows past ``valid`` are stored to
    ``dummy_address`` instead.
    Else the rows are pixels (p: a row of the input, read in place) and the columns output channels
    (v: weights packed in panels of ``vectors`` * 8), the bias a value per column and every value
    stored on its own (NCHW puts a channel's pixels side by side); columns past ``valid`` go to
    ``dummy_address``. ``tapped`` (channels in rows only): v_stride is instead the address of an
    int64 table of ``depth`` offsets, step k's vectors read at v + offsets[k] floats (a tapped
    convolution's taps, ``cpu_parallel.tapped_conv``). ``lanes``: floats per vector (8 unless channels
    are in the rows)."""
    assert channels_in_rows or lanes == _LANES
    @intrinsic
    def kernel(typingctx, p_address, p_stride, v_address, v_stride, depth, out_address, row_step, column_step,
               valid, bias_address, lo, hi, swish, dummy_address):
        def codegen(context, builder, signature, args):
            f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
            vector = ir.VectorType(f32, lanes)
            p, v, out, bias, dummy = (builder.inttoptr(args[i], f32.as_pointer()) for i in (0, 2, 5, 9, 13))
            row_step, column_step, valid = args[6], args[7], args[8]
            lo, hi = _splat(builder, args[10], lanes), _splat(builder, args[11], lanes)
            offsets = builder.inttoptr(args[3], i64.as_pointer()) if tapped else None
            # pixels in the rows: v is the weight panel (channels in rows: the input, read in place)
            prefetch = 0 if tapped else PIXELS_PREFETCH_FLOATS if channels_in_rows else PREFETCH_FLOATS
            totals = _emit_products(builder, rows, vectors, p, args[1], v, args[3], args[4], offsets,
                                    prefetch=prefetch, lanes=lanes)

            def finish(total, value, with_swish):
                total = cpu_jit.clamped_ir(builder, builder.fadd(total, value), lo, hi)
                return cpu_jit.hard_swish_ir(builder, total) if with_swish else total

            def store(with_swish):
                if channels_in_rows:
                    for r in range(rows):
                        value = _splat(builder, builder.load(builder.gep(bias, [ir.Constant(i64, r)]), align=4), lanes)
                        row = builder.gep(out, [builder.mul(ir.Constant(i64, r), row_step)])
                        row = builder.select(builder.icmp_signed("<", ir.Constant(i64, r), valid), row, dummy)
                        for h in range(vectors):
                            total = finish(totals[r * vectors + h], value, with_swish)
                            address = builder.gep(row, [builder.mul(ir.Constant(i64, h * lanes), column_step)])
                            builder.store(total, builder.bitcast(address, vector.as_pointer()), align=4)
                    return
                _store_columns(builder, totals, rows, vectors, out, row_step, column_step, None, valid, bias, dummy,
                               lambda total, value: finish(total, value, with_swish))

            with builder.if_else(builder.icmp_signed("!=", args[12], ir.Constant(i64, 0))) as (then, otherwise):
                with then:
                    store(True)
                with otherwise:
                    store(False)
            return context.get_dummy_value()
        return types.void(*[types.intp] * 10, types.float32, types.float32, types.intp, types.intp), codegen
    return kernel


#: acc[MR, NR] (row-major at ``acc_address``) = p^T v over ``depth`` steps: p's MR values at
#: ``p_address`` + step * ``p_stride`` floats, v's NR at ``v_address`` + step * ``v_stride``
#: (all addresses and strides as integers: ``tile_product(p, p_stride, v, v_stride, depth, acc)``).
#: v is prefetched: Winograd's products stream their weight panels through it; its output
#: transform's v, the thread's scratch of at most 8 steps, is in cache anyway.
tile_product = _tile_kernel(MR, NR, prefetch=PREFETCH_FLOATS)
#: Floats per vector register of the compile target: 16 (one 512-bit register) where it has
#: AVX-512, else 8
TARGET_LANES = 16 if cpu_jit.target_features().get("avx512f") else _LANES
#: ``cpu_parallel.packed_conv``'s tiles, storing their outputs into NCHW themselves with the bias and
#: a clamp (``_storing_kernel``): ``tile_product_stored`` on packed pixel panels, and
#: ``tile_in_place_stored`` with IN_PLACE_ROWS rows read in place, row r of step k at p + bases[r] +
#: offsets[k] floats (the windows read from the zero-bordered input, no panels packed), by weight
#: panels of IN_PLACE_COLUMNS output channels
tile_product_stored = _storing_kernel(MR, NR, in_place=False)
#: Pixel rows and channel columns of the tile that reads its windows in place. On 8-float vectors
#: 5 x 16: five rows ran as fast as six on whole convolutions where six pad no pixel panel, and
#: faster where they do (25 pixels: 30 rows for 25). On 16-float ones 7 x 32, 14 accumulators of
#: two vectors a row: a tile one vector wide waited on its loads (bench/RESULTS.md, s20)
IN_PLACE_ROWS, IN_PLACE_COLUMNS = (7, 2 * TARGET_LANES) if TARGET_LANES == 16 else (5, NR)
tile_in_place_stored = _storing_kernel(IN_PLACE_ROWS, IN_PLACE_COLUMNS, in_place=True, lanes=TARGET_LANES)
#: Whether that tile holds two vectors of channels a row (16-float targets): the engine's choices
#: that follow from it (``engines.packed_in_place``, ``WINOGRAD_PAYS``, ``Engine.pointwise_in_place``)
#: read this
WIDE_IN_PLACE = IN_PLACE_COLUMNS > NR
#: The register tile with its rows read in place at a stride: ``rows_in_place(p, bases, stride, v,
#: v_stride, depth, acc)``, row r of step k at p + bases[r] + k * stride floats (``cpu_parallel``'s 1D
#: Winograd input transform: a panel's MR tiles at once)
rows_in_place = _in_place_kernel(MR, NR, table=False)
#: The side of ``square_product``'s tile: one vector register of floats
SQUARE = _LANES
#: The same for a SQUARE x SQUARE tile: SQUARE accumulators of one vector each, as many independent
#: multiply-add chains per step. Winograd's transforms (``cpu_parallel.winograd_packed``) are such
#: products of at most 8 x 8 matrices (``schemes.MAX_ALPHA``), one tile at a time.
square_product = _tile_kernel(SQUARE, SQUARE)
#: The width of ``row_product``'s row: two vector registers, the most a 1D tile's alpha may be
ROW = 2 * _LANES
#: A row of ROW sums: acc[0:ROW] = sum over steps of p[step] v[step, 0:ROW], two vector
#: multiply-adds per step: the transform of a 1D Winograd tile (a 1x7 or 7x1 kernel's, p the
#: tile's inputs ``p_stride`` apart; ``schemes.MAX_ALPHA_1D``), where ``square_product`` would do
#: eight rows for one.
row_product = _tile_kernel(1, ROW)
#: The width of ``wide_product``'s row: eight vector registers, as many independent multiply-add
#: chains per step, enough to cover the multiply-add's latency
WIDE = 8 * _LANES
#: acc[0:WIDE] = sum over steps of p[step] v[step, 0:WIDE]: a vector times WIDE columns of a matrix
#: (``small_product``)
wide_product = _tile_kernel(1, WIDE)

#: Floats per vector of the tiles whose vectors hold pixels: the target's (where it has AVX-512
#: the 8-float tile ran slower: bench/RESULTS.md, s19)
PIXEL_LANES = TARGET_LANES
#: Output channels per weight panel of the pointwise tiles with pixels in the vector registers, the
#: first preferred (``pointwise_rows``): on one vector per row where it is 16 floats wide, 16 or 12
#: accumulators; else the 6 x 16 tile's 12 of 8 floats
POINTWISE_ROWS = (16, 12) if PIXEL_LANES == 16 else (MR, MR)


def pointwise_rows(channels: int) -> int:
    """The panel height (one of POINTWISE_ROWS) for ``channels`` output channels: the first that
    pads no channel, else the one that pads fewest."""
    return min(POINTWISE_ROWS, key=lambda rows: (-channels % rows, POINTWISE_ROWS.index(rows)))


#: The pointwise tiles (``cpu_parallel.pointwise_tiles``). Pixels in the vector registers: a panel of
#: output channels (``pointwise_rows``) by NR pixels of an input row (``channel_rows_tile``) or by one
#: vector of NARROW of them (``channel_rows_narrow``, an image's last pixels); pixels broadcast: 1 to
#: MR pixels by NR output channels (``pixel_rows_<rows>``), for images of fewer than NR pixels, or one
#: pixel by WIDE channels (``pixel_row_wide``: as many independent sums as ``wide_product``), for one pixel.
NARROW = _LANES
channel_rows_tile = _pointwise_kernel(POINTWISE_ROWS[0], NR // PIXEL_LANES, True, lanes=PIXEL_LANES)
channel_rows_narrow = _pointwise_kernel(POINTWISE_ROWS[0], 1, True)
#: the same for panels of POINTWISE_ROWS[1] channels (the same kernels where both heights are one)
channel_rows_short_tile, channel_rows_short_narrow = (
    (channel_rows_tile, channel_rows_narrow) if POINTWISE_ROWS[1] == POINTWISE_ROWS[0] else
    (_pointwise_kernel(POINTWISE_ROWS[1], NR // PIXEL_LANES, True, lanes=PIXEL_LANES),
     _pointwise_kernel(POINTWISE_ROWS[1], 1, True)))
pixel_rows_1, pixel_rows_2, pixel_rows_3, pixel_rows_4, pixel_rows_5, pixel_rows_6 = (
    _pointwise_kernel(rows, NR // _LANES, False) for rows in range(1, MR + 1))
pixel_row_wide = _pointwise_kernel(1, WIDE // _LANES, False)
#: The tapped convolution's tiles (``cpu_parallel.tapped_conv``): MR output channels by NR (or one
#: vector of) output pixels of a row, each step one (input channel, tap) pair whose pixels are read
#: where they lie in the zero-bordered input, at the step's offset from a table
tapped_tile = _pointwise_kernel(MR, NR // _LANES, True, tapped=True)
tapped_narrow = _pointwise_kernel(MR, 1, True, tapped=True)


@cpu_jit.inlined
def product_row(x, b, bias, o, lo, hi, acc, n0, n1):
    """o[n0:n1] = clamp(x @ b + bias)[n0:n1] to [lo, hi] for one row x [K] of a product by b [K, N]
    (C-contiguous float32), acc a scratch of WIDE floats: WIDE columns at a time with the sums in
    vector registers over the whole inner dimension (``wide_product``), then ROW, then the columns
    left one at a time."""
    k, n = x.shape[0], b.shape[1]
    while n0 < n1:
        if n0 + WIDE <= n1:
            wide_product(x.ctypes.data, 1, b.ctypes.data + 4 * n0, n, k, acc.ctypes.data)
            width = WIDE
        elif n0 + ROW <= n1:
            row_product(x.ctypes.data, 1, b.ctypes.data + 4 * n0, n, k, acc.ctypes.data)
            width = ROW
        else:
            width = n1 - n0
            for j in range(width):
                total = np.float32(0.0)
                for step in range(k):
                    total += x[step] * b[step, n0 + j]
                acc[j] = total
        for j in range(width):
            o[n0 + j] = min(max(acc[j] + bias[n0 + j], lo), hi)
        n0 += width


@cpu_jit.compiled
def small_product(a, b, bias, out, lo, hi):
    """out[i] = clamp(a[i] @ b[i or 0] + bias) to [lo, hi] for a [B, M, K], b [1 or B, K, N], bias
    [N], out [B, M, N], all C-contiguous float32, a row at a time (``product_row``). An LSTM step's
    recurrent product (a few tens of thousands of multiply-adds) spent most of its time entering a
    region and BLAS; a loop adding a scaled row of b per element kept the sums in memory."""
    shared = b.shape[0] == 1
    acc = np.empty(WIDE, np.float32)
    for i in range(a.shape[0]):
        bi = b[0] if shared else b[i]
        for m in range(a.shape[1]):
            product_row(a[i, m], bi, bias, out[i, m], lo, hi, acc, 0, out.shape[2])


def _copy_kernel(count: int, stride: int = 1):
    """dst[0:count] = src[0:count * stride:stride], stored as whole vectors (a power-of-two piece
    each, largest first: 4 + 2 for MR = 6) and, at stride 1, loaded so too; at stride 2, two
    overlapping vector loads covering the span (the first and the last float taken) and a shuffle
    of their even floats into each piece, as ``_even_lanes_kernel`` does, where a load per float
    kept the copy slow. No float past either end is touched."""
    pieces, left = [], count
    while left:
        piece = 1 << (left.bit_length() - 1)
        pieces.append((count - left, piece))
        left -= piece
    span = (count - 1) * stride + 1  # floats from the first taken to the last
    wide = 1 << max(0, (-(-span // 2) - 1).bit_length())  # two loads of this many cover the span
    second = span - wide  # where the second load starts

    def lane_of(index: int) -> int:  # where src[index] is in the two loads side by side
        return index if index < wide else wide + index - second

    @intrinsic
    def kernel(typingctx, dst_address, src_address):
        def codegen(context, builder, signature, args):
            f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
            dst, src = (builder.inttoptr(a, f32.as_pointer()) for a in args)
            if stride == 2 and count > 1:
                loads = [builder.load(builder.bitcast(builder.gep(src, [ir.Constant(i64, at)]),
                                                      ir.VectorType(f32, wide).as_pointer()), align=4)
                         for at in (0, second)]
            for start, width in pieces:
                kind = ir.VectorType(f32, width)
                if stride == 2 and count > 1:
                    taken = ir.Constant(ir.VectorType(i32, width), [lane_of(2 * (start + j)) for j in range(width)])
                    value = builder.shuffle_vector(loads[0], loads[1], taken)
                elif stride == 1:
                    value = builder.load(builder.bitcast(builder.gep(src, [ir.Constant(i64, start)]), kind.as_pointer()),
                                         align=4)
                else:
                    value = ir.Constant(kind, ir.Undefined)
                    for lane in range(width):
                        scalar = builder.load(builder.gep(src, [ir.Constant(i64, (start + lane) * stride)]), align=4)
                        value = builder.insert_element(value, scalar, ir.Constant(i32, lane))
                builder.store(value, builder.bitcast(builder.gep(dst, [ir.Constant(i64, start)]), kind.as_pointer()),
                              align=4)
            return context.get_dummy_value()
        return types.void(types.intp, types.intp), codegen
    return kernel


def _even_lanes_kernel(count: int):
    """dst[0:count] = src[0:2 * count:2] as one load of 2 * count floats, a shuffle keeping the
    even lanes and one store: a gather per element is what kept a stride-2 copy slow. Reads
    src[2 * count - 1], one float past the last one kept."""
    @intrinsic
    def kernel(typingctx, dst_address, src_address):
        def codegen(context, builder, signature, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            dst, src = (builder.inttoptr(a, f32.as_pointer()) for a in args)
            wide = builder.load(builder.bitcast(src, ir.VectorType(f32, 2 * count).as_pointer()), align=4)
            even = ir.Constant(ir.VectorType(i32, count), [2 * lane for lane in range(count)])
            kept = builder.shuffle_vector(wide, ir.Constant(ir.VectorType(f32, 2 * count), ir.Undefined), even)
            builder.store(kept, builder.bitcast(dst, ir.VectorType(f32, count).as_pointer()), align=4)
            return context.get_dummy_value()
        return types.void(types.intp, types.intp), codegen
    return kernel


#: The floats ``copy_even_lanes`` writes: two vector registers' worth read, one written
EVEN_LANES = 2 * _LANES
#: copy_even_lanes(dst_address, src_address): EVEN_LANES floats taken two apart (reads
#: 2 * EVEN_LANES floats from src): a row of a stride-2 convolution's im2col copy
copy_even_lanes = _even_lanes_kernel(EVEN_LANES)

#: copy_row(dst_address, src_address): the MR floats of a pixel panel's row whose pixels lie side by
#: side in the input, and copy_row_s2 those two apart (a stride-2 convolution's), for
#: ``cpu_parallel.pack_windows``
copy_row, copy_row_s2 = _copy_kernel(MR), _copy_kernel(MR, 2)


def pack_panels(matrix: np.ndarray, width: int) -> np.ndarray:
    """``matrix`` [R, K] as panels [ceil(R / width), K, width] (panel i, step k holds rows i*width..
    at column k), zeros past row R: the layout ``tile_product`` streams (width NR for the vector
    operand, MR for the broadcast one)."""
    rows, depth = matrix.shape
    count = -(-rows // width)
    padded = np.zeros((count * width, depth), np.float32)
    padded[:rows] = matrix
    return np.ascontiguousarray(padded.reshape(count, width, depth).transpose(0, 2, 1))
