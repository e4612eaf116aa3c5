"""Releases a finalizer asks for, done later at a safe point of the device they belong to.

A session dropped without ``close()`` is closed by its finalizer, which Python runs wherever the
garbage collector happens to start: inside another session's call on the same device and thread
(holding the device's locks, between a submit and its wait, half-way through a pipeline build),
or on another thread while its device objects are still bound there (an OpenGL context current
in the thread that used it). Freeing device objects there is what issue 27 traced to wrong
results, "cannot create buffer" and heap corruption. So a finalizer only *queues* the release
here; the device performs it at a safe point: the outermost entry into a bracket of that device
on the calling thread (:meth:`DeferredReleases.bracket`: the session brackets creation, each run
and close), the device's own acquire and release of backends, and interpreter exit.
"""
from __future__ import annotations

import atexit
import threading
from collections import deque
from contextlib import contextmanager
from typing import Callable, Iterator

#: every queue made (one per device: few), so that interpreter exit drains them all
_queues: "list[DeferredReleases]" = []
_queues_lock = threading.Lock()
#: interpreter exit has begun: a finalizer closes at once (no call of this process is in flight)
exiting = False
_before_exit: list[Callable[[], None]] = []  # close what is still open (the sessions)
_after_exit: list[Callable[[], None]] = []  # then tear the devices down


class DeferredReleases:
    """A per-device queue of releases (callables) and the per-thread depth of its brackets."""

    def __init__(self, name: str):
        self.name = name
        self._pending: deque[Callable[[], None]] = deque()  # append/popleft are atomic: no lock a finalizer could wait on
        self._depth = threading.local()
        self._draining = threading.Lock()
        with _queues_lock:
            _queues.append(self)

    def defer(self, release: Callable[[], None]) -> None:
        """Queue ``release`` (safe anywhere, a finalizer included: it takes no lock)."""
        self._pending.append(release)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def inside(self) -> bool:
        """Whether the calling thread is inside a bracket of this device (not a safe point)."""
        return getattr(self._depth, "n", 0) > 0

    def drain(self) -> int:
        """Perform the queued releases now, unless this thread is inside a bracket of the device
        (then they wait for its outermost exit) or another thread is draining; returns how many
        ran. A release that raises is dropped (it runs once, and close paths are best effort)."""
        if self.inside() or not self._pending:
            return 0
        if not self._draining.acquire(blocking=False):
            return 0
        done = 0
        try:
            self._depth.n = getattr(self._depth, "n", 0) + 1  # a release that finalizes more only queues them
            try:
                while self._pending:
                    release = self._pending.popleft()
                    try:
                        release()
                    except Exception:  # noqa: BLE001 -- the device may already be lost
                        pass
                    done += 1
            finally:
                self._depth.n -= 1
        finally:
            self._draining.release()
        return done

    @contextmanager
    def bracket(self) -> Iterator[None]:
        """A call on the device: pending releases run first when this is the thread's outermost
        bracket of the device, and again when it closes (what a finalizer queued meanwhile)."""
        self.drain()
        self._depth.n = getattr(self._depth, "n", 0) + 1
        try:
            yield
        finally:
            self._depth.n -= 1
            if self._depth.n == 0 and self._pending:
                self.drain()


def drain_all() -> int:
    """Drain every queue that the calling thread is not inside (interpreter exit calls it)."""
    with _queues_lock:
        queues = list(_queues)
    return sum(q.drain() for q in queues)


def on_exit(teardown: Callable[[], None], first: bool = False) -> None:
    """Run ``teardown`` at interpreter exit, in one fixed order whatever order modules were
    imported in: the ``first`` ones (closing open sessions), then every queue drained, then the
    others (destroying idle devices and contexts), each once."""
    (_before_exit if first else _after_exit).append(teardown)


def _exit() -> None:
    global exiting
    exiting = True
    for hooks in (_before_exit, None, _after_exit):
        if hooks is None:
            drain_all()
            continue
        while hooks:
            try:
                hooks.pop(0)()
            except Exception:  # noqa: BLE001 -- the rest must still run
                pass


atexit.register(_exit)

__all__ = ["DeferredReleases", "drain_all", "on_exit"]
