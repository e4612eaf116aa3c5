"""Prepared run states lent to one run at a time: how a session serves several threads.

A run writes its inputs into the session's pool, submits recordings that read and write that
pool, and reads its outputs back. Two runs sharing one pool overwrite each other's tensors, so
every run borrows a *run state* (pools, executions, recordings and I/O handles of its own) for
its whole duration. The first state is prepared with the session; when a second thread arrives
while every state is busy, another is prepared (up to ``capacity``, which the backends bound:
a backend whose verbs cannot overlap allows one) and kept for later runs, so steady-state runs
prepare nothing. Past the capacity, callers wait their turn; with capacity 1 this is a lock.

States are prepared one at a time (``make_lock``, which the session shares among all its shape
sets), since preparation builds programs into the backends' shared caches; runs on other states
go on meanwhile.

The pool holds states and nothing of their owner: the owner hands over how to make and discard
a state with each ``borrow``. A pool that kept its owner's methods would form a reference cycle
with it (owner -> pool -> bound method -> owner), and then a closed or dropped session's device
objects (kernels, scratch buffers, the context they keep alive) would go only when the cyclic
garbage collector next ran, not when the last reference went: resident memory then steps up by
whatever several sessions' worth of freed-late device objects cost.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Generic, Iterator, TypeVar

from ..errors import SessionClosedError

State = TypeVar("State")


class RunStatePool(Generic[State]):
    """At most ``capacity`` states, each lent to one borrower at a time.

    ``keep=False`` (eager sessions) discards a state after its run (the borrower's ``discard``)
    instead of keeping it, so every run prepares afresh while the capacity still bounds concurrency.
    """

    def __init__(self, capacity: int, keep: bool = True, first: State | None = None,
                 make_lock: threading.Lock | threading.RLock | None = None):
        if capacity < 1:
            raise ValueError(f"a session needs at least one run state, not {capacity}")
        self.capacity = capacity
        self._keep = keep
        # a run takes and gives back under this plain lock; the condition on it is waited on
        # (and notified) only when every state is lent
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._waiting = 0  # borrowers waiting on ``_cond``
        self._make_lock = make_lock or threading.Lock()
        self._idle: list[State] = [first] if first is not None else []
        self._created = len(self._idle)
        self._closed = False

    @property
    def prepared(self) -> int:
        """How many states exist (idle or lent)."""
        return self._created

    @contextmanager
    def borrow(self, make: Callable[[], State], discard: Callable[[State], None] | None = None) -> Iterator[State]:
        """Lend an idle state, or prepare one with ``make`` if under capacity, or wait for one to
        come back. ``discard`` frees a state the pool does not keep (``keep=False``)."""
        state = self.take(make)
        try:
            yield state
        finally:
            self.give_back(state, discard)

    def take(self, make: Callable[[], State]) -> State:
        """``borrow`` without the context manager: the caller must ``give_back`` the state."""
        with self._lock:
            while True:
                if self._closed:
                    raise SessionClosedError("the session is closed")
                if self._idle:
                    return self._idle.pop()
                if self._created < self.capacity:
                    self._created += 1
                    break
                self._waiting += 1
                try:
                    self._cond.wait()
                finally:
                    self._waiting -= 1
        try:
            with self._make_lock:
                return make()
        except BaseException:
            with self._lock:
                self._created -= 1
                self._cond.notify_all()  # close() may be waiting for the count to fall
            raise

    def give_back(self, state: State, discard: Callable[[State], None] | None = None) -> None:
        """Return a state from ``take`` (discarded with ``discard`` when the pool does not keep states)."""
        if not self._keep:
            try:
                if discard is not None:
                    discard(state)
            finally:
                with self._lock:
                    self._created -= 1
                    self._cond.notify_all()
            return
        with self._lock:
            self._idle.append(state)
            if self._waiting or self._closed:  # a borrower, or close(), is waiting for a state
                self._cond.notify_all()

    def close(self) -> list[State]:
        """Refuse new borrowers, wait for lent states to come back, and hand all of them over."""
        with self._lock:
            self._closed = True
            self._cond.notify_all()
            while len(self._idle) < self._created:
                self._cond.wait()
            states, self._idle = self._idle, []
            self._created = 0
            return states


class RunSlots:
    """A bound on runs in flight (a bounded semaphore): at most ``limit`` holders at once, the
    others waiting their turn. Entering and leaving take one plain lock each when nobody waits."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"at least one run must be allowed in flight, not {limit}")
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._free = limit
        self._waiting = 0

    def __enter__(self) -> "RunSlots":
        with self._lock:
            if not self._free:
                self._waiting += 1
                try:
                    while not self._free:
                        self._cond.wait()
                finally:
                    self._waiting -= 1
            self._free -= 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._free += 1
            if self._waiting:
                self._cond.notify()


__all__ = ["RunSlots", "RunStatePool"]
