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


def _gelu_graph(form: str) -> "onnx.ModelProto":
    """MatMul + bias, then the exact GELU as exporters write it: ``half_last`` (PyTorch: x/sqrt2,
    Erf, +1, *x, *0.5), ``half_first`` (0.5x times 1 + erf(x * 1/sqrt2)), or ``wrong`` (a
    constant off by 1%: not a GELU, left alone)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b")]
    scalars = {"sqrt2": 2 ** 0.5 * (1.01 if form == "wrong" else 1), "rsqrt2": 2 ** -0.5, "one": 1.0, "half": 0.5}
    inits += [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in scalars.items()]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"), helper.make_node("Add", ["m", "b"], ["h"], name="bias")]
    if form == "half_first":
        nodes += [helper.make_node("Mul", ["h", "rsqrt2"], ["s"], name="scale"),
                  helper.make_node("Erf", ["s"], ["e"], name="erf"),
                  helper.make_node("Add", ["one", "e"], ["p"], name="plus_one"),
                  helper.make_node("Mul", ["h", "half"], ["hh"], name="half"),
                  helper.make_node("Mul", ["hh", "p"], ["y"], name="product")]
    else:
        nodes += [helper.make_node("Div", ["h", "sqrt2"], ["s"], name="scale"),
                  helper.make_node("Erf", ["s"], ["e"], name="erf"),
                  helper.make_node("Add", ["e", "one"], ["p"], name="plus_one"),
                  helper.make_node("Mul", ["h", "p"], ["q"], name="product"),
                  helper.make_node("Mul", ["q", "half"], ["y"], name="half")]
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 16))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4, 32))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("form", ["half_last", "half_first", "wrong"])
def test_exported_gelu_fuses_into_the_matmul(form, backend):
    """The five-node GELU becomes one activation of the MatMul (one atomic op), and agrees with
    ONNX Runtime; a near miss is not fused."""
    import onnxruntime as ort
    from conftest import rel_l2, require_backend
    require_backend(backend)
    model = _gelu_graph(form)
    net = gpumnn.load(model)
    assert net.optimizations["gelu_fused"] == (0 if form == "wrong" else 1)
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    sess = net.session(backend=backend)
    if form != "wrong":
        assert [op.kind for op in sess.program.ops] == ["matmul"]
        assert sess.program.ops[0].activation == ("gelu", ())
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert rel_l2(sess.run({"x": x})["y"], ref) < 1e-4


def _silu_graph(form: str) -> "onnx.ModelProto":
    """Conv, then SiLU as YOLO exports it: Sigmoid of the convolution's output times that output
    (``sigmoid_first``: Mul(s, c); ``conv_first``: Mul(c, s)), or ``two_readers``: the sigmoid also
    a graph output (left alone)."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")]
    product = ["s", "c"] if form == "sigmoid_first" else ["c", "s"]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sigmoid"),
             helper.make_node("Mul", product, ["y"], name="product")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8, 10, 10))]
    if form == "two_readers":
        outputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, (1, 8, 10, 10)))
    graph = helper.make_graph(nodes, "silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 4, 10, 10))],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("form", ["sigmoid_first", "conv_first", "two_readers"])
def test_exported_silu_fuses_into_the_convolution(form, backend):
    """Sigmoid and Mul become one ``silu`` activation of the Conv (one atomic op), and agree with
    ONNX Runtime; a sigmoid read elsewhere too is not fused."""
    import onnxruntime as ort
    from conftest import rel_l2, require_backend
    require_backend(backend)
    model = _silu_graph(form)
    net = gpumnn.load(model)
    assert net.optimizations["silu_fused"] == (0 if form == "two_readers" else 1)
    x = np.random.default_rng(3).standard_normal((1, 4, 10, 10)).astype(np.float32) * 4
    sess = net.session(backend=backend)
    if form != "two_readers":
        assert [op.kind for op in sess.program.ops] == ["conv2d"]
        assert sess.program.ops[0].activation == ("silu", ())
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert rel_l2(sess.run({"x": x})["y"], ref) < 1e-4


def _pool_then_pointwise(pool: dict, in_channels: int, out_channels: int, bias: bool, relu: bool,
                         second_reader: bool = False) -> "onnx.ModelProto":
    """AveragePool(**pool) -> Conv 1x1 (in_channels -> out_channels) [-> Relu], Inception's pool
    branch; ``second_reader``: the pool's output is a graph output too."""
    rng = np.random.default_rng(in_channels + out_channels)
    inits = [numpy_helper.from_array(rng.standard_normal((out_channels, in_channels, 1, 1)).astype(np.float32), "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(out_channels).astype(np.float32), "b"))
    nodes = [helper.make_node("AveragePool", ["x"], ["p"], name="pool", **pool),
             helper.make_node("Conv", ["p", "w"] + (["b"] if bias else []), ["c" if relu else "y"], name="conv")]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"], name="relu"))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if second_reader:
        outputs.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "pool_branch", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                  (2, in_channels, 9, 11))],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


SAME_3x3 = {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}
POINTWISE_AFTER_POOL = {  # id: (pool attributes, in channels, out channels, bias, relu, second reader, swapped)
    "inception-counted-padding": ({**SAME_3x3, "count_include_pad": 1}, 24, 8, True, True, False, True),
    "uncounted-padding-no-bias": (SAME_3x3, 24, 8, False, True, False, True),
    "same-upper-5x4-no-activation": ({"kernel_shape": [5, 4], "auto_pad": "SAME_UPPER"}, 16, 4, True, False, False, True),
    "no-bias-no-activation": ({"kernel_shape": [3, 3], "pads": [2, 0, 0, 2]}, 16, 4, False, False, False, True),
    "more-channels-out": (SAME_3x3, 8, 24, True, True, False, False),
    "stride-2": ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, 24, 8, True, True, False, False),
    "pool-read-twice": (SAME_3x3, 24, 8, True, True, True, False),
}


@pytest.mark.parametrize("case", list(POINTWISE_AFTER_POOL), ids=list(POINTWISE_AFTER_POOL))
def test_average_pool_moves_after_a_narrowing_pointwise_convolution(case, backend):
    """conv1x1(pool(x)) = pool(conv1x1(x)) + bias: the pool runs on the convolution's fewer
    channels, the bias and activation after it as an Add; not where the convolution widens, the
    pool strides, or another op reads the pool. Agrees with ONNX Runtime on every backend."""
    import onnxruntime as ort
    from conftest import rel_l2, require_backend
    require_backend(backend)
    pool, cin, cout, bias, relu, second, swapped = POINTWISE_AFTER_POOL[case]
    model = _pool_then_pointwise(pool, cin, cout, bias, relu, second)
    net = gpumnn.load(model)
    assert net.optimizations["pools_after_pointwise"] == int(swapped)
    sess = net.session(backend=backend)
    kinds = [op.kind for op in sess.program.ops]
    if swapped:
        assert kinds[:2] == ["conv2d", "pool2d"] and kinds[2:] == (["binary"] if bias or relu else []), kinds
    x = np.random.default_rng(3).standard_normal((2, cin, 9, 11)).astype(np.float32)
    refs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = sess.run({"x": x})
    for name, ref in zip(["y", "p"], refs):
        assert rel_l2(got[name], ref) < 1e-4, name


# -- reduced index maps (affine axes held at length 1) cut the regions the full maps cut ------------

REORDERS = [
    lambda a: [np.transpose(a[0], (0, 2, 3, 1))],
    lambda a: [np.concatenate([a[0], a[1]], axis=1)],
    lambda a: [np.concatenate([a[1], a[0], a[1]], axis=1)[:, 1:6]],
    lambda a: [np.pad(a[0], ((0, 0), (1, 1), (2, 0), (0, 0)), constant_values=-1)],
    lambda a: [np.pad(a[0], ((0, 0), (0, 0), (1, 2), (2, 1)), mode="reflect")],
    lambda a: [np.pad(a[0], ((1, 0), (0, 2), (0, 0), (1, 1)), mode="edge")],
    lambda a: [np.broadcast_to(a[1][:, :1], (2, 5, 4, 5))],
    lambda a: [a[0][:, ::-1, 1:3, ::2]],
    lambda a: [np.take(a[0], [2, 0, 2], axis=2)],
    lambda a: [a[0].reshape(2, 3, 2, 2, 5).transpose(0, 1, 3, 2, 4).reshape(2, 3, 4, 5)],
]


@pytest.mark.parametrize("build", REORDERS)
def test_reduced_maps_cut_the_regions_of_the_full_maps(build):
    shapes = [(2, 3, 4, 5), (2, 2, 4, 5)]
    srcs = build([np.full(s, k, dtype=np.int32) for k, s in enumerate(shapes)])[0]
    idxs = build([np.arange(np.prod(s)).reshape(s) for s in shapes])[0]
    full = IndexMap(np.ascontiguousarray(srcs, dtype=np.int32), np.ascontiguousarray(idxs, dtype=np.int64))
    reduced = full.reduced()
    assert reduced.shape == full.shape and reduced.idx.size < full.idx.size  # some axis is affine in each
    assert regions_of(reduced) == regions_of(full)
    widened = reduced.full()
    assert np.array_equal(widened.src, full.src)
    assert np.array_equal(np.where(full.src >= 0, widened.idx, 0), np.where(full.src >= 0, full.idx, 0))


def _random_reorders(seed: int):
    """A chain of random reorder ops (Transpose, Slice, Concat, Split, Pad, Gather) on one input."""
    rng = np.random.default_rng(seed)
    rank = int(rng.integers(2, 5))
    shape = [int(d) for d in rng.integers(1, 6, size=rank)]
    x_shape = tuple(shape)
    nodes, inits, current = [], [], "x"

    def const(name, values):
        inits.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    for k in range(4):
        kind = rng.choice(["Transpose", "Slice", "Concat", "Split", "Pad", "Gather"])
        out, axis = f"t{k}", int(rng.integers(0, rank))
        if kind == "Transpose":
            perm = [int(p) for p in rng.permutation(rank)]
            nodes.append(helper.make_node("Transpose", [current], [out], perm=perm))
            shape = [shape[p] for p in perm]
        elif kind == "Slice":
            step = int(rng.choice([1, 1, 2, -1]))
            start, end = sorted(int(v) for v in rng.integers(0, shape[axis] + 1, size=2))
            if step < 0:
                start, end = shape[axis] - 1 - start, -shape[axis] - 1 + start - (end - start)
            nodes.append(helper.make_node("Slice", [current, const(f"s{k}", [start]), const(f"e{k}", [end]),
                                                    const(f"a{k}", [axis]), const(f"p{k}", [step])], [out]))
            shape[axis] = len(range(*slice(start, end, step).indices(shape[axis])))
        elif kind == "Concat":
            nodes.append(helper.make_node("Concat", [current, "x" if list(x_shape) == shape else current, current],
                                          [out], axis=axis))
            shape[axis] *= 3
        elif kind == "Split":
            first = int(rng.integers(0, shape[axis] + 1))
            nodes.append(helper.make_node("Split", [current, const(f"sp{k}", [first, shape[axis] - first])],
                                          [out, f"rest{k}"], axis=axis))
            shape[axis] = first
        elif kind == "Pad":
            mode = str(rng.choice(["constant", "edge", "reflect"]))
            most = max(shape[axis] - 1, 0) if mode == "reflect" else 2
            pads = [0] * (2 * rank)
            pads[axis], pads[axis + rank] = int(rng.integers(0, most + 1)), int(rng.integers(0, most + 1))
            if mode != "constant" and shape[axis] == 0:
                mode = "constant"
            nodes.append(helper.make_node("Pad", [current, const(f"pd{k}", pads)], [out], mode=mode))
            shape[axis] += pads[axis] + pads[axis + rank]
        else:
            if shape[axis] == 0:
                continue
            picks = [int(v) for v in rng.integers(-shape[axis], shape[axis], size=int(rng.integers(1, 4)))]
            nodes.append(helper.make_node("Gather", [current, const(f"g{k}", picks)], [out], axis=axis))
            shape[axis] = len(picks)
        current = out
    nodes.append(helper.make_node("Neg", [current], ["y"]))  # a compute op, so the last Raster is kept
    graph = helper.make_graph(nodes, f"reorders{seed}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_empty_tensor_value_info("y")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), x_shape


@pytest.mark.parametrize("seed", range(40))
def test_held_axes_and_reduced_maps_lower_as_full_maps_do(seed, monkeypatch):
    """Random reorder chains lower to the very program that full index maps give (the code
    before maps were held reduced), and that program computes what NumPy does."""
    from gpumnn.geometry import regions
    from gpumnn.geometry import emit
    from test_lowering_digest import case_digest
    model, x_shape = _random_reorders(seed)
    fast = case_digest(model)
    assert not fast.startswith("error:"), fast
    with monkeypatch.context() as patch:
        patch.setattr(emit, "_held_axes", lambda shapes, kept: {})
        patch.setattr(regions.IndexMap, "reduced", lambda self: self)
        assert case_digest(model) == fast
    x = np.random.default_rng(seed).standard_normal(x_shape).astype(np.float32)
    with gpumnn.load(model).session() as sess:
        got = sess.run({"x": x})["y"]
    from conftest import onnxruntime_session
    want = onnxruntime_session(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
