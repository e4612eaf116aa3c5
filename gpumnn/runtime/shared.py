"""What the shape sets of one session share on its devices: uploaded constants and run reservations.

Constants. Lowering at another set of input shapes yields the same weights (often the very
same arrays, sometimes new views of them) beside a few shape-dependent folded tensors. The
store uploads each distinct constant once per backend, keyed by its content, and counts the
shape sets using it; when the last of them is closed, the upload is released, so a session
that meets ever new shapes does not accumulate shape-dependent constants. The backends' own
caches keyed by a constant's buffer (packed convolution weights on Vulkan / OpenGL) follow
along: one weight kept means one packed copy kept.

Hashing a model's weights takes tens of milliseconds (measured: bench/RESULTS.md), so the digest of an array is remembered process-wide (:func:`content_key`) by
the array that owns its memory and the view's place in it (address, shape, strides, dtype), for
as long as the owner lives: every session of a model -- and every shape set -- hashes its
weights once. The owner is held by a weak reference, so the memo keeps nothing alive; weights
are never written after loading.

Run reservations. ``Backend.reserve_run`` sets aside what one more run *in flight* needs
(Vulkan: a submit lane with its staging buffer) and has no inverse. Runs in flight are bounded
by the session's concurrency whatever the number of shape sets, so the session reserves once
per concurrent run, and again only when a new shape set's inputs or outputs outgrow the
staging reserved so far -- not once per prepared state, which would grow without bound as
shape sets are evicted and prepared again.
"""
from __future__ import annotations

import hashlib
import threading
import weakref
from dataclasses import dataclass, field
from typing import Hashable, Mapping

import numpy as np

from ..backends.base import Backend, TensorHandle

ContentKey = tuple[str, tuple[int, ...], bytes]  # dtype, shape, SHA-256 of the bytes


@dataclass
class _Upload:
    handle: TensorHandle
    users: set[Hashable] = field(default_factory=set)


class ConstantStore:
    """Constants uploaded once per (backend, content) and released when no shape set uses them."""

    def __init__(self, backends: Mapping[str, Backend]):
        self._backends = backends
        self._lock = threading.Lock()
        self._uploads: dict[tuple[str, ContentKey], _Upload] = {}
        self.uploads = 0
        self.reuses = 0

    def acquire(self, user: Hashable, backend: str, array: np.ndarray) -> TensorHandle:
        """The handle of ``array`` on ``backend`` for shape set ``user`` (uploaded if new there)."""
        key = (backend, content_key(array))
        with self._lock:
            upload = self._uploads.get(key)
            if upload is None:
                upload = self._uploads[key] = _Upload(self._backends[backend].constant(array))
                self.uploads += 1
            elif user not in upload.users:
                self.reuses += 1
            upload.users.add(user)
            return upload.handle

    def release(self, user: Hashable) -> None:
        """Shape set ``user`` is closed: release every upload no other set uses."""
        with self._lock:
            freed = [k for k, u in self._uploads.items() if user in u.users and len(u.users) == 1]
            for upload in self._uploads.values():
                upload.users.discard(user)
            handles = [(backend, self._uploads.pop((backend, content)).handle) for backend, content in freed]
        for backend, handle in handles:
            self._backends[backend].release(handle.buffer)

    def nbytes(self, backend: str) -> int:
        """Bytes of the constants held on ``backend``."""
        with self._lock:
            return sum(upload.handle.nbytes for (b, _), upload in self._uploads.items() if b == backend)

    @property
    def held(self) -> int:
        """Uploads currently held (one per distinct constant and backend)."""
        return len(self._uploads)


_memo_lock = threading.Lock()
_memo: dict[tuple, tuple[weakref.ref, ContentKey]] = {}  # (id(owner), view's memory) -> (owner, key)


def content_key(array: np.ndarray) -> ContentKey:
    """The content key of ``array`` (dtype, shape, SHA-256 of its bytes), hashed once per view of
    a live owning array (see the module docstring)."""
    array = np.asarray(array)
    owner = array
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    memory = (id(owner), array.__array_interface__["data"][0], array.shape, array.strides, array.dtype.str)
    with _memo_lock:
        known = _memo.get(memory)
    if known is not None and known[0]() is owner:
        return known[1]
    data = np.ascontiguousarray(array)
    key = (array.dtype.str, tuple(array.shape), hashlib.sha256(data.reshape(-1).view(np.uint8)).digest())
    try:
        ref = weakref.ref(owner, lambda _, memory=memory: _forget(memory))
    except TypeError:  # an owner that takes no weak reference: hashed again next time
        return key
    with _memo_lock:
        _memo[memory] = (ref, key)
    return key


def _forget(memory: tuple) -> None:
    with _memo_lock:
        _memo.pop(memory, None)


class RunReservations:
    """``reserve_run`` per backend: once per concurrent run, then only for larger staging."""

    def __init__(self, backends: Mapping[str, Backend], concurrent_runs: int):
        self._backends = backends
        self._concurrent_runs = concurrent_runs
        self._lock = threading.Lock()
        self._made: dict[str, int] = {b: 0 for b in backends}
        self._bytes: dict[str, int] = {b: 0 for b in backends}

    def reserve(self, backend: str, io_bytes: int) -> None:
        with self._lock:
            if self._made[backend] >= self._concurrent_runs and io_bytes <= self._bytes[backend]:
                return
            self._made[backend] += 1
            self._bytes[backend] = max(self._bytes[backend], io_bytes)
        self._backends[backend].reserve_run(io_bytes)


__all__ = ["ConstantStore", "RunReservations", "content_key"]
