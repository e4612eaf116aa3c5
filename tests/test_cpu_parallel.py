"""The cpu backend's native parallel regions (``cpu_parallel``): GEMM blocks through BLAS with their
epilogue, and the compiled depthwise and pooling loops on channel spans, against ONNX Runtime.

Each case runs three ways (regions, the compiled loops on the backend's Python threads, NumPy's
kernels; ``test_cpu_jit.WAYS``) on fresh random inputs and weights. The cases cover the layouts the
regions turn into BLAS arguments: transposed operands (Gemm's transA/transB, MatMul of a
transposed view), a bias that is a scalar, a row, a column or a matrix, alpha and beta, batched
products with shared or per-batch weights, grouped 1x1 convolutions and batches of images.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from conftest import onnxruntime_session, rel_l2, require_tool
from op_cases import model_proto
from gpumnn.backends.cpu import engines as cpu_engines, jit as cpu_jit, parallel as cpu_parallel
from test_cpu_jit import _both_ways_match_onnxruntime, _conv_model, _pool_model


def _gemm_model(m, k, n, trans_a, trans_b, alpha, beta, bias_shape, activation, rng):
    a = helper.make_tensor_value_info("x", TensorProto.FLOAT, [k, m] if trans_a else [m, k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    weight = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    inits = [numpy_helper.from_array(weight, "W")]
    inputs = ["x", "W"]
    if bias_shape is not None:
        inits.append(numpy_helper.from_array(rng.standard_normal(bias_shape).astype(np.float32), "C"))
        inputs.append("C")
    nodes = [helper.make_node("Gemm", inputs, ["g" if activation else "y"], transA=trans_a, transB=trans_b,
                              alpha=alpha, beta=beta)]
    if activation:
        nodes.append(helper.make_node(activation, ["g"], ["y"]))
    graph = helper.make_graph(nodes, "gemm", [a], [y], inits)
    return model_proto(graph, 13), ([k, m] if trans_a else [m, k])


# (m, k, n, transA, transB, alpha, beta, bias shape, activation)
GEMMS = [
    (128, 256, 512, 0, 0, 1.0, 1.0, (512,), "Relu"),        # a row bias, a clamp in the region
    (100, 64, 300, 0, 1, 0.5, 2.0, (100, 1), None),         # a column bias, alpha and beta, B transposed
    (96, 200, 130, 1, 0, 1.0, 0.5, (96, 130), "Sigmoid"),   # a full bias, A transposed, an activation after
    (300, 96, 40, 1, 1, 2.0, 1.0, (), None),                # a scalar bias, both transposed, split by rows
    (1, 512, 1000, 0, 1, 1.0, 1.0, (1000,), None),          # a classifier: one row, on the register tile
    (1, 300, 70, 0, 0, 1.0, 1.0, (), "Relu"),               # ... B as stored, a scalar bias, a partial panel
    (1, 96, 37, 0, 1, 1.0, 1.0, (1, 37), "Sigmoid"),        # ... an activation after
    (1, 64, 40, 0, 1, 0.5, 1.0, (40,), None),               # ... alpha: BLAS
    (96, 48, 64, 0, 0, 1.0, 1.0, None, "Relu"),             # no bias, small: one block
    (100, 192, 768, 0, 1, 1.0, 1.0, (768,), None),          # B stored [N, K], past the row tiles: a copy laid [K, N]
]


@pytest.mark.parametrize("case", GEMMS, ids=[f"gemm{c[0]}x{c[1]}x{c[2]}t{c[3]}{c[4]}" for c in GEMMS])
def test_gemm_in_regions(case, fresh_rng):
    rng = fresh_rng
    model, shape = _gemm_model(*case, rng)
    _both_ways_match_onnxruntime(model, tuple(shape), rng)


# products past SMALL_PRODUCT_MACS but below REGION_MIN_MACS: one block, on the calling thread
ONE_BLOCK_GEMMS = [
    (96, 48, 64, 0, 0, 1.0, 1.0, None, "Relu"),             # no bias, a clamp in the loop
    (96, 40, 60, 0, 1, 1.0, 0.5, (96, 1), "Sigmoid"),       # a column bias scaled by beta, an activation after
    (50, 70, 90, 1, 0, 2.0, 1.0, (90,), "Tanh"),            # A transposed, alpha, a row bias
]


@pytest.mark.parametrize("case", ONE_BLOCK_GEMMS, ids=[f"gemm{c[0]}x{c[1]}x{c[2]}" for c in ONE_BLOCK_GEMMS])
def test_gemm_of_one_block_runs_without_a_region(case, fresh_rng, monkeypatch):
    """A product too small to share between threads is one block, run as a loop on the calling
    thread (``cpu_parallel.alone``: no region entered); the outputs stay ONNX Runtime's."""
    m, k, n = case[:3]
    assert cpu_engines.SMALL_PRODUCT_MACS <= m * k * n < cpu_engines.REGION_MIN_MACS
    alone, plain_loop = [], cpu_parallel.alone
    monkeypatch.setattr(cpu_parallel, "alone", lambda region: alone.append(region) or plain_loop(region))
    model, shape = _gemm_model(*case, fresh_rng)
    _both_ways_match_onnxruntime(model, tuple(shape), fresh_rng)
    assert cpu_parallel.gemm_blocks in alone


# few rows by constant weights on the register tile, the weights packed once (engines.ROW_TILES_MAX_ROWS):
# (m, k, n, transB, bias shape, activation, the bias a graph input)
ROW_TILES = [
    (40, 192, 768, 1, (768,), None, False),      # an LSTM's projection: W stored [N, K], two blocks
    (13, 420, 200, 0, (200,), "Sigmoid", False),  # partial row and weight panels, an activation in the region
    (6, 1000, 200, 0, None, "Tanh", False),       # one row panel, no bias, an activation after
    (64, 128, 130, 0, (130,), "Relu", True),      # the most rows; a bias known at run time, a clamp
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", ROW_TILES, ids=[f"rows{c[0]}x{c[1]}x{c[2]}{c[5] or ''}" for c in ROW_TILES])
def test_few_rows_by_constant_weights_on_the_row_tiles(case, threads, fresh_rng):
    """A product of at most ROW_TILES_MAX_ROWS rows by constant weights runs on the row tiles
    (``cpu_parallel.row_tiles``), which the report names; its outputs are ONNX Runtime's."""
    require_tool("numba", cpu_jit.MISSING)
    require_tool("regions", cpu_parallel.available()[1])
    m, k, n, trans_b, bias_shape, activation, bias_input = case
    assert m <= cpu_engines.ROW_TILES_MAX_ROWS and m * k * n >= cpu_engines.REGION_MIN_MACS
    rng = fresh_rng
    weight = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    inits, inputs = [numpy_helper.from_array(weight, "W")], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])]
    feed = {"x": rng.standard_normal((m, k)).astype(np.float32)}
    names = ["x", "W"]
    if bias_shape is not None:
        bias = rng.standard_normal(bias_shape).astype(np.float32)
        if bias_input:
            inputs.append(helper.make_tensor_value_info("C", TensorProto.FLOAT, list(bias_shape)))
            feed["C"] = bias
        else:
            inits.append(numpy_helper.from_array(bias, "C"))
        names.append("C")
    nodes = [helper.make_node("Gemm", names, ["g" if activation else "y"], transB=trans_b)]
    if activation:
        nodes.append(helper.make_node(activation, ["g"], ["y"]))
    graph = helper.make_graph(nodes, "rows", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    model = model_proto(graph, 13)
    ref = onnxruntime_session(model).run(None, feed)[0]
    sess = gpumnn.load(model).session(backend="cpu", threads=threads)
    assert "row tiles" in sess.report(), sess.report()
    for _ in range(2):  # a run-time bias is read again on every run
        err = rel_l2(sess.run(feed)["y"], ref)
        assert err < 1e-5, f"relative L2 error {err:.2e}"
        if bias_input:
            feed["C"] = rng.standard_normal(bias_shape).astype(np.float32)
            ref = onnxruntime_session(model).run(None, feed)[0]


# (shape of x, shape of r, activation after the sum): x + r as one compiled pass where both are
# whole tensors of one shape, or one is a value per row of the other (a per-channel bias), and the
# activation a clamp; NumPy's calls elsewhere
SUMS = [
    ((1, 64, 56, 56), (1, 64, 56, 56), "Relu"),    # ResNet's residual: shared between the threads
    ((1, 8, 9, 9), (1, 8, 9, 9), None),            # small: one thread, no activation
    ((2, 16, 20, 20), (2, 16, 20, 20), "Relu"),    # a batch
    ((1, 64, 56, 56), (1, 64, 1, 1), "Relu"),      # a per-channel bias: a value per plane
    ((1, 32, 1, 1), (1, 32, 7, 9), None),          # ... on the left
    ((3, 16, 9, 9), (1, 16, 1, 1), "Relu"),        # ... over a batch: the values repeat per image
    ((6, 50), (6, 1), "Relu"),                     # a value per row of a matrix
    ((1, 64, 56, 56), (1, 1, 56, 56), "Relu"),     # broadcast over the channels: NumPy
    ((1, 64, 56, 56), (1, 64, 56, 56), "Sigmoid"), # not a clamp: NumPy
]


@pytest.mark.parametrize("case", SUMS, ids=[f"sum{'x'.join(map(str, c[1]))}{c[2] or ''}" for c in SUMS])
def test_residual_sums_in_regions(case, fresh_rng):
    x_shape, r_shape, activation = case
    rng = fresh_rng
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))
              for name, shape in (("x", x_shape), ("r", r_shape))]
    nodes = [helper.make_node("Add", ["x", "r"], ["s" if activation else "y"])]
    if activation:
        nodes.append(helper.make_node(activation, ["s"], ["y"]))
    graph = helper.make_graph(nodes, "sum", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    _both_ways_match_onnxruntime(model_proto(graph, 13), {"x": x_shape, "r": r_shape}, rng, names=("x", "r"))


# (shape of x, shape of s, activation after the product): x * s as one compiled pass where s is a
# value per row of x (squeeze-excitation's scale per channel), on one thread below
# cpu_engines.REGION_MIN_ELEMENTS; NumPy's call for whole tensors of one shape
PRODUCTS = [
    ((1, 576, 2, 6), (1, 576, 1, 1), None, True),      # MobileNet-v3's scale: one span on this thread
    ((1, 64, 56, 56), (1, 64, 1, 1), "Relu", True),    # shared between the threads, a clamp after
    ((1, 32, 1, 1), (1, 32, 7, 9), None, True),        # the scale on the left
    ((3, 16, 9, 9), (1, 16, 1, 1), None, True),        # over a batch: the values repeat per image
    ((1, 8, 9, 9), (1, 8, 9, 9), None, False),         # whole tensors: NumPy
]


@pytest.mark.parametrize("case", PRODUCTS, ids=[f"mul{'x'.join(map(str, c[1]))}{c[2] or ''}" for c in PRODUCTS])
def test_scales_per_row_in_regions(case, monkeypatch, fresh_rng):
    from gpumnn.backends.cpu import compiled as cpu_compiled
    x_shape, s_shape, activation, compiled = case
    made = []
    monkeypatch.setattr(cpu_compiled, "_row_sum_region",
                        lambda *a, real=cpu_compiled._row_sum_region, **k: made.append(k) or real(*a, **k))
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))
              for name, shape in (("x", x_shape), ("s", s_shape))]
    nodes = [helper.make_node("Mul", ["x", "s"], ["p" if activation else "y"])]
    if activation:
        nodes.append(helper.make_node(activation, ["p"], ["y"]))
    graph = helper.make_graph(nodes, "scale", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    _both_ways_match_onnxruntime(model_proto(graph, 13), {"x": x_shape, "s": s_shape}, rng=fresh_rng, names=("x", "s"))
    assert (made == [{"product": True}]) == compiled, made


# (node, input shape, attributes): softmax along the last axis, layer and instance normalisation,
# global pooling, a mean or maximum along the last axes; one span below cpu_engines.REGION_MIN_ELEMENTS and rows on both threads above it
ROWS = [
    ("Softmax", (4, 128, 128), {"axis": -1}),           # a transformer's attention scores: both threads
    ("Softmax", (3, 7), {"axis": 1}),                   # short rows, one span
    ("LogSoftmax", (2, 300, 129), {"axis": -1}),        # an odd row length past a vector's width
    ("Softmax", (1, 1000), {}),                         # a classifier's one row
    ("LayerNormalization", (128, 256), {"axis": -1}),   # the transformer's, with scale and bias
    ("LayerNormalization", (2, 3, 40, 50), {"axis": 2}),  # rows over the last two axes
    ("InstanceNormalization", (1, 16, 56, 56), {}),     # no affine step in the row kernel: a Binary after
    ("GlobalAveragePool", (2, 1000, 13, 13), {}),       # SqueezeNet's classifier planes, a batch of two
    ("GlobalAveragePool", (1, 5, 3, 3), {}),            # a few small planes: one span
    ("GlobalMaxPool", (1, 64, 7, 7), {}),               # one span
    ("GlobalMaxPool", (2, 256, 1, 64), {}),             # a 1-D classifier's max over time, shared
    ("GlobalMaxPool", (1, 96, 5, 7), {}),               # planes of 35
    ("ReduceMean", (2, 672, 14, 14), {"axes": [2, 3]}),  # torch.onnx's global average pool: shared
    ("ReduceMean", (1, 40, 3, 7), {"axes": [2, 3], "keepdims": 0}),  # one span
    ("ReduceMean", (6, 33), {"axes": [1]}),             # along the last axis of any tensor
    ("ReduceMax", (1, 300, 129), {"axes": [2]}),        # shared
    ("ReduceMax", (2, 5, 7), {"axes": [-1], "keepdims": 0}),
]


def _rows_model(node, shape, attributes, rng):
    inits = []
    if node == "LayerNormalization":
        feature = shape[attributes["axis"]:]
        inits = [numpy_helper.from_array(rng.standard_normal(feature).astype(np.float32), name) for name in ("g", "b")]
    elif node == "InstanceNormalization":
        inits = [numpy_helper.from_array(rng.standard_normal(shape[1]).astype(np.float32), name) for name in ("g", "b")]
    inputs = ["x"] + [t.name for t in inits]
    if node.startswith("Reduce"):  # its axes as an input from opset 18 on
        attributes = dict(attributes)
        inits.append(numpy_helper.from_array(np.array(attributes.pop("axes"), np.int64), "axes"))
        inputs.append("axes")
    nodes = [helper.make_node(node, inputs, ["y"], **attributes)]
    graph = helper.make_graph(nodes, "rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return model_proto(graph, 18 if node.startswith("Reduce") else 17)


@pytest.mark.parametrize("case", ROWS, ids=[f"{c[0]}{'x'.join(map(str, c[1]))}" for c in ROWS])
def test_row_normalisations_in_regions(case, fresh_rng):
    rng = fresh_rng
    _both_ways_match_onnxruntime(_rows_model(*case, rng), case[1], rng)


@pytest.mark.parametrize("node", ["Softmax", "LogSoftmax"])
def test_softmax_rows_keep_special_values(node, fresh_rng):
    """A -inf beside finite scores (a masked attention score) gives 0 (log: -inf); a row holding a
    NaN or a +inf is NaN throughout, as ONNX Runtime and NumPy's kernel give it."""
    require_tool("regions", cpu_parallel.available()[1])
    rng = fresh_rng
    x = rng.standard_normal((6, 64, 33)).astype(np.float32) * 4
    x[0, :, :5] = -np.inf  # masked positions in every row of the first head
    x[1, 3, 7] = np.nan
    x[2, 10, 0] = np.inf
    x[3, 4] = -np.inf  # a row masked throughout
    model = _rows_model(node, x.shape, {"axis": -1}, rng)
    ref = onnxruntime_session(model).run(None, {"x": x})[0]
    got = gpumnn.load(model).session(backend="cpu", threads=2, jit=True, regions=True).run({"x": x})["y"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    finite = np.isfinite(ref)
    assert np.abs(got[finite] - ref[finite]).max() < 1e-5
    if node == "Softmax":
        assert not got[0, :, :5].any()  # e^-inf is 0, not a tiny number


@pytest.mark.parametrize("width", [3, 64, 70])
def test_global_max_pool_rows_keep_special_values(width, fresh_rng):
    """``rows.max_rows`` (rows shared and one span): a plane holding a NaN gives NaN, wherever in
    the plane it lies; +-inf are values like any other."""
    require_tool("regions", cpu_parallel.available()[1])
    x = fresh_rng.standard_normal((2, 300, 1, width)).astype(np.float32)
    x[0, 1, 0, 0] = np.nan
    x[0, 2, 0, width - 1] = np.nan
    x[1, 3, 0, width // 2] = np.nan
    x[0, 4, 0, width // 2] = np.inf
    x[0, 5] = -np.inf
    x[1, 6, 0, :2] = (np.nan, np.inf)
    x[1, 7, 0, -1] = -np.inf
    for part in (x, x[:1, :8]):  # rows shared, then one span
        model = _rows_model("GlobalMaxPool", part.shape, {}, fresh_rng)
        got = gpumnn.load(model).session(backend="cpu", threads=2, jit=True, regions=True).run({"x": part})["y"]
        np.testing.assert_array_equal(got.reshape(-1), part.max(axis=(2, 3)).reshape(-1))


def test_constant_weights_are_packed_once_for_every_run_state(fresh_rng):
    """An eager session prepares a run state per run: the weights its kernels read in their own
    layouts (Winograd's G W G^T, the register tile's panels, a classifier's) are made on the first
    run and read again by the next, not made again; the outputs stay ONNX Runtime's."""
    require_tool("regions", cpu_parallel.available()[1])
    rng = fresh_rng

    def weight(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),  # Winograd
             helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Conv", ["b", "w2"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),  # packed
             helper.make_node("GlobalAveragePool", ["c"], ["d"]),
             helper.make_node("Flatten", ["d"], ["e"]),
             helper.make_node("Gemm", ["e", "w3"], ["y"], transB=1)]  # one row past SMALL_PRODUCT_MACS: the classifier's panels
    graph = helper.make_graph(nodes, "packed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 24, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [weight("w1", (64, 64, 3, 3)), weight("w2", (64, 64, 3, 3)), weight("w3", (4096, 64))])
    model = model_proto(graph, 13)
    sess = gpumnn.load(model).session(backend="cpu", threads=2, record=False)
    ref = onnxruntime_session(model)
    packed = sess.backends["cpu"]._packed
    made = None
    for _ in range(3):
        feed = {"x": rng.standard_normal((1, 64, 24, 24)).astype(np.float32)}
        assert rel_l2(sess.run(feed)["y"], ref.run(None, feed)[0]) < 1e-4
        if made is None:
            made = dict(packed._made)
            assert {key[2][0] for key in made} == {"winograd panels", "panels", "vector panels"}, made.keys()
        else:
            assert packed._made.keys() == made.keys()
            assert all(packed._made[key] is array for key, array in made.items())


@pytest.mark.parametrize("outputs", [48, 4096], ids=["small-product", "register-tile"])
def test_one_row_times_constant_weights_reads_a_run_time_bias(outputs, fresh_rng):
    """A classifier's product (M = 1), in one compiled loop (small) or on the register tile, reads a
    bias that is a graph input anew on every run: the view is bound at creation, not a copy."""
    require_tool("regions", cpu_parallel.available()[1])
    rng = fresh_rng
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    c = helper.make_tensor_value_info("C", TensorProto.FLOAT, [outputs])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    weight = rng.standard_normal((outputs, 64)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "W", "C"], ["y"], transB=1)], "gemm", [x, c], [y],
                              [numpy_helper.from_array(weight, "W")])
    sess = gpumnn.load(model_proto(graph, 13)).session(backend="cpu", threads=2)
    for _ in range(2):
        feed = {"x": rng.standard_normal((1, 64)).astype(np.float32), "C": rng.standard_normal(outputs).astype(np.float32)}
        got = sess.run(feed)["y"]
        np.testing.assert_allclose(got, feed["x"] @ weight.T + feed["C"], rtol=1e-4, atol=1e-4)


def _matmul_model(a_shape, b_shape, transpose_b, rng, constant_b):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(a_shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inputs, inits, nodes = [x], [], []
    b_name = "b"
    if constant_b:
        inits.append(numpy_helper.from_array(rng.standard_normal(b_shape).astype(np.float32), "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b_shape)))
    if transpose_b:
        perm = list(range(len(b_shape)))
        perm[-2:] = perm[-1], perm[-2]
        nodes.append(helper.make_node("Transpose", ["b"], ["bt"], perm=perm))
        b_name = "bt"
    nodes.append(helper.make_node("MatMul", ["x", b_name], ["y"]))
    graph = helper.make_graph(nodes, "matmul", inputs, [y], inits)
    return model_proto(graph, 13)


# (A shape, B shape as stored, B transposed by a Transpose node, B a constant)
MATMULS = [
    ((1, 128, 256), (256, 512), False, True),          # shared weights: batch folded into rows
    ((4, 128, 64), (4, 64, 128), False, False),        # attention scores: a product per head
    ((4, 128, 64), (4, 128, 64), True, False),         # ... with K transposed
    ((2, 3, 40, 72), (2, 3, 72, 56), False, False),    # 4-D batches
    ((3, 200, 100), (300, 100), True, True),           # shared transposed weights (stored [N, K])
    ((2, 20, 100), (600, 100), True, True),            # ... few rows: read from a copy laid [K, N]
    ((1, 1, 200), (200, 50), False, True),             # one row times constant weights: the register tile
    ((1, 1, 200), (50, 200), True, True),              # ... stored [N, K]
]


@pytest.mark.parametrize("case", MATMULS, ids=[f"matmul{'x'.join(map(str, c[0]))}-{'x'.join(map(str, c[1]))}{'T' if c[2] else ''}"
                                               for c in MATMULS])
def test_matmul_in_regions(case, fresh_rng):
    a_shape, b_shape, transpose_b, constant_b = case
    rng = fresh_rng
    model = _matmul_model(a_shape, b_shape, transpose_b, rng, constant_b)
    names = ("x",) if constant_b else ("x", "b")
    shapes = {"x": a_shape, "b": b_shape}
    _both_ways_match_onnxruntime(model, a_shape if constant_b else shapes, rng, names=names)


@pytest.mark.parametrize("rows", [128, 7])
def test_matmul_with_gelu_in_regions(rows, fresh_rng):
    """A transformer's FFN input layer: MatMul, a bias row and GELU (opset 20), GELU applied on
    each GEMM block in the region (on both threads above REGION_MIN_MACS, one block below)."""
    rng = fresh_rng
    inits = [numpy_helper.from_array(rng.standard_normal((256, 1024)).astype(np.float32) / 16, "w"),
             numpy_helper.from_array(rng.standard_normal(1024).astype(np.float32), "c")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "c"], ["s"]),
             helper.make_node("Gelu", ["s"], ["y"])]
    graph = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    _both_ways_match_onnxruntime(model_proto(graph, 20), (1, rows, 256), rng)


# batches of images, grouped 1x1 convolutions, im2col: (channels, size, kernel, stride, pads, groups, out channels, activation)
IMAGES = [
    (256, 14, 1, 1, [0, 0, 0, 0], 1, 288, "relu6"),    # 1x1 on BLAS: weights past POINTWISE_MAX_WEIGHT_BYTES
    (64, 14, 1, 1, [0, 0, 0, 0], 4, 128, "relu"),      # grouped 1x1: a product per group
    (256, 14, 1, 1, [0, 0, 0, 0], 1, 288, "silu"),     # SiLU on each GEMM block
    (64, 28, 1, 1, [0, 0, 0, 0], 1, 96, "silu"),       # small weights: the pointwise tiles, SiLU per block
    (32, 12, 1, 1, [0, 0, 0, 0], 1, 48, "hard_swish"), # the pointwise tiles, hard-swish in registers, one thread
    (96, 28, 3, 2, [1, 1, 1, 1], 96, 96, "relu6"),     # depthwise stride 2
    (48, 21, 3, 1, [1, 1, 1, 1], 48, 48, "sigmoid"),   # depthwise stride 1, an activation after
    (16, 20, 5, 1, [2, 2, 2, 2], 16, 16, None),        # depthwise 5x5 (the generic loop)
    (16, 23, 3, 2, [1, 0, 2, 1], 1, 32, "relu"),       # im2col, stride 2, padding uneven
    (3, 40, 7, 2, [3, 3, 3, 3], 1, 24, None),          # im2col, a ResNet stem
    (24, 15, 3, 1, [0, 0, 0, 0], 1, 40, "sigmoid"),    # im2col or Winograd, no padding, an activation after
    (3, 41, 3, 2, [1, 1, 1, 1], 1, 16, "silu"),        # im2col, a YOLO stem: SiLU on each row block
    (16, 19, 3, 2, [1, 1, 1, 1], 1, 24, "hard_swish"), # im2col, hard-swish on each row block
    (3, 92, 3, 2, [1, 1, 1, 1], 1, 16, "hard_swish"),  # im2col in one block: hard-swish after, shared by the threads
]


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("case", IMAGES, ids=[f"conv{c[0]}x{c[1]}k{c[2]}s{c[3]}g{c[5]}" for c in IMAGES])
def test_convolutions_in_regions(case, batch, fresh_rng):
    channels, size, kernel, stride, pads, groups, out_channels, activation = case
    rng = fresh_rng
    model = _conv_model(channels, size, kernel, stride, 1, pads, groups, out_channels, activation, True, rng)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = batch
    _both_ways_match_onnxruntime(model, (batch, channels, size, size), rng)


# (in channels, length, kernel, stride, pad, out channels, relu): 1-D convolutions, one output row
SEQUENCES = [
    (16, 1024, 9, 2, 4, 64, True),     # a byte classifier's first convolution: more pixels than channels
    (1, 4096, 256, 128, 128, 258, False),  # an STFT's basis: fewer pixels than channels
    (64, 300, 5, 1, 2, 20, True),      # channel spans not a multiple of 8
]


def _conv1d_model(case, rng):
    """A 1-D convolution (``case``: in channels, length, kernel, stride, pad, out channels, relu) with
    seeded weights and bias, and a Relu after it where ``relu``."""
    channels, length, kernel, stride, pad, out_channels, relu = case
    weight = numpy_helper.from_array(rng.standard_normal((out_channels, channels, kernel)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.standard_normal(out_channels).astype(np.float32), "B")
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c" if relu else "y"], kernel_shape=[kernel], strides=[stride],
                              pads=[pad, pad])]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    graph = helper.make_graph(nodes, "conv1d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, length])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight, bias])
    return model_proto(graph, 13)


@pytest.mark.parametrize("case", SEQUENCES, ids=[f"conv1d{c[0]}x{c[1]}k{c[2]}s{c[3]}" for c in SEQUENCES])
def test_one_row_convolutions_share_channels_in_regions(case, fresh_rng, monkeypatch):
    """A 1-D convolution has one output row, so im2col's region cuts its output channels into a span
    per thread; the outputs stay ONNX Runtime's."""
    channels, length, kernel, stride, pad, out_channels, relu = case
    rng = fresh_rng
    monkeypatch.setattr(cpu_engines, "WINOGRAD_PAYS", {"regions": (1 << 30, 1 << 30, 1e9), "threads": (1 << 30, 1 << 30, 1e9)})
    monkeypatch.setattr(cpu_engines, "PACKED_MIN_DEPTH", 1 << 30)
    monkeypatch.setattr(cpu_engines, "IN_PLACE_MIN_DEPTH", 1 << 30)
    monkeypatch.setattr(cpu_engines, "PACKED_ANY_DEPTH_MACS", 0)
    monkeypatch.setattr(cpu_engines, "TAPPED_MAX_DEPTH", 0)  # im2col's region, not the tapped tiles
    model = _conv1d_model(case, rng)
    _both_ways_match_onnxruntime(model, (1, channels, length), rng)
    sess = gpumnn.load(model).session(backend="cpu", threads=2, jit=True, regions=True)
    convs = [exe for exe in sess.shape_set().first_state.executions if type(exe.op).__name__ == "Conv2D"]
    blocks = convs[0].keep[2]  # _im2col_region's (rows, channels) blocks
    assert convs[0].scheme == "im2col" and len(blocks) == 2
    assert blocks[0][2] == 0 and blocks[0][3] == blocks[1][2] and blocks[1][3] == out_channels


# (in channels, height, width, kernel (h, w), strides, pads (top, left, bottom, right), out channels):
# windows at least WINDOW_ROWS_MIN_WIDTH wide at a column stride past 2, copied a pixel a row
WIDE_WINDOWS = [
    (1, 1, 4096, (1, 256), (1, 128), (0, 128, 0, 128), 258),  # an STFT's frames: zeros at both ends
    (3, 7, 200, (3, 20), (2, 7), (1, 19, 2, 25), 24),         # rows and columns past both edges, uneven
    (2, 4, 67, (2, 16), (1, 3), (0, 0, 0, 0), 9),              # no padding, out channels not a multiple of 8
]


@pytest.mark.parametrize("case", WIDE_WINDOWS, ids=[f"conv{c[0]}x{c[1]}x{c[2]}k{c[3][1]}s{c[4][1]}" for c in WIDE_WINDOWS])
def test_wide_windows_are_copied_a_pixel_a_row(case, fresh_rng, monkeypatch):
    """im2col's region lays a convolution's columns a pixel a row where its windows are wide and
    far apart (``engines.window_rows``), BLAS reading them transposed; the outputs stay ONNX Runtime's."""
    channels, height, width, kernel, strides, pads, out_channels = case
    rng = fresh_rng
    monkeypatch.setattr(cpu_engines, "WINOGRAD_PAYS", {"regions": (1 << 30, 1 << 30, 1e9), "threads": (1 << 30, 1 << 30, 1e9)})
    monkeypatch.setattr(cpu_engines, "PACKED_MIN_DEPTH", 1 << 30)
    monkeypatch.setattr(cpu_engines, "IN_PLACE_MIN_DEPTH", 1 << 30)
    monkeypatch.setattr(cpu_engines, "PACKED_ANY_DEPTH_MACS", 0)
    monkeypatch.setattr(cpu_engines, "TAPPED_MAX_DEPTH", 0)  # im2col's region, not the tapped tiles
    weight = numpy_helper.from_array(rng.standard_normal((out_channels, channels, *kernel)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.standard_normal(out_channels).astype(np.float32), "B")
    node = helper.make_node("Conv", ["x", "W", "B"], ["y"], kernel_shape=list(kernel), strides=list(strides),
                            pads=[pads[0], pads[1], pads[2], pads[3]])
    graph = helper.make_graph([node], "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                             [1, channels, height, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight, bias])
    model = model_proto(graph, 13)
    _both_ways_match_onnxruntime(model, (1, channels, height, width), rng)
    sess = gpumnn.load(model).session(backend="cpu", threads=2, jit=True, regions=True)
    conv = next(exe for exe in sess.shape_set().first_state.executions if type(exe.op).__name__ == "Conv2D")
    assert conv.scheme == "im2col" and cpu_engines.window_rows(conv.op)
    fortran = conv.keep[3]  # _im2col_region's BLAS integers: the columns read transposed
    assert all(chr(row[0]) == "T" for row in fortran)


# (in channels, length, kernel, stride, pad, out channels, relu): 1-D convolutions on a few frames,
# below PACKED_ANY_DEPTH_MACS and all but the first below REGION_MIN_MACS (a voice model's encoder
# after its STFT)
SHORT_SEQUENCES = [
    (129, 33, 3, 1, 1, 64, True),      # depth 387
    (128, 33, 3, 2, 1, 64, True),      # stride 2
    (64, 9, 3, 2, 1, 64, True),        # fewer pixels than a pixel panel
    (64, 9, 3, 1, 1, 128, False),      # no activation
    (37, 7, 5, 1, 2, 20, True),        # out channels not a multiple of a weight panel
]


@pytest.mark.parametrize("case", SHORT_SEQUENCES, ids=[f"conv1d{c[0]}x{c[1]}k{c[2]}s{c[3]}" for c in SHORT_SEQUENCES])
def test_short_convolutions_on_one_thread_take_the_register_tile(case, fresh_rng, monkeypatch):
    """A small convolution on constant weights takes the register tile at any depth
    (``PACKED_ANY_DEPTH_MACS``), not BLAS's im2col; one too small to share between threads
    (``REGION_MIN_MACS``) runs as a loop on the calling thread (``cpu_parallel.alone``: no region
    entered for its one block); the outputs stay ONNX Runtime's."""
    from gpumnn.backends.cpu import compiled as cpu_compiled

    channels, length, kernel, stride, pad, out_channels, relu = case
    rng = fresh_rng
    monkeypatch.setattr(cpu_engines, "WINOGRAD_PAYS", {"regions": (1 << 30, 1 << 30, 1e9), "threads": (1 << 30, 1 << 30, 1e9)})
    monkeypatch.setattr(cpu_engines, "TAPPED_MAX_DEPTH", 0)
    monkeypatch.setattr(cpu_engines, "IN_PLACE_MIN_DEPTH", 1 << 30)  # the tile for their size, not their depth
    built, alone = [], []
    packed, plain_loop = cpu_compiled._packed_conv_region, cpu_parallel.alone
    monkeypatch.setattr(cpu_compiled, "_packed_conv_region", lambda op, *args: built.append(op) or packed(op, *args))
    monkeypatch.setattr(cpu_parallel, "alone", lambda region: alone.append(region) or plain_loop(region))
    model = _conv1d_model(case, rng)
    _both_ways_match_onnxruntime(model, (1, channels, length), rng)
    assert built and all(op.macs() < cpu_engines.PACKED_ANY_DEPTH_MACS for op in built)
    assert (cpu_parallel.packed_conv in alone) == all(op.macs() < cpu_engines.REGION_MIN_MACS for op in built)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pooling_of_a_batch_in_regions(op, stride, fresh_rng):
    rng = fresh_rng
    model = _pool_model(40, 23, op, 3, stride, [1, 1, 1, 1], 0, 0)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 3
    _both_ways_match_onnxruntime(model, (3, 40, 23, 23), rng)


# (channels, size, kernel, tile, pads, out channels, activation)
# Winograd on the register tile: tile panels of MR and channel panels of NR, partial at the ends;
# the pairs walk channel panels outer where the packed weights are the larger operand (all but
# the F(3, 5) case), tile panels outer elsewhere
WINOGRAD = [
    (32, 24, 3, 4, [1, 1, 1, 1], 48, "relu"),           # F(4, 3): partial tiles at no edge, 36 tiles
    (16, 17, 3, 6, [1, 1, 1, 1], 16, "relu6"),          # F(6, 3): the last tile row and column partial
    (6, 11, 5, 3, [2, 1, 0, 2], 8, "sigmoid"),          # F(3, 5), uneven padding, an activation after
    (12, 12, 2, 5, [0, 0, 0, 0], 10, None),             # F(5, 2), no padding
    (64, 7, 3, 2, [1, 1, 1, 1], 40, "relu"),            # F(2, 3) at 7x7: 16 tiles, a partial channel panel
    # rectangular kernels: 1D Winograd along the long axis (Inception's 1x7 and 7x1), and 2D with a
    # tile and alpha of its own per axis
    (24, 17, (1, 7), 4, [0, 3, 0, 3], 40, "relu"),      # F(1x4, 1x7), alpha 10: the last tile column partial
    (24, 17, (7, 1), 3, [3, 0, 3, 0], 20, "relu"),      # F(3x1, 7x1): the last tile row partial
    (24, 12, (1, 7), 2, [0, 3, 0, 3], 16, None),        # F(1x2, 1x7): alpha 8
    (16, 8, (3, 1), 6, [1, 0, 1, 0], 16, None),         # F(6x1, 3x1), Inception's 8x8 ones
    (16, 9, (1, 3), 4, [0, 1, 0, 1], 24, "sigmoid"),    # F(1x4, 1x3), an activation after
    (8, 10, (3, 5), 2, [1, 2, 1, 2], 12, "relu"),       # F(2x2, 3x5): alpha 4 x 6
    # activations a pair's output transform applies in its scratch: whole and partial channel panels
    (32, 13, 3, 4, [1, 1, 1, 1], 40, "silu"),           # F(4, 3), SiLU; the last tile row and panel partial
    (16, 10, 3, 2, [1, 1, 1, 1], 16, "hard_swish"),     # F(2, 3), hard-swish
    (16, 9, (1, 3), 4, [0, 1, 0, 1], 20, "silu"),       # F(1x4, 1x3), SiLU
    (16, 9, (3, 1), 4, [1, 0, 1, 0], 20, "sigmoid"),    # F(4x1, 3x1), sigmoid
]


def _kernel_id(kernel) -> str:
    return f"{kernel[0]}x{kernel[1]}" if isinstance(kernel, tuple) else str(kernel)


@pytest.mark.parametrize("case", WINOGRAD, ids=[f"wino{c[0]}x{c[1]}k{_kernel_id(c[2])}F{c[3]}" for c in WINOGRAD])
def test_winograd_on_the_register_tile_in_regions(case, fresh_rng):
    from gpumnn.scheduler import schemes

    channels, size, kernel, tile, pads, out_channels, activation = case
    rng = fresh_rng
    model = _conv_model(channels, size, kernel, 1, 1, pads, 1, out_channels, activation, True, rng)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    with schemes.forced_schemes(conv=("winograd", tile)):
        sess = gpumnn.load(model).session(backend="cpu", threads=2)
        assert "winograd" in sess.report(), sess.report()
        _both_ways_match_onnxruntime(model, (2, channels, size, size), rng)


# im2col with fewer output pixels than output channels: channel spans, each copying its rows'
# columns; with a small column budget, several row blocks too. (channels, size, stride, out channels)
FEW_PIXELS = [
    (96, 6, 1, 128),    # 36 pixels, 128 channels
    (64, 9, 2, 84),     # stride 2: 25 pixels; 84 channels, spans not a multiple of 8
]


@pytest.mark.parametrize("cols_bytes", [1 << 20, 4 * 9 * 96 * 6 * 2])
@pytest.mark.parametrize("case", FEW_PIXELS, ids=[f"im2col{c[0]}x{c[1]}s{c[2]}o{c[3]}" for c in FEW_PIXELS])
def test_im2col_channel_spans_in_regions(case, cols_bytes, monkeypatch, fresh_rng):
    from gpumnn.scheduler import schemes

    channels, size, stride, out_channels = case
    monkeypatch.setattr(cpu_engines, "REGION_COLS_BYTES", cols_bytes)  # the second: two output rows a block
    rng = fresh_rng
    model = _conv_model(channels, size, 3, stride, 1, [1, 1, 1, 1], 1, out_channels, "relu", True, rng)
    with schemes.forced_schemes(conv=("im2col", 0)):
        _both_ways_match_onnxruntime(model, (1, channels, size, size), rng)


# im2col on constant weights through cpu_tiles' register tile (every depth here, to reach small
# cases): (channels, size, kernel, stride, dilation, pads, out channels, activation, bias)
PACKED = [
    (96, 6, 3, 1, 1, [1, 1, 1, 1], 128, "relu", True),     # 36 pixels < 128 channels: panels packed once, shared
    (64, 9, 3, 2, 1, [1, 1, 1, 1], 84, "relu6", True),     # 25 pixels, 84 channels: a partial weight panel
    (16, 23, 3, 2, 1, [1, 0, 2, 1], 20, None, False),      # uneven padding, no bias: each block packs its own
    (3, 40, 7, 2, 1, [3, 3, 3, 3], 24, "sigmoid", True),   # a ResNet stem, an activation after
    (8, 17, 3, 1, 2, [2, 2, 2, 2], 16, "relu", True),      # dilation
    (24, 15, 3, 1, 1, [0, 0, 0, 0], 40, None, True),       # no padding: the input read as it lies
    (64, 9, 3, 2, 1, [1, 1, 1, 1], 84, "silu", True),      # SiLU on each block: weight spans, a partial panel
    (16, 23, 3, 2, 1, [1, 0, 2, 1], 20, "hard_swish", False),  # hard-swish on each pixel block, no bias
    (32, 11, 1, 2, 1, [0, 0, 0, 0], 40, "relu", True),     # a strided 1x1: its windows packed into panels
]


def _packed_op(case):
    """A PACKED case's convolution as the atomic op ``engines`` decides on."""
    from gpumnn import atomic as A

    channels, size, kernel, stride, dilation, pads, out_channels = case[:7]
    return A.Conv2D(("x", "w"), ("y",), "conv", in_channels=channels, out_channels=out_channels, kernel=(kernel, kernel),
                    strides=(stride, stride), dilations=(dilation, dilation))


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "packed"])
def test_a_strided_1x1_on_the_register_tile(in_place, monkeypatch, fresh_rng):
    """A 1x1 window moves a whole plane each depth step: on 8-float vectors its tiles read packed
    panels, on 16-float ones the two-vector tile reads it in place; both match ONNX Runtime."""
    from gpumnn.backends.cpu import tiles as cpu_tiles

    case = next(c for c in PACKED if c[2] == 1)
    assert cpu_engines.packed_in_place(_packed_op(case)) == (cpu_tiles.TARGET_LANES == 16)
    monkeypatch.setattr(cpu_engines, "packed_in_place", lambda op: in_place)
    works = _register_tile_matches_onnxruntime(case, monkeypatch, fresh_rng)
    assert works, "the packed region was not used"
    for work in works:
        assert (work.keep[5].size == case[0]) == in_place  # an offset per input channel where in place


@pytest.mark.parametrize("channels,size,out_channels,activation", [(320, 7, 40, "relu"), (256, 8, 72, "relu6"),
                                                                    (512, 5, 24, None)])
def test_deep_1x1_on_a_small_plane_on_the_in_place_tile(channels, size, out_channels, activation, monkeypatch,
                                                         fresh_rng):
    """A 1x1 convolution (stride 1) from 256 input channels on a plane of under 256 pixels whose
    pixels fill the in-place tile's panels but for a tenth (7x7, 8x8; not 5x5) runs on that tile
    where it holds two 16-float vectors a row (``Engine.pointwise_in_place``), else on the
    pointwise tiles; both match ONNX Runtime."""
    from gpumnn.backends.cpu import compiled as cpu_compiled, tiles as cpu_tiles

    require_tool("regions", cpu_parallel.available()[1])
    works = []
    monkeypatch.setattr(cpu_compiled, "_packed_conv_region",
                        lambda *a, real=cpu_compiled._packed_conv_region: works.append(real(*a)) or works[-1])
    model = _conv_model(channels, size, 1, 1, 1, [0, 0, 0, 0], 1, out_channels, activation, True, fresh_rng)
    _both_ways_match_onnxruntime(model, (1, channels, size, size), fresh_rng)
    takes = cpu_tiles.WIDE_IN_PLACE and size != 5
    assert cpu_engines.Engine.pointwise_in_place(size * size, channels) == takes
    assert bool(works) == takes


def _register_tile_matches_onnxruntime(case, monkeypatch, rng) -> list:
    """A PACKED case's convolution (a batch of two) on the register tile (``compiled._packed_conv_region``)
    at any depth, both ways within tolerance of ONNX Runtime; the KernelWorks the region made."""
    from gpumnn.backends.cpu import compiled as cpu_compiled, direct as cpu_direct
    from gpumnn.scheduler import schemes

    channels, size, kernel, stride, dilation, pads, out_channels, activation, bias = case
    monkeypatch.setattr(cpu_engines, "PACKED_MIN_DEPTH", 1)
    monkeypatch.setattr(cpu_engines, "IN_PLACE_MIN_DEPTH", 1)
    monkeypatch.setattr(cpu_direct, "MAX_IN_CHANNELS", 0)  # the stem case here is the tile's, not the direct rows'
    monkeypatch.setattr(cpu_engines, "MASKED_MAX_CHANNELS", 0)  # the 3-channel case: not the masked rows
    monkeypatch.setattr(cpu_engines, "TAPPED_MAX_DEPTH", 0)  # the register tile, not the tapped one
    works = []
    monkeypatch.setattr(cpu_compiled, "_packed_conv_region",
                        lambda *a, real=cpu_compiled._packed_conv_region: works.append(real(*a)) or works[-1])
    model = _conv_model(channels, size, kernel, stride, dilation, pads, 1, out_channels, activation, bias, rng)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    with schemes.forced_schemes(conv=("im2col", 0)):
        _both_ways_match_onnxruntime(model, (2, channels, size, size), rng)
    return works


@pytest.mark.parametrize("cols_bytes", [1 << 20, 4 * 9 * 96 * 6 * 2])
@pytest.mark.parametrize("case", PACKED, ids=[f"packed{c[0]}x{c[1]}k{c[2]}s{c[3]}d{c[4]}o{c[6]}" for c in PACKED])
def test_im2col_on_packed_weights_in_regions(case, cols_bytes, monkeypatch, fresh_rng):
    monkeypatch.setattr(cpu_engines, "REGION_COLS_BYTES", cols_bytes)  # the second: several pixel blocks
    assert _register_tile_matches_onnxruntime(case, monkeypatch, fresh_rng), "the packed region was not used"


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "packed"])
@pytest.mark.parametrize("case", [c for c in PACKED if c[2] > 1],
                         ids=[f"packed{c[0]}x{c[1]}k{c[2]}s{c[3]}d{c[4]}o{c[6]}" for c in PACKED if c[2] > 1])
def test_tiles_read_windows_in_place_or_packed(case, in_place, monkeypatch, fresh_rng):
    """Where a window is wider than one tap the register tile reads it where it lies, at any stride
    (``engines.packed_in_place``): the tile_in_place_stored offsets are given to the region and no
    pixel panel is packed. Both ways match ONNX Runtime: shared weight spans, stride 2, dilation, no
    padding (the input read as it lies)."""
    channels, kernel = case[0], case[2]
    assert cpu_engines.packed_in_place(_packed_op(case))
    if not in_place:
        monkeypatch.setattr(cpu_engines, "packed_in_place", lambda op: False)
    works = _register_tile_matches_onnxruntime(case, monkeypatch, fresh_rng)
    assert works, "the packed region was not used"
    for work in works:
        offsets, packs = work.keep[5], work.keep[8]
        assert (offsets.size == channels * kernel * kernel) == in_place
        assert (packs.size == 0) == in_place


def test_weights_known_only_at_run_time_keep_blas(monkeypatch, fresh_rng):
    """Weights that are a graph input are not packed at creation: the convolution keeps BLAS."""
    from gpumnn.backends.cpu import compiled as cpu_compiled

    monkeypatch.setattr(cpu_engines, "PACKED_MIN_DEPTH", 1)
    packed = []
    monkeypatch.setattr(cpu_compiled, "_packed_conv_region", lambda *a: packed.append(a))
    rng = fresh_rng
    model = _conv_model(16, 12, 3, 1, 1, [1, 1, 1, 1], 1, 24, "relu", False, rng)
    model.graph.initializer.pop()
    model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [24, 16, 3, 3]))
    _both_ways_match_onnxruntime(model, {"x": (1, 16, 12, 12), "W": (24, 16, 3, 3)}, rng, names=("x", "W"))
    assert not packed


@pytest.mark.parametrize("depth", [0, 1, 37])
def test_the_register_tile_against_numpy(depth, fresh_rng):
    """cpu_tiles.tile_product: acc = p^T v for strided p and v (none at depth 0)."""
    require_tool("regions", cpu_parallel.available()[1])
    from gpumnn.backends.cpu import tiles as cpu_tiles
    import numba

    @numba.njit
    def run(p, p_stride, v, v_stride, depth, acc):
        cpu_tiles.tile_product(p.ctypes.data, p_stride, v.ctypes.data, v_stride, depth, acc.ctypes.data)

    rng = fresh_rng
    mr, nr = cpu_tiles.MR, cpu_tiles.NR
    p = rng.standard_normal(depth * 9 + mr).astype(np.float32)
    v = rng.standard_normal(depth * 21 + nr).astype(np.float32)
    acc = np.full(mr * nr, np.nan, np.float32)
    run(p, 9, v, 21, depth, acc)
    ps = np.lib.stride_tricks.as_strided(p, (depth, mr), (36, 4))
    vs = np.lib.stride_tricks.as_strided(v, (depth, nr), (84, 4))
    want = ps.T.astype(np.float64) @ vs
    assert np.abs(acc.reshape(mr, nr) - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("in_place", [False, True], ids=["packed", "in-place"])
@pytest.mark.parametrize("valid_rows,valid_columns", [(None, None), (1, None), (None, 5), (4, 11), (2, 19)])
def test_the_storing_tiles_against_numpy(in_place, valid_rows, valid_columns, fresh_rng):
    """cpu_tiles.tile_product_stored and tile_in_place_stored: clamp(p^T v + bias) to [lo, hi] stored
    into NCHW planes (a channel's pixels side by side), the rows and columns past the valid ones
    to the dummy, nothing else written (the in-place tile is IN_PLACE_COLUMNS wide: 32 channels on
    16-float vectors)."""
    require_tool("regions", cpu_parallel.available()[1])
    from gpumnn.backends.cpu import tiles as cpu_tiles
    import numba

    @numba.njit
    def stored(p, v, v_stride, depth, bases, offsets, out, column_step, rows, columns, bias, dummy, lo, hi):
        if bases.shape[0]:
            cpu_tiles.tile_in_place_stored(p.ctypes.data, bases.ctypes.data, offsets.ctypes.data, v.ctypes.data,
                                           v_stride, depth, out.ctypes.data, column_step, rows, columns,
                                           bias.ctypes.data, dummy.ctypes.data, lo, hi)
        else:
            cpu_tiles.tile_product_stored(p.ctypes.data, 9, v.ctypes.data, v_stride, depth, out.ctypes.data,
                                          column_step, rows, columns, bias.ctypes.data, dummy.ctypes.data, lo, hi)

    rng = fresh_rng
    mr, nr = (cpu_tiles.IN_PLACE_ROWS, cpu_tiles.IN_PLACE_COLUMNS) if in_place else (cpu_tiles.MR, cpu_tiles.NR)
    depth, column_step, v_stride = 37, 10, nr + 5
    valid_rows = mr if valid_rows is None else valid_rows
    valid_columns = nr if valid_columns is None else min(valid_columns, nr)
    p = rng.standard_normal(depth * 9 + mr).astype(np.float32)
    v = rng.standard_normal(depth * v_stride + nr).astype(np.float32)
    bias = rng.standard_normal(nr).astype(np.float32)
    rows_read = np.lib.stride_tricks.as_strided(p, (depth, mr), (36, 4))
    if in_place:  # row r of step k at bases[r] + offsets[k]: rows in reverse order, steps 9 apart
        bases, offsets = np.arange(mr - 1, -1, -1, dtype=np.int64), np.arange(depth, dtype=np.int64) * 9
        rows_read = rows_read[:, ::-1]
    else:
        bases = offsets = np.zeros(0, np.int64)
    out = np.full(nr * column_step, np.nan, np.float32)
    dummy = np.zeros(mr, np.float32)
    stored(p, v, v_stride, depth, bases, offsets, out, column_step, valid_rows, valid_columns, bias, dummy, np.float32(-0.5),
           np.float32(2.0))
    sums = rows_read.T.astype(np.float64) @ np.lib.stride_tricks.as_strided(v, (depth, nr), (4 * v_stride, 4)) + bias
    want = np.full((nr, column_step), np.nan)
    want[:valid_columns, :valid_rows] = np.clip(sums, -0.5, 2.0).T[:valid_columns, :valid_rows]
    got = out.reshape(nr, column_step)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))  # nothing stored past the valid rows and columns
    assert np.nanmax(np.abs(got - want)) <= 1e-5 * max(1.0, np.abs(sums).max())


@pytest.mark.parametrize("stride", [1, 2], ids=["in-place", "packed"])
def test_register_tile_reads_a_run_time_bias(stride, monkeypatch, fresh_rng):
    """A bias that is a graph input is copied into the storing tiles' padded row on every run
    (84 channels: a partial weight panel)."""
    from gpumnn.scheduler import schemes

    require_tool("regions", cpu_parallel.available()[1])
    monkeypatch.setattr(cpu_engines, "TAPPED_MAX_DEPTH", 0)
    rng = fresh_rng
    model = _conv_model(64, 9, 3, stride, 1, [1, 1, 1, 1], 1, 84, "relu", True, rng)
    model.graph.initializer.pop()
    model.graph.input.append(helper.make_tensor_value_info("B", TensorProto.FLOAT, [84]))
    with schemes.forced_schemes(conv=("im2col", 0)):
        sess = gpumnn.load(model).session(backend="cpu", threads=2)
    assert "im2col" in sess.report()
    for _ in range(2):
        feed = {"x": rng.standard_normal((1, 64, 9, 9)).astype(np.float32), "B": rng.standard_normal(84).astype(np.float32)}
        err = rel_l2(sess.run(feed)["y"], onnxruntime_session(model).run(None, feed)[0])
        assert err < 1e-5, f"relative L2 error {err:.2e}"


def test_constants_are_read_only_and_known():
    """CpuBackend.constant hands out read-only buffers (what is_constant reads), leaving the
    caller's array writable; the pool's buffers are writable."""
    from gpumnn.backends.base import TensorHandle
    from gpumnn.backends.cpu.backend import CpuBackend

    backend = CpuBackend()
    array = np.arange(6, dtype=np.float32)
    handle = backend.constant(array)
    assert backend.is_constant(handle) and array.flags.writeable
    assert not backend.is_constant(TensorHandle(backend.allocate(24), 0, (2, 3)))


def test_both_blas_libraries_run_the_blocks(fresh_rng):
    """The regions call NumPy's own OpenBLAS where it has one (64-bit integers in NumPy's wheels)
    and SciPy's BLAS (32-bit) otherwise: the same blocks through each give NumPy's product."""
    require_tool("regions", cpu_parallel.available()[1])
    rng = fresh_rng
    a, b = rng.standard_normal((70, 90)).astype(np.float32), rng.standard_normal((90, 50)).astype(np.float32)
    libraries = [cpu_parallel._scipy_sgemm()] + [found for found in [cpu_parallel._numpy_sgemm()] if found]
    assert (cpu_parallel.SGEMM, cpu_parallel.BLAS_INT) in libraries
    for address, integer in libraries:
        c = np.zeros((70, 50), np.float32)
        calls = cpu_parallel.gemm_calls(a.reshape(-1), b.reshape(-1), c.reshape(-1),
                                        [(a[:40], b, c[:40], 0, 0), (a[40:], b, c[40:], 40, 0)])
        fortran = np.ascontiguousarray(calls[:, :8], dtype=integer)
        cpu_parallel.gemm_blocks(address, a.reshape(-1), b.reshape(-1), c.reshape(-1), calls, fortran,
                                 np.array([1.0, 0.0], np.float32), np.zeros(1, np.float32), 0, 0, 0, 0,
                                 np.float32(1.0), np.float32(-np.inf), np.float32(np.inf), False, False)
        assert np.abs(c - a @ b).max() < 1e-4 * np.abs(a @ b).max(), integer


def test_blocks_blas_cannot_take_are_left_to_numpy():
    """A view strided on both axes is no BLAS operand: the region declines (the NumPy chunks run)."""
    require_tool("regions", cpu_parallel.available()[1])
    buffer = np.zeros(4096, np.float32)
    a = buffer[:64 * 64].reshape(64, 64)[::2, ::2]  # strides (128, 2) elements
    b = buffer[:32 * 16].reshape(32, 16)
    c = np.zeros((32, 16), np.float32)
    assert cpu_parallel.gemm_calls(buffer, buffer, c.reshape(-1), [(a, b, c, 0, 0)]) is None
    calls = cpu_parallel.gemm_calls(buffer, buffer, c.reshape(-1), [(b.T[:16], b[:16], c[:16, :16], 0, 0)])
    assert calls is not None and chr(calls[0, 1]) == "T"  # b.T: columns contiguous, BLAS's transpose


def test_the_backend_uses_regions_and_says_so():
    require_tool("regions", cpu_parallel.available()[1])
    backend = gpumnn.backends.create_backend("cpu", threads=2)
    assert backend.regions == 2 and f"{cpu_parallel.available_layer()} regions" in backend.info.device
    assert gpumnn.backends.create_backend("cpu", threads=2, regions=False).regions == 0
    assert gpumnn.backends.create_backend("cpu", threads=1, regions=False).regions == 0


def test_one_thread_runs_the_regions_kernels_on_the_calling_thread(fresh_rng, monkeypatch):
    """A one-thread backend takes the regions' kernels (each op's on the calling thread), not
    NumPy's: a global average pool is the compiled rows, and agrees with NumPy's mean."""
    require_tool("regions", cpu_parallel.available()[1])
    alone, names = cpu_parallel.alone, []
    monkeypatch.setattr(cpu_parallel, "alone", lambda region: names.append(region.__name__) or alone(region))
    backend = gpumnn.backends.create_backend("cpu", threads=1)
    assert backend.regions == 1 and f"{cpu_parallel.available_layer()} regions" in backend.info.device
    graph = helper.make_graph([helper.make_node("GlobalAveragePool", ["x"], ["y"])], "gap",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 72, 6, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    net = gpumnn.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    x = fresh_rng.standard_normal((1, 72, 6, 24)).astype(np.float32)
    with net.session(backend="cpu", threads=1) as sess:
        got = sess.run({"x": x})["y"]
    assert names == ["mean_rows"]
    np.testing.assert_allclose(got, x.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)


def test_regions_option_is_checked(monkeypatch):
    from gpumnn.errors import BackendOptionError, BackendUnavailableError

    with pytest.raises(BackendOptionError, match="regions"):
        gpumnn.backends.create_backend("cpu", regions="yes")
    with pytest.raises(BackendOptionError, match="regions=True needs"):
        gpumnn.backends.create_backend("cpu", threads=2, jit=False, regions=True)
    monkeypatch.setattr(cpu_parallel, "available", lambda: (False, "Numba's threading layer is 'workqueue' (test)"))
    with pytest.raises(BackendUnavailableError, match="workqueue"):
        gpumnn.backends.create_backend("cpu", threads=2, regions=True)
    assert gpumnn.backends.create_backend("cpu", threads=2).regions == 0  # unset: the Python threads


@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 6, 7, 8])
def test_row_copies_into_pixel_panels(count, stride):
    """``cpu_tiles``' row copies (``copy_row``, ``copy_row_s2``: ``_copy_kernel``) take every
    ``stride``-th float from any offset and write ``count`` floats, none past them."""
    import numba
    from gpumnn.backends.cpu import tiles as cpu_tiles

    require_tool("numba", cpu_jit.MISSING)
    kernel = cpu_tiles._copy_kernel(count, stride)

    @numba.njit
    def copy(dst, src, at):
        kernel(dst.ctypes.data, src.ctypes.data + 4 * at)
    src = np.arange(64, dtype=np.float32) * 1.5 - 7
    span = (count - 1) * stride + 1
    for at in (0, 1, 5, 64 - span):
        dst = np.full(count + 8, -100.0, np.float32)
        copy(dst, src, at)
        np.testing.assert_array_equal(dst[:count], src[at:at + span:stride])
        assert (dst[count:] == -100.0).all()


FOUR_THREADS = textwrap.dedent("""
    import sys
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    import gpumnn

    rng = np.random.default_rng(int(sys.argv[1]))
    def weight(*shape):
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32))
    inits = [weight(32, 24, 3, 3), weight(128, 32, 1, 1), weight(128, 1, 3, 3)]
    for init, name in zip(inits, ("w1", "w2", "w3")):
        init.name = name
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["b"]),
             helper.make_node("Conv", ["b", "w3"], ["y"], group=128, pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "four", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 24, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    x = rng.standard_normal((1, 24, 12, 12)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    sess = gpumnn.load(model).session(backend="cpu", threads=4)
    backend = sess.backends["cpu"]
    parts = [backend.engine.conv(exe.op, True).parts for exe in sess.shape_set().first_state.executions]
    (recording,) = sess.shape_set().first_state.recordings.values()
    errors = []
    for way in (True, False):
        recording.choice.way = way
        got = sess.run({"x": x})["y"]
        errors.append(float(np.linalg.norm(got - want) / np.linalg.norm(want)))
    print("regions", backend.regions, "parts", *parts, "errors", *errors, flush=True)
""")


def test_regions_of_four_threads_share_each_op_by_its_size(fresh_rng):
    """On four region threads (Numba's pool widened past this machine's cores in a subprocess) a
    3x3 convolution of 1 M multiply-adds is cut for three of them and a 1x1 of 0.6 M for two
    (``Engine.shared``), and both ways of the recording match ONNX Runtime."""
    require_tool("numba", cpu_jit.MISSING)
    require_tool("regions", cpu_parallel.available()[1])
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, NUMBA_NUM_THREADS="4", PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, "-c", FOUR_THREADS, str(int(fresh_rng.integers(1 << 62)))], env=env,
                          cwd=root, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "regions 4 parts 3 2 1 errors" in out, out
    errors = [float(e) for e in out.split("errors")[1].split()[:2]]
    assert max(errors) < 1e-5, out
