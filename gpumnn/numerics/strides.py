"""Strided-layout arithmetic shared by geometry lowering and every backend.

Atomic ops describe data by element strides in ``RANK`` dims; both the lowering (which builds
those descriptions) and the kernels' launch code (which collapses them so GPU index maths needs
as few divisions as possible) use the same two rules, kept here once.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major element strides of ``shape``."""
    strides, acc = [], 1
    for dim in reversed(shape):
        strides.append(acc)
        acc *= int(dim)
    return tuple(reversed(strides))


def merge_dims(shape: Sequence[int], *stride_lists: Sequence[int]) -> list[tuple[int, ...]]:
    """Drop size-1 dims and merge neighbours contiguous in every stride list.

    Returns ``(size, stride_0, stride_1, ...)`` per remaining dim, outermost first; an empty
    list for a single element.
    """
    merged: list[tuple[int, ...]] = []
    for i, size in enumerate(shape):
        size = int(size)
        if size == 1:
            continue
        strides = tuple(int(s[i]) for s in stride_lists)
        if merged and all(outer == s * size for outer, s in zip(merged[-1][1:], strides)):
            merged[-1] = (merged[-1][0] * size,) + strides
        else:
            merged.append((size,) + strides)
    return merged


def one_run(dims: Sequence[tuple[int, ...]]) -> bool:
    """Whether ``merge_dims``' result is one contiguous run in every stride list (a flat copy or
    elementwise op: no broadcast, no gaps)."""
    return len(dims) <= 1 and all(stride == 1 for dim in dims for stride in dim[1:])


def strided_span(offset: int, shape: Sequence[int], strides: Sequence[int]) -> tuple[int, int]:
    """The lowest and highest element index a strided view (``offset``, ``shape``, ``strides``,
    strides of any sign) touches."""
    lo = offset + sum((n - 1) * st for n, st in zip(shape, strides) if st < 0)
    hi = offset + sum((n - 1) * st for n, st in zip(shape, strides) if st > 0)
    return lo, hi


def strided_indices(offset: int, shape: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    """Every element index of a strided view, in its row-major order (int64)."""
    index = np.full((1,) * len(shape), offset, np.int64)
    for axis, (n, st) in enumerate(zip(shape, strides)):
        along = [1] * len(shape)
        along[axis] = int(n)
        index = index + (np.arange(int(n), dtype=np.int64) * st).reshape(along)
    return index.ravel()
