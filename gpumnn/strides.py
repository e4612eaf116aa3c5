"""Strided-layout arithmetic shared by geometry lowering and every backend.

Atomic ops describe data by element strides in ``RANK`` dims; both the lowering (which builds
those descriptions) and the kernels' launch code (which collapses them so GPU index maths needs
as few divisions as possible) use the same two rules, kept here once.
"""
from __future__ import annotations

from typing import Sequence


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
