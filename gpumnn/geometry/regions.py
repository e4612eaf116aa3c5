"""Index maps and their compression into Raster regions (MNN's geometry compute).

A data-reorder op is described, at session creation, by an *index map*: for every output
element, which source tensor (``src`` id, -1 for padding fill) and which flat element of it
(``idx``). The map is obtained by applying the op's own NumPy semantics to arrays of element
indices, so every reorder op is exactly as correct as NumPy's transpose/pad/concatenate/...

Maps compose by indexing (that is region fusion: Transpose-after-Slice becomes one Raster) and
compress into a few strided :class:`~gpumnn.atomic.Region` s, which is what backends run.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..atomic import RANK, Region
from ..strides import contiguous_strides, merge_dims


@dataclass
class IndexMap:
    """Per output element: source id (-1 = fill) and flat index into that source."""

    src: np.ndarray  # int32, output shape
    idx: np.ndarray  # int64, output shape

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.idx.shape)


def _linear_strides(idx: np.ndarray) -> tuple[int, ...] | None:
    """The strides s with idx[i] == idx[0] + i.s for every index i, or None if not linear."""
    base = int(idx.flat[0])
    strides = []
    expected = np.full(idx.shape, base, dtype=np.int64)
    for axis, size in enumerate(idx.shape):
        if size == 1:
            strides.append(0)
            continue
        probe = [0] * idx.ndim
        probe[axis] = 1
        stride = int(idx[tuple(probe)]) - base
        strides.append(stride)
        shape = [1] * idx.ndim
        shape[axis] = size
        expected = expected + (np.arange(size, dtype=np.int64) * stride).reshape(shape)
    return tuple(strides) if np.array_equal(expected, idx) else None


def _emit(block_src: int, base_src: int, src_strides, base_dst: int, dst_strides, size) -> list[Region]:
    """Regions for one linear block, split along outer dims if it has more than RANK dims."""
    dims = merge_dims(size, src_strides, dst_strides) or [(1, 0, 0)]
    outer, inner = [], dims
    if len(dims) > RANK:  # loop over the smallest extents (never the innermost), so that a broadcast
        # with a long outer axis (Tile, Expand) stays a few regions instead of one per element of it
        looped = set(sorted(range(len(dims) - 1), key=lambda i: (dims[i][0], i))[:len(dims) - RANK])
        outer = [d for i, d in enumerate(dims) if i in looped]
        inner = [d for i, d in enumerate(dims) if i not in looped]
    inner = [(1, 0, 0)] * (RANK - len(inner)) + inner
    regions = []
    for counter in np.ndindex(*[n for n, _, _ in outer]) if outer else [()]:
        so = base_src + sum(i * s for i, (_, s, _) in zip(counter, outer))
        do = base_dst + sum(i * d for i, (_, _, d) in zip(counter, outer))
        regions.append(Region(block_src, so, tuple(s for _, s, _ in inner), do,
                              tuple(d for _, _, d in inner), tuple(n for n, _, _ in inner)))
    return regions


def _single(src: np.ndarray, idx: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
    """(source id, strides) if the block is one strided copy from one source (or all fill)."""
    first = int(src.flat[0])
    if not np.all(src == first):
        return None
    if first < 0:
        return first, (0,) * idx.ndim
    strides = _linear_strides(idx)
    return None if strides is None else (first, strides)


def _segments(src: np.ndarray, idx: np.ndarray, axis: int) -> list[tuple[int, int]]:
    """Split [0, n) along ``axis`` into runs over which the block is linear along that axis."""
    n = idx.shape[axis]
    if n == 1:
        return [(0, 1)]
    d = np.diff(idx, axis=axis)
    other = tuple(a for a in range(idx.ndim) if a != axis)
    real = np.take(src, range(1, n), axis=axis) >= 0  # fill entries carry no index: ignore their steps
    big = np.iinfo(np.int64).max
    d_min = np.where(real, d, big).min(axis=other)
    d_max = np.where(real, d, -big).max(axis=other)
    no_data = d_min == big
    d_min, d_max = np.where(no_data, 0, d_min), np.where(no_data, 0, d_max)
    same_src = np.all(np.diff(src, axis=axis) == 0, axis=other)
    joinable = (d_min == d_max) & same_src
    cuts, start = [], 0
    for i in range(n - 1):
        linked = bool(joinable[i]) and (i == start or d_min[i] == d_min[i - 1])
        if not linked:
            cuts.append((start, i + 1))
            start = i + 1
    cuts.append((start, n))
    return cuts


def _decompose(src, idx, dst_offset: int, dst_strides, out: list[Region], depth: int = 0) -> None:
    single = _single(src, idx)
    if single is not None:
        sid, strides = single
        if sid >= 0:
            out.extend(_emit(sid, int(idx.flat[0]), strides, dst_offset, dst_strides, idx.shape))
        return
    best = None  # (score, axis, segments): fewest regions, and recursion only where it must
    for axis in range(idx.ndim):
        if idx.shape[axis] == 1:
            continue
        segs = _segments(src, idx, axis)
        if len(segs) == 1:
            continue
        score = 0
        for lo, hi in segs:
            sl = [slice(None)] * idx.ndim
            sl[axis] = slice(lo, hi)
            part = _single(src[tuple(sl)], idx[tuple(sl)])
            score += 1000 if part is None else (0 if part[0] < 0 else 1)
        if best is None or score < best[0]:
            best = (score, axis, segs)
    if best is None:  # linear along every axis separately yet not overall: cannot happen, but be safe
        best = (0, 0, [(i, i + 1) for i in range(idx.shape[0])])
    _, axis, segs = best
    for lo, hi in segs:
        sl = [slice(None)] * idx.ndim
        sl[axis] = slice(lo, hi)
        sub = tuple(sl)
        _decompose(src[sub], idx[sub], dst_offset + lo * dst_strides[axis], dst_strides, out, depth + 1)


def regions_of(index_map: IndexMap) -> list[Region]:
    """Compress an index map into strided regions over a contiguous output."""
    shape = index_map.shape
    if int(np.prod(shape)) == 0:
        return []
    regions: list[Region] = []
    _decompose(index_map.src, index_map.idx, 0, contiguous_strides(shape), regions)
    return regions


def is_identity(index_map: IndexMap, source_size: int) -> bool:
    """True when the map copies one whole source unchanged (a free view: Reshape, Identity)."""
    idx = index_map.idx.reshape(-1)
    return (idx.size == source_size and bool(np.all(index_map.src == 0))
            and bool(np.array_equal(idx, np.arange(idx.size))))
