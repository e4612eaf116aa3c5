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
from test_static_int8 import GEOMETRIES, MAX_STEPS, SIZE, _case, qdq_models  # noqa: F401 (a fixture)

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


def test_qdq_model_on_vulkan_dot_products_is_the_plain_path_exactly(qdq_models):
    """A QDQ zoo model on Vulkan's implicit GEMM: with integer dot products (where the device has
    them) and with plain int32 products the same bits, within the bound of ONNX Runtime's unfused path."""
    import onnx
    import onnxruntime as ort

    import gpumnn
    from gpumnn import atomic as A

    require_backend("vulkan")
    name = "squeezenet1_1"
    path = qdq_models[name]
    x = np.random.default_rng(1).standard_normal((1, 3, SIZE, SIZE)).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    ref = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    model = onnx.load(path)
    outputs, dots = {}, {}
    for int8_dot in ("auto", "off"):
        session = gpumnn.load(str(path)).session(backend="vulkan", fallback=False, kernels="tiled", int8_dot=int8_dot)
        try:
            outputs[int8_dot] = session.run({"input": x})[model.graph.output[0].name]
            assert any(isinstance(op, A.QuantizedConv2D) for op in session.program.ops)
            be = session.backends["vulkan"]
            dots[int8_dot] = (be.int8_dot, be.dev.shared.integer_dot)
        finally:
            session.close()
    assert dots["off"][0] == "" and dots["auto"][0] == dots["auto"][1]  # the device's, where it has them
    np.testing.assert_array_equal(outputs["auto"], outputs["off"])
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    last = next(n for n in model.graph.node if n.output[0] == model.graph.output[0].name)
    assert np.abs(outputs["auto"] - ref).max() <= MAX_STEPS[name] * float(constants[last.input[1]]) * 1.001


#: cl_khr_integer_dot_product's packed signed dot product written out in OpenCL C, for a device
#: without the extension (PoCL): what the instruction computes, nothing else stood in for
WRITTEN_OUT_DOT = """#define __opencl_c_integer_dot_product_input_4x8bit_packed 1
int dot_4x8packed_ss_int(uint a, uint b)
{
    int sum = 0;
    for (int t = 0; t < 32; t += 8)
        sum += (((int)((a >> t) & 0xffu) ^ 0x80) - 0x80) * (((int)((b >> t) & 0xffu) ^ 0x80) - 0x80);
    return sum;
}
"""


@pytest.fixture(scope="module")
def opencl_written_out_dot():
    """The OpenCL backend's GPU family made to build quantized_conv.cl -DINT8_DOT on a device
    without cl_khr_integer_dot_product, the dot product written out (WRITTEN_OUT_DOT): the
    kernels CUDA runs on __dp4a -- packing, uint8 lanes moved to int8, the folded bias, the
    preparation launch -- run here, through the planner and backend as they run there."""
    require_backend("opencl")
    from gpumnn.backends.opencl import programs

    be = create_backend("opencl", kernels="tiled")
    if be.int8_dot:
        be.close()
        pytest.skip(f"{be.info.device} has {be.int8_dot}: the tests above run it")
    source_of = programs.family_source
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(programs, "family_source", lambda family: WRITTEN_OUT_DOT + source_of(family)
                      if family == "quantized_conv" else source_of(family))
        be.int8_dot = "dot_4x8packed_ss_int written out in OpenCL C"
        yield be
    be.close()


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=[g[0] for g in GEOMETRIES])
@pytest.mark.parametrize("types", [("int8", "int8"), ("uint8", "uint8"), ("uint8", "int8")], ids="-".join)
def test_opencl_dot_kernels_are_the_contract_exactly(opencl_written_out_dot, geometry, types):
    op, x, w, bias, multiplier, _ = _case(geometry, *types, seed=1)
    got, scheme = _run(opencl_written_out_dot, op, x, w, bias, multiplier)
    np.testing.assert_array_equal(got, int8_conv.quantized_conv_reference(op, x, w, bias, multiplier))
    assert ("/dot products" in scheme) == (op.scheme != "depthwise"), scheme
