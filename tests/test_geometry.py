"""Geometry lowering: index maps compress into few regions that reproduce them exactly."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from gpumnn import atomic as A
from gpumnn.geometry.regions import IndexMap, regions_of


def _apply(regions, sources, out_size, fill=0.0):
    out = np.full(out_size, fill, dtype=np.float64)
    for r in regions:
        for i in np.ndindex(*r.size):
            out[r.dst_offset + int(np.dot(i, r.dst_strides))] = sources[r.src][r.src_offset + int(np.dot(i, r.src_strides))]
    return out


@pytest.mark.parametrize("build, max_regions", [
    (lambda a: [np.transpose(a[0], (0, 2, 3, 1))], 1),
    (lambda a: [np.concatenate([a[0], a[1]], axis=1)], 2),
    (lambda a: [np.pad(a[0], ((0, 0), (1, 1), (2, 0), (0, 0)), constant_values=-1)], 1),
    (lambda a: [np.pad(a[0], ((0, 0), (0, 0), (1, 2), (2, 1)), mode="reflect")], 12),
    (lambda a: [np.broadcast_to(a[1][:, :1], (2, 5, 4, 5))], 1),
    (lambda a: [a[0][:, ::-1, 1:3, ::2]], 1),
])
def test_regions_reproduce_the_index_map(build, max_regions):
    shapes = [(2, 3, 4, 5), (2, 2, 4, 5)]
    srcs = build([np.full(s, k, dtype=np.int32) for k, s in enumerate(shapes)])[0]
    idxs = build([np.arange(np.prod(s)).reshape(s) for s in shapes])[0]
    regions = regions_of(IndexMap(np.ascontiguousarray(srcs), np.ascontiguousarray(idxs)))
    data = [np.random.default_rng(k).standard_normal(np.prod(s)) for k, s in enumerate(shapes)]
    expected = np.where(srcs >= 0, np.choose(np.maximum(srcs, 0), [np.take(d, np.minimum(idxs, d.size - 1)) for d in data]), 0.0)
    assert np.array_equal(_apply(regions, data, srcs.size), expected.reshape(-1))
    assert len(regions) <= max_regions
    assert all(len(r.size) == A.RANK for r in regions)


def _chain_model():
    nodes = [helper.make_node("Transpose", ["x"], ["t1"], name="t1", perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t1", "shape"], ["r"], name="r"),
             helper.make_node("Transpose", ["r"], ["t2"], name="t2", perm=[1, 0]),
             helper.make_node("Slice", ["t2", "st", "en"], ["y"], name="s")]
    inits = [numpy_helper.from_array(np.array([6, -1], np.int64), "shape"),
             numpy_helper.from_array(np.array([1], np.int64), "st"), numpy_helper.from_array(np.array([7], np.int64), "en")]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3, 4, 5))],
                              [helper.make_empty_tensor_value_info("y")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_consecutive_reorders_fuse_into_one_raster():
    sess = gpumnn.load(_chain_model()).session()
    assert [op.kind for op in sess.program.ops] == ["raster"]
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    ref = np.transpose(np.transpose(x, (0, 2, 1, 3)).reshape(6, -1), (1, 0))[1:7]
    np.testing.assert_array_equal(sess.run({"x": x})["y"], ref)


def test_reshape_and_flatten_are_free_views():
    nodes = [helper.make_node("Flatten", ["x"], ["f"], name="f"), helper.make_node("Relu", ["f"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "views", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3, 4))],
                              [helper.make_empty_tensor_value_info("y")])
    sess = gpumnn.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)).session()
    assert [op.kind for op in sess.program.ops] == ["unary"]


def test_load_time_optimisations_fold_and_fuse():
    from gpumnn import zoo
    net = gpumnn.load(zoo.build("resnet18"))
    assert net.optimizations["batchnorm_folded"] == 20
    assert net.optimizations["activations_fused"] >= 17
    assert not any(n.op_type in ("BatchNormalization", "Relu") for n in net.graph.nodes)
