"""What the cost model assumes of a device's speed (paper Appendix C), in one place for every
backend: the host CPU's multiply-accumulates per second, the fallbacks when a device does not
say, and the SIMD width a software renderer names.
"""
from __future__ import annotations

import os
import re

#: multiply-accumulates per second per core when the core's frequency is unknown (paper Appendix C)
CPU_DEFAULT_FLOPS = 2e9
#: multiply-accumulates per second of a GPU that says nothing of its clock (paper Appendix C)
GPU_DEFAULT_FLOPS = 4e9
#: compute units (SMs, CUs, cores) of a GPU whose driver does not say how many it has (Vulkan
#: without VK_NV_shader_sm_builtins, VK_AMD_shader_core_properties or VK_ARM_shader_core_builtins,
#: OpenGL without GL_NV_shader_thread_group): few, as on integrated and mobile GPUs, so that an
#: unknown device splits only the GEMMs with the fewest tiles
GPU_DEFAULT_COMPUTE_UNITS = 8
#: compute units of a CPU device (lavapipe, llvmpipe): one, so that its kernels are planned as
#: before (its threads take workgroups from one queue; there are no idle units to fill)
CPU_DEVICE_COMPUTE_UNITS = 1


def host_cpu_flops(threads: int) -> float:
    """Paper Appendix C: sum of the max frequencies of the ``threads`` fastest cores (Hz)."""
    freqs = []
    for cpu in range(os.cpu_count() or 1):
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq") as fh:
                freqs.append(int(fh.read()) * 1e3)
        except OSError:
            break
    if not freqs:
        return CPU_DEFAULT_FLOPS * threads
    return float(sum(sorted(freqs, reverse=True)[:threads]))


def software_renderer_flops() -> float:
    """A software Vulkan or OpenGL (lavapipe, llvmpipe: the same Mesa shader compiler) on the
    host's cores: measured ~10x below NumPy/BLAS on the same cores (scalarised buffer loads), so
    a tenth of the CPU backend's estimate."""
    return host_cpu_flops(os.cpu_count() or 1) / 10


def simd_lanes(device_name: str) -> int:
    """32-bit SIMD lanes of a software renderer's vector unit, from the width its name gives
    (llvmpipe: "llvmpipe (LLVM 15.0.6, 256 bits)"), 4 to 16; 8 where it names none."""
    bits = re.search(r"(\d+) bits", device_name)
    return min(16, max(4, int(bits.group(1)) // 32)) if bits else 8


__all__ = ["CPU_DEFAULT_FLOPS", "CPU_DEVICE_COMPUTE_UNITS", "GPU_DEFAULT_COMPUTE_UNITS", "GPU_DEFAULT_FLOPS", "host_cpu_flops", "simd_lanes", "software_renderer_flops"]
