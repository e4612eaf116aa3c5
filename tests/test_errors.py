"""Bad input gets a clear error that names the problem, and the session survives it."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import gpumnn
from gpumnn import zoo


def _tiny(op_type="Relu", domain="", shape=(1, 3, 4, 4)):
    node = helper.make_node(op_type, ["x"], ["y"], name="the_node", domain=domain)
    graph = helper.make_graph([node], "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def test_malformed_file_raises_model_error(tmp_path):
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"\x08\x07this is not a protobuf\xff\xff")
    with pytest.raises(gpumnn.ModelError, match="broken.onnx"):
        gpumnn.load(path)


def test_missing_file_raises_model_error(tmp_path):
    with pytest.raises(gpumnn.ModelError, match="does not exist"):
        gpumnn.load(tmp_path / "nope.onnx")


def test_unsupported_op_names_op_node_and_supported_set():
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["y"], name="the_node")
    graph = helper.make_graph([node], "nms", [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, (1, 5, 4)),
                                              helper.make_tensor_value_info("scores", TensorProto.FLOAT, (1, 1, 5))],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, (None, 3))])
    with pytest.raises(gpumnn.UnsupportedOpError) as info:
        gpumnn.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    message = str(info.value)
    assert "NonMaxSuppression" in message and "the_node" in message and "Conv" in message
    assert info.value.op_type == "NonMaxSuppression" and info.value.node_name == "the_node"


def test_custom_domain_is_unsupported():
    with pytest.raises(gpumnn.UnsupportedOpError, match="com.example"):
        gpumnn.load(_tiny("Relu", domain="com.example"))


def test_unsupported_attribute_value_is_named():
    node = helper.make_node("Pad", ["x", "p"], ["y"], name="wrap_pad", mode="wrap")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 1, 4, 4))],
                              [helper.make_empty_tensor_value_info("y")],
                              [onnx.numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "p")])
    net = gpumnn.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9))
    with pytest.raises(gpumnn.UnsupportedOpError, match="wrap_pad.*wrap"):
        net.session()


def test_training_mode_dropout_is_refused():
    node = helper.make_node("Dropout", ["x", "ratio", "training"], ["y"], name="the_dropout")
    graph = helper.make_graph([node], "dropout", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 3))],
                              [onnx.numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
                               onnx.numpy_helper.from_array(np.array(True), "training")])
    net = gpumnn.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    with pytest.raises(gpumnn.UnsupportedOpError, match="the_dropout.*training mode"):
        net.session()


def test_out_of_range_opset_is_a_model_error():
    model = _tiny()
    model.opset_import[0].version = 6  # opsets 7-10 are converted at load (tests/test_opsets.py)
    with pytest.raises(gpumnn.ModelError, match="opset 6"):
        gpumnn.load(model)


def _bug(*args, **kwargs):
    raise KeyError("a bug of gpumnn's")


def _assert_internal(info, where: str) -> None:
    """An InternalError, not a ModelError (a refusal), that says it is a bug, asks for a report,
    names where it happened and keeps its cause."""
    assert not isinstance(info.value, gpumnn.ModelError)
    message = str(info.value)
    assert "bug in gpumnn" in message and "report" in message and where in message, message
    assert isinstance(info.value.__cause__, KeyError)


def test_a_bug_in_a_lowering_is_an_internal_error(monkeypatch):
    from gpumnn.geometry import registry
    registry.supported_ops()
    monkeypatch.setitem(registry.LOWERINGS, "Relu", _bug)
    net = gpumnn.load(_tiny())
    with pytest.raises(gpumnn.InternalError) as info:
        net.session(fallback=False)
    _assert_internal(info, "'the_node' (Relu)")


def test_a_bug_in_an_optimisation_pass_is_an_internal_error(monkeypatch):
    from gpumnn.frontend import optimize
    monkeypatch.setattr(optimize, "fuse_gelu", _bug)
    with pytest.raises(gpumnn.InternalError) as info:
        gpumnn.load(_tiny())
    _assert_internal(info, "optimising the model (pass _bug)")


def test_a_bug_in_constant_folding_is_not_a_node_left_unfolded(monkeypatch):
    """Folding skips nodes that cannot fold (their refusal comes at lowering); a bug must not be skipped."""
    from gpumnn.geometry import registry
    registry.supported_ops()
    monkeypatch.setitem(registry.LOWERINGS, "Relu", _bug)
    model = _tiny()
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((1, 3, 4, 4), np.float32), "x"))
    with pytest.raises(gpumnn.InternalError) as info:
        gpumnn.load(model)
    _assert_internal(info, "lowering node 'the_node' (Relu)")


def test_a_bug_in_the_import_is_an_internal_error(monkeypatch):
    from gpumnn import net
    monkeypatch.setattr(net, "import_onnx", _bug)
    with pytest.raises(gpumnn.InternalError) as info:
        gpumnn.load(_tiny())
    _assert_internal(info, "reading the model")


@pytest.fixture(scope="module")
def session():
    return gpumnn.load(zoo.build("squeezenet1_1")).session()


def test_wrong_input_name(session):
    x = np.zeros((1, 3, 224, 224), np.float32)
    with pytest.raises(gpumnn.InputError, match="unknown.*'image'.*missing.*'input'"):
        session.run({"image": x})


def test_wrong_input_shape_says_what_was_expected(session):
    x = np.random.default_rng(0).standard_normal((1, 3, 200, 224)).astype(np.float32)
    with pytest.raises(gpumnn.InputError, match=r"\[1, 3, 200, 224\].*\[1, 3, 224, 224\]"):
        session.run({"input": x})


def test_wrong_input_dtype_says_what_was_expected(session):
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224))
    with pytest.raises(gpumnn.InputError, match="float64.*expected float32"):
        session.run({"input": x})


def test_session_still_works_after_bad_input(session):
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    with pytest.raises(gpumnn.InputError):
        session.run({"input": x[:, :2]})
    assert np.all(np.isfinite(session.run({"input": x})["output"]))


def test_symbolic_input_shapes_come_from_the_first_run_or_input_shapes():
    net = gpumnn.load(_tiny(shape=("batch", 3, 4, 4)))
    lazy = net.session()  # nothing to prepare until a run says what "batch" is
    with pytest.raises(gpumnn.InputError, match=r"input_shapes=.*gpumnn run MODEL --shape x=N,3,4,4"):
        lazy.report()
    x = np.random.default_rng(2).standard_normal((3, 3, 4, 4)).astype(np.float32)
    np.testing.assert_array_equal(lazy.run({"x": x})["y"], np.maximum(x, 0))
    assert lazy.input_shapes == {"x": (3, 3, 4, 4)}
    sess = net.session(input_shapes={"x": (2, 3, 4, 4)})
    x = np.random.default_rng(2).standard_normal((2, 3, 4, 4)).astype(np.float32)
    np.testing.assert_array_equal(sess.run({"x": x})["y"], np.maximum(x, 0))


def test_input_shapes_must_agree_with_the_model():
    with pytest.raises(gpumnn.InputError, match="does not match"):
        gpumnn.load(_tiny()).session(input_shapes={"x": (1, 3, 5, 4)})


def test_unknown_backend_without_fallback_refuses():
    with pytest.raises(gpumnn.UnknownBackendError, match="unknown backend 'metal'"):
        gpumnn.load(_tiny()).session(backend="metal", fallback=False)


@pytest.mark.parametrize("spec", ["vulkn", ["cpu", "vulkn"], "a pin"])
def test_misspelt_backend_raises_with_the_known_names(spec, recwarn):
    """A name gpumnn does not know is an error wherever it stands, fallback or not: no cpu run."""
    net = gpumnn.load(_tiny())
    kwargs = {"backend": "cpu", "placement": {"y": "vulkn"}} if spec == "a pin" else {"backend": spec}
    with pytest.raises(gpumnn.UnknownBackendError) as info:
        net.session(**kwargs)
    assert isinstance(info.value, ValueError) and not isinstance(info.value, gpumnn.BackendUnavailableError)
    assert "unknown backend 'vulkn' (did you mean 'vulkan'?)" in str(info.value)
    assert "known backends: cpu, opencl, vulkan, gl, cuda" in str(info.value)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    with pytest.raises(gpumnn.UnknownBackendError, match="known backends"):
        gpumnn.probe("vulkn")


def test_unavailable_backend_with_fallback_warns_and_runs_on_cpu(monkeypatch):
    """A known backend that cannot start here still falls back to the cpu, with a warning."""
    from gpumnn.backends import REGISTRY
    monkeypatch.setitem(REGISTRY, "opencl", ("gpumnn.backends.no_such_api", "NoSuchBackend"))
    with pytest.warns(RuntimeWarning, match="opencl"):
        sess = gpumnn.load(_tiny()).session(backend="opencl")
    assert sess.backend == "cpu" and "opencl" in sess.fallback_reason
    with pytest.raises(gpumnn.BackendUnavailableError, match="opencl"):
        gpumnn.load(_tiny()).session(backend="opencl", fallback=False)
