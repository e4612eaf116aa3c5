"""Memory planning: lay every tensor of one backend into a single pool.

Lifetimes come from the schedule (first write to last read); tensors whose lifetimes never
overlap share bytes. Placement is greedy by size (largest first, lowest offset that fits),
which is what TFLite and MNN do and is near-optimal for CNN-shaped lifetimes.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lifetime:
    name: str
    nbytes: int
    first: int  # schedule time of the first write
    last: int   # schedule time of the last read


@dataclass
class MemoryPlan:
    """Byte offsets of every tensor in one backend's pool, the pool size and the naive sum."""

    offsets: dict[str, int]
    pool_bytes: int
    naive_bytes: int

    def element_offset(self, name: str) -> int:
        return self.offsets[name] // 4


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def plan_memory(lifetimes: list[Lifetime], alignment: int = 64) -> MemoryPlan:
    """Assign aligned offsets so that tensors alive at the same time never overlap."""
    placed: list[tuple[int, int, Lifetime]] = []  # (offset, aligned size, tensor)
    offsets: dict[str, int] = {}
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
    naive = sum(_align(max(t.nbytes, 4), alignment) for t in lifetimes)
    return MemoryPlan(offsets, pool, naive)
