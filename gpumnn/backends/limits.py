"""How much memory a backend's device can give: the figures behind ``Backend.memory_limits``.

A session checks its pool layout against these numbers before it allocates anything
(``gpumnn.scheduler.resources``), so that a model too large for the device fails with a
``ResourceError`` naming bytes needed and available instead of a NumPy ``MemoryError``, an
out-of-memory kill or a driver's ``VK_ERROR_OUT_OF_DEVICE_MEMORY`` halfway through creation.

Host memory is what the kernel says can be given without swapping (``MemAvailable`` in
/proc/meminfo), further bounded by the cgroup's memory limit (containers) and by the address
space limit (``ulimit -v``); ``os.sysconf`` is the portable fallback.

:func:`release_freed_memory` is the other half: after a session closes, the heap pages that
drivers of host-memory devices freed go back to the operating system (see there why).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
from dataclasses import dataclass
from typing import Any

from ..errors import ResourceError


@dataclass(frozen=True)
class MemoryLimits:
    """What one backend's device can give, in bytes.

    ``total``: the memory the device has; ``available``: what it can give now;
    ``max_allocation``: the largest single buffer (a pool or a constant); ``max_binding``: the
    largest tensor one kernel can address (maxStorageBufferRange, GL_MAX_SHADER_STORAGE_BLOCK_SIZE;
    an op over a larger tensor is placed on the CPU); ``host_memory``: the device's memory is the
    host's RAM (CPU, PoCL, lavapipe, llvmpipe), so its needs add up with the CPU backend's;
    ``copies_constants``: uploading a weight copies it (False where the backend keeps a view of
    the host array); ``used``: device memory in use as the API reports it (None where it reports
    nothing); ``source``: where the figures come from (shown in errors).
    """

    total: int
    available: int
    max_allocation: int
    max_binding: int
    host_memory: bool
    copies_constants: bool = True
    used: int | None = None
    source: str = ""


def _meminfo() -> dict[str, int]:
    values = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    values[key] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    except OSError:
        pass
    return values


def _cgroup_limit() -> tuple[int, int] | None:
    """(limit, usage) of this process's cgroup v2 (or v1) memory controller, if it has a limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file) as fh:
                text = fh.read().strip()
            if not text.isdigit():
                continue  # "max": no limit
            limit = int(text)
            if limit >= 1 << 60:  # v1 writes a huge number for "no limit"
                continue
            with open(usage_file) as fh:
                usage = int(fh.read().strip())
            return limit, usage
        except (OSError, ValueError):
            continue
    return None


def _address_space_left() -> int | None:
    """Bytes of address space left under ``ulimit -v`` (None when unlimited)."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ValueError, OSError):
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return max(0, soft - int(line.split()[1]) * 1024)
    except OSError:
        pass
    return soft


def host_memory() -> tuple[int, int, str]:
    """(total, available, source) of the host's RAM for this process, in bytes."""
    info = _meminfo()
    if "MemTotal" in info and "MemAvailable" in info:
        total, available, source = info["MemTotal"], info["MemAvailable"], "/proc/meminfo MemAvailable"
    else:
        try:
            page = os.sysconf("SC_PAGE_SIZE")
            total = os.sysconf("SC_PHYS_PAGES") * page
            available = os.sysconf("SC_AVPHYS_PAGES") * page
            source = "sysconf(SC_AVPHYS_PAGES)"
        except (ValueError, OSError, AttributeError):  # no way to ask: do not pretend to know
            return 1 << 62, 1 << 62, "unknown (no /proc/meminfo, no sysconf)"
    cgroup = _cgroup_limit()
    if cgroup is not None and cgroup[0] - cgroup[1] < available:
        total, available, source = cgroup[0], max(0, cgroup[0] - cgroup[1]), "the cgroup's memory limit"
    space = _address_space_left()
    if space is not None and space < available:
        available, source = space, "ulimit -v (RLIMIT_AS)"
    return total, available, source


def host_limits(copies_constants: bool = True) -> MemoryLimits:
    """Limits of a device whose memory is the host's RAM and which has no limits of its own."""
    total, available, source = host_memory()
    return MemoryLimits(total, available, available, available, host_memory=True,
                        copies_constants=copies_constants, source=f"host memory ({source})")


_libc: Any = None


def release_freed_memory() -> bool:
    """Give heap pages that are free back to the OS (glibc's ``malloc_trim``); False elsewhere.

    Why: software devices (lavapipe, llvmpipe, PoCL) and NumPy allocate tensors with malloc.
    Once a large block has been freed, glibc raises its mmap threshold, so later blocks of that
    size come from the heap, and freed heap pages stay resident: closing sessions then leaves
    resident memory ratcheting up (measured: bench/RESULTS.md) although nothing is leaked. Trimming after a session's
    backends are closed keeps resident memory flat, for a few milliseconds per close.
    """
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):  # not glibc (musl, macOS, Windows)
            _libc = False
    if not _libc:
        return False
    _libc.malloc_trim(0)
    return True


#: below this many bytes lowering does not ask the host how much memory it has
_SMALL = 64 * 2 ** 20


def human(nbytes: int) -> str:
    """``nbytes`` with a binary unit: 1.5 GiB."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{nbytes} B"


def describe_bytes(nbytes: int) -> str:
    """``nbytes`` in bytes and with a binary unit: 1610612736 bytes (1.5 GiB)."""
    return f"{nbytes} bytes ({human(nbytes)})"


def check_host_bytes(nbytes: int, what: str) -> None:
    """Raise ResourceError if materialising ``nbytes`` on the host cannot fit in its free RAM.
    ``what`` says what would be materialised (node, tensor, shape)."""
    if nbytes < _SMALL:
        return
    _, available, source = host_memory()
    if nbytes > available:
        raise ResourceError(f"{what} needs {describe_bytes(nbytes)} of host memory; {describe_bytes(available)} "
                            f"available ({source})")

__all__ = ["MemoryLimits", "check_host_bytes", "describe_bytes", "host_limits", "host_memory", "human", "release_freed_memory"]
