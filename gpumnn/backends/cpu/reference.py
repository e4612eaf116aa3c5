"""The cpu backend's NumPy reference kernels: NumPy and BLAS calls with ``out=`` targets on the
backend's Python threads (``Workers``), and the pieces the makers and the compiled kernels share
with them.

The views of a pool's tensors (``typed``, ``view``, ``flat``, ``strided``), the spans a kernel
is cut into, the zero-bordered input copy and the window view; the convolution kernels on BLAS
(``_winograd``, ``_depthwise``, ``_gemm_chunk`` and ``_conv_epilogue`` for the im2col ones the
maker builds), separable pooling windows. With ``jit``, their epilogues run ``cpu_jit``'s compiled
passes (``_compiled_clamp``, ``_compiled_epilogue``). Which kernel runs an op is the backend's
``engines.Engine``'s decision; ``compiled`` holds the compiled-loop and native-region kernels.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ... import atomic as A
from ..base import KernelWork, TensorHandle
from . import activations as cpu_activations, engines, jit as cpu_jit
from .elementwise import unary_function
from .workers import Workers
from ...numerics.winograd import conv_matrices, transformed_weights


def typed(handle: TensorHandle) -> np.ndarray:
    """The handle's whole buffer seen as its dtype (a pool holds float32 and int32 tensors)."""
    buf = handle.buffer
    return buf if buf.dtype == handle.dtype else buf.view(handle.dtype)  # dtypes compared: ``dtype.name`` is slow per call


def view(handle: TensorHandle) -> np.ndarray:
    """The NumPy array a handle denotes (a view into its pool, never a copy)."""
    return typed(handle)[handle.offset:handle.offset + handle.size].reshape(handle.shape)


def flat(handle: TensorHandle) -> np.ndarray:
    return typed(handle)[handle.offset:handle.offset + handle.size]


def strided(handle: TensorHandle, offset: int, shape: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    """An element-strided view starting ``offset`` elements into a handle (strides may be <= 0)."""
    base = typed(handle)
    start = base[handle.offset + offset:]
    if start.size == 0:  # a view at the very end (only possible for empty shapes)
        start = base[-1:]
    item = base.itemsize
    return as_strided(start, shape=tuple(shape), strides=tuple(s * item for s in strides), writeable=True)


def _spans(total: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """[start, stop) spans cutting ``range(total)`` into at most ``parts`` pieces, each a
    multiple of ``align`` long (but the last)."""
    size = -(-total // max(1, parts))
    size = -(-size // align) * align
    return [(start, min(start + size, total)) for start in range(0, total, size)]


def _on_pool(pool: Workers, count: int, chunk: Callable[[int, int], None]) -> Callable[[], None]:
    """The work item running ``chunk(k, slot)`` for k < ``count`` on ``pool`` (inline for one)."""
    if count == 1:
        return lambda: chunk(0, 0)
    return lambda: pool.run(count, chunk)


def _epilogue(activation: A.Activation) -> Callable[[np.ndarray], None] | None:
    if activation is None:
        return None
    fn = unary_function(activation[0], activation[1], np.dtype(np.float32))
    return lambda arr: fn(arr, arr)


class _PaddedInput:
    """A zero-bordered scratch copy of an NCHW input, so windows never index out of bounds.

    The border is written once at creation; each run copies only the interior. ``extent``
    enlarges the buffer for ceil-mode windows that reach past the padding.
    """

    def __init__(self, x: np.ndarray, pads: tuple[int, int, int, int], border: float, extent: tuple[int, int]):
        n, c, h, w = x.shape
        top, left, bottom, right = pads
        hp = max(h + top + bottom, extent[0])
        wp = max(w + left + right, extent[1])
        self.needed = any(pads) or hp > h or wp > w
        self.src = x
        if self.needed:
            self.buf = np.full((n, c, hp, wp), border, dtype=x.dtype)
            self.interior = self.buf[:, :, top:top + h, left:left + w]
        else:
            self.buf = x

    def refresh(self) -> None:
        if self.needed:
            np.copyto(self.interior, self.src)


def _window_view(xp: np.ndarray, kernel, strides, dilations, out_hw) -> np.ndarray:
    """[N, C, KH, KW, OH, OW] strided view of sliding windows over a padded NCHW array."""
    n, c, _, _ = xp.shape
    sn, sc, sh, sw = xp.strides
    return as_strided(xp, shape=(n, c, kernel[0], kernel[1], out_hw[0], out_hw[1]),
                      strides=(sn, sc, sh * dilations[0], sw * dilations[1], sh * strides[0], sw * strides[1]),
                      writeable=False)


def _conv_pads(op) -> tuple[int, int, int, int]:
    (h, w), (oh, ow) = op.in_hw, op.out_hw
    need_h = (oh - 1) * op.strides[0] + (op.kernel[0] - 1) * op.dilations[0] + 1
    need_w = (ow - 1) * op.strides[1] + (op.kernel[1] - 1) * op.dilations[1] + 1
    top, left = op.pads
    return top, left, max(0, need_h - h - top), max(0, need_w - w - left)


def _compiled_clamp(activation: A.Activation) -> tuple[np.float32, np.float32, Callable | None]:
    """The clamp (lo, hi) compiled loops apply in a register (+-inf: none), and the activation to
    run after them where it is not a clamp (else None)."""
    clamp = cpu_jit.clamp_of(activation)
    lo, hi = (np.float32(v) for v in (clamp or (-np.inf, np.inf)))
    if clamp:
        return lo, hi, None
    return lo, hi, cpu_activations.activation_in_place(activation[0], _epilogue(activation), activation[1])


def _compiled_epilogue(activation: A.Activation, bias: np.ndarray | None,
                       channels: int) -> tuple[np.ndarray, np.float32, np.float32, Callable | None]:
    """What ``cpu_jit``'s loops take for a bias and an activation: the bias per channel (zeros
    where there is none) and ``_compiled_clamp``'s three."""
    bias1 = bias.reshape(channels) if bias is not None else np.zeros(channels, np.float32)
    return bias1, *_compiled_clamp(activation)


def _conv_epilogue(op: A.Conv2D, out: np.ndarray, bias: np.ndarray | None,
                   jit: bool) -> Callable[[int, int, int, int, int], None]:
    """``finish(b, o0, o1, p0, p1)``: the bias and activation of image b's output channels
    [o0, o1) and pixels [p0, p1) of ``out`` [N, O, pixels], on a block while it is in cache --
    with ``jit``, a clamp activation and the bias in one compiled pass (``cpu_jit.bias_clamp``)."""
    act = _epilogue(op.activation)
    clamp = cpu_jit.clamp_of(op.activation) if jit else None
    if clamp is None:
        def finish(b: int, o0: int, o1: int, p0: int, p1: int) -> None:
            dst = out[b, o0:o1, p0:p1]
            if bias is not None:
                np.add(dst, bias[o0:o1], out=dst)
            if act:
                act(dst)
        return finish
    if bias is None and op.activation is None:
        return lambda *block: None
    bias1, lo, hi, _ = _compiled_epilogue(op.activation, bias, out.shape[1])
    compiled = cpu_jit.bind(cpu_jit.bias_clamp, out[0], bias1, 0, 0, 0, 0, lo, hi)
    return lambda b, o0, o1, p0, p1: compiled(out[b], bias1, o0, o1, p0, p1, lo, hi)


def _gemm_chunk(tasks: list, finish: Callable[..., None]) -> Callable[[int, int], None]:
    """``chunk(k, slot)`` of (weights, columns, output block, its ``finish`` arguments) GEMM tasks
    and their epilogue."""
    def chunk(index: int, slot: int) -> None:
        wb, xb, ob, block = tasks[index]
        np.matmul(wb, xb, out=ob)
        finish(*block)
    return chunk


def _winograd(op: A.Conv2D, x, weight, out, bias, pads, pool: Workers, parts: int, jit: bool, once: Callable) -> KernelWork:
    """Winograd F(n x n, k x k) (``op.winograd_tile``; the scheme step chose it; a rectangular
    kernel's tile and alpha per axis, ``winograd.conv_matrices``) in chunks of tile rows, each in
    the thread's scratch while in cache: its [alpha, alpha, C, tiles] input tiles copied out of
    the padded input, ``B^T d B`` as two GEMMs, one batched product per tile position against the weights transformed at creation (``G W G^T``), ``A^T m A`` as two GEMMs,
    then the tiles put in place with bias and activation. Faster than the im2col kernel at
    ResNet-18's sizes (measured: bench/RESULTS.md); where it does not pay, see
    ``CpuBackend.winograd_min_tiles``."""
    c, oc = op.in_channels, op.out_channels
    (oh, ow), (kh, kw) = op.out_hw, op.kernel
    rows_m, cols_m = conv_matrices(op.winograd_tile, op.kernel)
    nh, nw = rows_m.n, cols_m.n
    ah, aw = rows_m.alpha, cols_m.alpha
    th, tw = -(-oh // nh), -(-ow // nw)
    padded = _PaddedInput(x, pads, 0.0, (th * nh + kh - 1, tw * nw + kw - 1))
    _, sc, sh, sw = padded.buf.strides
    # constant weights (schemes.winograd_fits), transformed once
    u = once(("winograd", op.winograd_tile, weight.shape),
             lambda: transformed_weights(rows_m, weight, cols_m).astype(np.float32))
    bt_rows, bt_cols = rows_m.B.T.astype(np.float32), cols_m.B.T.astype(np.float32)
    at_rows, at_cols = rows_m.A.T.astype(np.float32), cols_m.A.T.astype(np.float32)
    bias3 = bias.reshape(oc, 1, 1) if bias is not None else None
    act = _epilogue(op.activation)
    out4 = out.reshape(op.batch, oc, oh, ow)
    # tile-row spans of even length: ``parts`` of them, more where one would not fit CHUNK_BYTES of scratch
    spans = _even_spans(th, max(parts, -(-th * tw * ah * aw * 4 * max(c, oc) // engines.CHUNK_BYTES)))
    size = ah * aw * max(c, oc) * max(t1 - t0 for t0, t1 in spans) * tw
    scratch = [(np.empty(size, np.float32), np.empty(size, np.float32)) for _ in range(pool.threads)]
    if jit:  # the output tiles put in place with the bias and a clamp in one compiled pass
        bias1, lo, hi, act = _compiled_epilogue(op.activation, bias, oc)
        t = max(t1 - t0 for t0, t1 in spans)
        place = cpu_jit.bind(cpu_jit.winograd_place, scratch[0][1][:nh * nw * oc * t * tw].reshape(nh, nw, oc, t * tw),
                             bias1, out4[0], 0, t * tw, tw, lo, hi, True)
    tasks = [(b, t0, t1, _tile_places(out4[b], (nh, nw), t0, t1)) for b in range(op.batch) for t0, t1 in spans]

    def chunk(index: int, slot: int) -> None:
        b, t0, t1, places = tasks[index]
        t = (t1 - t0) * tw
        p, q = scratch[slot]  # two buffers, each stage reading one and writing the other
        d = p[:ah * aw * c * t].reshape(ah, aw, c, t1 - t0, tw)
        np.copyto(d, as_strided(padded.buf[b, :, t0 * nh:], shape=d.shape, strides=(sh, sw, sc, sh * nh, sw * nw)))
        v1 = q[:ah * aw * c * t].reshape(ah, aw, c * t)
        np.matmul(bt_rows, d.reshape(ah, aw * c * t), out=v1.reshape(ah, aw * c * t))  # B^T on the tiles' rows
        v = p[:ah * aw * c * t].reshape(ah, aw, c * t)
        np.matmul(bt_cols, v1, out=v)  # ... and on their columns
        m = q[:ah * aw * oc * t].reshape(ah * aw, oc, t)
        np.matmul(u, v.reshape(ah * aw, c, t), out=m)  # one product per tile position
        y1 = p[:nh * aw * oc * t].reshape(nh, aw, oc * t)
        np.matmul(at_rows, m.reshape(ah, aw * oc * t), out=y1.reshape(nh, aw * oc * t))
        y = q[:nh * nw * oc * t].reshape(nh, nw, oc, t1 - t0, tw)
        np.matmul(at_cols, y1, out=y.reshape(nh, nw, oc * t))
        dst = out4[b, :, t0 * nh:min(t1 * nh, oh)]
        if jit:
            place(y.reshape(nh, nw, oc, t), bias1, out4[b], t0 * tw, t1 * tw, tw, lo, hi, True)
        else:
            for target, rows, cols, i, j in places:
                np.copyto(target, y[:i, :j, :, rows, cols])
            if bias3 is not None:
                np.add(dst, bias3, out=dst)
        if act:
            act(dst)
    run_chunks = _on_pool(pool, len(tasks), chunk)

    def run():
        padded.refresh()
        run_chunks()
    return KernelWork((run,), "winograd")


def _even_spans(total: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) spans cutting ``range(total)`` into ``min(parts, total)`` pieces whose
    lengths differ by at most one (10 in 4: 3, 3, 2, 2, where ``_spans`` gives 3, 3, 3, 1)."""
    parts = max(1, min(parts, total))
    return [(total * i // parts, total * (i + 1) // parts) for i in range(parts)]


def _tile_places(out3: np.ndarray, tile: tuple[int, int], t0: int, t1: int) -> list[tuple[np.ndarray, slice, slice, int, int]]:
    """Where Winograd's output tiles (``tile`` = (nh, nw)) of tile rows [t0, t1) land in ``out3``
    [C, OH, OW]: at most four rectangles (whole tiles, the partial last tile row and column, their
    corner), each a strided view [i, j, C, rows, cols] of the output (tile position (i, j) of tile
    (r, q) is output pixel (r nh + i, q nw + j)) with the tile rows and columns it takes from the
    [nh, nw, C, t1 - t0, tiles per row] products and the positions i, j it keeps. Four copies
    instead of one per tile position (36 for F(6, 3)), each NumPy call costing a few
    microseconds and a hand-over of the GIL between threads."""
    _, oh, ow = out3.shape
    so, sr, sq = out3.strides
    nh, nw = tile
    whole_r, whole_q = oh // nh, ow // nw
    row_parts = [(t0, min(t1, whole_r), nh), (whole_r, min(t1, whole_r + 1), oh % nh)]
    col_parts = [(0, whole_q, nw), (whole_q, whole_q + 1, ow % nw)]
    places = []
    for r0, r1, i in row_parts:
        r0 = max(r0, t0)
        for q0, q1, j in col_parts:
            if r1 > r0 and q1 > q0 and i and j:
                target = as_strided(out3[:, r0 * nh:, q0 * nw:], shape=(i, j, out3.shape[0], r1 - r0, q1 - q0),
                                    strides=(sr, sq, so, sr * nh, sq * nw), writeable=True)
                places.append((target, slice(r0 - t0, r1 - t0), slice(q0, q1), i, j))
    return places


def _depthwise(op: A.Conv2D, x, weight, out, pads, finish, pool: Workers, parts: int) -> KernelWork:
    """Channel blocks, each in two passes: one copy of its KH*KW shifted windows into the
    thread's scratch, then one batched [1, KH*KW] x [KH*KW, pixels] product per channel (BLAS),
    bias and activation after: faster at MobileNet's sizes than a multiply and an add per tap
    (18 NumPy calls and passes over memory per block)."""
    n, c = op.batch, op.in_channels
    (oh, ow), (kh, kw) = op.out_hw, op.kernel
    taps, pixels = kh * kw, oh * ow
    padded = _PaddedInput(x, pads, 0.0, (0, 0))
    windows = _window_view(padded.buf, op.kernel, op.strides, op.dilations, op.out_hw)  # [n, c, kh, kw, oh, ow]
    per_channel = 4 * (padded.buf.shape[2] * padded.buf.shape[3] + (taps + 1) * pixels)
    per_block = max(1, min(engines.CHUNK_BYTES // per_channel, -(-c // parts)))
    w3 = weight.reshape(c, 1, taps)  # a view: W may be a run-time tensor
    out3 = out.reshape(n, c, 1, pixels)
    scratch = [np.empty(per_block * taps * pixels, dtype=np.float32) for _ in range(pool.threads)]
    tasks = [((padded.interior[b, c0:c1], x[b, c0:c1]) if padded.needed else None, windows[b, c0:c1],
              w3[c0:c1], out3[b, c0:c1], (b, c0, c1, 0, pixels), c0, c1)
             for b in range(n) for c0, c1 in _spans(c, -(-c // per_block))]

    def block(index: int, slot: int) -> None:
        interior, src, wb, ob, block, c0, c1 = tasks[index]
        if interior is not None:
            np.copyto(*interior)
        cols = scratch[slot][:src.size]
        np.copyto(cols.reshape(src.shape), src)
        np.matmul(wb, cols.reshape(c1 - c0, taps, pixels), out=ob)
        finish(*block)
    return KernelWork((_on_pool(pool, len(tasks), block),), "depthwise")


def _separable_windows(xp: np.ndarray, kernel, strides, out: np.ndarray, combine: np.ufunc) -> Callable[[], None]:
    """``out`` = ``combine`` (np.maximum, np.add) over each pooling window of the padded NCHW
    ``xp``, separably: over each row's window first (into scratch [N, C, rows, OW]), then over
    each column's -- kh + kw - 2 passes instead of kh kw - 1, the second over a map ``sw`` times
    narrower (max is exact in any order; a sum only reassociates). Faster than a pass per tap on
    SqueezeNet's and Inception's pools; channel spans shared between the threads were no faster
    (bound by memory). Measured: bench/RESULTS.md."""
    (kh, kw), (sh, sw) = kernel, strides
    n, c, oh, ow = out.shape
    rows = (oh - 1) * sh + kh
    row_acc = np.empty((n, c, rows, ow), dtype=out.dtype)
    across = [xp[:, :, :rows, j:j + (ow - 1) * sw + 1:sw] for j in range(kw)]
    down = [row_acc[:, :, i:i + (oh - 1) * sh + 1:sh] for i in range(kh)]

    def fold(views: list[np.ndarray], dst: np.ndarray) -> None:
        if len(views) == 1:
            np.copyto(dst, views[0])
            return
        combine(views[0], views[1], out=dst)
        for view_ in views[2:]:
            combine(dst, view_, out=dst)

    def run() -> None:
        fold(across, row_acc)
        fold(down, out)
    return run
