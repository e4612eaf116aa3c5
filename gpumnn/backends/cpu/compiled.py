"""The cpu backend's compiled kernels: ``cpu_jit``'s loops on the backend's Python threads, and
native parallel regions (``cpu_parallel``) that run one op's spans on Numba's
threads in one call, the bias and a clamp activation applied in the loop.

The residual sum and its per-row form, GEMM blocks on BLAS's sgemm, im2col and the register
tile's packed convolution, Winograd on the register tile, the depthwise convolution and 3x3
pooling; the scratch, span bounds and work items they share. Which kernel runs an op is the
backend's ``engines.Engine``'s decision; the NumPy kernels, and the views and spans these read,
are in ``reference``.
"""
from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from ... import atomic as A
from ..base import KernelWork, TensorHandle
from . import direct as cpu_direct, engines, jit as cpu_jit, parallel as cpu_parallel, tiles as cpu_tiles
from .reference import _compiled_clamp, _compiled_epilogue, _conv_pads, _even_spans, _on_pool, _spans, strided
from .arena import ScratchArena
from .workers import Workers
from ...numerics.winograd import conv_matrices, transformed_weights


def _row_broadcast(dims: list[tuple[int, ...]], side: int) -> bool:
    """Whether ``merge_dims``' (size, out stride, a stride, b stride) dims add to a dense operand
    (the other side's) one value of operand ``side`` (1: a, 2: b) per row of the innermost run:
    a per-channel bias over NCHW planes."""
    dense = 3 - side
    return len(dims) >= 2 and dims[-1][side + 1] == 0 and all(d[1] == d[dense + 1] for d in dims)


def row_value_index(dims: list[tuple[int, ...]], side: int) -> np.ndarray:
    """Where ``_row_broadcast`` holds: each row's offset in operand ``side``'s values."""
    index = np.zeros(1, np.int64)
    for size, *strides in dims[:-1]:
        index = (index[:, None] + np.arange(size, dtype=np.int64)[None, :] * strides[side]).reshape(-1)
    return index


def _row_sum_region(dense: np.ndarray, values: TensorHandle, dims: list[tuple[int, ...]], side: int, out: np.ndarray,
                    activation: A.Activation, parts: int, product: bool = False) -> KernelWork:
    """out = clamp(dense + a value per row) (times, where ``product``) as one pass on the region's
    threads (``cpu_parallel.row_sum_spans``): a bias added after an average pool (``optimize``'s
    ``pointwise_before_average_pool``) and its ReLU, or squeeze-excitation's scale per channel,
    where NumPy's broadcast add and clamp made two passes on one thread (measured: bench/RESULTS.md)."""
    width, index = dims[-1][0], row_value_index(dims, side)
    flat = strided(values, 0, (int(index.max()) + 1,), (1,))
    lo, hi, _ = _compiled_clamp(activation)
    bounds = _bounds(_even_spans(index.size, parts))
    args = (dense, flat, index, out, bounds, width, lo, hi, product)
    return KernelWork((_region_items(cpu_parallel.row_sum_spans, [args], None, out, one_span=len(bounds) == 2),),
                      "product" if product else "sum", keep=(index, bounds))


def _sum_region(a: np.ndarray, b: np.ndarray, out: np.ndarray, activation: A.Activation, parts: int) -> KernelWork:
    """out = clamp(a + b) (a residual connection and its ReLU) as one pass on the region's
    threads (``cpu_parallel.sum_spans``), where NumPy made two on one thread (the sum, then the
    clamp). ``parts``: spans. Measured: bench/RESULTS.md."""
    lo, hi, _ = _compiled_clamp(activation)
    bounds = _bounds(_spans(out.size, parts, align=engines.CACHE_LINE_FLOATS))
    return KernelWork((_region_items(cpu_parallel.sum_spans, [(a, b, out, bounds, lo, hi)], None, out,
                                     one_span=len(bounds) == 2),), "sum")


def _vector_product_region(op: A.MatMul, x: np.ndarray, weights: np.ndarray, out: np.ndarray, bias: np.ndarray | None,
                           constant_bias: bool, regions: int, once: Callable) -> KernelWork:
    """A vector times a constant matrix (a classifier's last layer: M = 1), x [K] @ weights [K, N]
    -> out [N], as a 1x1 convolution of one pixel on the pointwise tiles (``_pointwise_region``):
    the matrix packed into panels of WIDE columns once, and each run reads them once, half on each
    thread, with WIDE independent sums per step. BLAS's sgemm packs the whole matrix on every call
    to multiply it by one row (measured: bench/RESULTS.md)."""
    k, n = weights.shape
    conv = A.Conv2D(op.inputs, op.outputs, op.source, batch=1, in_channels=k, out_channels=n,
                    activation=op.activation, has_bias=bias is not None, scheme="gemm1x1")
    made = _pointwise_region(conv, x.reshape(1, k, 1), weights.T, out.reshape(1, n, 1),
                             None if bias is None else bias[0], constant_bias, regions, regions,
                             lambda recipe, make: once(("vector panels", *recipe[1:]), make))
    return KernelWork(made.work, op.scheme, made.keep)  # the report names the product's scheme, not the convolution's


def _panel_bias(bias: np.ndarray | None, channels: int, panels: int, width: int,
                constant: bool) -> tuple[np.ndarray, tuple[Callable[[], None], ...]]:
    """The bias zero-padded to ``panels`` whole panels of ``width`` (the tiles read it a vector at a
    time), and the work that copies a run-time bias into it before each run (none where it is
    ``constant`` or absent: copied here, once)."""
    padded = np.zeros(panels * width, np.float32)
    if bias is None:
        return padded, ()
    refresh = functools.partial(np.copyto, padded[:channels], bias.reshape(channels))
    refresh()
    return padded, () if constant else (refresh,)


def _row_tiles_region(a: np.ndarray, weights: Callable[[], np.ndarray], out: np.ndarray, bias: np.ndarray | None,
                      constant_bias: bool, activation: A.Activation, regions: int, parts: int) -> KernelWork:
    """a [M, K] @ constant weights [K, N] (+ a bias row) into out [M, N], all C-contiguous float32, on
    the register tile (``cpu_parallel.row_tiles``): ``weights()`` packs them once into panels of NR
    columns; blocks are spans of those panels, ``parts`` of them; a clamp in the tile's store, any
    other activation on each block's outputs. A bias that is not ``constant_bias`` is copied into
    the kernel's zero-padded row on every run."""
    m, k = a.shape
    n = out.shape[1]
    panels = weights()
    padded_bias, refresh = _panel_bias(bias, n, len(panels), cpu_tiles.NR, constant_bias)
    lo, hi, after = _compiled_clamp(activation)
    kind = _activation_kind(activation)
    if kind >= 0:  # the region applies it to each block
        after = None
    rows = -(-m // cpu_tiles.MR) * cpu_tiles.MR
    bases = np.minimum(np.arange(rows), m - 1).astype(np.int64) * k  # rows past M read the last one
    blocks = np.array(_spans(len(panels), parts), np.int64)
    accs = _thread_scratch(regions, cpu_tiles.MR * cpu_tiles.NR)
    args = (a, bases, panels, out, padded_bias, blocks, accs, lo, hi, kind)
    run = _region_items(cpu_parallel.row_tiles, [args], after, out, activation, regions, one_span=len(blocks) == 1)
    return KernelWork((*refresh, run), "row tiles", keep=(panels, padded_bias, bases, blocks, accs))


def one_pixel_operands(op: A.Conv2D, weight: np.ndarray, bias: np.ndarray | None, constant_bias: bool,
                       once: Callable) -> tuple[np.ndarray, np.ndarray | None, A.Activation]:
    """A one-pixel convolution as ``cpu_tiles.small_product`` takes it: (its weights laid [C, OC],
    made by ``once(recipe, make)``; its bias per output channel or None; its activation).
    Squeeze-excitation's hard-sigmoid gate clip(a (x W + b) + c, 0, 1) becomes the clamp of
    x (a W) + (a b + c) on weights and a bias scaled once (where ``constant_bias``), where a pass
    after the product would cost as much as the product."""
    oc, c = op.out_channels, op.in_channels
    bias1, activation, scale = None if bias is None else bias.reshape(oc), op.activation, np.float32(1.0)
    if activation is not None and activation[0] == "hard_sigmoid" and constant_bias:
        scale, shift = (np.float32(v) for v in activation[1])
        bias1 = (np.zeros(oc, np.float32) if bias1 is None else bias1 * scale) + shift
        activation = ("clip", (0.0, 1.0))
    rows = once(("rows", float(scale), weight.shape), lambda: np.ascontiguousarray(weight.reshape(oc, c).T) * scale)
    return rows, bias1, activation


def _small_product(a: np.ndarray, b: np.ndarray | Callable[[], np.ndarray], bias: np.ndarray | None,
                   out: np.ndarray, activation: A.Activation) -> KernelWork:
    """``cpu_tiles.small_product`` (a [B, M, K] @ b [1 or B, K, N] + bias [N] into out [B, M, N], all
    C-contiguous float32) on the calling thread, a clamp in its loop and any other activation
    after as one compiled pass: a product too small for a region's and BLAS's fixed cost. ``b`` may
    be the call that lays the weights: then they are laid and the kernel bound on the first call, so
    that a product no run calls (a step a run of LSTM steps computes instead) holds no copy of them."""
    lo, hi, after = _compiled_clamp(activation)
    bias = np.zeros(out.shape[2], np.float32) if bias is None else bias
    if callable(b):
        return _small_product_on_first_call(a, b, bias, out, lo, hi, after)
    args = (a, b, bias, out, lo, hi)
    compiled = cpu_jit.bind(cpu_tiles.small_product, *args)
    if after is None:
        return KernelWork((functools.partial(compiled, *args),), "small product", keep=(b, bias))

    def run() -> None:
        compiled(*args)
        after(out)
    return KernelWork((run,), "small product", keep=(b, bias))


def _small_product_on_first_call(a, lay_b, bias, out, lo, hi, after) -> KernelWork:
    """``_small_product`` whose weights ``lay_b()`` lays on its first call; the kernel is bound here,
    for weights of the laid type (C-contiguous float32 [1 or B, K, N]), so that no run compiles."""
    compiled = cpu_jit.bind(cpu_tiles.small_product, a, np.empty((1, 1, 1), np.float32), bias, out, lo, hi)
    laid: list = []  # the run state lends an execution to one run at a time

    def run() -> None:
        if not laid:
            laid.append(lay_b())
        compiled(a, laid[0], bias, out, lo, hi)
        if after is not None:
            after(out)
    return KernelWork((run,), "small product", keep=(bias,))


def _gemm_region(bases: tuple[np.ndarray, np.ndarray, np.ndarray], blocks: list, activation: A.Activation,
                 out: np.ndarray, alpha: float = 1.0, bias: tuple | None = None,
                 beta: float = 1.0, regions: int = 1) -> Callable[[], None] | None:
    """The work item running GEMM ``blocks`` (A, B and C views of the flat float32 ``bases``, bias
    row, bias column) as one native region (``cpu_parallel.gemm_blocks``) with the bias and a clamp
    or one of ``cpu_parallel.ACTIVATION_KINDS`` on each block while it is in cache, any other
    activation after on ``out`` (``_shared_activation`` on ``regions`` threads); None where a
    layout is not one BLAS takes. ``bias``: (flat buffer, offset, rows it repeats over, row
    stride, column stride). A single block runs as a loop on the calling thread (``cpu_parallel.alone``)."""
    calls = cpu_parallel.gemm_calls(*bases, blocks)
    if bias is None:
        bias = (np.zeros(1, np.float32), 0, 0, 0, 0)
    buffer, offset, period, row_stride, column_stride = bias
    if calls is None or column_stride not in (0, 1) or row_stride < 0 or buffer.dtype != np.float32:
        return None
    lo, hi, after = _compiled_clamp(activation)
    shared = _shared_activation(activation, out, regions) if after is not None else None
    kind = _activation_kind(activation)
    if kind >= 0 and (calls.shape[0] >= regions or shared is None):  # per block where that keeps every thread busy
        after, shared = None, None
    else:
        kind = -1
    epilogue = _applies_epilogue(bool(period), lo, hi) or kind >= 0
    scalars = np.array([alpha, 0.0], np.float32)
    args = (cpu_parallel.SGEMM, *bases, calls, cpu_parallel.fortran_arguments(calls), scalars, buffer, offset, period,
            row_stride, column_stride, np.float32(beta), lo, hi, kind, epilogue)
    one_block = calls.shape[0] == 1  # a region's entry costs more than the smallest products take
    compiled = cpu_jit.bind(cpu_parallel.alone(cpu_parallel.gemm_blocks) if one_block else cpu_parallel.gemm_blocks,
                            *args)
    if after is None:
        return functools.partial(compiled, *args)
    after = shared or functools.partial(after, out)

    def run() -> None:
        compiled(*args)
        after()
    return run


def _im2col_region(op: A.Conv2D, x, weight, out, bias, regions: int, parts: int,
                   arena: ScratchArena | None = None) -> KernelWork:
    """im2col as one native region per image (``cpu_parallel.im2col_blocks``): blocks of output
    rows (of output channels too where the image has fewer pixels than channels or fewer rows than
    threads), each copying its windows into its thread's scratch, one BLAS product and the bias and
    a clamp while in cache; padding is read as zeros in the copy, so no padded copy of the input.
    ``parts``: threads to share it; ``arena``: the run state's scratch (None: the op's own)."""
    n, oc = op.batch, op.out_channels
    (oh, ow), (kh, kw) = op.out_hw, op.kernel
    k = weight.shape[1]
    fit = max(1, engines.REGION_COLS_BYTES // (4 * k * ow))  # rows whose columns fit the scratch
    # channel spans where the image has fewer pixels than channels, or fewer output rows than
    # threads (a 1-D convolution's one row), so that every thread has a product
    channel_parts = parts if oh * ow < oc or oh < parts else 1
    rows = min(fit, oh) if channel_parts > 1 else min(fit, -(-oh // parts))
    blocks = np.array([(r0, r1, o0, o1) for r0, r1 in _spans(oh, -(-oh // rows))
                       for o0, o1 in _spans(oc, channel_parts, align=8)], np.int64)
    cols = _scratch_rows(arena, "im2col columns", regions, k * rows * ow)
    b1, lo, hi, act = _compiled_epilogue(op.activation, bias, oc)
    epilogue = _applies_epilogue(bias is not None, lo, hi)
    kind, act = _in_region(op.activation, act, len(blocks), out, regions)
    geometry = (kh, kw, *op.strides, *op.dilations, *op.pads[:2])
    out4 = out.reshape(n, oc, oh, ow)
    window_rows = engines.window_rows(op)
    fortran = cpu_parallel.im2col_arguments(blocks, k, ow, oh * ow, window_rows)
    scalars = np.array([1.0, 0.0], np.float32)
    images = [(cpu_parallel.SGEMM, x[b], weight, out4[b], b1, blocks, fortran, scalars, cols, geometry, window_rows, lo,
               hi, epilogue, kind) for b in range(n)]
    return KernelWork((_region_items(cpu_parallel.im2col_blocks, images, act, out, op.activation, regions,
                                     one_span=len(blocks) == 1),), "im2col", keep=(b1, cols, blocks, fortran, scalars))


def _direct_region(op: A.Conv2D, x, weight, out, bias, constant_bias: bool, regions: int, parts: int) -> KernelWork:
    """A convolution over few input channels as one native region per image on spans of output
    rows (``cpu_direct.direct_spans``): no im2col columns, the weights laid along the output
    channels once (with the bias: again on every run where it is not ``constant_bias``), the bias,
    a clamp or hard-swish applied in registers (other activations after, on ``out``). ``parts``:
    threads to share it."""
    n, oc = op.batch, op.out_channels
    (oh, ow), (kh, kw) = op.out_hw, op.kernel
    b1, lo, hi, act = _compiled_epilogue(op.activation, bias, oc)
    swish = int(op.activation is not None and op.activation[0] == "hard_swish")
    if swish:
        act = None
    table = cpu_direct.output_table(weight, b1)
    rows, width = cpu_direct.plane_shape(op)
    planes = _thread_scratch(regions, op.in_channels * rows * width + cpu_direct.ROW_WIDTH)
    bounds = _bounds(_spans(oh, parts))
    geometry = (kh, kw, *op.strides, *op.dilations)
    out4 = out.reshape(n, oc, oh, ow)
    images = [(x[b], table, out4[b], planes, bounds, rows, width, geometry, *op.pads[:2], lo, hi, swish)
              for b in range(n)]
    run = _region_items(cpu_direct.direct_spans, images, act, out, op.activation, regions, one_span=parts == 1)
    work = (run,) if constant_bias else (functools.partial(cpu_direct.fill_output_table, table, weight, b1), run)
    return KernelWork(work, "direct", keep=(table, planes, bounds))


def _packed_conv_region(op: A.Conv2D, x, panels, out, bias, constant_bias: bool, regions: int, parts: int,
                        arena: ScratchArena | None = None) -> KernelWork:
    """im2col on constant weights as one native region per image (``cpu_parallel.packed_conv``):
    the weights packed into ``cpu_tiles``' panels once (``panels``); per run, the input copied into a
    zero-bordered buffer (where there is padding), its windows packed into pixel panels, and the
    register tile's products with the bias and a clamp on the way out. Blocks are spans of pixel
    panels, each packing its own, where the image has as many pixels as channels; else spans of
    weight panels, all reading panels packed once. ``parts``: threads to share it; ``arena``: the
    run state's scratch (None: the op's own). A bias that is not ``constant_bias`` is copied into
    the tiles' zero-padded row on every run."""
    n, oc = op.batch, op.out_channels
    (oh, ow), (h, w) = op.out_hw, op.in_hw
    k, pixels, mr = panels.shape[1], oh * ow, cpu_tiles.MR
    top, left, bottom, right = _conv_pads(op)
    padded = (h + top + bottom, w + left + right)
    in_place = engines.packed_in_place(op)
    rows = cpu_tiles.IN_PLACE_ROWS if in_place else mr  # pixels per panel
    bases, taps = cpu_parallel.packed_conv_tables(op.kernel, op.strides, op.dilations, (oh, ow), padded[1], rows)
    offsets = (cpu_parallel.tapped_conv_offsets(op.in_channels, op.kernel, op.dilations, padded[0] * padded[1],
                                                padded[1]) if in_place else np.zeros(0, np.int64))
    count = -(-pixels // rows)  # pixel panels
    fit = max(1, engines.REGION_COLS_BYTES // (4 * k * rows))  # panels whose packing fits the scratch
    shared = pixels < oc and parts > 1
    if shared:
        pixel_spans, panel_spans = _spans(count, -(-count // fit)), _spans(len(panels), parts)
        pack_floats = count * rows * k
    else:
        pixel_spans, panel_spans = _spans(count, max(parts, -(-count // fit))), [(0, len(panels))]
        pack_floats = max(q1 - q0 for q0, q1 in pixel_spans) * rows * k
    packs = _scratch_rows(arena, "pixel panels", 1 if shared and not in_place else regions,
                          0 if in_place else pack_floats)
    blocks = np.array([(q0, q1, v0, v1) for q0, q1 in pixel_spans for v0, v1 in panel_spans], np.int64)
    pack_bounds = _bounds(_even_spans(count, regions))
    xp = _zero_bordered(arena, "packed plane", op, padded, op.in_channels * padded[0] * padded[1]
                        if top + left + bottom + right else 0)
    accs = _scratch_rows(arena, "tile accumulators", regions, mr * cpu_tiles.NR)
    padded_bias, refresh = _panel_bias(bias, oc, len(panels), panels.shape[2], constant_bias)
    lo, hi, act = _compiled_clamp(op.activation)
    kind, act = _in_region(op.activation, act, len(blocks), out, regions)
    inner = (top, left, *padded)
    out4 = out.reshape(n, oc, oh, ow)
    pixels_outer = panels.nbytes <= 4 * pack_floats  # the smaller operand in the inner loop, in cache
    images = [(x[b], xp, inner, bases, taps, offsets, rows, panels, out4[b], padded_bias, pack_bounds, blocks, packs,
               accs, shared, pixels_outer, lo, hi, kind) for b in range(n)]
    # one block on one thread (parts 1): no region to enter, not even for the copy into xp
    one_span = len(blocks) == 1 and parts == 1
    run = _region_items(cpu_parallel.packed_conv, images, act, out, op.activation, regions, one_span)
    return KernelWork((*refresh, run), "im2col",
                      keep=(panels, padded_bias, xp, bases, taps, offsets, pack_bounds, blocks, packs, accs))


def _tapped_conv_region(op: A.Conv2D, x: np.ndarray, weight: np.ndarray, out: np.ndarray, bias: np.ndarray | None,
                        constant_bias: bool, regions: int, parts: int, once: Callable) -> KernelWork:
    """A convolution on few input channels and constant weights, at any stride (the engine gives it
    1 along columns, or 2: ``Engine.tapped_fits``), as one native region per image (``cpu_parallel.tapped_conv``): the weights packed once into panels of
    MR output channels, per run the input copied into a zero-bordered buffer (where there is
    padding, or a stride along columns: each row stored as its column phases) and read there by
    the tiles, no im2col copy; the bias and a clamp in the tile's registers. ``x`` [N, C, H, W],
    ``weight`` [O, C*KH*KW], ``out`` [N, O, OH*OW]."""
    n, c = op.batch, op.in_channels
    oc = op.out_channels
    (oh, ow), (h, w) = op.out_hw, op.in_hw
    mr, stride_w = cpu_tiles.MR, op.strides[1]
    top, left, bottom, right = _conv_pads(op)
    rows, cols = h + top + bottom, cpu_parallel.tapped_row_width(w + left + right, stride_w)
    panels = once(("tapped panels", mr, weight.shape), lambda: cpu_tiles.pack_panels(weight, mr))
    padded_bias, refresh = _panel_bias(bias, oc, len(panels), mr, constant_bias)
    copied = top + left + bottom + right > 0 or stride_w > 1
    xp = np.zeros(c * rows * cols if copied else 0, np.float32)
    offsets = cpu_parallel.tapped_conv_offsets(c, op.kernel, op.dilations, rows * cols, cols, stride_w)
    row_spans = _spans(oh, min(parts, oh))
    panel_spans = _spans(len(panels), parts) if len(row_spans) < parts else [(0, len(panels))]
    blocks = np.array([(r0, r1, v0 * mr, v1 * mr) for r0, r1 in row_spans for v0, v1 in panel_spans], np.int64)
    lo, hi, after = _compiled_clamp(op.activation)
    kind, after = _in_region(op.activation, after, len(blocks), out, regions)
    dummies = _thread_scratch(regions, cpu_tiles.NR)
    inner = (top, left, rows, cols, stride_w)
    out4 = out.reshape(n, oc, oh, ow)
    images = [(x[b], xp, inner, offsets, panels, out4[b], padded_bias, blocks, dummies, op.strides[0], lo, hi, kind)
              for b in range(n)]
    run = _region_items(cpu_parallel.tapped_conv, images, after, out, op.activation, regions,
                        one_span=len(blocks) == 1 and parts == 1)
    return KernelWork((*refresh, run), "tapped", keep=(panels, padded_bias, xp, offsets, blocks, dummies))


def _pointwise_blocks(channels: int, width: int, pixels: int, channels_in_rows: bool, parts: int) -> np.ndarray:
    """``cpu_parallel.pointwise_tiles``' blocks (first channel, channel stop, first pixel, pixel stop)
    for ``parts`` threads: spans of whole channel panels (``width`` channels each), or spans of
    pixels where they share out as evenly or more (pixels in the vector registers only, each span NR
    pixels or more, cut at multiples of NR): then each thread reads only its pixels of the input,
    half of which the op before may have left in the other core's cache."""
    panels = -(-channels // width)
    tiles = pixels // cpu_tiles.NR if channels_in_rows else 0
    by_channels = [(v0 * width, v1 * width, 0, pixels) for v0, v1 in _spans(panels, min(parts, panels))]

    def slowest(shares: list[int]) -> float:  # the largest share against an even one (parts: one thread)
        return max(shares) * parts / sum(shares) if len(shares) == parts else float(parts)
    if tiles >= parts > 1:
        cuts = [q0 * cpu_tiles.NR for q0, _ in _spans(tiles, parts)] + [pixels]
        if slowest([p1 - p0 for p0, p1 in zip(cuts, cuts[1:])]) <= slowest([v1 - v0 for v0, v1, _, _ in by_channels]):
            return np.array([(0, panels * width, p0, p1) for p0, p1 in zip(cuts, cuts[1:])], np.int64)
    return np.array(by_channels, np.int64)


def _pointwise_region(op: A.Conv2D, x: np.ndarray, weight: np.ndarray, out: np.ndarray, bias: np.ndarray | None,
                      constant_bias: bool, regions: int, parts: int, once: Callable) -> KernelWork:
    """A 1x1 convolution on constant weights as one native region per image
    (``cpu_parallel.pointwise_tiles``): the weights packed once into panels, the input read where it
    lies, the bias and a clamp (and hard-swish) in the tile's registers, the other activations per
    block. The pixels are the vector operand (the weights in panels of ``cpu_tiles.pointwise_rows``
    channels) or the output channels are (panels of NR; of WIDE for one pixel), as
    ``Engine.pointwise_pixels_in_rows`` says.
    BLAS packs the weights, the larger operand on such images, on every call. ``x`` [N, C, P],
    ``weight`` [O, C], ``out`` [N, O, P]."""
    n, oc, pixels = out.shape
    channels_in_rows = engines.Engine.pointwise_pixels_in_rows(pixels, weight.nbytes)
    width = cpu_tiles.pointwise_rows(oc) if channels_in_rows else cpu_tiles.NR if pixels > 1 else cpu_tiles.WIDE
    panels = once(("pointwise panels", width, weight.shape), lambda: cpu_tiles.pack_panels(weight, width))
    padded, refresh = _panel_bias(bias, oc, len(panels), width, constant_bias)
    lo, hi, after = _compiled_clamp(op.activation)
    blocks = _pointwise_blocks(oc, width, pixels, channels_in_rows, parts)
    kind, after = _in_region(op.activation, after, len(blocks), out, regions)
    dummies = _thread_scratch(regions, cpu_tiles.NR)
    images = [(x[b], panels, out[b], padded, blocks, dummies, channels_in_rows, lo, hi, kind) for b in range(n)]
    run = _region_items(cpu_parallel.pointwise_tiles, images, after, out, op.activation, regions,
                        one_span=len(blocks) == 1)
    return KernelWork((*refresh, run), "gemm1x1", keep=(panels, padded, blocks, dummies))


def _applies_epilogue(biased: bool, lo: np.float32, hi: np.float32) -> bool:
    """Whether a region's loop has a bias to add or a clamp to apply (else it skips the pass)."""
    return biased or lo > -np.inf or hi < np.inf


def _winograd_region(op: A.Conv2D, x, weight, out, bias, regions: int, once: Callable,
                     arena: ScratchArena | None = None) -> KernelWork:
    """Winograd (a tile and alpha per axis: 1D tiles for a 1x7 or 7x1 kernel) as one native
    region per image (``cpu_parallel.winograd_packed``) on the register tile: the weights
    transformed (G_h W G_w^T) and packed into ``cpu_tiles``' panels once, here; per
    run, the input copied into a zero-bordered plane, the tiles transformed in panels of MR, the
    alpha^2 products per (tile panel, channel panel) pair and the output transform with the bias
    and a clamp while the pair's products are in cache. Faster than the BLAS transforms and
    products it replaces (measured: bench/RESULTS.md). ``arena``: the run state's scratch (None:
    the op's own)."""
    c, oc = op.in_channels, op.out_channels
    (oh, ow), (kh, kw) = op.out_hw, op.kernel
    rows_m, cols_m = conv_matrices(op.winograd_tile, op.kernel)
    nh, nw = rows_m.n, cols_m.n
    ah, aw, mr, nr = rows_m.alpha, cols_m.alpha, cpu_tiles.MR, cpu_tiles.NR
    th, tw = -(-oh // nh), -(-ow // nw)
    tiles = th * tw
    panels = -(-tiles // mr)
    # [oc/NR, ah*aw, c, NR]: a channel panel's weights at every position in one run of memory
    u = once(("winograd panels", op.winograd_tile, weight.shape),
             lambda: np.ascontiguousarray(np.stack([cpu_tiles.pack_panels(m, nr)
                                                    for m in transformed_weights(rows_m, weight, cols_m)], axis=1)))
    square = cpu_tiles.SQUARE

    def zero_padded(matrix: np.ndarray, width: int) -> np.ndarray:  # the kernels read rows ``width`` wide
        wide = np.zeros((matrix.shape[0], width), np.float32)
        wide[:, :matrix.shape[1]] = matrix
        return wide
    b_width = cpu_tiles.ROW if min(ah, aw) == 1 else square  # a 1D tile's transform: cpu_tiles.row_product
    b_rows, b_cols = zero_padded(rows_m.B, b_width), zero_padded(cols_m.B, b_width)
    a_rows, a_cols = zero_padded(rows_m.A, mr), zero_padded(cols_m.A, mr)
    rows, cols = th * nh + kh - 1, tw * nw + kw - 1  # every tile's inputs inside the zero-bordered plane
    # + square: the input transform reads rows that wide
    xp = _zero_bordered(arena, "winograd plane", op, (rows, cols), c * rows * cols + square)
    # each tile's origin in the plane, in panels of MR: the windows of a 1x1 kernel at stride (nh, nw)
    bases, _ = cpu_parallel.packed_conv_tables((1, 1), (nh, nw), (1, 1), (th, tw), cols)
    v = np.empty(ah * aw * panels * c * mr, np.float32) if arena is None else \
        arena.scratch("winograd tiles", ah * aw * panels * c * mr)
    scratch = _scratch_rows(arena, "winograd products", regions, cpu_parallel.winograd_scratch_floats(ah, aw, nh))
    b1, lo, hi, act = _compiled_epilogue(op.activation, bias, oc)
    kind, act = _in_region(op.activation, act, panels * u.shape[0], out, regions)
    geometry = (nh, nw, tiles, tw, panels, u.nbytes > v.nbytes)
    inner = (*op.pads[:2], rows, cols)
    out4 = out.reshape(op.batch, oc, oh, ow)
    images = [(x[b], xp, inner, bases, b_rows, b_cols, a_rows, a_cols, u, v, scratch, out4[b], b1, geometry, lo, hi,
               kind) for b in range(op.batch)]
    return KernelWork((_region_items(cpu_parallel.winograd_packed, images, act, out, op.activation, regions),), "winograd",
                  keep=(u, b_rows, b_cols, a_rows, a_cols, xp, bases, v, scratch, b1))


def _depthwise_compiled(op: A.Conv2D, x, weight, out, bias, pool: Workers, parts: int, regions: int = 0,
                        constant: bool = False) -> KernelWork:
    """The depthwise convolution as ``cpu_jit``'s one-pass loops on channel spans, the bias and a
    clamp activation applied in the loop (others after, on the span), each thread on its own
    scratch plane: one pass where ``_depthwise`` makes several (measured: bench/RESULTS.md).
    With ``regions``, each image's spans are one native region. ``constant``: the weights and
    bias never change, so a kernel's layout of them (``cpu_jit.lane_table``) is made once."""
    n, c = op.batch, op.in_channels
    (oh, ow), (kh, kw) = op.out_hw, op.kernel
    w3 = weight.reshape(c, kh, kw)  # a view: W may be a run-time tensor
    b1, lo, hi, act = _compiled_epilogue(op.activation, bias, c)
    # depthwise_masked and depthwise_bands read each channel's taps as one row and the input's rows in place
    kernel, scratch_shapes, geometry = cpu_jit.depthwise_kernel(
        op, masked=w3.flags.c_contiguous and b1.flags.c_contiguous and x.strides[-1] == 4)
    refresh = None
    if kernel is cpu_jit.depthwise_channels_last:
        weight_now, bias_now = w3, b1  # the op's own tensors, which a run-time weight is read from
        table, w3, b1 = cpu_jit.lane_table(weight_now, bias_now)
        if not constant:
            refresh = functools.partial(cpu_jit.fill_lane_table, table, weight_now, bias_now)
    out4 = out.reshape(n, c, oh, ow)
    swish = 0
    if kernel in cpu_jit.SWISH_KERNELS:
        if op.activation is not None and op.activation[0] == "hard_swish":
            swish, act = 1, None  # applied in the kernel's registers before the store
    scratch = [np.zeros((regions or pool.threads, *shape), np.float32) for shape in scratch_shapes]  # a slice per thread
    tail = (geometry, *op.pads[:2], lo, hi)
    if regions:
        bounds = _bounds(_spans(c, parts))
        regions_of = [cpu_parallel.depthwise_region(kernel, (x[b], w3, b1, out4[b], bounds, *scratch, *tail, swish))
                      for b in range(n)]
        work = _region_items(regions_of[0][0], [args for _, args in regions_of], act, out, op.activation, regions,
                             one_span=parts == 1)
    else:
        spans = [(x[b, c0:c1], w3[c0:c1], b1[c0:c1], out4[b, c0:c1]) for b in range(n) for c0, c1 in _spans(c, parts)]
        if kernel in cpu_jit.SWISH_KERNELS:
            tail = (*tail, swish)
        compiled = cpu_jit.bind(kernel, *spans[0], scratch[0][0], scratch[1][0], *tail)

        def span(index: int, slot: int) -> None:
            compiled(*spans[index], scratch[0][slot], scratch[1][slot], *tail)
            if act:
                act(spans[index][3])
        work = _on_pool(pool, len(spans), span)
    return KernelWork(((refresh, work) if refresh else (work,)), "depthwise", keep=(b1, w3, scratch))


def _masked_conv_region(op: A.Conv2D, x, weight, out, bias, regions: int, parts: int) -> KernelWork:
    """A convolution over few input channels as one native region per image on spans of output
    rows (``cpu_parallel.masked_conv_rows``): each input row read in place once for 16 output
    channels' sums in vector registers, the bias, a clamp and hard-swish before the store; no
    im2col copy. ``weight`` [OC, C, KH, KW] contiguous (a view: it may be a run-time tensor)."""
    n, oc = op.batch, op.out_channels
    (oh, ow) = op.out_hw
    b1, lo, hi, act = _compiled_epilogue(op.activation, bias, oc)
    swish = 0
    if op.activation is not None and op.activation[0] == "hard_swish":
        swish, act = 1, None  # applied in the kernel's registers before the store
    bounds = _bounds(_spans(oh, parts))
    geometry = (*op.strides, *op.dilations)
    out4 = out.reshape(n, oc, oh, ow)
    images = [(x[b], weight, b1, out4[b], bounds, geometry, *op.pads[:2], lo, hi, swish) for b in range(n)]
    return KernelWork((_region_items(cpu_parallel.masked_conv_rows, images, act, out, op.activation, regions,
                                     one_span=parts == 1),), "direct", keep=(b1, bounds))


def _thread_scratch(threads: int, floats: int, fill: float = 0.0) -> np.ndarray:
    """[threads, ``floats`` rounded up to whole ``engines.THREAD_ROW_FLOATS``] float32, each thread's row
    starting on a multiple of it, so that no two threads write one line or its prefetched
    neighbours: rows side by side shared their edge lines, and the lines went back
    and forth between the cores (measured: bench/RESULTS.md)."""
    step = engines.THREAD_ROW_FLOATS
    width = -(-floats // step) * step
    raw = np.full(threads * width + step, fill, np.float32)
    start = (-raw.ctypes.data % (4 * step)) // 4
    return raw[start:start + threads * width].reshape(threads, width)


def _scratch_rows(arena: ScratchArena | None, role: str, threads: int, floats: int) -> np.ndarray:
    """``_thread_scratch(threads, floats)``, from the run state's ``arena`` where there is one
    (shared with the other ops asking for ``role``: written before it is read)."""
    return _thread_scratch(threads, floats) if arena is None else arena.thread_rows(role, threads, floats)


def _zero_bordered(arena: ScratchArena | None, role: str, op: A.Conv2D, padded: tuple[int, int],
                   floats: int) -> np.ndarray:
    """A zeroed buffer of ``floats`` whose inside the op's region overwrites with its input each run
    (at the op's pads, in planes of ``padded`` rows and columns): shared through ``arena`` with
    the ops that write the same inside, so that the border stays zero."""
    if arena is None or not floats:
        return np.zeros(floats, np.float32)
    return arena.plane((role, op.in_channels, *op.in_hw, *op.pads[:2], *padded), floats)


def _bounds(spans: list[tuple[int, int]]) -> np.ndarray:
    """Consecutive [start, stop) spans (``_spans``, ``_even_spans``) as the bounds array a region's
    ``prange`` walks: [start0, start1, ..., last stop]."""
    return np.array([start for start, _ in spans] + [spans[-1][1]], np.int64)


def _region_items(region: Callable, calls: list[tuple], after: Callable[[np.ndarray], None] | None,
                  out: np.ndarray, activation: A.Activation = None, regions: int = 1,
                  one_span: bool = False) -> Callable[[], None]:
    """The work item calling ``region`` (compiled once, for the first call's types) with each of
    ``calls``' arguments, then ``after`` on ``out`` (an activation the region does not apply): as
    a region of its own on ``regions`` threads where ``activation`` is one of
    ``cpu_parallel.ACTIVATION_KINDS`` and ``out`` large enough to share, else on this thread.
    ``one_span``: each call is one span, run as a loop on this thread (``cpu_parallel.alone``)."""
    compiled = cpu_jit.bind(cpu_parallel.alone(region) if one_span else region, *calls[0])
    if after:
        after = _shared_activation(activation, out, regions) or functools.partial(after, out)
    elif len(calls) == 1:  # called from C: no Python frame of its own on every run
        return functools.partial(compiled, *calls[0])

    def run() -> None:
        for args in calls:
            compiled(*args)
        if after:
            after()
    return run


def _activation_kind(activation: A.Activation) -> int:
    """The index of ``activation`` in ``cpu_parallel.ACTIVATION_KINDS`` (a compiled region applies
    it, per block or in spans), else -1."""
    if activation is None or activation[0] not in cpu_parallel.ACTIVATION_KINDS:
        return -1
    return cpu_parallel.ACTIVATION_KINDS.index(activation[0])


def _in_region(activation: A.Activation, after: Callable | None, blocks: int, out: np.ndarray,
               regions: int) -> tuple[int, Callable | None]:
    """(the ``cpu_parallel.ACTIVATION_KINDS`` index a convolution's region applies to each of its
    ``blocks`` while it is in cache, or -1; the activation left to run after the region): per
    block where the blocks keep every region thread busy or ``out`` is too small to share, as
    ``_gemm_region`` decides; else ``after`` as it was (the shared pass on a one-block region's
    large output)."""
    kind = _activation_kind(activation)
    if kind >= 0 and (blocks >= regions or _shared_activation(activation, out, regions) is None):
        return kind, None
    return -1, after


def _shared_activation(activation: A.Activation, out: np.ndarray, regions: int) -> Callable[[], None] | None:
    """``activation`` in place on ``out`` shared by ``regions`` threads (``cpu_parallel.activation_spans``),
    or None where it has no kind there, ``out`` is not flat float32 or too small to share."""
    kind = _activation_kind(activation)
    if (kind < 0 or out.dtype != np.float32 or not out.flags.c_contiguous or regions < 2
            or out.size < engines.REGION_MIN_ELEMENTS):
        return None
    flat = out.reshape(-1)
    bounds = _bounds(_spans(flat.size, regions, align=engines.CACHE_LINE_FLOATS))
    compiled = cpu_jit.bind(cpu_parallel.activation_spans, kind, flat, bounds)
    return functools.partial(compiled, kind, flat, bounds)


def _pool_compiled(op: A.Pool2D, x, out, inv_count, pool: Workers, parts: int, regions: int = 0) -> KernelWork:
    """3x3 pooling as compiled loops on channel spans, reading the input in place (no padded
    copy): ``cpu_jit.pool3x3_same`` on flat planes where the output is the input's size at
    stride 1 (Inception's average pools), else ``cpu_jit.pool3x3`` row by row, each thread on
    its own scratch: faster than nine taps per output from rows split by phase (measured:
    bench/RESULTS.md). ``parts``: channel spans; with ``regions``, each image's are one native region."""
    n, c = op.batch, op.channels
    (h, w), (oh, ow), (sh, sw), (top, left) = op.in_hw, op.out_hw, op.strides, op.pads[:2]
    is_max = op.op == "max"
    border, scale = (-np.inf, np.ones(op.out_hw, np.float32)) if is_max else (0.0, inv_count)
    threads = regions or pool.threads
    if op.strides == (1, 1) and op.pads == (1, 1, 1, 1) and min(h, w) >= 2:
        x, out = x.reshape(n, c, h * w), out.reshape(n, c, h * w)
        kernel, region, scratch = cpu_jit.pool3x3_same, cpu_parallel.pool_same_spans, _thread_scratch(threads, h * w)
        tail: tuple = (is_max,)
    else:
        kernel, region = cpu_jit.pool3x3, cpu_parallel.pool_spans
        scratch = _thread_scratch(threads, (ow - 1) * sw + 3, border)  # a padded row per thread
        tail = (is_max, sh, sw, top, left)
    if regions:
        bounds = _bounds(_spans(c, parts))
        images = [(x[b], out[b], scale, bounds, scratch, *tail) for b in range(n)]
        return KernelWork((_region_items(region, images, None, out, one_span=parts == 1),), keep=(scale, scratch))
    spans = [(x[b, c0:c1], out[b, c0:c1], scale) for b in range(n) for c0, c1 in _spans(c, parts)]
    compiled = cpu_jit.bind(kernel, *spans[0], scratch[0], *tail)
    return KernelWork((_on_pool(pool, len(spans), lambda index, slot: compiled(*spans[index], scratch[slot], *tail)),),
                  keep=(scale, scratch))
