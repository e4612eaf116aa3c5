"""Building OpenCL programs, through the on-disk binary cache.

A program is one family of the OpenCL C sources (``cl_plans.family_source``) compiled with
``-D`` defines for one device. Its binary is cached on disk (``gpumnn.diskcache``: checksummed
reads, atomic writes) under a digest of the source, the options and the platform, device and
driver versions, so a new process loads instead of compiling; a binary the driver no longer
takes is rebuilt from source and overwritten.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pyopencl as cl

from ... import diskcache
from ..kernels.cl.planner import family_source


def load_program(context: Any, platform: Any, device: Any, family: str,
                 defines: tuple[tuple[str, int], ...]) -> tuple[Any, bool]:
    """(the built program of ``family`` with ``defines``, whether it was compiled now rather
    than loaded from the disk cache)."""
    options = " ".join(f"-D{k}={v}" for k, v in defines)
    source = family_source(family)
    digest = hashlib.sha256("\0".join([
        source, options, platform.name, platform.version, device.name, device.version,
        device.driver_version, cl.VERSION_TEXT]).encode()).hexdigest()[:40]
    path = diskcache.cache_dir("opencl") / f"{family}-{digest}.bin"
    binary = diskcache.read(path)  # checksummed: a damaged entry is a miss, rebuilt and overwritten
    if binary is not None:
        try:
            prg = cl._cl._Program(context, [device], [binary])
            prg.build(options.encode(), [device])
            return prg, False
        except Exception:  # a binary this driver no longer takes: rebuild from source
            pass
    prg = cl._cl._Program(context, source)
    try:
        prg.build(options.encode(), [device])
    except cl.Error as exc:
        try:
            log = prg.get_build_info(device, cl.program_build_info.LOG)
        except Exception:
            log = ""
        detail = str(exc) if log and log.strip() in str(exc) else f"{exc}\n{log}"
        raise RuntimeError(f"OpenCL build of {family!r} ({options or 'no options'}) failed on "
                           f"{device.name}: {detail}") from None
    _store_binary(prg, path)
    return prg, True


def _store_binary(prg: Any, path: Path) -> None:
    try:
        binaries = prg.get_info(cl.program_info.BINARIES)
    except cl.Error:  # a driver without binaries: memory cache only
        return
    if binaries and binaries[0]:
        diskcache.write(path, bytes(binaries[0]))  # atomic; a read-only home only costs rebuilding


__all__ = ["load_program"]
