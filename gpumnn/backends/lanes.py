"""Submit lanes: what one verb call in flight has to itself on a GPU API, lent from a pool.

A backend that lets several threads use one device at once (CUDA: a stream, an event and pinned
staging; Vulkan: a command pool, a fence and a host-visible staging buffer) gives each write,
read, record or run a lane of its own, so that no two calls share unfinished work or a staging
buffer. The pool is the same for every API: an idle lane is taken (a new one made when all are
lent) and given back after the call; ``reserve`` makes a lane per run state ahead of time with
staging for its inputs and outputs, so that a recorded run creates nothing; a lane's staging only
grows. What a lane is, how it is made and how staging is made and freed are the backend's, passed
in as callables.

Those callables are held weakly where they are bound methods: a backend that holds its pool and
whose pool holds the backend's methods would be a reference cycle, leaving a dropped backend (and
its device memory) to the cyclic garbage collector instead of reference counting.
"""
from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Generic, Iterator, TypeVar

L = TypeVar("L")


def _weak(fn: Callable | None) -> Callable | None:
    """A bound method as a callable that does not keep its object alive; anything else as is."""
    if fn is None or getattr(fn, "__self__", None) is None or not hasattr(fn, "__func__"):
        return fn
    ref = weakref.WeakMethod(fn)

    def call(*args):
        method = ref()
        if method is None:
            raise ReferenceError("the backend that owns this lane pool is gone")
        return method(*args)
    return call


class LanePool(Generic[L]):
    """Lanes lent one per call. ``make_lane()`` makes a lane (it may refuse, e.g. on a closed
    backend); ``make_staging(nbytes)`` makes staging of at least ``nbytes`` (the lane's
    ``staging`` attribute holds it), whose size ``staging_bytes`` reads; ``free_staging``, where
    given, frees the staging a larger one replaces. A lane whose ``hung`` attribute is true is
    not given back: its submission never finished, so nothing may reuse it. ``all`` lists every
    lane made, for the backend to wait for and destroy at close (``drain``)."""

    def __init__(self, make_lane: Callable[[], L], make_staging: Callable[[int], Any],
                 staging_bytes: Callable[[Any], int] = lambda staging: staging.nbytes,
                 free_staging: Callable[[Any], None] | None = None):
        self._make_lane = _weak(make_lane)
        self._make_staging = _weak(make_staging)
        self._staging_bytes = staging_bytes
        self._free_staging = _weak(free_staging)
        self._lock = threading.Lock()  # never held while a lane or staging is made
        self._idle: list[L] = []
        self._reserved = 0  # lanes run states asked for (``reserve``)
        self._reserved_bytes = 0  # the largest staging a reservation asked for
        self.all: list[L] = []

    def _new(self) -> L:
        lane = self._make_lane()
        with self._lock:
            self.all.append(lane)
        return lane

    def reserve(self, nbytes: int) -> None:
        """Lanes for one more run state, made now: as many as run states have asked for, counting
        those made on demand. Every idle lane's staging is grown to the largest ``nbytes``
        reserved so far (a later, smaller reservation must not leave a lane short; 0: none)."""
        with self._lock:
            self._reserved += 1
            missing = self._reserved - len(self.all)
        made = [self._new() for _ in range(missing)]
        with self._lock:
            self._reserved_bytes = nbytes = max(self._reserved_bytes, nbytes)
            self._idle.extend(made)
            idle = list(self._idle)
            self._idle.clear()  # lent to this call while their staging grows
        try:
            for lane in idle:
                self.staging(lane, nbytes)
        finally:
            with self._lock:
                self._idle.extend(idle)

    @contextmanager
    def lend(self) -> Iterator[L]:
        """An idle lane (a new one when every lane is lent) for one call."""
        lane = self.take()
        try:
            yield lane
        finally:
            self.give(lane)

    def take(self) -> L:
        """An idle lane (a new one when every lane is lent), the caller's until ``give``."""
        with self._lock:
            lane = self._idle.pop() if self._idle else None
        return self._new() if lane is None else lane

    def give(self, lane: L) -> None:
        """The lane back to the idle ones, unless its submission hung."""
        if getattr(lane, "hung", False):
            return
        with self._lock:
            self._idle.append(lane)

    def staging(self, lane: Any, nbytes: int) -> Any:
        """The lane's staging, grown (never shrunk) to at least ``nbytes``."""
        old = lane.staging
        if nbytes and (old is None or self._staging_bytes(old) < nbytes):
            if old is not None and self._free_staging is not None:
                lane.staging = None
                self._free_staging(old)
            lane.staging = self._make_staging(nbytes)
        return lane.staging

    def drain(self) -> list[L]:
        """Every lane made, the pool emptied: the caller waits for them and destroys them."""
        with self._lock:
            lanes, self.all, self._idle = self.all, [], []
        return lanes


__all__ = ["LanePool"]
