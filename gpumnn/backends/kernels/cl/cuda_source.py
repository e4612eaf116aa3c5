"""CUDA C source of the OpenCL kernel programs: one kernel source, two APIs.

A CUDA program is the OpenCL program's own text (``cl_plans.family_source``: the generated op-id
header, ``vec.cl``, ``index.cl`` and the family's files, exactly as the OpenCL backend builds it)
behind ``opencl/prelude_cuda.h``, a prelude of macros and inline functions that maps OpenCL C
onto CUDA C++ (qualifiers, work-item ids, barriers, the few builtins CUDA lacks). The program's
defines, which OpenCL gets as ``-D`` options, come as ``#define`` lines after the prelude, so the
text is a complete translation unit: one string to compile, cache and key a module on.
Compile it with :data:`NVRTC_OPTIONS` (and an ``-arch``); ``tests/test_cuda_source.py``
compiles every program the OpenCL backend builds for a GPU this way with NVRTC, in CI.

The CPU-device kernels are OpenCL-only: ``gemm_cpu.cl`` and the ``#ifdef VEC`` parts of the
other files exist because a CPU OpenCL compiler vectorises only explicit ``floatN`` code, and
they rely on OpenCL's vector types (per-lane ``?:``, swizzles such as ``.even``), which C++
cannot express with macros. A GPU never runs them: the OpenCL backend picks the GPU family on
GPU devices, and so does CUDA. :func:`cuda_source` refuses them with that reason.

No GPU package is imported here. The program tables and the text of a family are
:mod:`gpumnn.backends.kernels.cl.planner`' (the API-neutral planner both backends read).
"""
from __future__ import annotations

from typing import Mapping

from .planner import FAMILIES, SHADER_DIR, family_source

PRELUDE_FILE = SHADER_DIR / "prelude_cuda.h"

#: NVRTC options every program needs: the sources' plain ``inline`` helpers become __device__
NVRTC_OPTIONS: tuple[str, ...] = ("-default-device",)

#: program families made for CPU OpenCL devices only, and the define that selects CPU variants
CPU_ONLY_FAMILIES: frozenset[str] = frozenset({"gemm_cpu"})
CPU_ONLY_DEFINE = "VEC"


def cuda_families() -> tuple[str, ...]:
    """The program families that compile as CUDA (every family but the CPU-device ones)."""
    return tuple(f for f in FAMILIES if f not in CPU_ONLY_FAMILIES)


def cuda_source(family: str, defines: Mapping[str, int] | None = None) -> str:
    """CUDA C++ text of program ``family`` built with ``defines`` (as the OpenCL ``-D`` options)."""
    defines = dict(defines or {})
    if family in CPU_ONLY_FAMILIES or CPU_ONLY_DEFINE in defines:
        raise ValueError(f"program {family!r} with {defines or 'no defines'} is a CPU-device variant "
                         f"(family in {sorted(CPU_ONLY_FAMILIES)} or -D{CPU_ONLY_DEFINE}): OpenCL-only, "
                         "CUDA builds the GPU kernels")
    lines = [PRELUDE_FILE.read_text()]
    lines += [f"#define {key} {value}" for key, value in sorted(defines.items())]
    lines.append(family_source(family))
    return "\n".join(lines)
