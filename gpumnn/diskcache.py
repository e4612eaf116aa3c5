"""The on-disk cache of compiled programs (OpenCL binaries, SPIR-V): checked reads, atomic writes.

A cache entry is loaded straight into a driver, so a damaged one must never be used: a disk
that filled up, a crash between write and flush, or a stray edit would otherwise hand the
driver a truncated binary (at best a build error, at worst a kernel that computes garbage).
Every entry therefore starts with a header -- a magic tag, the payload's length and its SHA-256
-- and :func:`read` returns the payload only when all three match; anything else is a miss, and
the caller rebuilds and overwrites the entry.

:func:`write` publishes atomically: the entry is written to a temporary file in the same folder
and moved over the final name with ``os.replace``, so a reader (another thread or process, e.g.
two processes warming one cache at once) sees either no entry, the old one or the complete new
one, never a partial file. Whoever publishes last wins; both wrote the same program. A cache that
cannot be written (read-only home) only costs rebuilding.

The root is ``$GPUMNN_CACHE_DIR`` or ``~/.cache/gpumnn``, one subfolder per kind of program.
"""
from __future__ import annotations

import hashlib
import os
import struct
import tempfile
import threading
from collections import Counter
from pathlib import Path

MAGIC = b"GPUMNNC1"
_HEADER = struct.Struct(f"<{len(MAGIC)}sQ32s")  # magic, payload length, sha256 of the payload

#: what the cache saw in this process: hits, misses (absent), corrupt (present but damaged), writes
counters: Counter = Counter()
_lock = threading.Lock()


def _count(what: str) -> None:
    with _lock:
        counters[what] += 1


def cache_dir(kind: str) -> Path:
    """The folder of one kind of cached program (``GPUMNN_CACHE_DIR`` moves the root)."""
    root = os.environ.get("GPUMNN_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "gpumnn"
    return base / kind


def read(path: Path) -> bytes | None:
    """The payload stored at ``path``, or None if it is absent, truncated or corrupted."""
    try:
        data = path.read_bytes()
    except OSError:
        _count("misses")
        return None
    payload = data[_HEADER.size:]
    if len(data) >= _HEADER.size:
        magic, length, digest = _HEADER.unpack_from(data)
        if magic == MAGIC and length == len(payload) and hashlib.sha256(payload).digest() == digest:
            _count("hits")
            return payload
    _count("corrupt")
    return None


def write(path: Path, payload: bytes) -> bool:
    """Publish ``payload`` at ``path`` atomically; False (and nothing left behind) if it cannot."""
    header = _HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest())
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(header)
            fh.write(payload)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False
    _count("writes")
    return True


__all__ = ["MAGIC", "cache_dir", "counters", "read", "write"]
