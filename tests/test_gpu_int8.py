"""Static int8 on the GPU APIs (issue 30): QuantizedConv2D's kernels of both GPU families
(quantized_conv.cl on opencl and cuda, quantized_conv2d.comp on vulkan and gl, packed bytes and
native 8-bit storage; Vulkan's implicit GEMM on integer dot products where the device has
VK_KHR_shader_integer_dot_product, lavapipe included, and on plain int32 products with
int8_dot="off") give the contract's bits exactly: those of the NumPy reference."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import require_backend
from gpumnn.backends import create_backend
from gpumnn.backends.cpu import int8_conv
from gpumnn.errors import BackendOptionError
from test_static_int8 import GEOMETRIES, _case

#: backend, its options: both kernel families, Vulkan's packed bytes beside its native ones, and
#: its implicit GEMM with and without integer dot products (on packed bytes too)
TARGETS = [("opencl", {"kernels": "tiled"}), ("opencl", {"kernels": "simd"}), ("vulkan", {}), ("vulkan", {"kernels": "tiled"}),
           ("vulkan", {"kernels": "tiled", "int8_dot": "off"}), ("vulkan", {"kernels": "tiled", "narrow_storage": "packed"}),
           ("vulkan", {"narrow_storage": "packed"}), ("gl", {}), ("gl", {"kernels": "tiled"}), ("cuda", {}),
           ("cuda", {"int8_dot": "off"})]


@pytest.fixture(scope="module", params=TARGETS, ids=[f"{n}{'-' + '-'.join(o.values()) if o else ''}" for n, o in TARGETS])
def gpu(request):
    name, options = request.param
    require_backend(name)
    be = create_backend(name, **options)
    yield be
    be.close()


def _run(be, op, x, w, bias, multiplier) -> tuple[np.ndarray, str]:
    """(the op's output on ``be``, the scheme its kernel says it ran): x and the output at
    unaligned-looking offsets of one pool, the rest constants."""
    out_shape = (op.batch, op.out_channels) + op.out_hw
    x_at, out_at = 4 * be.alignment, 8 * be.alignment + x.nbytes
    pool = be.allocate(out_at + int(np.prod(out_shape)) + 4 * be.alignment)
    try:
        xh = be.tensor(pool, x_at, x.shape, op.dtype)
        yh = be.tensor(pool, out_at, out_shape, op.out_dtype)
        be.write(xh, x)
        be.write(yh, np.full(out_shape, 7, op.out_dtype))
        ins = [xh, be.constant(w), be.constant(bias), be.constant(multiplier)]
        exe = be.create_execution(op, ins, [yh])
        be.submit(be.record([exe]))
        return be.read(yh), exe.scheme
    finally:
        be.release(pool)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=[g[0] for g in GEOMETRIES])
@pytest.mark.parametrize("types", [("int8", "int8"), ("uint8", "uint8"), ("uint8", "int8")], ids="-".join)
def test_gpu_quantized_conv_is_the_contract_exactly(gpu, geometry, types):
    op, x, w, bias, multiplier, _ = _case(geometry, *types, seed=1)
    got, scheme = _run(gpu, op, x, w, bias, multiplier)
    np.testing.assert_array_equal(got, int8_conv.quantized_conv_reference(op, x, w, bias, multiplier))
    gemm = gpu.kernels == "tiled" and op.scheme != "depthwise"
    assert ("/dot products" in scheme) == (gemm and bool(gpu.int8_dot)), (scheme, gpu.int8_dot)


def test_vulkan_uses_the_dot_products_its_device_has():
    """The implicit GEMM takes VK_KHR_shader_integer_dot_product where the device enables it
    (lavapipe does), unless int8_dot="off"; ``gpumnn info``'s sentence names the arithmetic."""
    require_backend("vulkan")
    for options, expected in (({"kernels": "tiled"}, "device"), ({"kernels": "tiled", "int8_dot": "off"}, ""),
                              ({"kernels": "simd"}, "")):
        be = create_backend("vulkan", **options)
        try:
            device_has = be.dev.shared.integer_dot
            assert be.int8_dot == (device_has if expected == "device" else "")
            assert be.int8_arithmetic.startswith("integer dot products in the implicit GEMM: VK_KHR_shader_integer_dot_product" if be.int8_dot
                                                 else "plain int32")
        finally:
            be.close()


def test_int8_dot_option_is_checked():
    require_backend("vulkan")
    with pytest.raises(BackendOptionError, match="int8_dot"):
        create_backend("vulkan", int8_dot="always")
