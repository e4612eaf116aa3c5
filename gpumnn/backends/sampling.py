"""Resize sampling tables: which input rows/columns each output samples, and with what weight.

Computed once per op on the host in float64, exactly as ONNX specifies (``atomic.Resize``), and
shared by every backend, so nearest-neighbour ties round the same way on every API. GPU
backends upload the tables as constants at execution creation, like a weight re-layout.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import atomic as A


def source_coords(out_size: int, in_size: int, scale: float, coord: str) -> np.ndarray:
    """ONNX Resize: the input coordinate each output index samples (before rounding/clamping)."""
    o = np.arange(out_size, dtype=np.float64)
    if coord == "align_corners":
        return o * (in_size - 1) / (out_size - 1) if out_size > 1 else np.zeros(out_size)
    if coord == "asymmetric":
        return o / scale
    if coord == "pytorch_half_pixel" and out_size == 1:
        return np.zeros(out_size)
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
