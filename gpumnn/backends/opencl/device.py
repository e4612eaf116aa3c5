"""OpenCL device choice and description: which device a backend opens, what the cost model
assumes of it and how much memory it can give.

Devices are ranked GPUs first, then everything else, each in platform order; ``device=`` picks
by index into that ranking, by type ("gpu", "cpu", "accelerator") or by a substring of
"platform / device" names.
"""
from __future__ import annotations

from typing import Any

import pyopencl as cl

from ..base import BackendInfo
from ..device_choice import choose_device
from ..limits import MemoryLimits, host_memory
from ..speed import CPU_DEFAULT_FLOPS, GPU_DEFAULT_FLOPS


def pick_device(device: str | int | None) -> tuple[Any, Any]:
    """(platform, device) that ``device`` names (None: the first GPU, else the first device)."""
    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:
        raise RuntimeError(f"no OpenCL platform found ({exc}); install an ICD such as pocl-opencl-icd "
                           "or a GPU vendor driver") from exc
    devices = []
    for plat in platforms:
        try:
            devices += [(plat, dev) for dev in plat.get_devices()]
        except cl.Error:
            continue
    if not devices:
        raise RuntimeError("OpenCL platforms exist but expose no device: "
                           + ", ".join(p.name for p in platforms))
    # GPUs first, then everything else, each in platform order
    devices.sort(key=lambda pd: 0 if pd[1].type & cl.device_type.GPU else 1)
    kinds = {word: [i for i, (_, d) in enumerate(devices) if d.type & kind]
             for word, kind in (("gpu", cl.device_type.GPU), ("cpu", cl.device_type.CPU),
                                ("accelerator", cl.device_type.ACCELERATOR))}
    return devices[choose_device(device, [f"{p.name} / {d.name}" for p, d in devices], "OpenCL", kinds=kinds)]


def is_gpu(device: Any) -> bool:
    return bool(device.type & cl.device_type.GPU)


def in_host_memory(device: Any) -> bool:
    """Whether the device's memory is the host's RAM (a CPU device, or a GPU sharing it)."""
    return not is_gpu(device) or bool(getattr(device, "host_unified_memory", False))


def device_info(platform: Any, device: Any) -> BackendInfo:
    """The cost-model figures of a device (paper Appendix C: compute units x clock x 8 lanes)."""
    gpu = is_gpu(device)
    units = int(device.max_compute_units)
    clock = int(getattr(device, "max_clock_frequency", 0) or 0)
    if clock > 0:
        flops = units * clock * 1e6 * 8
    else:
        flops = GPU_DEFAULT_FLOPS if gpu else CPU_DEFAULT_FLOPS * units
    return BackendInfo(name="opencl", device=f"{platform.name.strip()} / {device.name.strip()}",
                       flops=float(flops), t_schedule_ms=0.05,
                       bandwidth_gbs=20.0 if in_host_memory(device) else 12.0, is_gpu=gpu)


def memory_limits(device: Any) -> MemoryLimits:
    """CL_DEVICE_GLOBAL_MEM_SIZE and CL_DEVICE_MAX_MEM_ALLOC_SIZE; what is free now where the
    device says (AMD's cl_amd_device_attribute_query), and the host's free RAM for CPU devices
    and GPUs sharing host memory."""
    total, max_alloc = int(device.global_mem_size), int(device.max_mem_alloc_size)
    available, source = total, "CL_DEVICE_GLOBAL_MEM_SIZE"
    try:
        free_kib = device.global_free_memory_amd  # per memory bank, KiB
        available, source = min(total, int(free_kib[0]) * 1024), "CL_DEVICE_GLOBAL_FREE_MEMORY_AMD"
    except Exception:
        pass
    in_host = in_host_memory(device)
    if in_host:
        _, host_available, host_source = host_memory()
        if host_available < available:
            available, source = host_available, f"host memory ({host_source})"
    return MemoryLimits(total, available, max_alloc, max_alloc, host_memory=in_host,
                        source=f"{source}; CL_DEVICE_MAX_MEM_ALLOC_SIZE {max_alloc}")


#: the device extension of OpenCL C's integer dot products (quantized_conv.cl -DINT8_DOT)
INTEGER_DOT_EXTENSION = "cl_khr_integer_dot_product"
#: builds where the compiler has the packed signed dot product the int8 GEMM uses
_PACKED_DOT_PROBE = """#ifndef __opencl_c_integer_dot_product_input_4x8bit_packed
#error no 4x8-bit packed inputs
#endif
__kernel void packed_dot_probe(__global int* out, const uint a, const uint b) { out[0] = dot_4x8packed_ss_int(a, b); }
"""


def integer_dot(context: Any, device: Any) -> tuple[str, str]:
    """(the integer dot product the int8 implicit GEMM can use on ``device``, "" for none; why
    none): cl_khr_integer_dot_product with 4x8-bit packed inputs, which its compiler must
    build (pyopencl cannot query CL_DEVICE_INTEGER_DOT_PRODUCT_CAPABILITIES_KHR)."""
    if INTEGER_DOT_EXTENSION not in device.extensions.split():
        return "", f"no {INTEGER_DOT_EXTENSION}"
    try:
        cl.Program(context, _PACKED_DOT_PROBE).build(devices=[device])
    except cl.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return "", f"{INTEGER_DOT_EXTENSION} without 4x8-bit packed inputs ({reason})"
    return f"{INTEGER_DOT_EXTENSION} (dot_4x8packed_ss_int on 4x8-bit packed words)", ""


__all__ = ["INTEGER_DOT_EXTENSION", "device_info", "in_host_memory", "integer_dot", "is_gpu", "memory_limits", "pick_device"]
