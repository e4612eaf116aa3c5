"""Index maps and their compression into Raster regions (MNN's geometry compute).

A data-reorder op is described, at session creation, by an *index map*: for every output
element, which source tensor (``src`` id, -1 for padding fill) and which flat element of it
(``idx``). The map is obtained by applying the op's own NumPy semantics to arrays of element
indices, so every reorder op is exactly as correct as NumPy's transpose/pad/concatenate/...

Maps compose by indexing (that is region fusion: Transpose-after-Slice becomes one Raster) and
compress into a few strided :class:`~gpumnn.atomic.Region` s, which is what backends run.

Why maps are held *reduced*: most axes of a reorder are affine -- along them the source is the
same and the index moves by one fixed step (the channel and spatial axes of a Concat's blocks,
every axis of a Transpose). Such an axis is kept at length 1 with its step (``IndexMap.steps``),
which shrinks a [1, 128, 55, 55] Concat map to [1, 128, 1, 1]; compressing the reduced map cuts
exactly the regions the full map would give (see :func:`regions_of`), at a cost that no longer
grows with the tensor's size. That compression was most of a session's preparation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..atomic import RANK, Region
from ..numerics.strides import contiguous_strides, merge_dims


@dataclass
class IndexMap:
    """Per output element: source id (-1 = fill) and flat index into that source.

    ``src`` and ``idx`` hold the map with every *affine* axis (``steps[axis]`` not None) at
    length 1: there, for every element, the source is the one at coordinate 0 of that axis and
    the index is the one at 0 plus ``coordinate * step``. ``shape`` is the map's full shape.
    A map built from full arrays (``IndexMap(src, idx)``) has no affine axis until
    :meth:`reduced`."""

    src: np.ndarray  # int32
    idx: np.ndarray  # int64
    steps: tuple[int | None, ...] = field(default=None)  # type: ignore[assignment]
    full_shape: tuple[int, ...] = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.steps is None:
            self.steps = (None,) * self.idx.ndim
        if self.full_shape is None:
            self.full_shape = tuple(int(d) for d in self.idx.shape)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.full_shape

    @property
    def size(self) -> int:
        return math.prod(self.full_shape)

    @classmethod
    def strided(cls, offset: int, shape, strides) -> "IndexMap":
        """The map of one strided read of source 0: element ``i`` is ``offset + i . strides``
        (every axis longer than 1 held affine, so nothing of the output's size is built)."""
        shape = tuple(int(d) for d in shape)
        if math.prod(shape) == 0:
            idx = np.full(shape, offset, dtype=np.int64)
            return cls(np.zeros(shape, dtype=np.int32), idx)
        steps = tuple(int(s) if d > 1 else None for d, s in zip(shape, strides))
        one = (1,) * len(shape)
        return cls(np.zeros(one, dtype=np.int32), np.full(one, offset, dtype=np.int64), steps, shape)

    def reduced(self) -> "IndexMap":
        """The same map with every affine axis of length > 1 kept at length 1 (innermost first,
        so that each further test reads an already smaller array)."""
        src, idx, steps = self.src, self.idx, list(self.steps)
        if idx.size == 0:
            return self
        for axis in reversed(range(idx.ndim)):
            if steps[axis] is not None or idx.shape[axis] < 2:
                continue
            step = _uniform_step(src, idx, axis)
            if step is not None:
                src, idx, steps[axis] = _first(src, axis), _first(idx, axis), step
        if steps == list(self.steps):
            return self
        return IndexMap(np.ascontiguousarray(src), np.ascontiguousarray(idx), tuple(steps), self.full_shape)

    def full(self) -> "IndexMap":
        """The map with every axis held in full (for composition, which indexes it by element)."""
        if all(s is None for s in self.steps):
            return self
        return IndexMap(*_widen(self.src, self.idx, self.steps, self.full_shape))


def _cut(axis: int, ndim: int, part: slice) -> tuple[slice, ...]:
    return (slice(None),) * axis + (part,) + (slice(None),) * (ndim - axis - 1)


def _first(array: np.ndarray, axis: int) -> np.ndarray:
    return array[_cut(axis, array.ndim, slice(0, 1))]


def _uniform_step(src: np.ndarray, idx: np.ndarray, axis: int) -> int | None:
    """The step s with idx[.., i+1, ..] == idx[.., i, ..] + s along ``axis`` wherever the
    element is not fill, the source being the same along the axis everywhere; else None."""
    ahead, behind = _cut(axis, idx.ndim, slice(1, None)), _cut(axis, idx.ndim, slice(None, -1))
    if not np.array_equal(src[ahead], src[behind]):
        return None
    d = idx[ahead] - idx[behind]
    real = src[behind] >= 0
    if real.all():
        step = int(d.flat[0])
        return step if bool(np.all(d == step)) else None
    d = d[real]
    if d.size == 0:
        return 0  # fill only: no index to step
    step = int(d[0])
    return step if bool(np.all(d == step)) else None


def _widen(src: np.ndarray, idx: np.ndarray, steps, sizes):
    """``src``, ``idx`` with each affine axis widened to its full length in ``sizes``."""
    for axis, step in enumerate(steps):
        if step is None:
            continue
        n = sizes[axis]
        shape = [1] * idx.ndim
        shape[axis] = n
        offsets = (np.arange(n, dtype=np.int64) * step).reshape(shape)
        target = list(idx.shape)
        target[axis] = n
        idx = idx + offsets
        src = np.broadcast_to(src, target)
    return np.ascontiguousarray(src, dtype=np.int32), np.ascontiguousarray(idx, dtype=np.int64)


def _linear_strides(idx: np.ndarray, steps) -> tuple[int, ...] | None:
    """The strides s with idx[i] == idx[0] + i.s for every index i, or None if not linear
    (an affine axis, held at length 1, strides by its step)."""
    base = int(idx.flat[0])
    strides = []
    expected = np.full(idx.shape, base, dtype=np.int64)
    for axis, size in enumerate(idx.shape):
        if steps[axis] is not None:
            strides.append(steps[axis])
            continue
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


def _single(src: np.ndarray, idx: np.ndarray, steps) -> tuple[int, tuple[int, ...]] | None:
    """(source id, strides) if the block is one strided copy from one source (or all fill)."""
    first = int(src.flat[0])
    if not np.all(src == first):
        return None
    if first < 0:
        return first, (0,) * idx.ndim
    strides = _linear_strides(idx, steps)
    return None if strides is None else (first, strides)


def _segments(src: np.ndarray, idx: np.ndarray, axis: int) -> list[tuple[int, int]]:
    """Split [0, n) along ``axis`` into runs over which the block is linear along that axis."""
    n = idx.shape[axis]
    if n == 1:
        return [(0, 1)]
    d = np.diff(idx, axis=axis)
    other = tuple(a for a in range(idx.ndim) if a != axis)
    real = src[_cut(axis, idx.ndim, slice(1, None))] >= 0  # fill entries carry no index: ignore their steps
    big = np.iinfo(np.int64).max
    d_min = np.where(real, d, big).min(axis=other)
    d_max = np.where(real, d, -big).max(axis=other)
    no_data = d_min == big
    d_min, d_max = np.where(no_data, 0, d_min), np.where(no_data, 0, d_max)
    same_src = np.all(np.diff(src, axis=axis) == 0, axis=other)
    joinable = ((d_min == d_max) & same_src).tolist()  # Python values: the loop below reads each once
    d_min = d_min.tolist()
    cuts, start = [], 0
    for i in range(n - 1):
        linked = joinable[i] and (i == start or d_min[i] == d_min[i - 1])
        if not linked:
            cuts.append((start, i + 1))
            start = i + 1
    cuts.append((start, n))
    return cuts


def _decompose(src, idx, steps, sizes, dst_offset: int, dst_strides, out: list[Region]) -> None:
    """Cut the block (``sizes`` in full; affine axes held at length 1) into regions: one if it
    is a single strided copy, else split along the axis whose runs make the fewest regions."""
    single = _single(src, idx, steps)
    if single is not None:
        sid, strides = single
        if sid >= 0:
            out.extend(_emit(sid, int(idx.flat[0]), strides, dst_offset, dst_strides, sizes))
        return
    best = None  # (score, axis, segments): fewest regions, and recursion only where it must
    for axis in range(idx.ndim):
        if idx.shape[axis] == 1:  # an affine axis is one run: never split
            continue
        segs = _segments(src, idx, axis)
        if len(segs) == 1:
            continue
        score = 0
        for lo, hi in segs:
            sub = _cut(axis, idx.ndim, slice(lo, hi))
            part = _single(src[sub], idx[sub], steps)
            score += 1000 if part is None else (0 if part[0] < 0 else 1)
        if best is None or score < best[0]:
            best = (score, axis, segs)
    if best is None:  # linear along every axis separately yet not overall: cannot happen, but be safe
        src, idx = _widen(src, idx, steps, sizes)
        steps = (None,) * idx.ndim
        best = (0, 0, [(i, i + 1) for i in range(idx.shape[0])])
    _, axis, segs = best
    for lo, hi in segs:
        sub = _cut(axis, idx.ndim, slice(lo, hi))
        part_sizes = sizes[:axis] + (hi - lo,) + sizes[axis + 1:]
        _decompose(src[sub], idx[sub], steps, part_sizes, dst_offset + lo * dst_strides[axis], dst_strides, out)


def regions_of(index_map: IndexMap) -> list[Region]:
    """Compress an index map into strided regions over a contiguous output.

    A reduced map gives the regions of its full map: along an affine axis the full map is one
    run, its pairs of neighbours all step alike, and every block cut from it is a single copy
    exactly when its coordinate-0 slice is one (then striding by the axis's step), so every
    decision of the cut -- and the regions emitted at the full sizes -- is the same."""
    shape = index_map.shape
    if math.prod(shape) == 0:
        return []
    regions: list[Region] = []
    _decompose(index_map.src, index_map.idx, tuple(index_map.steps), tuple(shape), 0, contiguous_strides(shape),
               regions)
    return regions


def needs_fill(index_map: IndexMap) -> bool:
    """True when some output element is fill (padding), not a copy."""
    return bool(np.any(index_map.src < 0))


def is_identity(index_map: IndexMap, source_size: int) -> bool:
    """True when the map copies one whole source unchanged (a free view: Reshape, Identity)."""
    if index_map.size != source_size or not bool(np.all(index_map.src == 0)):
        return False
    contiguous = contiguous_strides(index_map.shape)
    expected = np.zeros(index_map.idx.shape, dtype=np.int64)
    for axis, (step, stride) in enumerate(zip(index_map.steps, contiguous)):
        if step is not None:
            if step != stride:
                return False
            continue
        view = [1] * expected.ndim
        view[axis] = expected.shape[axis]
        expected = expected + (np.arange(expected.shape[axis], dtype=np.int64) * stride).reshape(view)
    return bool(np.array_equal(index_map.idx, expected))
