"""gpumnn.onnx_backend: the onnx.backend.base API (prepare, run_model, run_node, supports_device)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import gpumnn
from gpumnn.backends import probe
from gpumnn.onnx_backend import GpumnnBackend, backend_for


def _add_relu_model():
    nodes = [helper.make_node("Add", ["a", "b"], ["s"], name="add"), helper.make_node("Relu", ["s"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "add_relu", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ("n", 4)),
                                                  helper.make_tensor_value_info("b", TensorProto.FLOAT, (4,))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ("n", 4))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_prepare_runs_on_the_bound_backend_and_keeps_a_shape_set_per_shape(backend):
    rng = np.random.default_rng(3)
    b = rng.standard_normal(4).astype(np.float32)
    with backend_for(backend).prepare(_add_relu_model()) as rep:
        assert rep.backend == backend
        for n in (2, 5, 2):
            a = rng.standard_normal((n, 4)).astype(np.float32)
            (y,) = rep.run([a, b])
            np.testing.assert_allclose(y, np.maximum(a + b, 0), rtol=1e-6)
            assert rep.run({"a": a, "b": b}).y.shape == (n, 4)  # by name; outputs by name too
        session = rep.session
        assert session.backend == backend and len(session.shape_sets) == 2
    assert session.closed


def test_run_model_and_run_node(backend):
    cls = backend_for(backend)
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    (y,) = cls.run_node(helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.25), [x])
    np.testing.assert_allclose(y, np.where(x < 0, 0.25 * x, x), rtol=1e-6)
    (y,) = cls.run_node(helper.make_node("Softmax", ["x"], ["y"], axis=0), [x], opset_version=11)
    np.testing.assert_allclose(y, np.exp(x) / np.exp(x).sum(), rtol=1e-5)  # opset 11: the input as 2D from axis 0
    (y,) = cls.run_model(_add_relu_model(), [x, np.ones(4, np.float32)])
    np.testing.assert_allclose(y, np.maximum(x + 1, 0))


def test_devices_name_the_bound_backend_or_a_gpumnn_backend():
    assert GpumnnBackend.gpumnn_backend("CPU") == "cpu" and GpumnnBackend.gpumnn_backend("CPU:0") == "cpu"
    assert backend_for("vulkan").gpumnn_backend("CPU") == "vulkan"
    assert GpumnnBackend.gpumnn_backend("VULKAN") == "vulkan" and GpumnnBackend.gpumnn_backend("gl") == "gl"
    assert backend_for("gl") is backend_for("GL") and backend_for("cpu") is GpumnnBackend
    for name in ("cpu", "opencl", "vulkan", "gl", "cuda"):
        assert backend_for(name).supports_device("CPU") == (probe(name) is None)
    assert GpumnnBackend.supports_device("CUDA") == (probe("cuda") is None)
    assert not GpumnnBackend.supports_device("TPU")
    with pytest.raises(gpumnn.BackendUnavailableError, match="unknown device 'TPU'"):
        GpumnnBackend.prepare(_add_relu_model(), "TPU")
    with pytest.raises(gpumnn.UnknownBackendError, match="unknown backend 'metal'"):
        backend_for("metal")


def test_non_tensor_graph_values_are_refused():
    seq = helper.make_tensor_sequence_value_info("x", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "seq", [seq],
                              [helper.make_tensor_sequence_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert not GpumnnBackend.is_compatible(model)
    with pytest.raises(gpumnn.ModelError, match=r"\['x', 'y'\] are not tensors"):
        GpumnnBackend.prepare(model)


def _resize_by_input_scales_model():
    """Resize whose scales are a graph input, behind a Mul (the value a session needs is computed from it)."""
    nodes = [helper.make_node("Mul", ["s", "two"], ["scales"], name="double"),
             helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize", mode="nearest")]
    graph = helper.make_graph(nodes, "resize_scales_input",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 1, 2, 3)),
                               helper.make_tensor_value_info("s", TensorProto.FLOAT, (4,))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [helper.make_tensor("two", TensorProto.FLOAT, (), [2.0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_shape_determining_graph_inputs_are_bound_per_run(backend):
    """The session binds a small graph input that decides a shape: its values key shape sets."""
    model = _resize_by_input_scales_model()
    x = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)
    with backend_for(backend).prepare(model) as rep:
        for factors in ((0.5, 0.5, 1, 1), (0.5, 0.5, 0.5, 1.5), (0.5, 0.5, 1, 1)):  # doubled: 2x2, then 1x3
            s = np.array(factors, np.float32)
            (y,) = rep.run([x, s])
            f = (2 * s).astype(int)
            np.testing.assert_array_equal(y, x.repeat(f[2], axis=2).repeat(f[3], axis=3))
        assert rep.session.bound_inputs == {"s"}
        assert (rep.session.stats["prepares"], rep.session.stats["cache_hits"]) == (2, 1)


def test_large_inputs_are_not_bound(backend):
    """Only small inputs are bound (BIND_LIMIT elements): a large one stays refused by name."""
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")
    graph = helper.make_graph([node], "reshape_big_shape",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3)),
                               helper.make_tensor_value_info("shape", TensorProto.INT64, (2000,))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with backend_for(backend).prepare(model) as rep, pytest.raises(gpumnn.errors.DataDependentError, match="reshape"):
        rep.run([np.zeros((2, 3), np.float32), np.ones(2000, np.int64)])


def test_shape_sets_are_bounded():
    """A model fed ever new input shapes keeps at most MAX_SHAPE_SETS shape sets, closing the oldest."""
    from gpumnn import onnx_backend

    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with onnx_backend.prepare(model) as rep:
        for n in range(1, onnx_backend.MAX_SHAPE_SETS + 3):
            x = np.linspace(-1, 1, n, dtype=np.float32)
            np.testing.assert_array_equal(rep.run([x])[0], np.maximum(x, 0))
        assert rep.session.stats["cached"] == onnx_backend.MAX_SHAPE_SETS
        assert rep.session.stats["evictions"] == 2
