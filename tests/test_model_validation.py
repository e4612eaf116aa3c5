"""Invalid models are refused at load, by the ONNX checker, with a ModelError naming the node.

Each invalid model is also offered to ONNX Runtime: it refuses the same ones, except a graph
output declared with a shape that contradicts inference, which ONNX Runtime only warns about
("Falling back to lenient merge") and gpumnn refuses, since the declaration is wrong.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from gpumnn import zoo
from gpumnn.frontend import checker as onnx_check
from gpumnn.frontend.checker import INLINE_ELEMENTS, weightless_view

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _vi(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def _big_int_weight(name: str) -> onnx.TensorProto:
    """An int64 initializer large enough to be left out of the checked view (declared as an input)."""
    return numpy_helper.from_array(np.ones((2, INLINE_ELEMENTS), np.int64), name)


# name -> (model, node named in the error, words of the reason, whether ONNX Runtime refuses it too)
INVALID = {
    "flatten_axis_out_of_range": (
        _model([helper.make_node("Flatten", ["x"], ["y"], name="flat", axis=-99)], [_vi("x", (2, 3, 4))],
               [helper.make_empty_tensor_value_info("y")]),
        "flat", "axis", True),
    "input_never_produced": (
        _model([helper.make_node("Add", ["x", "ghost"], ["y"], name="add_ghost")], [_vi("x", (2, 3))],
               [_vi("y", (2, 3))]),
        "add_ghost", "ghost", True),
    "type_mismatch": (
        _model([helper.make_node("Add", ["x", "c"], ["y"], name="mixed_add")], [_vi("x", (2, 3))], [_vi("y", (2, 3))],
               [numpy_helper.from_array(np.ones((2, 3), np.int64), "c")]),
        "mixed_add", "int64", True),
    "type_mismatch_of_a_large_weight": (
        _model([helper.make_node("Add", ["x", "w"], ["y"], name="big_add")], [_vi("x", (2, INLINE_ELEMENTS))],
               [_vi("y", (2, INLINE_ELEMENTS))], [_big_int_weight("w")]),
        "big_add", "int64", True),
    "output_rank_contradicts_inference": (
        _model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [_vi("x", (2, 3, 4))], [_vi("y", (2, 12))]),
        "relu", "rank", False),
    "duplicate_output_name": (
        _model([helper.make_node("Relu", ["x"], ["y"], name="first"),
                helper.make_node("Sigmoid", ["x"], ["y"], name="second")], [_vi("x", (2, 3))], [_vi("y", (2, 3))]),
        "second", "'y'", True),
    "unknown_attribute": (
        _model([helper.make_node("Relu", ["x"], ["y"], name="relu_attr", alpha=1.0)], [_vi("x", (2, 3))],
               [_vi("y", (2, 3))]),
        "relu_attr", "alpha", True),
    "too_few_inputs": (
        _model([helper.make_node("Add", ["x"], ["y"], name="lonely_add")], [_vi("x", (2, 3))], [_vi("y", (2, 3))]),
        "lonely_add", "input size", True),
    "cycle": (
        _model([helper.make_node("Add", ["x", "b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2")],
               [_vi("x", (2, 3))], [_vi("b", (2, 3))]),
        "n1", "topologically", True),
    "unnamed_node": (
        _model([helper.make_node("Gather", ["x", "i"], ["y"], axis=5)], [_vi("x", (2, 3))],
               [helper.make_empty_tensor_value_info("y")], [numpy_helper.from_array(np.array([0], np.int64), "i")]),
        "Gather_0", "axis", True),
}


def _ort_refuses(model: onnx.ModelProto) -> bool:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the lenient-merge warnings are expected here
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception:
        return True
    return False


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_model_is_refused_naming_the_node(case):
    model, node, reason, ort_refuses = INVALID[case]
    with pytest.raises(gpumnn.ModelError) as info:
        gpumnn.load(model)
    message = str(info.value)
    assert f"node {node!r}" in message and reason in message, message
    assert _ort_refuses(model) == ort_refuses


def test_invalid_model_is_refused_from_a_file_and_from_bytes(tmp_path):
    model = INVALID["flatten_axis_out_of_range"][0]
    path = tmp_path / "flatten.onnx"
    onnx.save(model, path)
    for source in (path, str(path), model.SerializeToString()):
        with pytest.raises(gpumnn.ModelError, match=r"node 'flat' \(Flatten\).*axis"):
            gpumnn.load(source)


def test_truncated_weight_is_refused_naming_it():
    """The checked view leaves large weights out; reading them still finds a byte count that lies."""
    weight = numpy_helper.from_array(np.ones((2, INLINE_ELEMENTS), np.float32), "w")
    weight.raw_data = weight.raw_data[:-4]
    model = _model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [_vi("x", (2, INLINE_ELEMENTS))],
                   [_vi("y", (2, INLINE_ELEMENTS))], [weight])
    assert len(weightless_view(model).graph.initializer) == 0
    with pytest.raises(gpumnn.ModelError, match="'w'"):
        gpumnn.load(model)
    assert _ort_refuses(model)


def test_valid_model_with_undeclared_outputs_loads_and_runs(backend):
    """The checker wants typed outputs; ONNX Runtime does not, and neither do we (inference fills them)."""
    weight = np.random.default_rng(0).standard_normal((3, INLINE_ELEMENTS // 2)).astype(np.float32)
    model = _model([helper.make_node("Flatten", ["x"], ["f"], name="flat", axis=-1),
                    helper.make_node("MatMul", ["f", "w"], ["y"], name="mm")],
                   [_vi("x", (2, 2, 3))], [helper.make_empty_tensor_value_info("y")],
                   [numpy_helper.from_array(weight, "w")])
    x = np.random.default_rng(1).standard_normal((2, 2, 3)).astype(np.float32)
    got = gpumnn.load(model).session(backend=backend, fallback=False).run({"x": x})["y"]
    np.testing.assert_allclose(got, x.reshape(4, 3) @ weight, rtol=1e-4, atol=1e-4)


def test_model_too_large_for_the_checker_loads_unchecked_with_a_warning(monkeypatch):
    """Weights in Constant nodes stay in the checked view; past protobuf's 2 GiB the checker cannot run."""
    value = np.arange(2 * INLINE_ELEMENTS, dtype=np.float32).reshape(2, INLINE_ELEMENTS)
    model = _model([helper.make_node("Constant", [], ["c"], name="weights", value=numpy_helper.from_array(value)),
                    helper.make_node("Add", ["x", "c"], ["y"], name="add")],
                   [_vi("x", (2, INLINE_ELEMENTS))], [_vi("y", (2, INLINE_ELEMENTS))])
    monkeypatch.setattr(onnx_check, "PROTOBUF_LIMIT", model.ByteSize() // 2)  # stand-in for 2 GiB
    with pytest.warns(RuntimeWarning, match="2 GiB.*unchecked"):
        net = gpumnn.load(model)
    x = np.ones((2, INLINE_ELEMENTS), np.float32)
    np.testing.assert_array_equal(net.session().run({"x": x})["y"], x + value)


@pytest.mark.parametrize("name", zoo.names())
def test_every_zoo_model_passes_the_checker(name):
    model = zoo.build(name)
    net = gpumnn.load(model)
    assert net.graph.nodes
