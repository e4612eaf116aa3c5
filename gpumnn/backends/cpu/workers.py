"""The NumPy backend's own threads: chunks of one op pulled by the caller and helper threads.

Why not BLAS's threads: OpenBLAS splits a GEMM statically between its threads and makes them
meet many times per call. When another process holds a core, the thread that shares it arrives
late at every meeting and the other spins: under load a GEMM on two OpenBLAS threads took
longer than on one (measured: bench/RESULTS.md). ONNX Runtime barely slows under the
same load because its threads take work from a shared counter. So do we: an op is cut into
chunks (row blocks of a convolution with their own im2col, channel blocks of a depthwise
convolution, column blocks of a GEMM), every thread takes the next chunk index until none is
left, and BLAS runs one thread inside each chunk. A thread slowed by the machine just takes
fewer chunks. NumPy releases the GIL inside its loops and BLAS calls, so chunks run in parallel;
elementwise work (im2col copies, epilogues, depthwise taps), which NumPy runs on one thread,
gets every thread too, on chunks small enough to stay in cache.

Where Numba's compiled loops run with a TBB or OpenMP threading layer, the ops they cover (GEMMs,
im2col, depthwise convolution, pooling) run as native parallel regions instead (``cpu_parallel``:
a hand-over here costs a wake-up and GIL turns, tens of microseconds each); Winograd and the
NumPy kernels stay here.

One pool per thread count serves the whole process (no threads per session to leak). It runs
one op at a time: a run that finds it busy (another session's, or another run state's, op)
runs its chunks on its own thread, which is what a busy pool would give it anyway.
"""
from __future__ import annotations

import itertools
import threading
from typing import Callable

import numpy as np

#: ``fn(chunk, slot)``: do chunk ``chunk``; ``slot`` (0 .. threads-1) names the calling thread,
#: so a chunk may use that thread's own scratch.
ChunkFn = Callable[[int, int], None]


class _Job:
    """One op's chunks: the next index to take, and how many taken chunks are not done yet."""

    def __init__(self, count: int, fn: ChunkFn):
        self.count, self.fn = count, fn
        self.next = itertools.count()
        self.left = count
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.errors: list[BaseException] = []

    def work(self, slot: int) -> None:
        for k in self.next:  # next() on itertools.count is atomic under the GIL
            if k >= self.count:
                return
            try:
                self.fn(k, slot)
            except BaseException as exc:  # handed to the caller, which raises it
                self.errors.append(exc)
            with self.lock:
                self.left -= 1
                if self.left == 0:
                    self.done.set()


class Workers:
    """``threads - 1`` helper threads (started on first use) that join the caller on a job.

    The caller waits for the chunks taken, never for a helper to wake: a helper the machine
    has not scheduled yet finds the chunks gone when it does (or helps with the next job)."""

    def __init__(self, threads: int):
        self.threads = max(1, threads)
        self._busy = threading.Lock()
        self._started = False
        self._go = [threading.Event() for _ in range(self.threads - 1)]
        self._job: _Job | None = None

    def run(self, count: int, fn: ChunkFn) -> None:
        """Run ``fn(k, slot)`` for every k in ``range(count)``, on all threads, and wait."""
        if count <= 1 or self.threads == 1 or not self._busy.acquire(blocking=False):
            for k in range(count):
                fn(k, 0)
            return
        try:
            if not self._started:
                self._start()
            job = self._job = _Job(count, fn)
            for go in self._go:
                go.set()
            job.work(0)
            job.done.wait()
            if job.errors:
                raise job.errors[0]
        finally:
            self._job = None  # the pool outlives sessions: hold no chunk function (its views, scratch)
            self._busy.release()

    def _start(self) -> None:
        for slot in range(1, self.threads):
            threading.Thread(target=self._loop, args=(slot,), name=f"gpumnn-cpu-{slot}", daemon=True).start()
        self._started = True

    def _loop(self, slot: int) -> None:
        np.seterr(all="ignore")  # as the runs' own np.errstate: per thread, and no one else runs here
        go = self._go[slot - 1]
        while True:
            go.wait()
            go.clear()
            job = self._job
            if job is not None:
                job.work(slot)
            job = None  # nor while waiting for the next


_POOLS: dict[int, Workers] = {}
_POOLS_LOCK = threading.Lock()


def workers(threads: int) -> Workers:
    """The process's pool of ``threads`` threads (the caller counts as one)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(threads)
        if pool is None:
            pool = _POOLS[threads] = Workers(threads)
        return pool
