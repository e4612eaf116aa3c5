"""Resize sampling tables: which input rows/columns each output samples, and with what weight.

Computed once per op on the host in float64, exactly as ONNX specifies (``atomic.Resize``), and
shared by every backend, so nearest-neighbour ties round the same way on every API. GPU
backends upload the tables as constants at execution creation, like a weight re-layout.

Two forms: :func:`resize_axis` gives the 2-tap tables (``lo``, ``hi``, ``frac``) the Resize
kernels read (nearest and linear); :func:`axis_weights` gives the whole ``[out, in]`` weight
matrix of one axis for every ONNX mode (cubic, antialias, ``exclude_outside``,
``tf_crop_and_resize`` with its extrapolation), which the geometry lowering turns into a pair of
MatMuls with constant matrices, so no backend needs a kernel of more taps.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import atomic as A


def source_coords(out_size: int, in_size: int, scale: float, coord: str,
                  roi: tuple[float, float] = (0.0, 1.0)) -> np.ndarray:
    """ONNX Resize: the input coordinate each output index samples (before rounding/clamping).

    As the ONNX reference computes it: ``align_corners`` and ``tf_crop_and_resize`` divide by the
    unrounded output length ``scale * in_size`` (the same as the output size when sizes were
    given), ``half_pixel_symmetric`` centres the rounded output on the input; ``roi`` (start, end,
    normalised) is read by ``tf_crop_and_resize`` only.
    """
    o = np.arange(out_size, dtype=np.float64)
    length = scale * in_size  # the unrounded output length
    if coord == "align_corners":
        return o * (in_size - 1) / (length - 1) if out_size > 1 and length != 1 else np.zeros(out_size)
    if coord == "asymmetric":
        return o / scale
    if coord == "tf_crop_and_resize":
        start, end = roi
        if out_size > 1 and length != 1:
            src = o * (end - start) * (in_size - 1) / (length - 1)
        else:
            src = np.full(out_size, (end - start) * (in_size - 1) / 2)
        return src + start * (in_size - 1)
    if coord == "pytorch_half_pixel" and out_size == 1:
        return np.zeros(out_size)
    if coord == "half_pixel_symmetric":
        offset = in_size / 2 * (1 - out_size / length)
        return offset + (o + 0.5) / scale - 0.5
    return (o + 0.5) / scale - 0.5  # half_pixel, pytorch_half_pixel


def nearest_index(src: np.ndarray, in_size: int, nearest_mode: str) -> np.ndarray:
    if nearest_mode == "floor":
        idx = np.floor(src)
    elif nearest_mode == "ceil":
        idx = np.ceil(src)
    elif nearest_mode == "round_prefer_ceil":
        idx = np.floor(src + 0.5)
    else:  # round_prefer_floor
        idx = np.ceil(src - 0.5)
    return np.clip(idx, 0, in_size - 1).astype(np.int64)


@dataclass(frozen=True)
class AxisSampling:
    """Per output index along one axis: blend ``lo`` and ``hi`` input indices by ``frac``
    (nearest mode: ``lo == hi`` and ``frac == 0``)."""

    lo: np.ndarray
    hi: np.ndarray
    frac: np.ndarray


def resize_axis(op: A.Resize, axis: int) -> AxisSampling:
    """The sampling of axis 0 (height) or 1 (width) of a Resize op."""
    size, out = op.in_hw[axis], op.out_hw[axis]
    src = source_coords(out, size, op.scales[axis], op.coord)
    if op.mode == "nearest":
        idx = nearest_index(src, size, op.nearest_mode)
        return AxisSampling(idx, idx, np.zeros(out, dtype=np.float32))
    src = np.clip(src, 0, size - 1)
    lo = np.floor(src).astype(np.int64)
    return AxisSampling(lo, np.minimum(lo + 1, size - 1), (src - lo).astype(np.float32))


def _cubic(t: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with coefficient ``a`` at distances ``t``."""
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def axis_weights(in_size: int, out_size: int, scale: float, mode: str, coord: str, *,
                 nearest_mode: str = "round_prefer_floor", cubic_coeff_a: float = -0.75,
                 exclude_outside: bool = False, antialias: bool = False,
                 roi: tuple[float, float] = (0.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
    """The ``[out_size, in_size]`` float64 matrix that resizes one axis, and the outputs to extrapolate.

    Row ``o`` holds the weight of every input index in output ``o`` (ONNX Resize, as the ONNX
    reference computes it: the taps nearest the source coordinate, indices past either end read
    the edge, ``exclude_outside`` drops them and renormalises, antialias widens the linear or
    cubic kernel by ``1/scale`` when downsampling). The second result flags the outputs whose
    ``tf_crop_and_resize`` coordinate falls outside the input: their rows are zero and the
    output takes the extrapolation value instead.
    """
    src = source_coords(out_size, in_size, scale, coord, roi)
    outside = ((src < 0) | (src > in_size - 1)) if coord == "tf_crop_and_resize" else np.zeros(out_size, bool)
    base = np.floor(src)
    ratio = np.where(src == base, 1.0, src - base)  # in (0, 1]: the left neighbour is preferred
    if mode == "nearest":
        if nearest_mode == "round_prefer_ceil":
            right = ratio >= 0.5
        elif nearest_mode == "floor":
            right = np.zeros(out_size, bool)
        elif nearest_mode == "ceil":
            right = np.ones(out_size, bool)
        else:  # round_prefer_floor
            right = ratio > 0.5
        right |= ratio == 1.0  # an exact integer coordinate samples itself
        coeffs = np.stack([~right, right], axis=1).astype(np.float64)
    elif antialias and scale < 1.0:
        support = 1.0 if mode == "linear" else 2.0
        first = int(np.floor(-support / scale) + 1)
        offsets = np.arange(first, 2 - first if mode == "cubic" else first + 2 - 2 * first)
        args = (offsets[None, :] - ratio[:, None]) * scale
        coeffs = np.clip(1 - np.abs(args), 0, 1) if mode == "linear" else _cubic(args, cubic_coeff_a)
        coeffs = coeffs / coeffs.sum(axis=1, keepdims=True)
    elif mode == "linear":
        coeffs = np.stack([1 - ratio, ratio], axis=1)
    else:  # cubic
        coeffs = _cubic(np.stack([ratio + 1, ratio, 1 - ratio, 2 - ratio], axis=1), cubic_coeff_a)
    taps = coeffs.shape[1]
    # the taps nearest the coordinate, the smaller index on ties (ONNX's reference, edge padding)
    pad = int(np.ceil(taps / 2))
    padded = src + pad
    p = np.floor(padded).astype(np.int64)
    frac = padded - p
    if taps % 2 == 0:
        start = p + np.where(frac == 0, -(taps // 2), -(taps // 2) + 1)
    else:
        start = p + np.where(frac <= 0.5, -((taps - 1) // 2), -((taps - 1) // 2) + 1)
    neighbours = start[:, None] + np.arange(taps)[None, :] - pad
    if exclude_outside:
        coeffs = np.where((neighbours < 0) | (neighbours >= in_size), 0.0, coeffs)
        total = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    matrix = np.zeros((out_size, in_size))
    rows = np.repeat(np.arange(out_size), taps)
    np.add.at(matrix, (rows, np.clip(neighbours, 0, in_size - 1).reshape(-1)), coeffs.reshape(-1))
    matrix[outside] = 0.0
    return matrix, outside
