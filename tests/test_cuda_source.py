"""Every kernel program the OpenCL backend builds for a GPU also compiles as CUDA, with NVRTC.

The OpenCL C sources (gpumnn/backends/kernels/cl) are the CUDA kernels too, behind prelude_cuda.h
(gpumnn.backends.kernels.cl.cuda_source). NVRTC compiles each program variant -- every GPU-family program,
with every define combination the OpenCL backend builds it with -- to PTX for compute_90, which
needs no GPU and no driver, so a prelude mistake fails here and not on a user's GPU. The PTX must
keep the source's promises: the kernels OpenCL finds in the same program (CL_PROGRAM_KERNEL_NAMES,
on PoCL in CI) are exactly its entries, unmangled; a kernel with reqd_work_group_size is bounded
to that many threads; a kernel declaring __local arrays works in shared memory.

NVRTC comes from pip (cuda-bindings, nvidia-cuda-nvrtc: the [dev] and [all] extras). Where it is
missing the tests skip saying so, except under GPUMNN_REQUIRE_TOOLS=nvrtc (CI), where they fail.
"""
from __future__ import annotations

import functools
import re

import pytest

from conftest import require_backend, require_tool
from gpumnn import atomic as A
from gpumnn.backends.kernels.cl.planner import (GEMM_CONFIGS, GEMV_CONFIGS, KIND_IDS, family_source, gemm_f16_fits,
                                        gemm_tf32_fits)
from gpumnn.backends.kernels.cl.cuda_source import (CPU_ONLY_DEFINE, CPU_ONLY_FAMILIES, NVRTC_OPTIONS, cuda_families,
                                        cuda_source)

ARCH = "compute_90"  # PTX for Hopper; any arch NVRTC knows compiles without a GPU


def gpu_variants() -> list[tuple[str, dict[str, int]]]:
    """(family, defines) of every program the OpenCL backend builds with the GPU kernels: the GEMM
    tilings of GEMM_CONFIGS (as ``_gemm_launch`` passes them), Winograd tiles, the element-moving
    families for 4-, 2- and 1-byte elements (``elem_defines``), the conversion between every two
    storage dtypes of which one is narrow, the matrix-vector tilings of GEMV_CONFIGS, the other
    families without defines, the 8-bit operands of the int8 families as uint8 and as int8, and the
    float16-storage build (-DHALF) of each family with one."""
    out: list[tuple[str, dict[str, int]]] = []
    for family in cuda_families():
        if family == "gemm":
            out += [(family, dict(zip(("TM", "TN", "WM", "WN", "TK"), cfg))) for cfg in GEMM_CONFIGS.values()]
        elif family == "gemv":
            out += [(family, dict(zip(("KL", "NL", "KFAST"), cfg))) for cfg in GEMV_CONFIGS.values()]
        elif family == "winograd":  # the tile sizes are compile-time: the smallest, the largest, a 1D one
            out += [(family, dict(zip(("AH", "AW", "NH", "NW"), tile))) for tile in ((4, 4, 2, 2), (8, 8, 6, 6), (1, 10, 1, 4))]
        elif family in ("raster", "gather", "select", "scatter"):
            out += [(family, {}), (family, {"ELEM": 2}), (family, {"ELEM": 1})]
        elif family == "quantized_conv":  # x as uint8 and as int8; the implicit GEMM on __dp4a too
            dot = dict(zip(("TM", "TN", "WM", "WN", "TK"), GEMM_CONFIGS["64x64"]), INT8_DOT=1)
            out += [(family, {}), (family, {"X_SIGNED": 1}), (family, dot), (family, {**dot, "X_SIGNED": 1})]
        elif family in ("quantized_add", "pool"):  # bytes as uint8 and as int8 (pool: max pooling of bytes)
            out += [(family, {}), (family, {"X_SIGNED": 1})]
        elif family == "quantized_matmul":  # the GEMM tilings, rows quantized at run time or given
            out += [(family, {**dict(zip(("TM", "TN", "WM", "WN", "TK"), cfg)), **pre})
                    for cfg in GEMM_CONFIGS.values() for pre in ({}, {"PREQUANTIZED": 1})]
        elif family == "convert":
            out += [(family, {"IN_KIND": KIND_IDS[a], "OUT_KIND": KIND_IDS[b]}) for a in A.STORAGE_DTYPES
                    for b in A.STORAGE_DTYPES if a != b and {a, b} & A.NARROW_DTYPES]
        else:
            out.append((family, {}))
    # the float16-storage builds (-DHALF, precision="fp16") of the families that have them: one each
    firsts = {family: defines for family, defines in reversed(out)}
    out += [(family, {**firsts[family], "HALF": 1})
            for family in ("elementwise", "conv", "pool", "gemm", "winograd", "reduce")]
    return out


VARIANTS = gpu_variants()
#: kernels a program holds only when built with a define (inside ``#ifdef``)
DEFINED_ONLY_WITH = {"quantized_conv2d_dot": "INT8_DOT"}
IDS = [family + "".join(f"-{k}{v}" for k, v in defines.items()) for family, defines in VARIANTS]


@functools.cache
def _nvrtc():
    """(the nvrtc module, None) or (None, why it cannot be used here)."""
    try:
        from cuda.bindings import nvrtc
        err, major, minor = nvrtc.nvrtcVersion()
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return None, f"nvrtcVersion failed: {err}"
        return nvrtc, None
    except Exception as exc:  # no package, or no libnvrtc for it to load
        return None, (f"{type(exc).__name__}: {exc}; pip install cuda-bindings nvidia-cuda-nvrtc "
                      "(gpumnn's [dev] extra)")


def _excerpt(source: str, log: str, name: str) -> str:
    """The source lines NVRTC's log points at (``name(LINE): error``)."""
    lines = source.splitlines()
    out = []
    for n in sorted({int(m) for m in re.findall(rf"{re.escape(name)}\((\d+)\)", log)})[:5]:
        out += [f"{k:5d}{'>' if k == n else ' '} {lines[k - 1]}" for k in range(max(1, n - 2), min(len(lines), n + 2) + 1)]
        out.append("  ...")
    return "\n".join(out)


@functools.cache
def compile_ptx(family: str, defines: tuple[tuple[str, int], ...], arch: str = ARCH) -> str:
    """PTX of the CUDA text of ``family`` built with ``defines`` (for a virtual ``arch``,
    compute_XX), or with a real one (sm_XX) the size of the machine code ptxas made, as text; a
    failed compile fails the test with NVRTC's log and the source lines it names."""
    nvrtc, reason = _nvrtc()
    require_tool("nvrtc", reason)
    source = cuda_source(family, dict(defines))
    name = f"{family}.cu"
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"nvrtcCreateProgram: {err}"
    try:
        options = [f"-arch={arch}".encode()] + [o.encode() for o in NVRTC_OPTIONS]
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        # a fresh writable buffer: NVRTC writes into it, and ``b" " * 1`` is the interpreter's shared
        # one-byte object, which its NUL would corrupt for the rest of the process
        log = bytearray(size)
        nvrtc.nvrtcGetProgramLog(prog, log)
        log_text = log.decode(errors="replace").rstrip("\x00 \n")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            pytest.fail(f"NVRTC cannot compile {family} {dict(defines)} as CUDA for {arch}: {status}\n{log_text}\n"
                        f"{_excerpt(source, log_text, name)}")
        if arch.startswith("sm_"):
            _, size = nvrtc.nvrtcGetCUBINSize(prog)
            return str(size)
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = bytearray(size)
        nvrtc.nvrtcGetPTX(prog, ptx)
        return ptx.decode().rstrip("\x00")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def ptx_entries(ptx: str) -> dict[str, str]:
    """Kernel name -> its PTX (from ``.entry name(`` to the next entry)."""
    parts = re.split(r"^\.visible \.entry ", ptx, flags=re.MULTILINE)[1:]
    return {part[:part.index("(")]: part for part in parts}


def kernels_with_local_arrays(source: str) -> set[str]:
    """Kernels written out in ``source`` (not macro-generated) whose body declares a __local array."""
    found = set()
    for m in re.finditer(r"__kernel\b[^{;]*?\bvoid\s+(\w+)\s*\(", source):
        start = source.index("{", m.end())
        depth, i = 0, start
        while True:
            depth += {"{": 1, "}": -1}.get(source[i], 0)
            if depth == 0:
                break
            i += 1
        if re.search(r"^\s*__local\s", source[start:i], flags=re.MULTILINE):
            found.add(m.group(1))
    return found


@pytest.mark.parametrize("family,defines", VARIANTS, ids=IDS)
def test_program_compiles_as_cuda(family, defines):
    ptx = compile_ptx(family, tuple(sorted(defines.items())))
    entries = ptx_entries(ptx)
    assert entries, f"{family}: PTX has no kernel entry"
    for name in kernels_with_local_arrays(family_source(family)):
        if name in DEFINED_ONLY_WITH and DEFINED_ONLY_WITH[name] not in defines:
            continue
        assert name in entries, f"{family}: kernel {name} missing from the PTX (entries: {sorted(entries)})"
        assert re.search(r"\b(st|ld)\.shared\.", entries[name]), f"{family}: {name}'s __local arrays are not in shared memory"
    if "INT8_DOT" in defines:  # the int8 GEMM's four-byte dot products: one dp4a per product, the sum its addend
        body = entries["quantized_conv2d_dot"]
        assert len(re.findall(r"\bdp4a\.s32\.s32\b", body)) >= defines["WM"] * defines["WN"], "no __dp4a in the int8 GEMM"
    if family in ("gemm", "gemv"):  # reqd_work_group_size: gemm (TN / WN, TM / WM, 1), gemv (KL * NL, 1, 1)
        threads = (defines["TN"] // defines["WN"]) * (defines["TM"] // defines["WM"]) if family == "gemm" \
            else defines["KL"] * defines["NL"]
        for name, body in entries.items():
            bound = re.search(r"\.maxntid\s+(\d+),\s*(\d+),\s*(\d+)", body[:body.index("{")])
            assert bound and int(bound.group(1)) * int(bound.group(2)) * int(bound.group(3)) == threads, \
                f"{name}: launch bound {bound and bound.group(0)} != the work-group of {threads} threads"


@pytest.fixture(scope="module")
def opencl_gpu_family():
    """The OpenCL backend building the GPU kernels (PoCL in CI), whatever the device."""
    require_backend("opencl")
    from gpumnn.backends import create_backend

    be = create_backend("opencl", kernels="tiled")
    yield be
    be.close()


@pytest.mark.parametrize("family,defines", VARIANTS, ids=IDS)
def test_cuda_kernels_are_the_opencl_kernels(opencl_gpu_family, family, defines):
    """The same text, the same kernels: what OpenCL builds is what CUDA compiles (the integer
    dot-product variants with the extension's builtin written out where the OpenCL device lacks
    cl_khr_integer_dot_product, as on PoCL: test_opencl_int8_dot_needs_the_extension)."""
    import pyopencl as cl
    from gpumnn.backends.opencl.device import INTEGER_DOT_EXTENSION

    if "INT8_DOT" in defines and INTEGER_DOT_EXTENSION not in opencl_gpu_family.device.extensions.split():
        from test_gpu_int8 import WRITTEN_OUT_DOT
        options = " ".join(f"-D{k}={v}" for k, v in sorted(defines.items()))
        program = cl.Program(opencl_gpu_family.context, WRITTEN_OUT_DOT + family_source(family)).build(options)
    else:
        program = opencl_gpu_family.program((family, tuple(sorted(defines.items()))))
    opencl_names = set(program.get_info(cl.program_info.KERNEL_NAMES).split(";"))
    ptx = compile_ptx(family, tuple(sorted(defines.items())))
    assert set(ptx_entries(ptx)) == opencl_names


def test_opencl_int8_dot_needs_the_extension(opencl_gpu_family):
    """The dot-product variant of quantized_conv.cl builds where the OpenCL device has
    cl_khr_integer_dot_product with 4x8-bit packed inputs and is refused with that reason
    elsewhere (PoCL on a CPU); a backend picks it exactly where it builds."""
    from gpumnn.backends.opencl.device import INTEGER_DOT_EXTENSION, integer_dot

    defines = tuple(sorted(dict(zip(("TM", "TN", "WM", "WN", "TK"), GEMM_CONFIGS["64x64"]), INT8_DOT=1).items()))
    available, missing = integer_dot(opencl_gpu_family.context, opencl_gpu_family.device)
    if available:
        assert "quantized_conv2d_dot" in opencl_gpu_family.program(("quantized_conv", defines)).kernel_names
    else:
        assert INTEGER_DOT_EXTENSION in missing
        with pytest.raises(Exception, match="needs cl_khr_integer_dot_product"):
            opencl_gpu_family.program(("quantized_conv", defines))
    assert opencl_gpu_family.int8_dot == available  # kernels="tiled", int8_dot="auto"


def test_cpu_device_variants_are_refused():
    """The CPU-device kernels (floatN vectors) are OpenCL-only, and say so."""
    for family in CPU_ONLY_FAMILIES:
        with pytest.raises(ValueError, match="CPU-device variant"):
            cuda_source(family, {CPU_ONLY_DEFINE: 16})
    with pytest.raises(ValueError, match="OpenCL-only"):
        cuda_source("elementwise", {CPU_ONLY_DEFINE: 16})


# -- precision="tf32": the GEMM tiles on tensor cores -----------------------------------------------

#: every GEMM tiling with a TF32 variant, as the planner builds it for a cuda backend with tf32
TF32_VARIANTS = [dict(zip(("TM", "TN", "WM", "WN", "TK"), cfg), GEMM_TF32=1)
                 for name, cfg in GEMM_CONFIGS.items() if gemm_tf32_fits(name)]
TF32_IDS = ["x".join(map(str, cfg[:2])) for name, cfg in GEMM_CONFIGS.items() if gemm_tf32_fits(name)]
#: the GPUs with TF32 tensor cores that matter here: Ampere (A100) and Hopper (H100)
TF32_ARCHS = ("80", "90")


def test_tf32_covers_the_tilings_a_gpu_takes():
    """The two tilings of full-size GEMMs have a TF32 variant; the 4-row tiling stays in float32."""
    assert {cfg[:2] for cfg in (GEMM_CONFIGS[n] for n in GEMM_CONFIGS if gemm_tf32_fits(n))} == {(64, 64), (32, 32)}


@pytest.mark.parametrize("arch", TF32_ARCHS)
@pytest.mark.parametrize("defines", TF32_VARIANTS, ids=TF32_IDS)
def test_tf32_gemm_compiles_to_tensor_core_instructions(defines, arch):
    """Each TF32 GEMM variant compiles with NVRTC, no header and no GPU: to PTX whose every GEMM
    entry rounds to TF32 and multiplies with mma.sync m16n8k8, and through ptxas to machine code
    for sm_80 and sm_90."""
    ptx = compile_ptx("gemm", tuple(sorted(defines.items())), f"compute_{arch}")
    entries = ptx_entries(ptx)
    for name in ("gemm_dense", "gemm_conv", "gemm_deconv"):
        assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in entries[name], name
        assert "cvt.rna.tf32.f32" in entries[name], name
    assert "mma.sync" not in entries["gemm_split_sum"]
    assert int(compile_ptx("gemm", tuple(sorted(defines.items())), f"sm_{arch}")) > 0


@pytest.mark.parametrize("defines", [dict(zip(("TM", "TN", "WM", "WN", "TK"), cfg)) for cfg in GEMM_CONFIGS.values()],
                         ids=list(GEMM_CONFIGS))
def test_fp32_gemm_has_no_tensor_core_instructions(defines):
    """precision="fp32" (every variant without -DGEMM_TF32 or -DGEMM_F16) multiplies in float32 only."""
    ptx = compile_ptx("gemm", tuple(sorted(defines.items())))
    assert "mma." not in ptx and "tf32" not in ptx


# -- precision="fp16": the float16-storage GEMM tiles on tensor cores -------------------------------

#: every GEMM tiling with a float16 tensor-core variant, as the planner builds it for a cuda backend
#: of compute capability 8.0 or later under precision="fp16" (float16 storage: -DHALF)
F16_VARIANTS = [dict(zip(("TM", "TN", "WM", "WN", "TK"), cfg), HALF=1, GEMM_F16=1)
                for name, cfg in GEMM_CONFIGS.items() if gemm_f16_fits(name)]
F16_IDS = ["x".join(map(str, cfg[:2])) for name, cfg in GEMM_CONFIGS.items() if gemm_f16_fits(name)]


def test_f16_tensor_cores_cover_the_tilings_a_gpu_takes():
    """The tilings with TF32 variants have float16 ones too (K staged 16 deep); the 4-row one stays in float32."""
    assert {cfg[:2] for cfg in (GEMM_CONFIGS[n] for n in GEMM_CONFIGS if gemm_f16_fits(n))} == {(64, 64), (32, 32)}


@pytest.mark.parametrize("arch", TF32_ARCHS)
@pytest.mark.parametrize("defines", F16_VARIANTS, ids=F16_IDS)
def test_f16_gemm_compiles_to_tensor_core_instructions(defines, arch):
    """Each float16 tensor-core GEMM variant compiles with NVRTC, no header and no GPU: to PTX whose
    every GEMM entry multiplies with mma.sync m16n8k16 on float16 with float32 sums (and no TF32), and
    through ptxas to machine code for sm_80 and sm_90."""
    ptx = compile_ptx("gemm", tuple(sorted(defines.items())), f"compute_{arch}")
    entries = ptx_entries(ptx)
    for name in ("gemm_dense", "gemm_conv", "gemm_deconv"):
        assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in entries[name], name
        assert "tf32" not in entries[name] and "m16n8k8" not in entries[name], name
    assert "mma.sync" not in entries["gemm_split_sum"]
    assert int(compile_ptx("gemm", tuple(sorted(defines.items())), f"sm_{arch}")) > 0
