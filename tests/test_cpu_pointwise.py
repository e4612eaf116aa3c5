"""The cpu backend's pointwise tiles (``compiled._pointwise_region``, ``cpu_parallel.pointwise_tiles``):
1x1 convolutions on constant weights over few pixels, against NumPy at odd sizes (pixels on both
sides of NR, channels that fill no panel, every activation the tiles apply or leave for after) and
against ONNX Runtime through a session."""
from __future__ import annotations

import types

import numpy as np
import pytest

from conftest import rel_l2, require_tool
from test_cpu_jit import _both_ways_match_onnxruntime, _conv_model
from gpumnn.backends.cpu import compiled as cpu_compiled, engines as cpu_engines, jit as cpu_jit
from gpumnn.backends.cpu import parallel as cpu_parallel, tiles as cpu_tiles


def _reference(activation, y: np.ndarray) -> np.ndarray:
    """``activation`` on float64 ``y`` as ONNX defines it."""
    if activation is None:
        return y
    name, params = activation
    if name == "relu":
        return np.maximum(y, 0.0)
    if name == "clip":
        return np.clip(y, params[0], params[1])
    if name == "hard_swish":
        return y * np.clip(y / 6.0 + 0.5, 0.0, 1.0)
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-y))
    if name == "silu":
        return y / (1.0 + np.exp(-y))
    if name == "gelu":
        from math import erf
        return 0.5 * y * (1.0 + np.vectorize(erf)(y / np.sqrt(2.0)))
    raise AssertionError(name)


ACTIVATIONS = [None, ("relu", ()), ("clip", (0.0, 6.0)), ("hard_swish", ()), ("sigmoid", ()), ("silu", ()),
               ("gelu", ())]
# (pixels, in channels, out channels): pixels from 1 to 3025 (both orientations, every tail), channel
# counts that fill neither a panel of MR nor one of NR; the last two deep enough to cut their pixels
# into chunks (``cpu_parallel.POINTWISE_CHUNK_FLOATS``), the last chunk taking the pixels left
SHAPES = [(1, 20, 37), (1, 300, 130), (2, 3, 5), (5, 37, 17), (6, 16, 16), (7, 9, 33), (12, 96, 40), (13, 5, 1),
          (15, 31, 47), (16, 20, 7), (17, 37, 13), (23, 8, 29), (31, 1, 6), (36, 40, 61), (47, 21, 19), (49, 64, 12),
          (64, 13, 100), (70, 35, 22), (53, 700, 10), (70, 2100, 9),
          # planes the small-weights gate gives the tiles (``engines.POINTWISE_MAX_WEIGHT_BYTES``)
          (97, 33, 5), (144, 24, 88), (400, 64, 32), (576, 16, 72), (575, 17, 19), (1600, 32, 16), (729, 33, 130),
          (3025, 16, 64), (400, 128, 130), (100, 256, 250),
          # weights past it on fewer than ``engines.POINTWISE_BROADCAST_MAX_PIXELS`` pixels: each pixel broadcast
          (16, 2048, 40), (49, 520, 130), (63, 1024, 70), (196, 600, 120), (255, 1100, 61)]


def _run(pixels, channels, out_channels, activation, has_bias, parts, batch, rng, constant_bias=True):
    """(got, want): the pointwise region on a random batch against float64 NumPy. ``out`` lies inside
    a guard of NaNs that must stay as they are."""
    x = rng.standard_normal((batch, channels, pixels)).astype(np.float32)
    weight = rng.standard_normal((out_channels, channels)).astype(np.float32)
    bias = rng.standard_normal((out_channels, 1)).astype(np.float32) if has_bias else None
    guarded = np.full(batch * out_channels * pixels + 64, np.nan, np.float32)
    out = guarded[32:32 + batch * out_channels * pixels].reshape(batch, out_channels, pixels)
    op = types.SimpleNamespace(activation=activation)
    made = cpu_compiled._pointwise_region(op, x, weight, out, bias, constant_bias, 2, parts,
                                          lambda key, make: make())
    for work in made.work:
        work()
    y = np.einsum("oc,bcp->bop", weight.astype(np.float64), x.astype(np.float64))
    if has_bias:
        y += bias.astype(np.float64)[None]
    assert np.isnan(guarded[:32]).all() and np.isnan(guarded[-32:]).all(), "a store past the output"
    return out, _reference(activation, y), (x, weight, bias, made)


def _close(got: np.ndarray, want: np.ndarray) -> None:
    """float32 sums against float64 ones: within 1e-5 in relative L2 (a wrong output among a few
    hundred is far past it), every output written."""
    assert np.isfinite(got).all()
    assert rel_l2(got, want) < 1e-5


@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"p{s[0]}c{s[1]}o{s[2]}" for s in SHAPES])
def test_pointwise_tiles_against_numpy(shape, parts, fresh_rng):
    require_tool("regions", cpu_parallel.available()[1])
    pixels, channels, out_channels = shape
    for index, activation in enumerate(ACTIVATIONS):
        got, want, _ = _run(pixels, channels, out_channels, activation, index % 2 == 0, parts, 1 + index % 2,
                            fresh_rng)
        _close(got, want)


@pytest.mark.parametrize("lanes", [8, 16])
def test_pointwise_tiles_under_large_weights_in_both_orientations(lanes, monkeypatch, fresh_rng):
    """Weights past ``engines.POINTWISE_MAX_WEIGHT_BYTES`` on a few dozen pixels: each pixel broadcast
    where the pixel vectors are 8 floats wide, the pixels in the vectors where 16 (both decisions, on
    whichever host; the kernels are the host's)."""
    require_tool("regions", cpu_parallel.available()[1])
    monkeypatch.setattr(cpu_tiles, "PIXEL_LANES", lanes)
    for pixels, channels, out_channels in SHAPES[-5:]:
        assert 4 * channels * out_channels > cpu_engines.POINTWISE_MAX_WEIGHT_BYTES
        for parts in (1, 2):
            got, want, _ = _run(pixels, channels, out_channels, ("clip", (0.0, 6.0)), True, parts, 1, fresh_rng)
            _close(got, want)


@pytest.mark.parametrize("activation", ACTIVATIONS, ids=[a[0] if a else "none" for a in ACTIVATIONS])
@pytest.mark.parametrize("has_bias", [True, False])
def test_pointwise_tiles_each_activation(activation, has_bias, fresh_rng):
    """Each activation on both orientations and a pixel split across the threads."""
    require_tool("regions", cpu_parallel.available()[1])
    for pixels, channels, out_channels in [(11, 24, 50), (48, 24, 10), (70, 17, 40)]:
        got, want, _ = _run(pixels, channels, out_channels, activation, has_bias, 2, 2, fresh_rng)
        _close(got, want)


def test_pointwise_tiles_read_a_run_time_bias(fresh_rng):
    """A bias that is not a constant is copied into the padded one on every run."""
    require_tool("regions", cpu_parallel.available()[1])
    got, want, (x, weight, bias, made) = _run(20, 12, 21, ("relu", ()), True, 1, 1, fresh_rng, constant_bias=False)
    _close(got, want)
    bias[:] = fresh_rng.standard_normal(bias.shape).astype(np.float32)
    for work in made.work:
        work()
    _close(got, np.maximum(weight.astype(np.float64) @ x[0].astype(np.float64) + bias, 0.0)[None])


@pytest.mark.parametrize("pixels,channels,out_channels", [(17, 8, 6), (40, 8, 3), (64, 4, 7), (33, 2, 1)])
def test_pointwise_blocks_cover_every_output_once(pixels, channels, out_channels):
    """Pixel spans (few channel panels) start at multiples of NR and hold NR pixels or more; channel
    spans hold whole panels; together they cover every output once."""
    for in_rows in (True, False):
        if in_rows and pixels < cpu_tiles.NR:
            continue
        width = cpu_tiles.pointwise_rows(out_channels) if in_rows else cpu_tiles.NR
        for parts in (1, 2, 3):
            blocks = cpu_compiled._pointwise_blocks(out_channels, width, pixels, in_rows, parts)
            seen = np.zeros((-(-out_channels // width) * width, pixels), np.int64)
            for c0, c1, p0, p1 in blocks:
                assert c0 % width == 0 and c1 % width == 0
                if in_rows:
                    assert p0 % cpu_tiles.NR == 0 and p1 - p0 >= cpu_tiles.NR
                seen[c0:c1, p0:p1] += 1
            assert (seen == 1).all()
            assert len(blocks) <= parts


def test_pointwise_blocks_split_pixels_where_as_even():
    """Where pixel spans share out as evenly as channel panels, the threads take pixels: each then
    reads only its part of the input (MobileNet-v2's 24-channel 1x1s on 56x56, two panels)."""
    rows = cpu_tiles.pointwise_rows(24)
    blocks = cpu_compiled._pointwise_blocks(24, rows, 3136, True, 2)
    assert [tuple(b) for b in blocks] == [(0, -(-24 // rows) * rows, 0, 1568), (0, -(-24 // rows) * rows, 1568, 3136)]


def test_pointwise_rows_pad_fewest_channels():
    """The panel height pads no channel where one of POINTWISE_ROWS divides the channels, else the
    fewest; 16-float vectors (AVX-512 targets) hold 16 or 12 channels a panel, 8-float ones MR."""
    assert cpu_tiles.PIXEL_LANES in (8, 16)
    for channels in (1, 5, 12, 16, 24, 32, 40, 96, 144, 250):
        rows = cpu_tiles.pointwise_rows(channels)
        assert rows in cpu_tiles.POINTWISE_ROWS
        assert -channels % rows == min(-channels % r for r in cpu_tiles.POINTWISE_ROWS)
    if cpu_tiles.PIXEL_LANES == 16:
        assert [cpu_tiles.pointwise_rows(c) for c in (24, 32, 144, 96, 5)] == [12, 16, 16, 16, 12]
    else:
        assert cpu_tiles.POINTWISE_ROWS == (cpu_tiles.MR, cpu_tiles.MR)


# (rows, vectors, lanes) of the channels-in-rows tile: both targets' shapes (16 or 12 rows on one
# 16-float vector, MR rows on two 8-float ones) and the narrow tiles of 8 floats, whichever this host runs
CHANNEL_ROW_TILES = [(16, 1, 16), (12, 1, 16), (cpu_tiles.MR, 2, 8), (16, 1, 8), (12, 1, 8), (cpu_tiles.MR, 1, 8)]


@pytest.mark.parametrize("rows,vectors,lanes", CHANNEL_ROW_TILES, ids=[f"{r}x{v}x{l}" for r, v, l in CHANNEL_ROW_TILES])
def test_channel_rows_tile_at_each_width(rows, vectors, lanes, fresh_rng):
    """A channels-in-rows pointwise tile at every vector width and panel height either target builds
    (LLVM splits a 16-float vector where the host has no AVX-512): clamp(p^T x + bias) into its rows,
    the rows past ``valid`` into the dummy, nothing stored past a row's pixels."""
    require_tool("numba", cpu_jit.MISSING)
    kernel = cpu_tiles._pointwise_kernel(rows, vectors, True, lanes=lanes)
    depth, width, pixels, valid = 37, vectors * lanes, vectors * lanes + 5, rows - 3
    p = fresh_rng.standard_normal((depth, rows)).astype(np.float32)
    x = fresh_rng.standard_normal((depth, pixels)).astype(np.float32)
    bias = fresh_rng.standard_normal(rows).astype(np.float32)
    out = np.full((rows, pixels), np.nan, np.float32)
    dummy = np.zeros(width, np.float32)

    @cpu_jit.numba.njit
    def call(p, x, out, bias, dummy):
        kernel(p.ctypes.data, rows, x.ctypes.data, pixels, depth, out.ctypes.data, pixels, 1, valid, bias.ctypes.data,
               np.float32(-1.0), np.float32(2.0), 0, dummy.ctypes.data)
    call(p, x, out, bias, dummy)
    want = np.clip(p.T.astype(np.float64) @ x.astype(np.float64) + bias[:, None], -1.0, 2.0)
    assert rel_l2(out[:valid, :width], want[:valid, :width]) < 1e-5
    assert np.isnan(out[valid:]).all() and np.isnan(out[:, width:]).all()


# (channels, size, out channels, activation): 1x1 convolutions the engine gives the pointwise tiles
MODELS = [(96, 2, 576, "hard_swish"), (576, 3, 96, None), (40, 6, 37, "relu6"), (13, 8, 20, "silu"),
          (16, 1, 24, "relu"), (16, 24, 72, "hard_swish"), (72, 12, 24, None), (24, 13, 20, "relu")]


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("case", MODELS, ids=[f"pw{c[0]}x{c[1]}o{c[2]}" for c in MODELS])
def test_pointwise_convolutions_match_onnxruntime(case, batch, monkeypatch, fresh_rng):
    require_tool("numba", cpu_jit.MISSING)
    require_tool("regions", cpu_parallel.available()[1])
    channels, size, out_channels, activation = case
    calls = []
    monkeypatch.setattr(cpu_compiled, "_pointwise_region",
                        lambda *a, real=cpu_compiled._pointwise_region: calls.append(a) or real(*a))
    monkeypatch.setattr(cpu_engines, "SMALL_PRODUCT_MACS", 0)  # one pixel too
    model = _conv_model(channels, size, 1, 1, 1, [0, 0, 0, 0], 1, out_channels, activation, True, fresh_rng)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = batch
    _both_ways_match_onnxruntime(model, (batch, channels, size, size), fresh_rng)
    assert calls, "the pointwise tiles were not used"


def _squeeze_excitation_model(channels, size, reduced, alpha, beta, gate_bias, rng):
    """x -> GlobalAveragePool -> 1x1 Conv + Relu -> 1x1 Conv -> HardSigmoid(alpha, beta) -> Mul(x, gate)
    (MobileNet-v3's squeeze-excitation); ``gate_bias``: "constant", "input" (a graph input, so a
    run-time tensor) or None."""
    from onnx import TensorProto, helper, numpy_helper

    from op_cases import model_proto
    w1 = (rng.standard_normal((reduced, channels, 1, 1)) / np.sqrt(channels)).astype(np.float32)
    w2 = (rng.standard_normal((channels, reduced, 1, 1)) / np.sqrt(reduced)).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(rng.standard_normal(reduced).astype(np.float32), "B1"),
             numpy_helper.from_array(w2, "W2")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])]
    gate_inputs = ["r", "W2"]
    if gate_bias == "constant":
        inits.append(numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "B2"))
        gate_inputs.append("B2")
    elif gate_bias == "input":
        inputs.append(helper.make_tensor_value_info("B2", TensorProto.FLOAT, [channels]))
        gate_inputs.append("B2")
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]),
             helper.make_node("Conv", ["p", "W1", "B1"], ["q"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["q"], ["r"]),
             helper.make_node("Conv", gate_inputs, ["g"], kernel_shape=[1, 1]),
             helper.make_node("HardSigmoid", ["g"], ["s"], alpha=alpha, beta=beta),
             helper.make_node("Mul", ["x", "s"], ["y"])]
    graph = helper.make_graph(nodes, "se", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return model_proto(graph, 13)


# (channels, size, reduced channels, alpha, beta, the gate's bias)
SQUEEZE_EXCITATION = [(96, 3, 24, 1.0 / 6.0, 0.5, "constant"), (40, 5, 10, 0.2, 0.5, None),
                      (72, 4, 24, 1.0 / 6.0, 0.5, "input"), (33, 2, 7, 0.3, 0.2, "constant")]


@pytest.mark.parametrize("case", SQUEEZE_EXCITATION, ids=[f"se{c[0]}r{c[2]}{c[5]}" for c in SQUEEZE_EXCITATION])
def test_squeeze_excitation_gate_in_the_small_product(case, monkeypatch, fresh_rng):
    """The one-pixel 1x1 convolution before HardSigmoid (``small_product``) takes the gate as a clamp
    on weights and bias scaled once where its bias is constant (none counts), else the pass after;
    both against ONNX Runtime."""
    channels, size, reduced, alpha, beta, gate_bias = case
    activations = []
    monkeypatch.setattr(cpu_compiled, "_small_product",
                        lambda *a, real=cpu_compiled._small_product: activations.append(a[4]) or real(*a))
    model = _squeeze_excitation_model(channels, size, reduced, alpha, beta, gate_bias, fresh_rng)
    if gate_bias == "input":
        _both_ways_match_onnxruntime(model, {"x": (1, channels, size, size), "B2": (channels,)}, fresh_rng,
                                     names=("x", "B2"))
    else:
        _both_ways_match_onnxruntime(model, (1, channels, size, size), fresh_rng)
    names = {activation[0] for activation in activations if activation is not None}
    assert "relu" in names, "the squeeze's product did not take small_product"
    if gate_bias == "input":
        assert "hard_sigmoid" in names and "clip" not in names
    else:
        assert "clip" in names and "hard_sigmoid" not in names
