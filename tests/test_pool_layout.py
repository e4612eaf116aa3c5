"""The pool layout: tensors alive together never overlap, and the vectorised greedy search lays
every tensor exactly where the plain greedy loop (kept here as the reference) puts it."""
from __future__ import annotations

import numpy as np
import pytest

from gpumnn.scheduler.memory import Lifetime, PoolLayout, lay_out_pool


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def reference_layout(lifetimes: list[Lifetime], alignment: int = 64) -> PoolLayout:
    """Largest first, the lowest aligned offset clear of every placed tensor alive meanwhile."""
    placed, offsets = [], {}
    for tensor in sorted(lifetimes, key=lambda t: (-t.nbytes, t.first, t.name)):
        size = _align(max(tensor.nbytes, 4), alignment)
        busy = sorted((off, off + sz) for off, sz, other in placed
                      if other.first <= tensor.last and tensor.first <= other.last)
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, _align(hi, alignment))
        placed.append((offset, size, tensor))
        offsets[tensor.name] = offset
    pool = max((off + sz for off, sz, _ in placed), default=0)
    return PoolLayout(offsets, pool, sum(_align(max(t.nbytes, 4), alignment) for t in lifetimes))


@pytest.mark.parametrize("seed", range(30))
def test_plan_matches_the_greedy_loop_and_never_overlaps_live_tensors(seed):
    rng = np.random.default_rng(seed)
    count, span = int(rng.integers(0, 120)), int(rng.integers(1, 60))
    sizes = rng.choice([0, 4, 60, 64, 100, 256, 4096, 5000], size=count)  # ties in size, sizes below alignment
    lifetimes = []
    for i, nbytes in enumerate(sizes):
        first = int(rng.integers(0, span))
        lifetimes.append(Lifetime(f"t{i}", int(nbytes), first, first + int(rng.integers(0, span))))
    alignment = int(rng.choice([4, 16, 64, 256]))
    layout = lay_out_pool(lifetimes, alignment)
    assert layout == reference_layout(lifetimes, alignment)
    for a in lifetimes:
        for b in lifetimes:
            if a.name < b.name and a.first <= b.last and b.first <= a.last:
                a0, b0 = layout.offsets[a.name], layout.offsets[b.name]
                assert a0 + max(a.nbytes, 4) <= b0 or b0 + max(b.nbytes, 4) <= a0
