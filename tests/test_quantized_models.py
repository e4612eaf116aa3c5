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


def _onnxruntime_unfused_outputs(model, feeds):
    """Every output of ONNX Runtime's unfused path, on one thread (its dynamically quantized LSTM
    quantizes each thread's part of the batch over that part's own range)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _onnxruntime_unfused(model, feeds):
    return _onnxruntime_unfused_outputs(model, feeds)[0]


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


@pytest.mark.parametrize("qtype", ["int8", "uint8"])
def test_a_quantized_tensor_only_dequantized_is_never_stored(backend, qtype):
    """QuantizeLinear -> DequantizeLinear twice: the first pair's quantized tensor is a graph output
    too, so it is stored as itself; the second's is only dequantized, so no op converts to or from
    8 bits for it. Both answers equal the ONNX reference's."""
    zp = np.array(3 if qtype == "uint8" else -2, dtype=qtype)
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["d"]),
             helper.make_node("QuantizeLinear", ["d", "scale2", "zp"], ["q2"]),
             helper.make_node("DequantizeLinear", ["q2", "scale2", "zp"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 16))],
                   [helper.make_tensor_value_info("q", QTYPES[qtype], (4, 16)),
                    helper.make_tensor_value_info("y", TensorProto.FLOAT, (4, 16))],
                   [numpy_helper.from_array(np.array(0.25, np.float32), "scale"),
                    numpy_helper.from_array(np.array(0.75, np.float32), "scale2"), numpy_helper.from_array(zp, "zp")])
    x = np.random.default_rng(6).uniform(-80, 80, (4, 16)).astype(np.float32)  # past the range too: it clips
    got, program = _run(model, {"x": x}, backend)
    narrow = {n for op in program.ops for n in op.inputs + op.outputs if program.storage_dtype_of(n) in A.NARROW_DTYPES}
    assert narrow == {"q"}, narrow
    # the cpu quantizes the stored one in one pass (``precision.one_pass_quantize``), the other in the float ops
    assert [op.outputs for op in program.ops if isinstance(op, A.Quantize)] == ([("q",)] if backend == "cpu" else [])
    for name, ref in zip(("q", "y"), _reference(model, {"x": x})):
        assert got[name].dtype == ref.dtype
        np.testing.assert_array_equal(got[name], ref, err_msg=name)


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


@pytest.mark.parametrize("qtype", ["int4", "uint4"])
def test_four_bit_graph_input_and_output(backend, qtype):
    """A 4-bit graph input takes its values one per element of an int8 / uint8 array (NumPy has no
    4-bit dtype; an ml_dtypes array of the type is taken too), and a 4-bit output comes back as
    int8 / uint8: both against the ONNX reference, which takes and returns ml_dtypes arrays
    (ONNX Runtime's Python API converts no NumPy array to or from a 4-bit tensor)."""
    import ml_dtypes

    code, held, four_bit = {"int4": (TensorProto.INT4, np.int8, ml_dtypes.int4),
                            "uint4": (TensorProto.UINT4, np.uint8, ml_dtypes.uint4)}[qtype]
    info = ml_dtypes.iinfo(four_bit)
    rng = np.random.default_rng(8)
    q = rng.integers(int(info.min), int(info.max) + 1, (3, 8)).astype(held)
    x = rng.uniform(-8, 8, (3, 8)).astype(np.float32)
    scale = rng.uniform(0.2, 0.5, (3, 2)).astype(np.float32)
    nodes = [helper.make_node("DequantizeLinear", ["q", "scale"], ["y"], name="dq", axis=1, block_size=4),
             helper.make_node("QuantizeLinear", ["x", "scale", "zero_point"], ["x_q"], name="q", axis=1, block_size=4)]
    model = _model(nodes, [helper.make_tensor_value_info("q", code, q.shape),
                           helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, q.shape),
                    helper.make_tensor_value_info("x_q", code, x.shape)],
                   [numpy_helper.from_array(scale, "scale"),
                    helper.make_tensor("zero_point", code, scale.shape, np.full(scale.size, 1 if qtype == "int4" else 3))])
    y_ref, x_q_ref = _reference(model, {"q": q.astype(four_bit), "x": x})
    assert {int(x_q_ref.min()), int(x_q_ref.max())} == {int(info.min), int(info.max)}  # both ends saturate
    session = gpumnn.load(model).session(backend=backend, fallback=False)
    try:
        for given in (q, q.astype(four_bit)):
            got = session.run({"q": given, "x": x})
            np.testing.assert_array_equal(got["y"], y_ref)
            assert got["x_q"].dtype == held
            np.testing.assert_array_equal(got["x_q"], x_q_ref.astype(held))
        outside = q.copy()
        outside[1, 2] = info.max + 1
        with pytest.raises(gpumnn.InputError, match=rf"input 'q' is {qtype}: its values must lie in "
                                                    rf"\[{info.min}, {info.max}\]"):
            session.run({"q": outside, "x": x})
    finally:
        session.close()


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


def _branchy_model() -> onnx.ModelProto:
    """Ops that the QOperator format writes as com.microsoft QLinear ops: Add, Mul, Sigmoid,
    LeakyRelu, Concat, AveragePool, GlobalAveragePool, Gemm, Softmax."""
    rng = np.random.default_rng(6)
    weights = {"w1": rng.standard_normal((8, 3, 3, 3)) * 0.3, "w2": rng.standard_normal((8, 3, 3, 3)) * 0.3,
               "wg": rng.standard_normal((10, 16)) * 0.3, "bg": rng.standard_normal(10) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["a", "b"], ["s"]),
             helper.make_node("Mul", ["s", "b"], ["m"]),
             helper.make_node("Sigmoid", ["m"], ["g"]),
             helper.make_node("LeakyRelu", ["a"], ["l"], alpha=0.1),
             helper.make_node("Concat", ["g", "l"], ["c"], axis=1),
             helper.make_node("AveragePool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["p"], ["gp"]),
             helper.make_node("Flatten", ["gp"], ["f"]),
             helper.make_node("Gemm", ["f", "wg", "bg"], ["z"], transB=1),
             helper.make_node("Softmax", ["z"], ["y"], axis=-1)]
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
    branchy = folder / "branchy.onnx"
    onnx.save(_branchy_model(), branchy)
    for act in ("QInt8", "QUInt8"):
        name = f"microsoft_{act}"
        quantize_static(branchy, folder / f"{name}.onnx", _calibration(), quant_format=QuantFormat.QOperator,
                        activation_type=QuantType[act], weight_type=QuantType.QInt8, per_channel=act == "QInt8")
        models[name] = folder / f"{name}.onnx"
    return models


def _output_step(model: onnx.ModelProto) -> float | None:
    """The scale of the DequantizeLinear that produces the graph output, if one does."""
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.output[0] == model.graph.output[0].name:
            return float(constants[node.input[1]])
    return None


MODELS = [f"{f}_{a}_{g}" for f in ("QDQ", "QOperator") for a in ("QInt8", "QUInt8")
          for g in ("per_tensor", "per_channel")] + ["dynamic", "microsoft_QInt8", "microsoft_QUInt8"]
#: the ops each form must bring (so that a quantizer change that drops them is noticed)
FORM_OPS = {"QDQ": {"QuantizeLinear", "DequantizeLinear"}, "QOperator": {"QLinearConv", "QLinearMatMul"},
            "dynamic": {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"},
            "microsoft": {"QLinearConv", "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat",
                          "QLinearAveragePool", "QLinearGlobalAveragePool", "QGemm", "QLinearSoftmax"}}


@pytest.mark.parametrize("name", MODELS)
def test_quantized_model_matches_onnxruntime_unfused(backend, quantized, name):
    """Within one quantization step of the output (ONNX Runtime, graph optimizations disabled); in
    QDQ form with no conversion out to 8 bits and back."""
    path = quantized[name]
    model = onnx.load(path)
    ops = {n.op_type for n in model.graph.node}
    assert FORM_OPS[name.split("_")[0]] <= ops
    if name.startswith("QDQ"):  # quantize_static drops each Relu: the next QuantizeLinear clamps
        assert "Relu" not in ops
    x = np.random.default_rng(5).standard_normal((1, 3, 8, 8)).astype(np.float32)
    ref = _onnxruntime_unfused(model, {"x": x})
    got, program = _run(model, {"x": x}, backend)
    narrow = [op for op in program.ops if {op.dtype, op.output_dtype()} & A.NARROW_DTYPES]
    if name.startswith(("QDQ", "QOperator")):  # every backend builds QuantizedConv2D
        assert any(isinstance(op, A.QuantizedConv2D) for op in program.ops)
        if name.startswith("QOperator"):  # QLinearConv and QLinearMatMul: every product in int8
            assert not [op for op in program.ops if isinstance(op, (A.Conv2D, A.MatMul))]
        if name.startswith("QDQ"):  # 8-bit tensors only between int8 ops, the input's Quantize (the cpu's)
            # and the conversions of the rest
            assert all(isinstance(op, (A.QuantizedConv2D, A.Quantize))
                       or isinstance(op, A.Unary) and op.op == "identity" for op in narrow), narrow[:3]
    step = _output_step(model)
    if step is None:  # dynamic: float output of float32 rescaling
        np.testing.assert_allclose(got["y"], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    else:
        assert np.abs(got["y"] - ref).max() <= step * 1.001


# -- com.microsoft dynamic and weight-only ops ------------------------------------------------------

MS = "com.microsoft"


def _pack(values: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned ``bits``-bit values packed along the last axis, low bits first."""
    per_byte = 8 // bits
    grouped = values.reshape(*values.shape[:-1], -1, per_byte).astype(np.uint16)
    return (grouped << (np.arange(per_byte) * bits)).sum(-1).astype(np.uint8)


def _ms_cases():
    """(name, model, feeds) for each dynamic or weight-only com.microsoft op."""
    rng = np.random.default_rng(7)
    k, n, block = 64, 12, 16
    a = rng.standard_normal((3, k)).astype(np.float32)
    b_q = rng.integers(-128, 128, (k, n)).astype(np.int8)
    consts = {"b_q": b_q, "b_scale": rng.uniform(0.01, 0.02, n).astype(np.float32),
              "b_zp": rng.integers(-5, 5, n).astype(np.int8), "bias": rng.standard_normal(n).astype(np.float32),
              "a_scale": np.array(0.05, np.float32), "a_zp": np.array(128, np.uint8)}
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)

    def case(name, node, inputs, feeds, names):
        tensors = [consts[c] if isinstance(consts[c], onnx.TensorProto) else numpy_helper.from_array(consts[c], c)
                   for c in names]
        model = _model([node], inputs, [y], tensors, opset=17, domains=[MS])
        return name, model, feeds
    a_info = helper.make_tensor_value_info("a", TensorProto.FLOAT, a.shape)
    yield case("DynamicQuantizeMatMul", helper.make_node("DynamicQuantizeMatMul", ["a", "b_q", "b_scale", "b_zp", "bias"],
                                                         ["y"], domain=MS), [a_info], {"a": a},
               ["b_q", "b_scale", "b_zp", "bias"])
    a_q = rng.integers(0, 256, (3, k)).astype(np.uint8)
    yield case("MatMulIntegerToFloat", helper.make_node("MatMulIntegerToFloat", ["a_q", "b_q", "a_scale", "b_scale", "a_zp",
                                                                               "b_zp", "bias"], ["y"], domain=MS),
               [helper.make_tensor_value_info("a_q", TensorProto.UINT8, a_q.shape)], {"a_q": a_q},
               ["b_q", "a_scale", "b_scale", "a_zp", "b_zp", "bias"])
    blocks = k // block
    for bits in (4, 8):
        consts[f"B{bits}"] = _pack(rng.integers(0, 2 ** bits, (n, blocks, block)), bits)
        consts[f"s{bits}"] = rng.uniform(0.01, 0.1, n * blocks).astype(np.float32)
        consts[f"z{bits}"] = _pack(rng.integers(0, 2 ** bits, (n, blocks)), bits).reshape(-1)
        for zp in (False, True):
            names = [f"B{bits}", f"s{bits}"] + ([f"z{bits}"] if zp else [])
            yield case(f"MatMulNBits{bits}{'_zero_points' if zp else ''}",
                       helper.make_node("MatMulNBits", ["a"] + names, ["y"], domain=MS, K=k, N=n, bits=bits,
                                        block_size=block), [a_info], {"a": a}, names)
    consts["table"] = rng.integers(0, 256, (10, 16)).astype(np.uint8)
    consts["table_scale"] = rng.uniform(0.01, 0.1, (10, 2)).astype(np.float32)
    consts["table_zp"] = rng.integers(0, 256, (10, 1)).astype(np.uint8)
    indices = np.array([[1, 3], [9, 0]], np.int64)
    yield case("GatherBlockQuantized", helper.make_node("GatherBlockQuantized", ["table", "indices", "table_scale",
                                                                                "table_zp"], ["y"], domain=MS,
                                                        block_size=16, gather_axis=0, quantize_axis=1, bits=4),
               [helper.make_tensor_value_info("indices", TensorProto.INT64, indices.shape)], {"indices": indices},
               ["table", "table_scale", "table_zp"])
    for kind in ("int4", "uint4", "uint8"):  # a 4-bit tensor (default zero point 0) or 8-bit data (128)
        table = f"table_{kind}"
        if kind == "uint8":
            consts[table] = rng.integers(0, 256, (10, 32)).astype(np.uint8)
        else:
            low, high = (-8, 8) if kind == "int4" else (0, 16)
            consts[table] = helper.make_tensor(table, TensorProto.INT4 if kind == "int4" else TensorProto.UINT4,
                                               (10, 32), rng.integers(low, high, 320).tolist())
        yield case(f"GatherBlockQuantized_{kind}_default_zero_point",
                   helper.make_node("GatherBlockQuantized", [table, "indices", "table_scale"], ["y"], domain=MS,
                                    block_size=16, gather_axis=0, quantize_axis=1, bits=8 if kind == "uint8" else 4),
                   [helper.make_tensor_value_info("indices", TensorProto.INT64, indices.shape)], {"indices": indices},
                   [table, "table_scale"])
    k_odd, blocks_odd = 40, 3  # K not a multiple of the block, with a bias
    a_odd = rng.standard_normal((3, k_odd)).astype(np.float32)
    for bits in (4, 8):
        consts[f"B{bits}_odd"] = _pack(rng.integers(0, 2 ** bits, (n, blocks_odd, block)), bits)
        consts[f"s{bits}_odd"] = rng.uniform(0.01, 0.1, n * blocks_odd).astype(np.float32)
        consts[f"z{bits}_odd"] = _pack(rng.integers(0, 2 ** bits, (n, 4 if bits == 4 else 3)), bits).reshape(-1)
        names = [f"B{bits}_odd", f"s{bits}_odd", f"z{bits}_odd"]
        yield case(f"MatMulNBits{bits}_partial_block_bias",
                   helper.make_node("MatMulNBits", ["a_odd"] + names + ["", "bias"], ["y"], domain=MS, K=k_odd, N=n,
                                    bits=bits, block_size=block),
                   [helper.make_tensor_value_info("a_odd", TensorProto.FLOAT, a_odd.shape)], {"a_odd": a_odd},
                   names + ["bias"])
    weight = rng.integers(-127, 128, (k, n)).astype(np.int8)  # weight-only: int8 -> Cast -> Mul by scales
    consts["weight"], consts["scales"] = weight, consts["b_scale"]
    cast = helper.make_node("Cast", ["weight"], ["wf"], to=TensorProto.FLOAT)
    model = _model([cast, helper.make_node("Mul", ["wf", "scales"], ["w"]), helper.make_node("MatMul", ["a", "w"], ["y"])],
                   [a_info], [y], [numpy_helper.from_array(consts[c], c) for c in ("weight", "scales")], opset=17)
    yield "int8_Cast_Mul", model, {"a": a}


MS_CASES = {name: (model, feeds) for name, model, feeds in _ms_cases()}


@pytest.mark.parametrize("name", list(MS_CASES))
def test_dynamic_and_weight_only_ops_match_onnxruntime(backend, name):
    """Float outputs: ONNX Runtime's unfused kernels to float32 rounding; quantized weights are
    constants of the program (unpacked at load), no op of the program reads them packed."""
    model, feeds = MS_CASES[name]
    ref = _onnxruntime_unfused(model, feeds)
    got, program = _run(model, feeds, backend)
    np.testing.assert_allclose(got["y"], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    packed = {t.name for t in model.graph.initializer if t.data_type in (TensorProto.INT8, TensorProto.UINT8)}
    if "MatMulIntegerToFloat" not in name and "DynamicQuantize" not in name:
        assert not packed & set(program.constants)


def test_unsupported_quantization_forms_are_refused_naming_op_node_and_type():
    q8 = helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["y"], name="to_float8")
    model = _model([q8], [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4,))],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, (4,))],
                   [numpy_helper.from_array(np.array(0.5, np.float32), "scale"),
                    helper.make_tensor("zp", TensorProto.FLOAT8E4M3FN, (), [0.0])])
    with pytest.raises(gpumnn.UnsupportedOpError, match=r"'QuantizeLinear'.*'to_float8'.*float8_e4m3fn"):
        gpumnn.load(model).session(backend="cpu")
    attention = helper.make_node("QAttention", ["x"], ["y"], name="the_attention", domain=MS)
    model = _model([attention], [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4,))],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4,))], domains=[MS])
    with pytest.raises(gpumnn.UnsupportedOpError, match=r"'QAttention'.*'the_attention'.*com\.microsoft"):
        gpumnn.load(model)


# -- DynamicQuantizeLSTM (quantize_dynamic of an LSTM) ----------------------------------------------

LSTM_SEQ, LSTM_BATCH, LSTM_INPUT, LSTM_HIDDEN = 6, 2, 8, 16


def _float_lstm(direction: str, peephole_and_states: bool) -> onnx.ModelProto:
    """An LSTM with bias (and, if asked, initial states and peepholes) of constant weights."""
    d = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(11)
    h = LSTM_HIDDEN
    consts = {"W": rng.standard_normal((d, 4 * h, LSTM_INPUT)) * 0.4, "R": rng.standard_normal((d, 4 * h, h)) * 0.3,
              "B": rng.standard_normal((d, 8 * h)) * 0.1}
    inputs = ["x", "W", "R", "B"]
    if peephole_and_states:
        consts.update(initial_h=rng.standard_normal((d, LSTM_BATCH, h)) * 0.5,
                      initial_c=rng.standard_normal((d, LSTM_BATCH, h)) * 0.5, P=rng.standard_normal((d, 3 * h)) * 0.2)
        inputs += ["", "initial_h", "initial_c", "P"]
    node = helper.make_node("LSTM", inputs, ["y", "y_h", "y_c"], name="lstm", hidden_size=h, direction=direction)
    return _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, (LSTM_SEQ, LSTM_BATCH, LSTM_INPUT))],
                  [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "y_h", "y_c")],
                  [numpy_helper.from_array(a.astype(np.float32), n) for n, a in consts.items()], opset=17)


def _with_uint8_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """The int8 weights of a per-tensor DynamicQuantizeLSTM as uint8 with zero point 128 (the same
    values: quantize_dynamic writes int8 weights only)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for index, tensor in enumerate(model.graph.initializer):
        if tensor.name.endswith("_quantized"):
            values = numpy_helper.to_array(tensor).astype(np.int16) + 128
            model.graph.initializer[index].CopyFrom(numpy_helper.from_array(values.astype(np.uint8), tensor.name))
        elif tensor.name.endswith("_zero_point"):
            zero = np.full(numpy_helper.to_array(tensor).shape, 128, np.uint8)
            model.graph.initializer[index].CopyFrom(numpy_helper.from_array(zero, tensor.name))
    return model


LSTM_CASES = {"bidirectional_per_tensor": ("bidirectional", False, False),
              "forward_per_channel_peephole_states": ("forward", True, True),
              "reverse_per_tensor_uint8_weights": ("reverse", False, False)}


@pytest.fixture(scope="module")
def quantized_lstms(tmp_path_factory):
    """name -> a DynamicQuantizeLSTM model written by quantize_dynamic."""
    import logging
    from onnxruntime.quantization import quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)
    folder = tmp_path_factory.mktemp("quantized_lstm")
    models = {}
    for name, (direction, per_channel, extras) in LSTM_CASES.items():
        onnx.save(_float_lstm(direction, extras), folder / f"{name}_float.onnx")
        quantize_dynamic(folder / f"{name}_float.onnx", folder / f"{name}.onnx", op_types_to_quantize=["LSTM"],
                         per_channel=per_channel)
        model = onnx.load(folder / f"{name}.onnx")
        assert [n.op_type for n in model.graph.node] == ["DynamicQuantizeLSTM"]
        models[name] = _with_uint8_weights(model) if "uint8" in name else model
    return models


@pytest.mark.parametrize("name", list(LSTM_CASES))
def test_dynamic_quantize_lstm_matches_onnxruntime(backend, quantized_lstms, name):
    """Y, Y_h and Y_c within 1e-5 of ONNX Runtime (one thread, unfused).

    The lowering quantizes X (once) and each direction's H_{t-1} (each step) to uint8 over its range,
    as ONNX Runtime does, and multiplies the integers exactly; what is left is float32 rounding in the
    scaling and the gates (about 1e-7 here). The bound is far below one quantization step of H
    (2/255): a lowering that kept X and H in float32 with the weights dequantized differs from
    ONNX Runtime by about 6e-3 on these models and fails it."""
    model = quantized_lstms[name]
    x = np.random.default_rng(5).standard_normal((LSTM_SEQ, LSTM_BATCH, LSTM_INPUT)).astype(np.float32)
    want = dict(zip(("y", "y_h", "y_c"), _onnxruntime_unfused_outputs(model, {"x": x})))
    got, program = _run(model, {"x": x}, backend)
    for key, ref in want.items():
        assert np.abs(got[key] - ref).max() <= 1e-5, key
    weights = {t.name for t in model.graph.initializer if t.name.endswith("_quantized")}
    assert not weights & set(program.constants)


# -- MatMulNBitsQuantizer (int4 weight-only) ---------------------------------------------------------

NBITS_K, NBITS_HIDDEN, NBITS_N, NBITS_BLOCK = 80, 96, 16, 32  # K = 2.5 blocks: the last block is partial


def _float_mlp() -> onnx.ModelProto:
    """MatMul -> Relu -> MatMul of constant weights (the MatMuls MatMulNBitsQuantizer quantizes)."""
    rng = np.random.default_rng(12)
    weights = {"w1": rng.standard_normal((NBITS_K, NBITS_HIDDEN)) * 0.2,
               "w2": rng.standard_normal((NBITS_HIDDEN, NBITS_N)) * 0.2}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, (3, NBITS_K))],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, (3, NBITS_N))],
                  [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()])


NBITS_CASES = [f"{fmt}_{'symmetric' if symmetric else 'asymmetric'}"
               for fmt in ("MatMulNBits", "QDQ") for symmetric in (False, True)]


@pytest.fixture(scope="module")
def nbits_quantized():
    """name -> the MLP quantized to int4 blocks of 32 by MatMulNBitsQuantizer, in its default
    (com.microsoft MatMulNBits) or its QDQ (blocked 4-bit DequantizeLinear -> MatMul) output."""
    import copy
    import logging

    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    models = {}
    for name in NBITS_CASES:
        fmt = QuantFormat.QOperator if name.startswith("MatMulNBits") else QuantFormat.QDQ
        quantizer = MatMulNBitsQuantizer(copy.deepcopy(_float_mlp()), bits=4, block_size=NBITS_BLOCK,
                                         is_symmetric=name.endswith("_symmetric"), quant_format=fmt)
        quantizer.process()  # rewrites the model it holds
        models[name] = quantizer.model.model
    return models


def _four_bit_weights(model: onnx.ModelProto) -> set[str]:
    """The initializers that hold the packed 4-bit weights: a MatMulNBits node's B (uint8 bytes of
    two values each), or an int4/uint4 tensor that a DequantizeLinear dequantizes."""
    nbits = {n.input[1] for n in model.graph.node if n.op_type == "MatMulNBits"}
    dequantized = {n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return {t.name for t in model.graph.initializer if t.name in nbits or
            (t.name in dequantized and t.data_type in (TensorProto.INT4, TensorProto.UINT4))}


@pytest.mark.parametrize("name", NBITS_CASES)
def test_matmul_nbits_quantized_model_matches_onnxruntime_unfused(backend, nbits_quantized, name):
    """Both MatMuls quantized to 4 bits (MatMulNBits, or a blocked 4-bit DequantizeLinear feeding a
    MatMul); the output within float32 rounding of ONNX Runtime's unfused path (the weights are the
    same dequantized values, so nothing is left but the sums' order); the packed weights are unpacked
    at load, so no op of the program reads them."""
    model = nbits_quantized[name]
    ops = [n.op_type for n in model.graph.node]
    if name.startswith("MatMulNBits"):
        assert ops == ["MatMulNBits", "Relu", "MatMulNBits"], ops
        for node in model.graph.node[::2]:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            assert (node.domain, attrs["bits"], attrs["block_size"]) == (MS, 4, NBITS_BLOCK), attrs
    else:
        assert ops == ["DequantizeLinear", "MatMul", "Relu", "DequantizeLinear", "MatMul"], ops
        for node in model.graph.node[::3]:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            assert (attrs["axis"], attrs["block_size"]) == (0, NBITS_BLOCK), attrs
    packed = _four_bit_weights(model)
    assert len(packed) == 2, packed
    if name.startswith("QDQ"):
        code = TensorProto.INT4 if name.endswith("_symmetric") else TensorProto.UINT4
        assert {t.data_type for t in model.graph.initializer if t.name in packed} == {code}
    x = np.random.default_rng(13).standard_normal((3, NBITS_K)).astype(np.float32)
    ref = _onnxruntime_unfused(model, {"x": x})
    float_ref = _onnxruntime_unfused(_float_mlp(), {"x": x})
    assert np.abs(ref - float_ref).max() > 1e-3  # the 4-bit weights moved the answer: the model is quantized
    got, program = _run(model, {"x": x}, backend)
    np.testing.assert_allclose(got["y"], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    assert not packed & set(program.constants)


def test_integer_convolution_is_exact_where_winograd_would_be_chosen(backend):
    """A 3x3 QLinearConv large enough that the cpu's scheme selection would choose Winograd: its
    integer-valued float32 sums must stay exact (an int32 accumulation), so the uint8 output equals
    the ONNX reference everywhere (Winograd's transforms round, and move some by one step)."""
    channels, size = 64, 28
    rng = np.random.default_rng(14)
    x = rng.integers(0, 256, (1, channels, size, size)).astype(np.uint8)
    # scales of powers of two: the requantization (accumulator * 2**-11) is exact, so only the
    # accumulation can move an output
    constants = {"x_scale": np.array(2.0 ** -6, np.float32), "x_zp": np.array(128, np.uint8),
                 "w": rng.integers(-127, 128, (channels, channels, 3, 3)).astype(np.int8),
                 "w_scale": np.full(channels, 2.0 ** -8, np.float32), "w_zp": np.zeros(channels, np.int8),
                 "y_scale": np.array(2.0 ** -3, np.float32), "y_zp": np.array(128, np.uint8)}
    node = helper.make_node("QLinearConv", ["x", "x_scale", "x_zp", "w", "w_scale", "w_zp", "y_scale", "y_zp"], ["y"],
                            name="qconv", pads=[1, 1, 1, 1])
    model = _model([node], [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape)],
                   [helper.make_tensor_value_info("y", TensorProto.UINT8, (1, channels, size, size))],
                   [numpy_helper.from_array(a, n) for n, a in constants.items()])
    ref = _reference(model, {"x": x})[0]
    assert ((ref > 0) & (ref < 255)).mean() > 0.5  # mostly unsaturated: a rounding difference shows
    got, _ = _run(model, {"x": x}, backend)
    np.testing.assert_array_equal(got["y"], ref)


# -- quantize_dynamic's MatMulInteger on the int8 kernel ----------------------------------------------

DYN_K, DYN_HIDDEN, DYN_N = 37, 45, 19  # off the kernel's 4-byte steps and 32-column tiles


def _float_mlp_with_bias(graph_outputs=("y",)) -> onnx.ModelProto:
    """MatMul -> Add -> Relu -> MatMul -> Add on x [2, 5, K]: rows of a batch, as a transformer's."""
    rng = np.random.default_rng(21)
    weights = {"w1": rng.standard_normal((DYN_K, DYN_HIDDEN)) * 0.2, "b1": rng.standard_normal(DYN_HIDDEN) * 0.1,
               "w2": rng.standard_normal((DYN_HIDDEN, DYN_N)) * 0.2, "b2": rng.standard_normal(DYN_N) * 0.1}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["p"]),
             helper.make_node("Add", ["p", "b2"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 5, DYN_K))],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 5, DYN_N))],
                  [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()], opset=17)


@pytest.fixture(scope="module")
def dynamic_mlps(tmp_path_factory):
    """per tensor / per column -> the MLP as quantize_dynamic writes it (int8 weights)."""
    import logging
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)
    folder = tmp_path_factory.mktemp("dynamic_mlp")
    onnx.save(_float_mlp_with_bias(), folder / "float.onnx")
    models = {}
    for per_channel in (False, True):
        name = "per_column" if per_channel else "per_tensor"
        quantize_dynamic(folder / "float.onnx", folder / f"{name}.onnx", per_channel=per_channel,
                         weight_type=QuantType.QInt8)
        models[name] = onnx.load(folder / f"{name}.onnx")
    return models


def _prequantized(program) -> list[int]:
    return [i for i, op in enumerate(program.ops) if isinstance(op, A.QuantizedMatMul) and op.prequantized]


@pytest.mark.parametrize("form", ["per_tensor", "per_column"])
def test_dynamic_matmul_integer_runs_on_the_int8_kernel(backend, dynamic_mlps, form):
    """Each MatMulInteger -> Cast -> Mul of quantize_dynamic becomes one prequantized QuantizedMatMul
    (no int32 product, Cast or scaling Mul left), run on the session's backend, and the output is ONNX Runtime's unfused one: the same float operations on the same
    integers, so bit for bit where the ops around agree exactly, and at most one step of the
    output's last rescaling (x_scale * weight_scale, bounded by the largest scale product) apart."""
    model = dynamic_mlps[form]
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulInteger") == 2 and ops.count("Cast") == 2 and "DynamicQuantizeLinear" in ops
    x = np.random.default_rng(8).standard_normal((2, 5, DYN_K)).astype(np.float32)
    ref = _onnxruntime_unfused(model, {"x": x})
    session = gpumnn.load(model).session(backend=backend, fallback=False)
    try:
        got = session.run({"x": x})["y"]
        program, placement = session.program, session.placement
    finally:
        session.close()
    fused = _prequantized(program)
    assert len(fused) == 2, [type(op).__name__ for op in program.ops]
    assert not any(isinstance(op, A.MatMul) for op in program.ops)
    assert all(placement.op_backends[i] == backend for i in fused)  # every backend has the int8 kernels
    # the last layer's input is a Relu output in [0, max]: x_scale = max / 255
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    weight_scale = max(float(np.max(v)) for n, v in constants.items() if n.startswith("w2") and "scale" in n)
    step = float(np.maximum(_onnxruntime_unfused_outputs(_with_output(model, "r"), {"x": x})[1], 0).max()) / 255
    assert np.abs(got - ref).max() <= step * weight_scale
    if backend == "cpu":  # every op around the products is the same float operation as ONNX Runtime's
        np.testing.assert_array_equal(got, ref)


def _with_output(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """``model`` with ``name`` (a float tensor of its graph) as a second output."""
    import copy

    extended = copy.deepcopy(model)
    extended.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    return extended


def test_matmul_integer_read_elsewhere_keeps_its_int32_product(dynamic_mlps):
    """Where the int32 product of a MatMulInteger is also a graph output, it is computed as it is
    (the unfused lowering) and the other one still fuses; both outputs equal ONNX Runtime's."""
    model = dynamic_mlps["per_tensor"]
    first = next(n for n in model.graph.node if n.op_type == "MatMulInteger")
    copy_model = _with_output(model, first.output[0])
    copy_model.graph.output[-1].type.tensor_type.elem_type = TensorProto.INT32
    x = np.random.default_rng(9).standard_normal((2, 5, DYN_K)).astype(np.float32)
    ref_y, ref_product = _onnxruntime_unfused_outputs(copy_model, {"x": x})
    got, program = _run(copy_model, {"x": x}, "cpu")
    assert len(_prequantized(program)) == 1
    np.testing.assert_array_equal(got[first.output[0]], ref_product)
    np.testing.assert_allclose(got["y"], ref_y, rtol=1e-5, atol=1e-5 * np.abs(ref_y).max())


def test_quantize_dynamic_transformer_runs_its_weight_products_on_the_int8_kernel(tmp_path):
    """The zoo's transformer encoder through quantize_dynamic: each product with a constant weight
    (q, k, v, out, fc1, fc2) is a prequantized QuantizedMatMul on the cpu, no MatMulInteger with a
    constant weight is left as a float MatMul, and the output stays ONNX Runtime's unfused one
    (relative L2 error below 1e-5: the attention's float ops differ in their last bits only)."""
    import logging
    from onnxruntime.quantization import quantize_dynamic

    from gpumnn import zoo

    logging.getLogger().setLevel(logging.ERROR)
    onnx.save(zoo.transformer_encoder(), tmp_path / "float.onnx")
    quantize_dynamic(tmp_path / "float.onnx", tmp_path / "dynamic.onnx")
    model = onnx.load(tmp_path / "dynamic.onnx")
    constants = {t.name for t in model.graph.initializer}
    weight_products = [n for n in model.graph.node if n.op_type == "MatMulInteger" and n.input[1] in constants]
    assert len(weight_products) == 6
    name = model.graph.input[0].name
    x = np.random.default_rng(4).standard_normal((1, 128, 256)).astype(np.float32)
    ref = _onnxruntime_unfused(model, {name: x})
    got, program = _run(model, {name: x}, "cpu")
    assert len(_prequantized(program)) == 6
    float_products = [op for op in program.ops if isinstance(op, A.MatMul)]
    assert all(op.source not in {n.name for n in weight_products} for op in float_products)
    got = next(iter(got.values()))
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5
