"""The cpu backend's compiled loops (``cpu_jit``, Numba) against its NumPy kernels and ONNX Runtime.

The ``backend`` fixture's cpu runs the compiled loops (in native regions where ``cpu_parallel``
can start them) wherever Numba is installed, so the other ways are checked here too: the compiled
loops on the backend's Python threads (``regions=False``) and the NumPy kernels (``jit=False``), all
against ONNX Runtime, on the geometries where the
compiled loops have edge cases of their own (padding on one side only, strides 1-3, dilation,
ceil-mode windows past the input, activations that are and are not a clamp, no bias).
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from conftest import onnxruntime_session, rel_l2, require_tool
from op_cases import model_proto
from gpumnn.backends.cpu import jit as cpu_jit, parallel as cpu_parallel
from gpumnn.errors import BackendOptionError, BackendUnavailableError

TOLERANCE = 1e-4


def _conv_model(channels, size, kernel, stride, dilation, pads, groups, out_channels, activation, bias, rng):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    weight = rng.standard_normal((out_channels, channels // groups, kh, kw)).astype(np.float32)
    inits = [numpy_helper.from_array(weight, "W")]
    inputs = ["x", "W"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(out_channels).astype(np.float32), "B"))
        inputs.append("B")
    nodes = [helper.make_node("Conv", inputs, ["c" if activation else "y"], group=groups, kernel_shape=[kh, kw],
                              strides=[stride, stride], dilations=[dilation, dilation], pads=pads)]
    if activation == "relu6":
        inits += [numpy_helper.from_array(np.float32(0.0), "lo"), numpy_helper.from_array(np.float32(6.0), "hi")]
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
    elif activation == "silu":  # as YOLO exports it: the backend fuses the pair
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    elif activation:
        nodes.append(helper.make_node({"relu": "Relu", "sigmoid": "Sigmoid", "hard_swish": "HardSwish"}[activation],
                                      ["c"], ["y"]))
    graph = helper.make_graph(nodes, "conv", [x], [y], inits)
    return model_proto(graph, 14 if activation == "hard_swish" else 13)


def _pool_model(channels, size, op, kernel, stride, pads, ceil, include_pad):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    attrs = dict(kernel_shape=[kernel, kernel], strides=[stride, stride], pads=pads, ceil_mode=ceil)
    if op == "AveragePool":
        attrs["count_include_pad"] = include_pad
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "pool", [x], [y])
    return model_proto(graph, 19)


#: the ways the cpu backend runs an op: the compiled loops in native regions (``cpu_parallel``), the
#: compiled loops on the backend's Python threads, and NumPy's kernels
WAYS = ({"jit": True, "regions": True}, {"jit": True, "regions": False}, {"jit": False})


def _both_ways_match_onnxruntime(model, shape, rng, names=("x",)):
    """Run with the compiled loops (in native regions and on Python threads) and with NumPy's
    kernels: each within TOLERANCE of ONNX Runtime."""
    require_tool("numba", cpu_jit.MISSING)
    require_tool("regions", cpu_parallel.available()[1])
    feed = {name: rng.standard_normal(shape if len(names) == 1 else shape[name]).astype(np.float32) for name in names}
    ref = onnxruntime_session(model).run(None, feed)[0]
    net = gpumnn.load(model)
    for way in WAYS:
        got = net.session(backend="cpu", threads=2, **way).run(feed)["y"]
        assert got.shape == ref.shape
        err = rel_l2(got, ref)
        assert err < TOLERANCE, f"{way}: relative L2 error {err:.2e}"


# (channels, size, kernel, stride, dilation, pads t/l/b/r, activation, bias)
DEPTHWISE = [
    (96, 28, 3, 2, 1, [1, 1, 1, 1], "relu6", True),    # MobileNet's stride-2 kernel
    (32, 19, 3, 1, 1, [1, 1, 1, 1], "relu", True),     # stride 1, odd size: the plane as one flat row
    (16, 66, 3, 1, 1, [1, 1, 0, 1], "relu6", True),    # stride 1, a plane past FLAT_PLANE_MAX: row by row
    (16, 15, 3, 2, 1, [0, 0, 1, 1], "relu", True),     # TensorFlow's SAME: padding after only
    (16, 9, 3, 2, 1, [2, 1, 0, 2], None, False),       # uneven padding, no bias, no activation
    (24, 20, 5, 2, 1, [2, 2, 2, 2], "sigmoid", True),  # 5x5 stride 2 row by row, an activation after
    (40, 3, 5, 1, 1, [2, 2, 2, 2], "relu", True),      # 5x5 on a plane smaller than its kernel (channels innermost)
    (48, 9, 5, 2, 1, [2, 2, 2, 2], "relu6", True),     # 5x5 stride 2 on a few pixels (channels innermost)
    (64, 40, 5, 1, 1, [2, 2, 2, 2], "relu6", True),    # 5x5 stride 1 past CHANNELS_LAST_MAX_PIXELS: row by row
    (32, 21, 5, 2, 2, [4, 4, 4, 4], "relu", True),     # 5x5 stride 2, dilation 2: row by row, taps 2 apart
    (8, 17, 3, 1, 2, [2, 2, 2, 2], "relu", True),      # dilation
    (8, 17, 3, 3, 1, [1, 0, 1, 0], "relu6", True),     # stride 3
    (8, 40, 3, 3, 1, [1, 1, 1, 1], "relu", True),      # stride 3 on more pixels: the generic loop
    (600, 7, 3, 1, 1, [1, 1, 1, 1], "relu6", True),    # many channels: spans on both threads
    # rows of 8 to 16 columns in place under lane masks (depthwise_masked): 8, 4 and 1 channels at once
    (13, 12, 5, 1, 1, [2, 2, 2, 2], "hard_swish", True),   # hard-swish in the kernel's registers
    (240, 12, 5, 1, 1, [2, 2, 2, 2], "relu", True),        # spans on both threads
    (100, 6, 5, 1, 1, [2, 2, 2, 2], "hard_swish", True),   # rows of MASKED_MIN_ROW, 12 x 8 + 4 channels
    (29, 23, 5, 2, 1, [2, 2, 2, 2], "relu6", False),       # stride 2, no bias, clamp
    (7, 16, 5, 2, 1, [1, 2, 2, 1], "silu", True),          # uneven padding, an activation after
    (9, 11, 7, 1, 1, [3, 3, 3, 3], None, True),            # 7x7, a kernel taller than the plane's rows kept
    (5, 14, 5, 1, 2, [4, 4, 4, 4], "hard_swish", True),    # dilation 2
    (12, 20, 5, 2, 1, [0, 0, 0, 0], "sigmoid", True),      # no padding: every lane inside the rows
    # bands of output rows (depthwise_bands): 4 and 1 channels at once (8 on rows of 8 columns or
    # fewer), bands of 3, 2 and 1 rows, vectors of 16 and of 8 columns
    (9, 10, 3, 1, 1, [1, 1, 1, 1], "hard_swish", True),    # bands of 3 + 3 + 3 + 1 rows, 4 + 4 + 1 channels
    (6, 11, 5, 1, 1, [2, 2, 2, 2], "relu6", True),         # bands of 3 + 3 + 3 + 2 rows, a row of 11 in 16 lanes
    (10, 48, 3, 2, 1, [1, 1, 1, 1], "relu", False),        # stride 2, rows of 24: 16 lanes then 8
    (21, 7, 5, 1, 1, [2, 2, 2, 2], "hard_swish", True),    # rows of 7 in 8 lanes, 8 + 8 + 4 + 1 channels
    (11, 13, 5, 2, 1, [1, 2, 2, 1], "sigmoid", True),      # stride 2 in 8 lanes, uneven padding, an activation after
    (5, 20, 3, 2, 1, [0, 1, 1, 0], None, True),            # padding after only on rows, before only on columns
]


@pytest.mark.parametrize("case", DEPTHWISE, ids=[f"dw{c[0]}x{c[1]}k{c[2]}s{c[3]}d{c[4]}-{c[6]}" for c in DEPTHWISE])
def test_depthwise_convolution_compiled_and_numpy(case, fresh_rng):
    channels, size, kernel, stride, dilation, pads, activation, bias = case
    rng = fresh_rng
    model = _conv_model(channels, size, kernel, stride, dilation, pads, channels, channels, activation, bias, rng)
    _both_ways_match_onnxruntime(model, (1, channels, size, size), rng)


#: DEPTHWISE's cases the bands take that the kernels before them take otherwise (the flat plane,
#: rows over a copied plane, masked rows, channels innermost): a layout the bands cannot read still
#: falls back on these
WITHOUT_BANDS = [(channels, size, kernel, stride, dilation, pads, activation, bias)
                 for channels, size, kernel, stride, dilation, pads, activation, bias in DEPTHWISE
                 if dilation == 1 and stride in (1, 2)
                 and (size + pads[1] + pads[3] - kernel) // stride + 1 >= cpu_jit.BANDS_MIN_ROW]


@pytest.mark.parametrize("case", WITHOUT_BANDS, ids=[f"dw{c[0]}x{c[1]}k{c[2]}s{c[3]}-{c[6]}" for c in WITHOUT_BANDS])
def test_depthwise_convolution_without_the_bands(case, fresh_rng, monkeypatch):
    monkeypatch.setattr(cpu_jit, "BANDS_MIN_ROW", 1 << 30)
    channels, size, kernel, stride, dilation, pads, activation, bias = case
    model = _conv_model(channels, size, kernel, stride, dilation, pads, channels, channels, activation, bias, fresh_rng)
    _both_ways_match_onnxruntime(model, (1, channels, size, size), fresh_rng)


# (in channels, size, kernel, stride, pads, out channels, activation, bias): Winograd (3x3 stride 1
# at these sizes), the 1x1 GEMM and im2col with the compiled epilogue
DENSE = [
    (64, 24, 3, 1, [1, 1, 1, 1], 64, "relu", True),
    (32, 13, 3, 1, [1, 1, 1, 1], 48, "sigmoid", True),
    (32, 14, 3, 1, [0, 1, 2, 1], 32, None, False),
    (48, 20, 1, 1, [0, 0, 0, 0], 96, "relu6", True),
    (16, 23, 3, 2, [1, 1, 1, 1], 32, "relu", True),
    (8, 30, 7, 2, [3, 3, 3, 3], 16, None, True),
    (16, 48, 3, 1, [1, 1, 1, 1], 32, "sigmoid", True),  # an output large enough to share its activation
    (16, 48, 1, 1, [0, 0, 0, 0], 32, "sigmoid", True),  # ... after the 1x1 convolution's GEMM region
]


@pytest.mark.parametrize("case", DENSE, ids=[f"conv{c[0]}x{c[1]}k{c[2]}s{c[3]}-{c[6]}" for c in DENSE])
def test_convolution_epilogues_compiled_and_numpy(case, fresh_rng):
    channels, size, kernel, stride, pads, out_channels, activation, bias = case
    rng = fresh_rng
    model = _conv_model(channels, size, kernel, stride, 1, pads, 1, out_channels, activation, bias, rng)
    _both_ways_match_onnxruntime(model, (1, channels, size, size), rng)


def _stem_model(channels, hw, out_channels, kernel, strides, dilation, pads, activation, bias, batch, rng):
    """One convolution over few input channels on a [batch, channels, *hw] input, then ``activation``."""
    model = _conv_model(channels, hw[0], kernel, 1, dilation, pads, 1, out_channels, activation, bias, rng)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = batch
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_value = hw[1]
    conv = next(node for node in model.graph.node if node.op_type == "Conv")
    next(a for a in conv.attribute if a.name == "strides").ints[:] = strides
    return model


# (channels, [H, W], out channels, kernel, strides, dilation, pads t/l/b/r, activation, bias, batch): the
# direct rows (``cpu_direct``) in regions, im2col on Python threads and NumPy
DIRECT = [
    (3, [48, 192], 16, 3, [2, 2], 1, [1, 1, 1, 1], "hard_swish", True, 1),  # text_direction's stem, hard-swish in registers
    (3, [37, 41], 20, 3, [2, 2], 1, [0, 0, 0, 0], "relu6", True, 1),       # odd sizes, output channels past a block of 16
    (1, [32, 35], 7, 3, [1, 1], 1, [1, 1, 1, 1], "sigmoid", False, 1),      # one channel, no bias, an activation after
    (4, [30, 40], 33, 5, [1, 1], 2, [2, 0, 1, 3], "relu", True, 1),         # dilation 2, uneven padding, 3 blocks
    (2, [40, 38], 64, 7, [2, 2], 1, [3, 3, 3, 3], "silu", True, 1),         # ResNet's 7x7, SiLU after
    (3, [33, 34], 8, 3, [2, 1], 1, [1, 1, 1, 1], None, True, 2),            # row stride 2, column stride 1, a batch of 2
    (3, [20, 31], 16, 3, [1, 2], 1, [1, 1, 1, 1], "hard_swish", False, 1),  # rows of exactly ROW_WIDTH at stride 2
    (3, [20, 17], 5, 2, [1, 1], 1, [0, 0, 0, 0], "relu", True, 1),          # an even kernel, rows of exactly ROW_WIDTH
]


@pytest.mark.parametrize("case", DIRECT, ids=[f"direct{c[0]}x{c[1][0]}x{c[1][1]}k{c[3]}s{c[4][0]}{c[4][1]}-{c[7]}"
                                              for c in DIRECT])
def test_direct_convolution_over_few_channels(case, fresh_rng):
    channels, hw, out_channels, kernel, strides, dilation, pads, activation, bias, batch = case
    model = _stem_model(channels, hw, out_channels, kernel, strides, dilation, pads, activation, bias, batch, fresh_rng)
    sess = gpumnn.load(model).session(backend="cpu", threads=2)
    assert " direct " in sess.report(), sess.report()
    _both_ways_match_onnxruntime(model, (batch, channels, *hw), fresh_rng)


def test_direct_convolution_with_a_run_time_bias(fresh_rng):
    """Constant weights, the bias fed at run time: the direct rows' table takes it on every run."""
    model = _stem_model(3, [20, 40], 24, 3, [2, 2], 1, [1, 1, 1, 1], "hard_swish", True, 1, fresh_rng)
    bias = next(t for t in model.graph.initializer if t.name == "B")
    model.graph.initializer.remove(bias)
    model.graph.input.append(helper.make_tensor_value_info("B", TensorProto.FLOAT, list(bias.dims)))
    sess = gpumnn.load(model).session(backend="cpu", threads=2)
    assert " direct " in sess.report(), sess.report()
    _both_ways_match_onnxruntime(model, {"x": (1, 3, 20, 40), "B": tuple(bias.dims)}, fresh_rng, names=("x", "B"))


# (in channels, size, kernel, stride, dilation, pads, out channels, activation, bias): convolutions over
# few input channels (a stem): the direct rows where their rows are 16 columns or more, else rows of
# output channels under lane masks (cpu_jit.conv_masked)
FEW_CHANNELS = [
    (3, 33, 3, 2, 1, [1, 1, 1, 1], 16, "hard_swish", True),  # a MobileNet-v3 stem; rows of 16 + 1 columns
    (1, 20, 5, 1, 1, [2, 2, 2, 2], 7, "relu6", True),        # one input channel, 4 + 1 + 1 + 1 output channels
    (4, 17, 3, 2, 1, [0, 0, 1, 1], 21, None, False),         # padding after only, 16 + 4 + 1 output channels
    (3, 40, 3, 2, 1, [1, 1, 1, 1], 32, "sigmoid", True),     # an activation after the region
    (2, 19, 3, 1, 2, [2, 2, 2, 2], 24, "relu", True),        # dilation 2, 16 + 8
    (3, 21, 7, 2, 1, [3, 3, 3, 3], 8, "silu", True),         # 7x7 stride 2
]


@pytest.mark.parametrize("case", FEW_CHANNELS, ids=[f"conv{c[0]}x{c[1]}k{c[2]}s{c[3]}d{c[4]}-{c[7]}"
                                                    for c in FEW_CHANNELS])
def test_convolution_over_few_channels_compiled_and_numpy(case, fresh_rng):
    channels, size, kernel, stride, dilation, pads, out_channels, activation, bias = case
    model = _conv_model(channels, size, kernel, stride, dilation, pads, 1, out_channels, activation, bias, fresh_rng)
    _both_ways_match_onnxruntime(model, (1, channels, size, size), fresh_rng)


def test_few_channels_take_the_masked_rows_and_many_do_not():
    from gpumnn import atomic as A
    from gpumnn.backends.cpu.engines import Engine

    def kernel(channels, stride, constant=False):
        op = A.Conv2D(inputs=("x", "w"), outputs=("y",), source="test", in_channels=channels, out_channels=16,
                      in_hw=(48, 192), out_hw=(48 // stride, 192 // stride), kernel=(3, 3), strides=(stride, stride),
                      pads=(1, 1), scheme="im2col")
        return Engine(threads=2, jit=True, regions=2).conv(op, constant).kernel
    assert kernel(3, 2, constant=True) == "direct_region"  # rows of 96 columns on constant weights: the direct rows
    assert kernel(3, 2) == kernel(1, 2) == "masked_region"
    assert kernel(3, 3) != "masked_region" and kernel(16, 2) != "masked_region"
    assert kernel(3, 1) != "masked_region"  # past MASKED_MAX_MACS: im2col's region shares it


def test_masked_rows_leave_lanes_past_the_row_alone(fresh_rng):
    """The masked stores write the output row's columns only: a canary past each row survives."""
    require_tool("numba", cpu_jit.MISSING)
    x = fresh_rng.standard_normal((13, 3, 12)).astype(np.float32)
    w = fresh_rng.standard_normal((13, 5, 5)).astype(np.float32)
    bias = fresh_rng.standard_normal(13).astype(np.float32)
    wide = np.full((13, 3, 40), 7.0, np.float32)
    cpu_jit.depthwise_masked(x, w, bias, wide[:, :, :12], np.zeros((1, 1), np.float32), np.zeros(1, np.float32),
                             (1, 1, 1, 1), 2, 2, np.float32(-np.inf), np.float32(np.inf), 0)
    padded = np.pad(x, ((0, 0), (2, 2), (2, 2)))
    expected = bias[:, None, None] + sum(w[:, ky, kx, None, None] * padded[:, ky:ky + 3, kx:kx + 12]
                                         for ky in range(5) for kx in range(5))
    assert np.abs(wide[:, :, :12] - expected).max() < 1e-4
    assert (wide[:, :, 12:] == 7.0).all()


@pytest.mark.parametrize("stride, size, width", [(1, 7, 7), (1, 12, 24), (2, 9, 17), (2, 24, 48)])
def test_depthwise_bands_leave_lanes_past_the_row_alone(stride, size, width, fresh_rng):
    """The bands' masked stores write the output rows' columns only (vectors of 16 and of 8): a
    canary past each row and after the last channel survives; the sums match NumPy's."""
    require_tool("numba", cpu_jit.MISSING)
    channels, kernel, pad = 13, 5, 2  # 8 + 4 + 1 channels on rows of 8 columns or fewer, else 4 + 4 + 4 + 1
    x = fresh_rng.standard_normal((channels, size, width)).astype(np.float32)
    w = fresh_rng.standard_normal((channels, kernel, kernel)).astype(np.float32)
    bias = fresh_rng.standard_normal(channels).astype(np.float32)
    oh, ow = (size + 2 * pad - kernel) // stride + 1, (width + 2 * pad - kernel) // stride + 1
    wide = np.full((channels + 1, oh, ow + 40), 7.0, np.float32)
    cpu_jit.depthwise_bands(x, w, bias, wide[:channels, :, :ow], np.zeros((1, 1), np.float32), np.zeros(1, np.float32),
                            (stride, stride, 1, 1), pad, pad, np.float32(-np.inf), np.float32(np.inf), 0)
    padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad)))
    expected = bias[:, None, None] + sum(
        w[:, ky, kx, None, None] * padded[:, ky:ky + stride * (oh - 1) + 1:stride, kx:kx + stride * (ow - 1) + 1:stride]
        for ky in range(kernel) for kx in range(kernel))
    assert np.abs(wide[:channels, :, :ow] - expected).max() < 1e-4
    assert (wide[:channels, :, ow:] == 7.0).all() and (wide[channels] == 7.0).all()


def test_depthwise_on_few_pixels_with_run_time_weights(fresh_rng):
    """Weights fed at run time: the channels-innermost kernel's table of them is filled on every run."""
    model = _conv_model(40, 3, 5, 1, 1, [2, 2, 2, 2], 40, 40, "relu", True, fresh_rng)
    weight = next(t for t in model.graph.initializer if t.name == "W")
    model.graph.initializer.remove(weight)
    model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, list(weight.dims)))
    _both_ways_match_onnxruntime(model, {"x": (1, 40, 3, 3), "W": tuple(weight.dims)}, fresh_rng, names=("x", "W"))


def test_masked_depthwise_and_stem_with_run_time_weights(fresh_rng):
    """Weights fed at run time: the masked kernels read them where they lie on every run."""
    for channels, groups, out_channels, size in ((24, 24, 24, 12), (3, 1, 16, 20)):
        model = _conv_model(channels, size, 5 if groups > 1 else 3, 1, 1, [2, 2, 2, 2] if groups > 1 else [1, 1, 1, 1],
                            groups, out_channels, "hard_swish", True, fresh_rng)
        weight = next(t for t in model.graph.initializer if t.name == "W")
        model.graph.initializer.remove(weight)
        model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, list(weight.dims)))
        _both_ways_match_onnxruntime(model, {"x": (1, channels, size, size), "W": tuple(weight.dims)}, fresh_rng,
                                     names=("x", "W"))


def test_both_stride_1_depthwise_loops_are_covered(monkeypatch):
    from gpumnn import atomic as A

    monkeypatch.setattr(cpu_jit, "BANDS_MIN_ROW", 1 << 30)  # as where the bands cannot read the layout

    flat, rows = (cpu_jit.depthwise_kernel(A.Conv2D(inputs=("x", "w"), outputs=("y",), source="test", in_channels=8,
                                                    out_channels=8, groups=8, in_hw=(size, size),
                                                    out_hw=(size, size), kernel=(3, 3), pads=(1, 1)))[0]
                  for size in (19, 66))
    assert flat is cpu_jit.depthwise3x3_s1_flat and rows is cpu_jit.depthwise_rows


def test_each_generic_depthwise_loop_is_covered(monkeypatch):
    from gpumnn import atomic as A

    def kernel(channels, size, stride, dilation=1, masked=True):
        out = (size + 4 - 4 * dilation - 1) // stride + 1
        return cpu_jit.depthwise_kernel(A.Conv2D(inputs=("x", "w"), outputs=("y",), source="test",
                                                 in_channels=channels, out_channels=channels, groups=channels,
                                                 in_hw=(size, size), out_hw=(out, out), kernel=(5, 5),
                                                 strides=(stride, stride), dilations=(dilation, dilation),
                                                 pads=(2, 2)), masked)[0]
    # the bands: dilation 1, column stride 1 or 2, rows of BANDS_MIN_ROW columns or more, any plane
    assert kernel(24, 20, 2) is kernel(40, 12, 1) is kernel(40, 6, 1) is kernel(64, 40, 1) is cpu_jit.depthwise_bands
    assert kernel(40, 3, 1) is kernel(48, 9, 2) is cpu_jit.depthwise_channels_last  # rows of 3
    assert kernel(8, 40, 3) is cpu_jit.depthwise_any
    assert kernel(8, 14, 1, dilation=2) is cpu_jit.depthwise_masked
    one_row = A.Conv2D(inputs=("x", "w"), outputs=("y",), source="test", in_channels=8, out_channels=8, groups=8,
                       in_hw=(1, 64), out_hw=(1, 64), kernel=(1, 5), pads=(0, 2))
    assert cpu_jit.depthwise_kernel(one_row)[0] is cpu_jit.depthwise_rows  # a 1-D window: no rows to share
    assert kernel(40, 12, 1, masked=False) is cpu_jit.depthwise_rows  # weights the bands cannot read in place
    monkeypatch.setattr(cpu_jit, "BANDS_MIN_ROW", 1 << 30)
    assert kernel(64, 40, 1) is kernel(48, 40, 2) is cpu_jit.depthwise_rows
    assert kernel(24, 20, 2) is kernel(40, 12, 1) is kernel(40, 6, 1) is cpu_jit.depthwise_masked


def test_the_winograd_scheme_runs_with_the_compiled_epilogue():
    rng = np.random.default_rng(3)
    model = _conv_model(64, 24, 3, 1, 1, [1, 1, 1, 1], 1, 64, "relu", True, rng)
    sess = gpumnn.load(model).session(backend="cpu", threads=2)
    assert "winograd" in sess.report(), sess.report()


# (channels, size, op, kernel, stride, pads, ceil mode, count_include_pad)
POOLS = [
    (64, 111, "MaxPool", 3, 2, [0, 0, 0, 0], 1, 0),      # SqueezeNet: ceil-mode windows past the edge
    (32, 56, "MaxPool", 3, 2, [1, 1, 1, 1], 0, 0),       # ResNet
    (48, 17, "AveragePool", 3, 1, [1, 1, 1, 1], 0, 0),   # Inception, padding not counted
    (48, 17, "AveragePool", 3, 1, [1, 1, 1, 1], 0, 1),   # ... and counted
    (24, 8, "MaxPool", 3, 1, [1, 1, 1, 1], 0, 0),        # stride 1, the input's size: flat planes
    (16, 2, "AveragePool", 3, 1, [1, 1, 1, 1], 0, 0),    # ... the smallest plane they take
    (8, 9, "AveragePool", 3, 1, [0, 1, 1, 0], 0, 1),     # stride 1, uneven padding: row by row
    (8, 9, "MaxPool", 3, 1, [0, 0, 0, 0], 0, 0),         # stride 1, no padding
    (8, 10, "AveragePool", 3, 2, [0, 1, 2, 0], 1, 0),    # uneven padding, ceil mode
    (8, 10, "MaxPool", 3, 2, [0, 0, 0, 0], 0, 0),        # stride 2, even width: the last column read by no window
    (6, 13, "AveragePool", 3, 2, [1, 1, 1, 1], 0, 1),    # stride 2, padding counted
    (8, 9, "MaxPool", 3, 3, [1, 0, 1, 1], 1, 0),         # stride 3
    (8, 9, "MaxPool", 2, 2, [0, 0, 1, 1], 0, 0),         # not 3x3, padded: NumPy's kernel either way
    (32, 23, "MaxPool", 2, 2, [0, 0, 0, 0], 0, 0),       # windows that tile the input (the odd edge unread)
    (12, 12, "AveragePool", 2, 2, [0, 0, 0, 0], 0, 0),   # ... a mean
    (12, 13, "MaxPool", 3, 3, [0, 0, 0, 0], 0, 0),       # ... 3 wide
    (12, 16, "AveragePool", 4, 4, [0, 0, 0, 0], 0, 1),   # ... 4 wide
]


@pytest.mark.parametrize("case", POOLS, ids=[f"{c[2]}{c[0]}x{c[1]}k{c[3]}s{c[4]}c{c[6]}p{c[7]}" for c in POOLS])
def test_pooling_compiled_and_numpy(case, fresh_rng):
    channels, size, op, kernel, stride, pads, ceil, include_pad = case
    rng = fresh_rng
    _both_ways_match_onnxruntime(_pool_model(channels, size, op, kernel, stride, pads, ceil, include_pad),
                                 (1, channels, size, size), rng)


@pytest.mark.parametrize("model_name", ["mobilenet_v2", "squeezenet1_1"])
def test_a_zoo_model_on_numpy_kernels_alone(model_name):
    """The zoo runs on the compiled loops in every other test; here the NumPy reference kernels
    carry a whole network (depthwise convolutions, pooling) against ONNX Runtime."""
    from gpumnn.tools.benchmark import load_model

    import onnxruntime as ort

    net, model_bytes, feed = load_model(model_name)
    ref = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    got = next(iter(net.session(backend="cpu", jit=False, threads=2).run(feed).values()))
    assert rel_l2(got, ref) < 1e-3


def test_jit_option_is_checked():
    with pytest.raises(BackendOptionError, match="jit"):
        gpumnn.backends.create_backend("cpu", jit="yes")


def test_jit_without_numba_says_why(monkeypatch):
    monkeypatch.setattr(cpu_jit, "numba", None)
    monkeypatch.setattr(cpu_jit, "MISSING", "Numba is not importable (test)")
    with pytest.raises(BackendUnavailableError, match="Numba is not importable"):
        gpumnn.backends.create_backend("cpu", jit=True)
    backend = gpumnn.backends.create_backend("cpu")  # unset: the NumPy kernels, and it says so
    assert not backend.jit and "Numba" not in backend.info.device


# -- compiled GELU and erf (cpu_activations) --------------------------------------------------------

def test_compiled_gelu_and_erf_agree_with_numpy_and_the_exact_erf():
    """One vectorised pass (exp written out) gives what the NumPy kernels give: the same A&S
    formula, to float32 rounding; within 1e-6 of the exact erf; NaN and infinities as NumPy."""
    import math

    from gpumnn.backends.cpu import activations as cpu_activations, elementwise as cpu_math
    require_tool("numba", cpu_jit.MISSING)
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(4099) * 3, rng.uniform(-12, 12, 997), [0.0, -0.0, 1e-30, -1e-30, 40.0,
                        -40.0, 200.0, -200.0, np.inf, -np.inf, np.nan]]).astype(np.float32)
    for compiled, numpy_kernel in ((cpu_activations.erf_in_place, cpu_math.erf_into),
                                   (cpu_activations.gelu_in_place, cpu_math.gelu_into)):
        got, want = x.copy(), np.empty_like(x)
        compiled(got)
        with np.errstate(invalid="ignore"):
            numpy_kernel(x, want)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, equal_nan=True)
    erf = x.copy()
    cpu_activations.erf_in_place(erf)
    exact = np.array([math.erf(v) for v in x[np.isfinite(x)].astype(np.float64)])
    assert np.max(np.abs(erf[np.isfinite(x)] - exact)) < 1e-6


@pytest.mark.parametrize("name, params", [("sigmoid", ()), ("hard_swish", ()), ("hard_sigmoid", (0.2, 0.5)),
                                          ("hard_sigmoid", (1.0 / 6.0, 0.5)), ("sqrt", ()), ("silu", ())])
def test_compiled_mobile_activations_match_numpy(name, params):
    """Sigmoid, hard-swish, hard sigmoid and SiLU as compiled passes, in place (an epilogue) and from x
    into out (the Unary op), against the NumPy kernels: extremes and NaN included."""
    from gpumnn.backends.cpu import activations as cpu_activations, elementwise as cpu_math
    require_tool("numba", cpu_jit.MISSING)
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal(4093) * 4, [0.0, -0.0, 3.0, -3.0, 1e-30, 88.0, -88.0, 88.5, -88.5,
                                                        104.0, -104.0, np.inf, -np.inf, np.nan]]).astype(np.float32)
    want = np.empty_like(x)
    with np.errstate(all="ignore"):
        cpu_math.unary_function(name, params, np.dtype(np.float32))(x, want)
    in_place = x.copy()
    cpu_activations.activation_in_place(name, lambda a: pytest.fail("fell back"), params)(in_place)
    into = np.full_like(x, 7.0)
    cpu_activations.unary_into(name, params, x, into)()
    same = x.copy()
    cpu_activations.unary_into(name, params, same, same)()  # the Unary op on one buffer: the in-place loop
    for got in (in_place, into, same):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7, equal_nan=True)
    assert not np.allclose(want[:100], 0.0)
    assert cpu_activations.unary_into(name, params, x[1:], x[:-1]) is None  # overlapping views: NumPy's kernel


def test_sum_then_square_root_and_log_match_onnxruntime():
    """An STFT's magnitude: sqrt(re^2 + im^2), then log(x + eps). The square root rides on the sum
    (a Binary's activation), a compiled pass with the compiled loops, NumPy's ufunc without; the log
    is NumPy's ufunc written straight into the output."""
    require_tool("numba", cpu_jit.MISSING)
    rng = np.random.default_rng(11)
    nodes = [helper.make_node("Mul", ["re", "re"], ["re2"]), helper.make_node("Mul", ["im", "im"], ["im2"]),
             helper.make_node("Add", ["re2", "im2"], ["power"]), helper.make_node("Sqrt", ["power"], ["magnitude"]),
             helper.make_node("Add", ["magnitude", "eps"], ["floor"]), helper.make_node("Log", ["floor"], ["y"])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 129, 33]) for n in ("re", "im")]
    graph = helper.make_graph(nodes, "magnitude", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array([1e-3], np.float32), "eps")])
    model = model_proto(graph, 13)
    feed = {n: rng.standard_normal((1, 129, 33)).astype(np.float32) for n in ("re", "im")}
    feed["re"][0, 0, :5] = 0.0  # with im below: log(eps) where the magnitude is 0
    feed["im"][0, 0, :5] = 0.0
    want = onnxruntime_session(model).run(None, feed)[0]
    for jit in (True, False):
        sess = gpumnn.load(model).session(backend="cpu", threads=2, jit=jit)
        activations = {getattr(exe.op, "activation", None) for exe in sess.shape_set().first_state.executions}
        assert ("sqrt", ()) in activations  # the path under test: the square root on the sum
        for _ in range(2):
            got = sess.run(feed)["y"]
            assert rel_l2(got, want) < 1e-6, jit


def test_compiled_activation_falls_back_to_numpy_off_contiguous_float32():
    from gpumnn.backends.cpu import activations as cpu_activations, elementwise as cpu_math
    require_tool("numba", cpu_jit.MISSING)
    calls = []
    apply = cpu_activations.activation_in_place("gelu", lambda a: calls.append(a.shape))
    grid = np.linspace(-3, 3, 48, dtype=np.float32).reshape(6, 8)
    expected = np.empty_like(grid)
    cpu_math.gelu_into(grid, expected)
    apply(grid)  # contiguous: compiled, in place
    np.testing.assert_allclose(grid, expected, rtol=1e-6, atol=1e-7)
    apply(np.zeros((8, 6), np.float32).T)  # a transposed view: NumPy, so the write lands in place
    apply(np.zeros(4, np.float64))
    assert calls == [(6, 8), (4,)]
    assert cpu_activations.activation_in_place("tanh", np.tanh) is np.tanh  # no compiled loop: NumPy's


@pytest.mark.parametrize("directions, batch", [(1, 1), (2, 3)])
def test_compiled_lstm_step_matches_the_numpy_step(directions, batch):
    """``cpu_recurrent.lstm_steps`` (the usual LSTM step as one pass) against ``cell_step``, with
    large pre-activations in the gates, on a projection whose step rows are offset and strided."""
    from gpumnn import atomic as A
    from gpumnn.backends.cpu import recurrent as cpu_recurrent
    require_tool("numba", cpu_jit.MISSING)
    rng = np.random.default_rng(9)
    hidden, row_stride = 37, 4 * 37 * directions + 5
    offsets = tuple(3 + d * (batch * row_stride + 11) for d in range(directions))
    op = A.RecurrentCell(inputs=("g", "x", "s"), outputs=("y",), source="test", cell="lstm", directions=directions,
                         batch=batch, hidden=hidden, x_offsets=offsets, x_row_stride=row_stride,
                         steps=(0,) * directions, activations=(("sigmoid", 0.0, 0.0), ("tanh", 0.0, 0.0),
                                                               ("tanh", 0.0, 0.0)) * directions)
    gates = (rng.standard_normal(directions * batch * 4 * hidden) * 6).astype(np.float32)
    projection = rng.standard_normal(offsets[-1] + batch * row_stride + 4 * hidden).astype(np.float32)
    state = (rng.standard_normal(2 * directions * batch * hidden) * 2).astype(np.float32)
    want, got = np.empty_like(state), np.empty_like(state)
    x = np.lib.stride_tricks.as_strided(projection[offsets[0]:], (directions, batch, 4, hidden),
                                        tuple(4 * s for s in (offsets[-1] - offsets[0], row_stride, hidden, 1)))
    cpu_recurrent.cell_step(op, cpu_recurrent.direction_groups(op), gates.reshape(directions, batch, 4, hidden), x,
                            state.reshape(2, directions, batch, hidden), {}, want.reshape(2, directions, batch, hidden))
    cpu_recurrent.compiled_lstm_step(op, gates, projection, state, got)()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=3e-7)


def test_every_atomic_case_compiled_matches_numpy():
    """Every float32 case of the atomic-op table on the compiled engine (native regions on two
    threads) against the NumPy kernels (``jit=False``): the small-product loop, the compiled
    activations and the LSTM step among them."""
    from gpumnn.backends.cpu.backend import CpuBackend
    from test_atomic_ops import CASES, run_case

    require_tool("numba", cpu_jit.MISSING)
    compiled, numpy_kernels = CpuBackend(threads=2), CpuBackend(threads=1, jit=False)
    try:
        checked = 0
        for name, make in CASES.items():
            case = make(np.random.default_rng(0))
            if any(np.dtype(case.output_dtype(n)) != np.float32 for n in case.outputs):
                continue
            outputs = [run_case(be, case, {n: np.zeros(s, np.float32) for n, s in case.outputs.items()})
                       for be in (compiled, numpy_kernels)]
            for output in case.outputs:
                got, want = outputs[0][output], outputs[1][output]
                scale = max(float(np.linalg.norm(want)), 1e-12)
                assert float(np.linalg.norm(got - want)) / scale < 1e-5, f"{name}: {output} differs"
            checked += 1
        assert checked > 50
    finally:
        compiled.close()
        numpy_kernels.close()


@pytest.mark.parametrize("axis", [0, 1])
def test_gather_with_run_time_indices(axis, fresh_rng):
    """Gather's compiled rows (``cpu_jit.gather_rows``) and NumPy's kernel: an embedding lookup
    (axis 0) and a middle axis, indices negative (from the end) and out of range (clamped, the
    op's contract), float32 data."""
    require_tool("numba", cpu_jit.MISSING)
    data = fresh_rng.standard_normal((6, 5, 4)).astype(np.float32)
    indices = np.array([[0, 3, -1], [2, 9, -8]], np.int64)  # 9 and -8: past either end
    graph = helper.make_graph([helper.make_node("Gather", ["d", "i"], ["y"], axis=axis)], "gather",
                              [helper.make_tensor_value_info("i", TensorProto.INT64, list(indices.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(data, "d")])
    size = data.shape[axis]
    fixed = np.clip(np.where(indices < 0, indices + size, indices), 0, size - 1)
    expected = np.take(data, fixed, axis=axis)
    net = gpumnn.load(model_proto(graph, 13))
    for way in WAYS:
        sess = net.session(backend="cpu", threads=2, **way)
        np.testing.assert_array_equal(sess.run({"i": indices})["y"], expected)


@pytest.mark.parametrize("mode,coord", [("nearest", "asymmetric"), ("linear", "half_pixel"), ("linear", "align_corners")])
@pytest.mark.parametrize("size", [(5, 8), (96, 96)], ids=["small", "plane-spans"])
def test_resize_compiled_and_numpy(mode, coord, size, fresh_rng):
    """Nearest and linear Resize in ``cpu_jit``'s loops and in NumPy's, against ONNX Runtime: an FPN
    neck's 2x upsampling, and (96x96 planes, 2x up and 1.5x across) an output large enough to be cut
    into plane spans on the Python threads (``Engine.resize``). Widths times 1.5 are whole: ONNX
    Runtime's align_corners differs from the ONNX reference otherwise (tests/test_resize_modes.py)."""
    h, w = size
    scales = numpy_helper.from_array(np.array([1, 1, 2, 1.5], np.float32), "scales")
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode, coordinate_transformation_mode=coord)
    graph = helper.make_graph([node], "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 24, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [scales])
    if size == (96, 96):
        from gpumnn.backends.cpu.engines import Engine
        assert Engine(jit=True, threads=2).resize(24 * 192 * 144).parts == 2
    _both_ways_match_onnxruntime(model_proto(graph, 13), (1, 24, h, w), fresh_rng)
