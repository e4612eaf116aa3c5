"""Quantized ONNX models on every backend (issue 28): QuantizeLinear / DequantizeLinear against the
ONNX reference (exact for integer outputs), and small models quantized here by
onnxruntime.quantization against ONNX Runtime with graph optimizations disabled (its unfused path),
within one quantization step."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import gpumnn
from gpumnn import atomic as A


def _model(nodes, inputs, outputs, initializers=(), opset=21, domains=()):
    graph = helper.make_graph(nodes, "q", inputs, outputs, list(initializers))
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def _run(model, feeds, backend):
    session = gpumnn.load(model).session(backend=backend, fallback=False)
    try:
        return session.run(feeds), session.program
    finally:
        session.close()


def _reference(model, feeds):
    return ReferenceEvaluator(model).run(None, feeds)


# -- QuantizeLinear / DequantizeLinear -------------------------------------------------------------

QTYPES = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int16": TensorProto.INT16,
          "uint16": TensorProto.UINT16}


@pytest.mark.parametrize("qtype", list(QTYPES))
def test_quantize_rounds_half_to_even_and_saturates(backend, qtype):
    """Ties (x / scale = k + 1/2 exactly) go to the even integer; values past the range clip."""
    info = np.iinfo(qtype)
    zp = np.array(3 if info.min == 0 else -2, dtype=qtype)
    halves = np.arange(-12, 12, dtype=np.float32) + 0.5
    far = np.array([info.min * 4.0, info.max * 4.0, 0.0, -0.0], dtype=np.float32)
    x = np.concatenate([halves, far]) * np.float32(0.25)
    rng = np.random.default_rng(0)
    x = np.concatenate([x, rng.uniform(-40, 40, 64).astype(np.float32)]).reshape(2, -1)
    node = helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["y"], name="q")
    model = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                   [helper.make_tensor_value_info("y", QTYPES[qtype], x.shape)],
                   [numpy_helper.from_array(np.array(0.25, np.float32), "scale"),
                    numpy_helper.from_array(zp, "zp")])
    got, _ = _run(model, {"x": x}, backend)
    ref = _reference(model, {"x": x})[0]
    assert got["y"].dtype == ref.dtype
    np.testing.assert_array_equal(got["y"], ref)


@pytest.mark.parametrize("form", ["per_axis", "blocked"])
def test_quantize_dequantize_per_axis_and_blocked(backend, form):
    """Run-time scales and zero points per channel (axis 1) or per block of 4 along axis 2."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 10)).astype(np.float32) * 4
    if form == "per_axis":
        scale = np.array([0.05, 0.1, 0.2], np.float32)
        zp = np.array([0, 10, 250], np.uint8)
        attrs = {"axis": 1}
    else:
        scale = rng.uniform(0.02, 0.2, (2, 3, 3)).astype(np.float32)
        zp = rng.integers(0, 255, (2, 3, 3)).astype(np.uint8)
        attrs = {"axis": 2, "block_size": 4}
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"], name="q", **attrs),
             helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"], name="dq", **attrs)]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
                           helper.make_tensor_value_info("scale", TensorProto.FLOAT, scale.shape),
                           helper.make_tensor_value_info("zp", TensorProto.UINT8, zp.shape)],
                   [helper.make_tensor_value_info("q", TensorProto.UINT8, x.shape),
                    helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)])
    feeds = {"x": x, "scale": scale, "zp": zp}
    got, _ = _run(model, feeds, backend)
    q_ref, y_ref = _reference(model, feeds)
    np.testing.assert_array_equal(got["q"], q_ref)
    np.testing.assert_allclose(got["y"], y_ref, rtol=1e-6, atol=1e-7)


def test_constant_weights_are_dequantized_at_load(backend):
    """An int8 weight with per-channel scales becomes a float constant: no op of the program
    comes from its DequantizeLinear, and the convolution matches the reference."""
    rng = np.random.default_rng(2)
    w_q = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    w_scale = rng.uniform(0.01, 0.05, 4).astype(np.float32)
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "w_scale"], ["w"], name="dq_w", axis=0),
             helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 6, 6))],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 4, 6, 6))],
                   [numpy_helper.from_array(w_q, "w_q"), numpy_helper.from_array(w_scale, "w_scale")])
    x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
    got, program = _run(model, {"x": x}, backend)
    assert not [op for op in program.ops if op.source == "dq_w"]
    assert [type(op) for op in program.ops] == [A.Conv2D]
    np.testing.assert_allclose(got["y"], _reference(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
