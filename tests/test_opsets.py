"""Opsets 7 to the newest onnx defines: older models converted at load (weights kept out of the
converter), newer ones accepted op by op, and clear errors at either end and where an op changed."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from conftest import onnxruntime_session, rel_l2
from gpumnn.frontend import opsets as onnx_opsets
from gpumnn.frontend.checker import INLINE_ELEMENTS


def _opset9_model(weights_as_inputs: bool = False) -> onnx.ModelProto:
    """A small CNN written as an opset-9 exporter would: Upsample-9, Slice-1 and Pad-2 attributes,
    BatchNormalization-9, MaxPool without ceil_mode; the Gemm weight is larger than INLINE_ELEMENTS.
    ``weights_as_inputs`` declares every initializer as a graph input too (IR 3 exporters)."""
    rng = np.random.default_rng(9)
    weights = {
        "w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
        "gamma": rng.uniform(0.5, 1.5, 8).astype(np.float32), "beta": rng.standard_normal(8).astype(np.float32),
        "mean": rng.standard_normal(8).astype(np.float32) * 0.1, "var": rng.uniform(0.5, 1.5, 8).astype(np.float32),
        "scales": np.array([1, 1, 2, 2], np.float32),
        "fc_w": rng.standard_normal((8 * 5 * 5, 40)).astype(np.float32) * 0.05,  # 8000 elements
        "fc_b": rng.standard_normal(40).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["bn"], name="bn"),
        helper.make_node("Relu", ["bn"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Upsample", ["p", "scales"], ["u"], name="upsample", mode="nearest"),
        helper.make_node("Slice", ["u"], ["s"], name="slice", axes=[2, 3], starts=[1, 1], ends=[9, 9]),
        helper.make_node("Pad", ["s"], ["pd"], name="pad", pads=[0, 0, 0, 0, 0, 0, 2, 2], mode="constant", value=0.5),
        helper.make_node("MaxPool", ["pd"], ["q"], name="pool2", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["q"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], name="fc", alpha=0.5, beta=1.0),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 10, 10))]
    if weights_as_inputs:
        inputs += [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in weights.items()]
    graph = helper.make_graph(nodes, "opset9_cnn", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 40))],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=3 if weights_as_inputs else 4)


@pytest.mark.parametrize("weights_as_inputs", [False, True], ids=["ir4", "ir3-weights-as-inputs"])
def test_opset9_model_converted_at_load_matches_onnxruntime(backend, weights_as_inputs):
    model = _opset9_model(weights_as_inputs)
    onnx.checker.check_model(model, full_check=True)
    x = np.random.default_rng(1).standard_normal((1, 3, 10, 10)).astype(np.float32)
    ref = onnxruntime_session(model).run(None, {"x": x})[0]
    net = gpumnn.load(model)
    assert net.graph.opset == onnx_opsets.MIN_IMPLEMENTED
    assert [v.name for v in net.inputs] == ["x"]
    got = net.session(backend=backend, fallback=False).run({"x": x})["y"]
    assert rel_l2(got, ref) < 1e-5


def test_conversion_keeps_large_weights_out_of_the_converter(monkeypatch):
    model = _opset9_model(weights_as_inputs=True)
    seen = []
    convert = onnx.version_converter.convert_version

    def spy(view, target):
        seen.append(max(int(np.prod(t.dims)) for t in view.graph.initializer))
        return convert(view, target)
    monkeypatch.setattr(onnx_opsets.version_converter, "convert_version", spy)
    converted = onnx_opsets.upgrade(model)
    assert seen and seen[0] <= INLINE_ELEMENTS  # fc_w (8000 elements) stayed out
    assert onnx_opsets.default_opset(converted) == onnx_opsets.MIN_IMPLEMENTED
    weights = {t.name: numpy_helper.to_array(t) for t in converted.graph.initializer}
    np.testing.assert_array_equal(weights["fc_w"], numpy_helper.to_array(
        next(t for t in model.graph.initializer if t.name == "fc_w")))
    # the view's extra graph inputs are gone again; the IR-3 declarations of the weights stay
    assert [i.name for i in converted.graph.input] == [i.name for i in model.graph.input]
    assert onnx_opsets.default_opset(model) == 9  # the caller's model is left as it was


def test_converter_failure_is_a_model_error_naming_the_opsets(monkeypatch):
    def refuse(view, target):
        raise RuntimeError("adapter_lookup: No Adapter For Upsample")
    monkeypatch.setattr(onnx_opsets.version_converter, "convert_version", refuse)
    with pytest.raises(gpumnn.ModelError, match=r"opset-9 model could not be converted to opset 11.*No Adapter"):
        gpumnn.load(_opset9_model())


def _one_node(op_type: str, opset: int, shape=(1, 4, 4, 4), **attrs) -> onnx.ModelProto:
    node = helper.make_node(op_type, ["x"], ["y"], name="the_node", **attrs)
    graph = helper.make_graph([node], "one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_empty_tensor_value_info("y")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


@pytest.mark.parametrize("opset", [onnx_opsets.MIN_OPSET - 1, onnx_opsets.MAX_OPSET + 1])
def test_opsets_outside_the_range_are_refused_saying_why(opset):
    with pytest.raises(gpumnn.ModelError, match=rf"opset {opset} is outside the supported range "
                       rf"{onnx_opsets.MIN_OPSET}\.\.{onnx_opsets.MAX_OPSET}: .*(version_converter|installed onnx)"):
        gpumnn.load(_one_node("Relu", opset))


def test_newer_opset_with_type_only_changes_runs(backend):
    """Conv, MaxPool and Softplus changed at opset 22 only by bfloat16: an opset-22 model runs as at 21."""
    rng = np.random.default_rng(22)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Softplus", ["c"], ["s"], name="softplus"),
             helper.make_node("MaxPool", ["s"], ["y"], name="pool", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)]
    graph = helper.make_graph(nodes, "g22", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 8, 8))],
                              [helper.make_empty_tensor_value_info("y")],
                              [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)], ir_version=10)
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    ref = onnxruntime_session(model).run(None, {"x": x})[0]
    got = gpumnn.load(model).session(backend=backend, fallback=False).run({"x": x})["y"]
    assert rel_l2(got, ref) < 1e-5


def test_newer_op_version_that_changed_is_refused_naming_op_node_opset_and_change(monkeypatch):
    """Without its review, Cast-24 (new attribute round_mode) is a change gpumnn has not checked."""
    monkeypatch.delitem(onnx_opsets.REVIEWED, ("Cast", 24))
    with pytest.raises(gpumnn.UnsupportedOpError) as info:
        gpumnn.load(_one_node("Cast", 24, to=TensorProto.FLOAT))
    message = str(info.value)
    for part in ("'Cast'", "'the_node'", "opset 24", "Cast-24", "round_mode"):
        assert part in message


def test_changed_op_gpumnn_does_not_implement_is_named_as_unimplemented():
    """BitShift changed at opset 28, but what a user needs to hear is that gpumnn has no BitShift."""
    node = helper.make_node("BitShift", ["x", "shift"], ["y"], name="the_node", direction="LEFT")
    graph = helper.make_graph([node], "q", [helper.make_tensor_value_info("x", TensorProto.UINT32, (4,))],
                              [helper.make_empty_tensor_value_info("y")],
                              [numpy_helper.from_array(np.array(1, np.uint32), "shift")])
    with pytest.raises(gpumnn.UnsupportedOpError, match="gpumnn has no implementation of this op"):
        gpumnn.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 28)], ir_version=11))


def test_reviewed_change_refuses_attribute_values_it_does_not_cover(monkeypatch):
    monkeypatch.setitem(onnx_opsets.REVIEWED, ("SpaceToDepth", 28),
                        onnx_opsets.Reviewed("only the default order, for this test", allowed={"mode": ("DCR",)}))
    assert gpumnn.load(_one_node("SpaceToDepth", 28, blocksize=2))
    with pytest.raises(gpumnn.UnsupportedOpError, match=r"SpaceToDepth-28 added attribute 'mode'.*not 'CRD'"):
        gpumnn.load(_one_node("SpaceToDepth", 28, blocksize=2, mode="CRD"))


def test_every_op_version_after_the_implemented_opsets_is_type_only_or_reviewed():
    """Each supported op's versions 22..MAX_OPSET: added types only, or in REVIEWED (which names nothing else)."""
    unreviewed = {}
    for op in gpumnn.supported_ops():
        ours = onnx.defs.get_schema(op, onnx_opsets.MAX_IMPLEMENTED).since_version
        theirs = onnx.defs.get_schema(op, onnx_opsets.MAX_OPSET).since_version
        for version in onnx_opsets._versions_between(op, ours, theirs):
            changes = onnx_opsets.schema_differences(onnx.defs.get_schema(op, version - 1),
                                                     onnx.defs.get_schema(op, version))
            if changes and (op, version) not in onnx_opsets.REVIEWED:
                unreviewed[f"{op}-{version}"] = changes
    assert not unreviewed
    for op, version in onnx_opsets.REVIEWED:
        assert onnx.defs.get_schema(op, version).since_version == version, f"{op}-{version} is no op version"
