"""Bugs the fuzz corpus found, each as the smallest model that showed it, on every backend."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from conftest import onnxruntime_session, rel_l2
from gpumnn.backends import backend_class


def _model(nodes, inputs, inits=(), outputs=("y",), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "regression",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_empty_tensor_value_info(o) for o in outputs],
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _matches_onnxruntime(model: onnx.ModelProto, feeds, backend: str) -> None:
    ref = onnxruntime_session(model).run(None, feeds)
    got = gpumnn.load(model).session(backend=backend, fallback=False).run(feeds)
    for name, want in zip([o.name for o in model.graph.output], ref):
        assert got[name].shape == want.shape
        assert rel_l2(got[name], want) < 1e-5


def test_refused_session_closes_its_backends(backend, monkeypatch):
    """A model refused during pre-inference kept its device alive (~40 MiB of address space on Vulkan)."""
    closed = []
    cls = backend_class(backend)
    original = cls.close
    monkeypatch.setattr(cls, "close", lambda self: (closed.append(self), original(self))[1])
    bad_gather = helper.make_node("Gather", ["x", "i"], ["y"], "gather", axis=0)
    net = gpumnn.load(_model([bad_gather], [("x", (2, 3))], [("i", np.array([5], np.int64))]))
    with pytest.raises(gpumnn.GpumnnError, match="gather"):
        net.session(backend=backend, fallback=False)
    assert closed, "the session's backends were not closed"


@pytest.mark.parametrize("op", ["Softmax", "Sub", "ReduceMean"])
def test_empty_tensors_compute_nothing(backend, op):
    """Ops on zero-element tensors: OpenCL's padded CPU-kernel grids wrote past the pool (heap corruption)."""
    attrs = {"axis": 1} if op == "Softmax" else {"axes": [2, 3]} if op == "ReduceMean" else {}
    inputs = ["x", "b"] if op == "Sub" else ["x"]
    model = _model([helper.make_node(op, inputs, ["y"], "op", **attrs)], [("x", (0, 7, 6, 6))],
                   [("b", np.ones((1, 7, 1, 1), np.float32))] if op == "Sub" else [])
    sess = gpumnn.load(model).session(backend=backend, fallback=False, input_shapes={"x": (0, 7, 6, 6)})
    out = sess.run({"x": np.zeros((0, 7, 6, 6), np.float32)})["y"]
    assert out.size == 0 and out.shape[0] == 0


def test_clip_with_min_above_max_follows_onnx(backend):
    """ONNX: min(max(x, lo), hi), so every output is hi; OpenCL's clip returned lo."""
    model = _model([helper.make_node("Clip", ["x", "lo", "hi"], ["y"], "clip")], [("x", (2, 8))],
                   [("lo", np.array(0.7, np.float32)), ("hi", np.array(0.5, np.float32))])
    _matches_onnxruntime(model, {"x": np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)}, backend)


def test_tile_with_many_repeats_is_a_few_regions(backend):
    """Tile's periodic index map became one Raster region per period (41k regions, 30 s to prepare)."""
    model = _model([helper.make_node("Tile", ["x", "r"], ["y"], "tile")], [("x", (1, 3, 2, 2))],
                   [("r", np.array([1, 5000, 1, 2], np.int64))])
    sess = gpumnn.load(model).session(backend=backend, fallback=False)
    rasters = [op for op in sess.program.ops if op.kind == "raster"]
    assert len(rasters) == 1 and len(rasters[0].regions) <= 4
    x = np.arange(12, dtype=np.float32).reshape(1, 3, 2, 2)
    np.testing.assert_array_equal(sess.run({"x": x})["y"], np.tile(x, (1, 5000, 1, 2)))


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2], "strides": [2, 2]}, {"kernel_shape": [2, 2], "strides": [0, 1]},
    {"kernel_shape": [2, 2], "pads": [1, 1]}, {"strides": [1, 1]},
], ids=["kernel-exceeds-input", "zero-stride", "two-pads-for-2d", "no-kernel-shape"])
def test_bad_pooling_windows_name_the_node(attrs):
    """These raised ZeroDivisionError/IndexError, or ran (a 2x2 window on a width of 1 read only padding).

    The ONNX checker at load refuses some of them first; either way the error names the node.
    """
    model = _model([helper.make_node("MaxPool", ["x"], ["y"], "the_pool", **attrs)], [("x", (1, 3, 8, 1))])
    with pytest.raises(gpumnn.ModelError, match="the_pool"):
        gpumnn.load(model).session()


def test_unknown_element_type_is_a_model_error():
    model = _model([helper.make_node("Relu", ["x"], ["y"], "relu")], [("x", (2, 2))])
    model.graph.input[0].type.tensor_type.elem_type = 999
    with pytest.raises(gpumnn.ModelError, match="999"):
        gpumnn.load(model)


def test_batchnorm_with_mismatched_parameters_names_the_node():
    """fold_batchnorm raised a raw ValueError at load when BN's parameters did not fit the conv."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], "conv"),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["y"], "bn")]
    inits = [("w", rng.standard_normal((4, 3, 1, 1)).astype(np.float32)), ("g", np.ones(4, np.float32)),
             ("b", np.zeros(4, np.float32)), ("m", np.zeros(3, np.float32)), ("v", np.ones(4, np.float32))]
    with pytest.raises(gpumnn.ModelError, match="'bn'"):  # at load once the ONNX checker runs there
        gpumnn.load(_model(nodes, [("x", (1, 3, 4, 4))], inits)).session()


def _refused_by_onnxruntime() -> list[tuple[str, onnx.ModelProto]]:
    n = helper.make_node
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    no_outputs = _model([n("Relu", ["x"], ["y"], "relu")], [("x", (1, 4))])
    del no_outputs.graph.output[:]
    return [
        ("flatten-axis-beyond-rank", _model([n("Flatten", ["x"], ["y"], "flat", axis=-99)], [("x", (1, 3, 2, 2))])),
        ("flatten-huge-axis", _model([n("Flatten", ["x"], ["y"], "flat", axis=2**40)], [("x", (1, 3, 2, 2))])),
        ("slice-2d-starts", _model([n("Slice", ["x", "s", "e"], ["y"], "slice")], [("x", (4, 6))],
                                   [("s", np.array([[1]], np.int64)), ("e", i64(3))])),
        ("pool-pads-not-below-kernel", _model([n("AveragePool", ["x"], ["y"], "pool", kernel_shape=[1, 3],
                                                 pads=[1, 1, 1, 1])], [("x", (1, 2, 6, 6))])),
        ("resize-exclude-outside", _model([n("Resize", ["x", "", "s"], ["y"], "resize", mode="linear",
                                             exclude_outside=1)], [("x", (1, 1, 4, 4))],
                                          [("s", np.array([1, 1, 2, 2], np.float32))])),
        ("no-graph-outputs", no_outputs),
    ]


@pytest.mark.parametrize("name, model", _refused_by_onnxruntime(), ids=[c[0] for c in _refused_by_onnxruntime()])
def test_refused_like_onnxruntime(name, model):
    """Models the fuzz corpus found gpumnn running although ONNX Runtime refuses them."""
    feeds = {"x": np.ones([d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim], np.float32)}
    with pytest.raises(Exception):
        onnxruntime_session(model).run(None, feeds)
    with pytest.raises(gpumnn.ModelError):  # UnsupportedOpError is a ModelError
        gpumnn.load(model).session().run(feeds)
