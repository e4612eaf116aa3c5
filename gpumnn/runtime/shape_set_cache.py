"""A bounded cache of prepared shape sets: how a session follows its inputs' shapes.

MNN's ``resizeSession`` prepares a session again when its inputs change shape. Models whose
inputs change shape from run to run (text lines of different widths, batches of different
sizes) often alternate between a few shapes, so a session keeps the ``limit`` most recently used
prepared shape sets and prepares only a shape set it has not kept. Evicting a set closes it
(its run states and device memory go), but not while a run uses it: a run *leases* the set for
its whole duration, and the last lease of an evicted set closes it.

Preparing and closing go through the session's ``build_lock`` (the backends' program caches,
constant uploads and memory are shared by all of a session's shape sets); two callers asking
for the same new shapes prepare them once, the second waiting for the first.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Generic, Hashable, Iterator, TypeVar

from ..errors import SessionClosedError

Key = TypeVar("Key", bound=Hashable)
Value = TypeVar("Value")


@dataclass
class _Entry(Generic[Value]):
    value: Value
    leases: int = 0
    evicted: bool = False


class ShapeSetCache(Generic[Key, Value]):
    """At most ``limit`` (at least 1) prepared values, least recently used evicted first.

    ``make(key)`` prepares a value (called with ``build_lock`` held); ``discard(value)`` closes
    one that was evicted, once no lease holds it (called without the cache's lock). With
    ``fixed`` (a session with ``shape_cache=0``), the first key is the only one: another raises
    ``fixed(new key, first key)``, decided under the cache's lock so concurrent first runs agree.
    """

    def __init__(self, limit: int, make: Callable[[Key], Value], discard: Callable[[Value], None],
                 build_lock: threading.RLock, fixed: Callable[[Key, Key], Exception] | None = None):
        if limit < 1:
            raise ValueError(f"a shape-set cache holds at least one set, not {limit}")
        self.limit = limit
        self._make = make
        self._discard = discard
        self._build_lock = build_lock
        self._lock = threading.Lock()  # a run's lease and release take only this lock
        self._cond = threading.Condition(self._lock)  # waited on while another caller prepares a key
        self._entries: OrderedDict[Key, _Entry[Value]] = OrderedDict()
        self._draining: list[_Entry[Value]] = []  # evicted while leased: closed by their last lease
        self._fixed = fixed
        self._making: set[Key] = set()
        self._closed = False
        self.recent: Key | None = None  # the key of the set most recently leased (introspection's default)
        self.prepares = 0
        self.hits = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[Key]:
        """The keys kept, least recently used first."""
        with self._cond:
            return list(self._entries)

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {"prepares": self.prepares, "cache_hits": self.hits, "evictions": self.evictions,
                    "cached": len(self._entries), "limit": self.limit}

    def peek(self, key: Key) -> Value | None:
        """The value kept for ``key``, or None; neither counted nor made more recent (introspection)."""
        with self._cond:
            entry = self._entries.get(key)
            return entry.value if entry is not None else None

    @contextmanager
    def lease(self, key: Key) -> Iterator[Value]:
        """The value for ``key`` (prepared now if not kept), held open until the block ends."""
        entry = self.acquire(key)
        try:
            yield entry.value
        finally:
            self.release(entry)

    def acquire(self, key: Key) -> _Entry[Value]:
        """``lease`` without the context manager: the entry (its ``value``) for ``key``, leased
        until the caller hands it to ``release``."""
        with self._lock:  # a kept key: one lock, no condition
            entry = self._entries.get(key)
            if entry is not None and not self._closed:
                self._entries.move_to_end(key)
                entry.leases += 1
                self.hits += 1
                self.recent = key
                return entry
        return self._acquire(key)

    def release(self, entry: _Entry[Value]) -> None:
        """End a lease from ``acquire``: an evicted value is closed by its last lease."""
        with self._lock:
            entry.leases -= 1
            close = entry.evicted and entry.leases == 0
            if close:
                self._draining.remove(entry)
        if close:
            self._discard(entry.value)

    def _acquire(self, key: Key) -> _Entry[Value]:
        with self._cond:
            while True:
                if self._closed:
                    raise SessionClosedError("the session is closed")
                entry = self._entries.get(key)
                if entry is not None:
                    self._entries.move_to_end(key)
                    entry.leases += 1
                    self.hits += 1
                    self.recent = key
                    return entry
                held = next(iter(self._entries), None) or next(iter(self._making), None)
                if self._fixed is not None and held is not None and held != key:
                    raise self._fixed(key, held)
                if key not in self._making:
                    self._making.add(key)
                    break
                self._cond.wait()  # another caller is preparing these shapes
        evicted: list[_Entry[Value]] = []
        try:
            with self._build_lock:
                with self._cond:
                    if self._closed:
                        raise SessionClosedError("the session is closed")
                value = self._make(key)
                with self._cond:
                    entry = _Entry(value, leases=1)
                    self._entries[key] = entry
                    self.prepares += 1
                    self.recent = key
                    while len(self._entries) > self.limit:  # idle: closed below; leased: by its last lease
                        _, old = self._entries.popitem(last=False)
                        self.evictions += 1
                        if old.leases:
                            old.evicted = True
                            self._draining.append(old)
                        else:
                            evicted.append(old)
        finally:
            with self._cond:
                self._making.discard(key)
                self._cond.notify_all()
        for old in evicted:
            self._discard(old.value)
        return entry

    def close(self) -> list[Value]:
        """Refuse new leases and hand back every value kept or evicted but still leased (the
        caller closes them: ``discard`` of a value a run still leases must wait for that run)."""
        with self._build_lock, self._cond:
            self._closed = True
            entries = [*self._entries.values(), *self._draining]
            values = [entry.value for entry in entries]
            for entry in entries:
                entry.evicted = False  # closed by the caller, not by the last lease
            self._entries.clear()
            self._draining.clear()
            self._cond.notify_all()
            return values


__all__ = ["ShapeSetCache"]
