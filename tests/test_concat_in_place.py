"""Concatenations written in place (issue 29, ``scheduler.concat``): where a Concat only lays
whole tensors side by side in contiguous ranges, their producers write into the output and no
Raster copies them; elsewhere the Raster stays. Checked on every backend against ONNX Runtime."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from conftest import onnxruntime_session, rel_l2, require_backend
from gpumnn import atomic as A, zoo

TOLERANCE = 1e-4


def _conv(rng, inits, nodes, x: str, ic: int, oc: int, kernel: int, out: str) -> str:
    w = f"{out}_w"
    inits.append(numpy_helper.from_array((rng.standard_normal((oc, ic, kernel, kernel)) * 0.3).astype(np.float32), w))
    nodes.append(helper.make_node("Conv", [x, w], [f"{out}_c"], pads=[kernel // 2] * 4))
    nodes.append(helper.make_node("Relu", [f"{out}_c"], [out]))
    return out


def _model(case: str):
    """A fire-module-like block: a squeeze convolution, then branches that ``case`` concatenates
    (8x8 planes: every channel's offset keeps each backend's alignment, 256 bytes at most)."""
    rng = np.random.default_rng(3)
    batch = 2 if case == "batch2" else 1
    inits, nodes, outputs = [], [], ["y"]
    s = _conv(rng, inits, nodes, "x", 4, 6, 1, "s")
    e1 = _conv(rng, inits, nodes, s, 6, 5, 1, "e1")
    e3 = _conv(rng, inits, nodes, s, 6, 7, 3, "e3")
    channels = 12
    if case in ("fire", "batch2"):
        nodes.append(helper.make_node("Concat", [e1, e3], ["cat"], axis=1))
    elif case == "graph_input":
        nodes.append(helper.make_node("Concat", ["x", e3], ["cat"], axis=1))
        channels = 11
    elif case == "last_axis":
        nodes.append(helper.make_node("Concat", [e1, e1], ["cat0"], axis=3))
        nodes.append(helper.make_node("Reshape", ["cat0", "shape"], ["cat"]))
        inits.append(numpy_helper.from_array(np.array([1, 10, 8, 8], np.int64), "shape"))
        channels = 10
    elif case == "twice":
        nodes.append(helper.make_node("Concat", [e3, e3], ["cat"], axis=1))
        channels = 14
    elif case == "nested":
        e5 = _conv(rng, inits, nodes, s, 6, 3, 3, "e5")
        nodes.append(helper.make_node("Concat", [e1, e3], ["inner"], axis=1))
        nodes.append(helper.make_node("Concat", [e5, "inner"], ["cat"], axis=1))
        channels = 15
    elif case == "reread":  # an input read again after the concatenation, and an input that is a graph output
        nodes.append(helper.make_node("Concat", [e1, e3], ["cat"], axis=1))
        nodes.append(helper.make_node("Sigmoid", [e1], ["again"]))
        outputs += ["again", e3]
    elif case == "views":  # inputs flattened (free views) before a concatenation along their one axis
        nodes.append(helper.make_node("Flatten", [e1], ["f1"], axis=1))
        nodes.append(helper.make_node("Flatten", [e3], ["f3"], axis=1))
        nodes.append(helper.make_node("Concat", ["f1", "f3"], ["flat"], axis=1))
        nodes.append(helper.make_node("Reshape", ["flat", "shape"], ["cat"]))
        inits.append(numpy_helper.from_array(np.array([1, 12, 8, 8], np.int64), "shape"))
    _conv(rng, inits, nodes, "cat", channels, 4, 3, "y")
    graph = helper.make_graph(nodes, case, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4, 8, 8])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


#: case -> whether every concatenation is written in place
CASES = {"fire": True, "nested": True, "reread": True, "views": True,
         "graph_input": False, "last_axis": False, "twice": False, "batch2": False}


def _check(model, sess) -> None:
    feeds = {"x": np.random.default_rng(11).standard_normal(
        [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)}
    refs = onnxruntime_session(model).run(None, feeds)
    for _ in range(2):  # a second run: nothing a first run left behind is read
        got = sess.run(feeds)
        for info, ref in zip(model.graph.output, refs):
            assert rel_l2(got[info.name], ref) < TOLERANCE, info.name


@pytest.mark.parametrize("case", list(CASES))
def test_concatenations_in_place_where_the_layout_allows(backend, case):
    require_backend(backend)
    model = _model(case)
    sess = gpumnn.load(model).session(backend=backend, fallback=False)
    rasters = [op for op in sess.program.ops if isinstance(op, A.Raster)]
    if CASES[case]:
        assert not rasters, [op.source for op in rasters]
        assert sess.program.view_offsets
    else:
        assert rasters
    _check(model, sess)


def test_squeezenet_concatenates_without_copies(backend):
    """SqueezeNet's eight fire-module concatenations cost no launch and no copied byte."""
    require_backend(backend)
    sess = gpumnn.load(zoo.build("squeezenet1_1")).session(backend=backend, fallback=False)
    assert not [op for op in sess.program.ops if isinstance(op, A.Raster)]
    assert sess.shape_set(None).launch_line().endswith("Raster copies: 0 bytes in 0 ops")


def test_producers_on_another_backend_keep_the_copy():
    """A branch pinned to another backend would write a storage the Raster's backend holds: the
    Raster stays, and the split run is still right."""
    require_backend("opencl")
    model = _model("fire")
    for i, node in enumerate(model.graph.node):
        node.name = node.name or f"n{i}_{node.op_type}"
    pins = {node.name: "cpu" for node in model.graph.node if node.output[0] == "e3_c"}
    pins.update({node.name: "opencl" for node in model.graph.node if node.output[0] in ("e1_c", "cat")})
    sess = gpumnn.load(model).session(backend=["cpu", "opencl"], placement=pins)
    assert [op for op in sess.program.ops if isinstance(op, A.Raster)]
    _check(model, sess)


@pytest.mark.parametrize("backend", ["opencl", "vulkan", "gl"])
def test_gpu_kernel_family_writes_into_slices(backend):
    """The GPU kernel family (``kernels="tiled"``) writes its convolutions into their slices too."""
    require_backend(backend)
    model = _model("nested")
    sess = gpumnn.load(model).session(backend=backend, fallback=False, kernels="tiled")
    assert not [op for op in sess.program.ops if isinstance(op, A.Raster)]
    _check(model, sess)
