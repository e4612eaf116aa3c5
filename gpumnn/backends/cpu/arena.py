"""Scratch shared by the kernels of one run state: the cpu backend's scratch arena.

A run state's ops run one after another, so a convolution's scratch (per-thread products and
panels, transformed tiles, the zero-bordered copy of its input) is dead once the op returns.
Each op used to keep scratch of its own, so a run wrote every op's scratch into lines the rest
of the run had evicted; ops sharing one buffer find it in cache (bench/RESULTS.md). One arena
per run state (keyed by the state's pool buffer) keeps two states' runs, on two threads at
once, on distinct buffers; it lives as long as that pool, so every run reuses it.
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

from . import engines


def _aligned(floats: int, fill: float) -> np.ndarray:
    """``floats`` float32 starting on a multiple of ``engines.THREAD_ROW_FLOATS``,
    filled with ``fill``."""
    step = engines.THREAD_ROW_FLOATS
    raw = np.full(floats + step, fill, np.float32)
    start = (-raw.ctypes.data % (4 * step)) // 4
    return raw[start:start + floats]


def _size_class(floats: int) -> int:
    """The buffer size ``floats`` is served from: the next power of two, so that ops of nearby
    sizes share one buffer."""
    return 1 << max(0, floats - 1).bit_length()


class ScratchArena:
    """Buffers the ops of one run state share. ``scratch(role, floats)``: scratch that an op
    writes before it reads it (any contents on entry), shared by every op asking for ``role``;
    one op asks for each of its buffers under a role of its own, so that they never overlap.
    ``plane(key, floats)``: a zeroed buffer shared only by ops whose ``key`` says they write
    exactly the same elements of it each run (a zero-bordered copy's inside), so the rest stays
    zero. ``fill``: what scratch holds when made (tests fill it with NaN, so that an op reading
    scratch it did not write shows in its output)."""

    def __init__(self, fill: float = 0.0) -> None:
        self.fill = fill
        self._buffers: dict[tuple, np.ndarray] = {}
        self._lock = threading.Lock()

    def _buffer(self, key: tuple, floats: int, fill: float) -> np.ndarray:
        with self._lock:
            buffer = self._buffers.get(key)
            if buffer is None:
                buffer = self._buffers[key] = _aligned(floats, fill)
            return buffer

    def scratch(self, role: str, floats: int) -> np.ndarray:
        """``floats`` float32 starting on a multiple of ``engines.THREAD_ROW_FLOATS``, in the buffer of ``role`` and its size class."""
        size = _size_class(floats)
        return self._buffer(("scratch", role, size), size, self.fill)[:floats]

    def thread_rows(self, role: str, threads: int, floats: int) -> np.ndarray:
        """[threads, ``floats`` rounded up to whole ``engines.THREAD_ROW_FLOATS``], each row on a multiple of it (as
        ``compiled._thread_scratch``), in the buffer of ``role``."""
        width = -(-floats // engines.THREAD_ROW_FLOATS) * engines.THREAD_ROW_FLOATS
        return self.scratch(role, threads * width).reshape(threads, width)

    def plane(self, key: tuple, floats: int) -> np.ndarray:
        """A zeroed buffer of ``floats`` shared by the ops asking with the same ``key``."""
        return self._buffer(("plane", key, floats), floats, 0.0)

    @property
    def nbytes(self) -> int:
        """Bytes of every buffer made so far."""
        with self._lock:
            return sum(buffer.nbytes for buffer in self._buffers.values())


class RunStateArenas:
    """One ``ScratchArena`` per run state, found from the pool buffer its tensors live in and
    dropped with that buffer (an eager run's pool goes after the run)."""

    def __init__(self, fill: float = 0.0) -> None:
        self.fill = fill
        self._arenas: dict[int, ScratchArena] = {}
        self._lock = threading.Lock()

    def of(self, pool: np.ndarray) -> ScratchArena | None:
        """The arena of the run state whose pool is ``pool``; None for a read-only buffer (a
        constant: no run state's)."""
        if not pool.flags.writeable:
            return None
        key = id(pool)
        with self._lock:
            arena = self._arenas.get(key)
            if arena is None:
                arena = self._arenas[key] = ScratchArena(self.fill)
                weakref.finalize(pool, self._arenas.pop, key, None)  # before the pool's id can be reused
            return arena

    def __len__(self) -> int:
        with self._lock:
            return len(self._arenas)
