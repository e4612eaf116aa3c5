"""CUDA devices through CuPy: which device a ``cuda`` backend opens, what the cost model assumes
of it, how much memory it can give, which CuPy / CUDA versions are at work, and the compiled
kernel programs.

Versions matter to a user whose backend does not start: CuPy wheels carry the CUDA runtime they
were built for (``cupy-cuda12x``: 12.x, ``cupy-cuda13x``: 13.x) and need a driver at least that
new, and NVRTC (which compiles the kernels) comes from the same CUDA major version, so its code
runs on the same drivers. ``describe_versions`` names them all, with "none" for a missing driver.
"""
from __future__ import annotations

from typing import Any

import cupy
from cupy.cuda import runtime

from ..base import BackendInfo
from ..device_choice import choose_device
from ..limits import MemoryLimits
from ..speed import GPU_DEFAULT_FLOPS

#: the largest tensor a kernel addresses: element offsets and indices are 32-bit ``int``
MAX_BINDING = 4 * (2**31 - 1)


def _cuda_version(v: int) -> str:
    """CUDA's encoded version (12090) as text (12.9)."""
    return f"{v // 1000}.{v % 1000 // 10}"


def versions() -> dict[str, str]:
    """CuPy's version and the CUDA runtime, driver and NVRTC versions it finds ("none" for a
    missing driver, the error for what cannot be asked)."""
    out = {"cupy": cupy.__version__}
    try:
        out["runtime"] = _cuda_version(runtime.runtimeGetVersion())
    except Exception as exc:  # noqa: BLE001 -- reported, not raised
        out["runtime"] = f"unknown ({exc})"
    try:
        driver = runtime.driverGetVersion()
        out["driver"] = _cuda_version(driver) if driver else "none"
    except Exception as exc:  # noqa: BLE001
        out["driver"] = f"unknown ({exc})"
    try:
        from cupy_backends.cuda.libs import nvrtc

        major, minor = nvrtc.getVersion()
        out["nvrtc"] = f"{major}.{minor}"
    except Exception as exc:  # noqa: BLE001 -- no libnvrtc: the kernels cannot compile
        out["nvrtc"] = f"not found ({type(exc).__name__}: {exc})"
    return out


def version_mismatch(v: dict[str, str]) -> str | None:
    """Why the versions found may not work together, or None: code from an NVRTC of a newer CUDA
    major version than the driver's may not load (a pip ``nvidia-cuda-nvrtc`` wheel of another
    major version than the CuPy build can be the one CuPy finds)."""
    def major(text: str) -> int | None:
        head = text.split(".")[0]
        return int(head) if head.isdigit() else None

    nvrtc, driver = major(v["nvrtc"]), major(v["driver"])
    if nvrtc is not None and driver is not None and nvrtc > driver:
        return (f"NVRTC {v['nvrtc']} is newer than the driver's CUDA {v['driver']}: kernels it compiles may not "
                f"load; install nvidia-cuda-nvrtc-cu{driver} (gpumnn[cuda{driver}]) or a newer driver")
    return None


def describe_versions() -> str:
    v = versions()
    text = f"CuPy {v['cupy']}, CUDA runtime {v['runtime']}, driver {v['driver']}, NVRTC {v['nvrtc']}"
    mismatch = version_mismatch(v)
    return f"{text}; {mismatch}" if mismatch else text


def _name(device_id: int) -> str:
    name = runtime.getDeviceProperties(device_id)["name"]
    return (name.decode() if isinstance(name, bytes) else str(name)).strip()


def pick_device(device: str | int | None) -> int:
    """The CUDA device id ``device`` names: None the first, an index, or a substring of the
    name. RuntimeError saying why when there is none (no driver, no GPU, a driver older than
    CuPy's runtime), with the versions found."""
    try:
        count = runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError: no driver, insufficient driver, no device
        raise RuntimeError(f"no CUDA device: {exc} ({describe_versions()})") from None
    if count == 0:
        raise RuntimeError(f"no CUDA device ({describe_versions()})")
    return choose_device(device, [_name(i) for i in range(count)], "CUDA")


def attribute(device_id: int, name: str) -> int:
    """A device attribute (``cudaDevAttr<name>``), 0 where the runtime does not know it."""
    try:
        return int(runtime.deviceGetAttribute(getattr(runtime, f"cudaDevAttr{name}"), device_id))
    except Exception:  # noqa: BLE001 -- an attribute this CUDA version dropped
        return 0


def device_info(device_id: int) -> BackendInfo:
    """The cost-model figures (paper Appendix C, as for OpenCL: multiprocessors x clock x 8
    lanes) and a description naming the device, its compute capability and the versions."""
    units = attribute(device_id, "MultiProcessorCount")
    clock_khz = attribute(device_id, "ClockRate")
    flops = units * clock_khz * 1e3 * 8 if units and clock_khz else GPU_DEFAULT_FLOPS
    cc = cupy.cuda.Device(device_id).compute_capability
    return BackendInfo(name="cuda", device=f"{_name(device_id)} (sm_{cc}; {describe_versions()})",
                       flops=float(flops), t_schedule_ms=0.01, bandwidth_gbs=12.0, is_gpu=True)


def memory_limits(device_id: int) -> MemoryLimits:
    """cudaMemGetInfo's free and total bytes; no allocation limit below them, tensors up to
    what a 32-bit element index reaches."""
    with cupy.cuda.Device(device_id):
        free, total = runtime.memGetInfo()
    return MemoryLimits(int(total), int(free), int(free), min(int(free), MAX_BINDING), host_memory=False,
                        used=int(total - free), source="cudaMemGetInfo")


def load_kernels(source: str, options: tuple[str, ...]) -> Any:
    """The ``cupy.RawModule`` of a complete CUDA translation unit, compiled now (NVRTC, for this
    device's architecture; CuPy keeps the binary in its on-disk kernel cache), so that no
    compilation or module load happens later, inside a graph capture."""
    module = cupy.RawModule(code=source, options=tuple(options))
    module.compile()
    return module


__all__ = ["MAX_BINDING", "attribute", "describe_versions", "version_mismatch", "device_info", "load_kernels", "memory_limits",
           "pick_device", "versions"]
