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


# -- models quantized by onnxruntime.quantization ---------------------------------------------------

def _float_model() -> onnx.ModelProto:
    """Two convolutions (the second strided), each followed by Relu, and a MatMul."""
    rng = np.random.default_rng(3)
    weights = {"w1": rng.standard_normal((8, 3, 3, 3)) * 0.3, "b1": rng.standard_normal(8) * 0.1,
               "w2": rng.standard_normal((8, 8, 3, 3)) * 0.2, "b2": rng.standard_normal(8) * 0.1,
               "wm": rng.standard_normal((8 * 4 * 4, 10)) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("MatMul", ["f", "wm"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 8, 8))],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 10))],
                  [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()], opset=17)


def _calibration(shape=(1, 3, 8, 8), count=4):
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(4)
            self.batches = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(count)])

        def get_next(self):
            return next(self.batches, None)
    return Reader()


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """name -> (quantized model path, the step of its float output: the last DequantizeLinear's scale)."""
    import logging
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice on pre-processing
    folder = tmp_path_factory.mktemp("quantized")
    source = folder / "float.onnx"
    onnx.save(_float_model(), source)
    models = {}
    for fmt in ("QDQ", "QOperator"):
        for act in ("QInt8", "QUInt8"):
            for per_channel in (False, True):
                name = f"{fmt}_{act}_{'per_channel' if per_channel else 'per_tensor'}"
                quantize_static(source, folder / f"{name}.onnx", _calibration(), quant_format=QuantFormat[fmt],
                                activation_type=QuantType[act], weight_type=QuantType.QInt8, per_channel=per_channel)
                models[name] = folder / f"{name}.onnx"
    quantize_dynamic(source, folder / "dynamic.onnx")
    models["dynamic"] = folder / "dynamic.onnx"
    return models


def _output_step(model: onnx.ModelProto) -> float | None:
    """The scale of the DequantizeLinear that produces the graph output, if one does."""
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.output[0] == model.graph.output[0].name:
            return float(constants[node.input[1]])
    return None


MODELS = [f"{f}_{a}_{g}" for f in ("QDQ", "QOperator") for a in ("QInt8", "QUInt8")
          for g in ("per_tensor", "per_channel")] + ["dynamic"]
#: the ops each form must bring (so that a quantizer change that drops them is noticed)
FORM_OPS = {"QDQ": {"QuantizeLinear", "DequantizeLinear"}, "QOperator": {"QLinearConv", "QLinearMatMul"},
            "dynamic": {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"}}


@pytest.mark.parametrize("name", MODELS)
def test_quantized_model_matches_onnxruntime_unfused(backend, quantized, name):
    """Within one quantization step of the output (ONNX Runtime, graph optimizations disabled)."""
    import onnxruntime as ort

    path = quantized[name]
    model = onnx.load(path)
    ops = {n.op_type for n in model.graph.node}
    assert FORM_OPS[name.split("_")[0]] <= ops
    if name.startswith("QDQ"):  # quantize_static drops each Relu: the next QuantizeLinear clamps
        assert "Relu" not in ops
    x = np.random.default_rng(5).standard_normal((1, 3, 8, 8)).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got, _ = _run(model, {"x": x}, backend)
    step = _output_step(model)
    if step is None:  # dynamic: float output of float32 rescaling
        np.testing.assert_allclose(got["y"], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    else:
        assert np.abs(got["y"] - ref).max() <= step * 1.001
