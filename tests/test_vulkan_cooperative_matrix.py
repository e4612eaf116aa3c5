"""VK_KHR_cooperative_matrix: what a Vulkan device's cooperative matrices compute, as `gpumnn info`
reports it (no gpumnn kernel uses them yet). lavapipe lists no such extension; the formatting of a
device that does is checked on property records shaped as the driver returns them."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from conftest import require_backend


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
    assert text.startswith("VK_KHR_cooperative_matrix 16x16x16 float16*float16+float32->float32 (subgroup) (3 shapes")
    assert "no gpumnn kernel uses them yet" in text
    assert describe_cooperative_matrices((), "the driver reports no VK_KHR_cooperative_matrix") == \
        "none (the driver reports no VK_KHR_cooperative_matrix)"


def test_the_backend_says_what_its_device_has():
    """On lavapipe: none, because the driver lists no VK_KHR_cooperative_matrix."""
    require_backend("vulkan")
    from gpumnn.backends import create_backend

    be = create_backend("vulkan")
    try:
        text = be.cooperative_matrices
        if be.dev.name.startswith("llvmpipe"):
            assert text == "none (the driver reports no VK_KHR_cooperative_matrix)"
        else:
            assert text.startswith(("none (", "VK_KHR_cooperative_matrix "))
    finally:
        be.close()
