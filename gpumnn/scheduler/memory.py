"""Pool layout: lay every tensor of one backend into a single pool.

Lifetimes come from the schedule (first write to last read); tensors whose lifetimes never
overlap share bytes. Placement is greedy by size (largest first, lowest offset that fits),
which is what TFLite and MNN do and is near-optimal for CNN-shaped lifetimes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Lifetime:
    name: str
    nbytes: int
    first: int  # schedule time of the first write
    last: int   # schedule time of the last read


@dataclass
class PoolLayout:
    """Byte offsets of every tensor in one backend's pool, the pool size and the naive sum."""

    offsets: dict[str, int]
    pool_bytes: int
    naive_bytes: int

    def element_offset(self, name: str, itemsize: int = 4) -> int:
        """``name``'s offset counted in elements of ``itemsize`` bytes (every offset is aligned
        to at least 4 bytes, so it is a whole number of elements of any storage dtype)."""
        return self.offsets[name] // itemsize


#: pool bytes past which the layout is not searched (its offsets would overflow int64)
HUGE_POOL = 1 << 62


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def lay_out_pool(lifetimes: list[Lifetime], alignment: int = 64) -> PoolLayout:
    """Assign aligned offsets so that tensors alive at the same time never overlap.

    Offsets are aligned to ``alignment`` and at least 4 bytes, and every tensor takes whole 4-byte
    words, so that a tensor of 1- or 2-byte elements starts on a word boundary.

    Each tensor, largest first, goes to the lowest aligned offset below, between or above the
    tensors already placed whose lifetimes meet its own. Those are found, and the gap is
    searched, with array operations over the placed tensors: a sequence model has a thousand
    short-lived tensors, and a Python scan of every pair cost more than the rest of the layout."""
    alignment = _align(max(alignment, 4), 4)
    naive = sum(_align(max(t.nbytes, 4), alignment) for t in lifetimes)
    if naive >= HUGE_POOL:  # no device holds it (check_pool_layouts says so): tensors side by side
        offsets, end = {}, 0
        for tensor in lifetimes:
            offsets[tensor.name], end = end, end + _align(max(tensor.nbytes, 4), alignment)
        return PoolLayout(offsets, end, naive)
    order = sorted(lifetimes, key=lambda t: (-t.nbytes, t.first, t.name))
    count = len(order)
    offs, ends = np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64)
    firsts, lasts = np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64)
    offsets: dict[str, int] = {}
    for k, tensor in enumerate(order):
        size = _align(max(tensor.nbytes, 4), alignment)
        meets = (firsts[:k] <= tensor.last) & (lasts[:k] >= tensor.first)
        offset = _lowest_fit(offs[:k][meets], ends[:k][meets], size, alignment)
        offs[k], ends[k], firsts[k], lasts[k] = offset, offset + size, tensor.first, tensor.last
        offsets[tensor.name] = offset
    pool = int(ends.max()) if count else 0
    return PoolLayout(offsets, pool, naive)


def _lowest_fit(los: np.ndarray, his: np.ndarray, size: int, alignment: int) -> int:
    """The lowest offset, from 0 and after busy intervals [lo, hi) taken in (lo, hi) order, at
    which ``size`` bytes end at or before the next interval's start (each skip aligned up)."""
    if los.size <= 32:  # few neighbours (the common case): a plain scan beats array set-up
        offset = 0
        for lo, hi in sorted(zip(los.tolist(), his.tolist())):
            if offset + size <= lo:
                break
            offset = max(offset, _align(hi, alignment))
        return offset
    order = np.lexsort((his, los))
    los, his = los[order], his[order]
    after = np.maximum.accumulate(-(-his // alignment) * alignment)  # aligned end of the busy prefix
    before = np.concatenate(([0], np.maximum(after[:-1], 0)))  # the candidate offset at each interval
    fits = np.flatnonzero(before + size <= los)
    return int(before[fits[0]]) if fits.size else max(0, int(after[-1]))
