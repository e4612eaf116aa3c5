"""The cpu backend's tapped convolution (``compiled._tapped_conv_region``, ``cpu_parallel.tapped_conv``):
convolutions on few input channels read where they lie by ``cpu_tiles.tapped_tile``, against
float64 NumPy at odd sizes (rows on both sides of NR and NARROW, output channels that fill no panel,
padding on some sides only, dilations, strides along rows and columns, every activation) and against
ONNX Runtime through a session."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import rel_l2, require_tool
from test_cpu_jit import _both_ways_match_onnxruntime, _conv_model
from test_cpu_pointwise import ACTIVATIONS, _reference
from gpumnn import atomic as A
from gpumnn.backends.cpu import compiled as cpu_compiled, engines as cpu_engines, jit as cpu_jit
from gpumnn.backends.cpu import direct as cpu_direct, parallel as cpu_parallel, tiles as cpu_tiles
from gpumnn.backends.cpu.engines import Engine



@pytest.fixture(autouse=True)
def _tapped_tiles_take_few_channels(monkeypatch):
    """The few-channel cases here are the tapped tiles': the stems' direct and masked rows, which
    the engine tries first for at most 4 input channels, are kept off."""
    monkeypatch.setattr(cpu_direct, "MAX_IN_CHANNELS", 0)
    monkeypatch.setattr(cpu_engines, "MASKED_MAX_CHANNELS", 0)


def _op(channels, in_hw, out_channels, kernel, pads4, stride_h=1, dilations=(1, 1), activation=None, bias=True,
        batch=1, stride_w=1):
    """The Conv2D of these sizes; ``pads4`` (top, left, bottom, right)."""
    (h, w), (kh, kw), (dh, dw) = in_hw, kernel, dilations
    top, left, bottom, right = pads4
    oh = (h + top + bottom - (kh - 1) * dh - 1) // stride_h + 1
    ow = (w + left + right - (kw - 1) * dw - 1) // stride_w + 1
    return A.Conv2D(("x", "w", "b") if bias else ("x", "w"), ("y",), "conv", batch=batch, in_channels=channels,
                    in_hw=in_hw, out_channels=out_channels, out_hw=(oh, ow), kernel=kernel, strides=(stride_h, stride_w),
                    pads=(top, left), dilations=dilations, has_bias=bias, activation=activation)


def _want(op, x, weight, bias, pads4):
    """float64 NumPy: the convolution, its bias and activation, tap by tap over a zero-padded copy."""
    top, left, bottom, right = pads4
    (oh, ow), (kh, kw), (dh, dw), (sh, sw) = op.out_hw, op.kernel, op.dilations, op.strides
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    y = np.zeros((x.shape[0], op.out_channels, oh, ow))
    w64 = weight.astype(np.float64)
    for ky in range(kh):
        for kx in range(kw):
            window = xp[:, :, ky * dh:ky * dh + (oh - 1) * sh + 1:sh, kx * dw:kx * dw + (ow - 1) * sw + 1:sw]
            y += np.einsum("oc,bchw->bohw", w64[:, :, ky, kx], window)
    if bias is not None:
        y += bias.astype(np.float64).reshape(1, -1, 1, 1)
    return _reference(op.activation, y)


def _run(op, pads4, parts, rng, constant_bias=True):
    """(got, want, (x, weight, bias, made)): the tapped region on a random batch; ``out`` lies inside
    a guard of NaNs that must stay as they are."""
    n, c, oc = op.batch, op.in_channels, op.out_channels
    (h, w), (oh, ow), (kh, kw) = op.in_hw, op.out_hw, op.kernel
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    weight = rng.standard_normal((oc, c, kh, kw)).astype(np.float32)
    bias = rng.standard_normal((oc, 1)).astype(np.float32) if op.has_bias else None
    size = n * oc * oh * ow
    guarded = np.full(size + 64, np.nan, np.float32)
    out = guarded[32:32 + size].reshape(n, oc, oh * ow)
    made = cpu_compiled._tapped_conv_region(op, x, weight.reshape(oc, -1), out, bias, constant_bias, 2, parts,
                                            lambda key, make: make())
    for work in made.work:
        work()
    assert np.isnan(guarded[:32]).all() and np.isnan(guarded[-32:]).all(), "a store past the output"
    return out.reshape(n, oc, oh, ow), _want(op, x, weight, bias, pads4), (x, weight, bias, made)


def _close(got: np.ndarray, want: np.ndarray) -> None:
    """float32 sums against float64 ones within 1e-5 in relative L2, every output written."""
    assert np.isfinite(got).all()
    assert rel_l2(got, want) < 1e-5


# (channels, in (h, w), out channels, kernel, pads t/l/b/r, strides along rows and columns,
# dilations): output rows of 8 (one narrow tile), 9 to 15 (two narrow ones, the last moved back), 16,
# 17 and 40 (tiles of NR, the last moved back) and 160; output channels past whole panels of MR;
# padding on some sides only; at column stride 2, input rows of odd and even width, a left pad of 0
# and 1 (the first input column in either phase), no padding at all, dilated taps
SHAPES = [
    (3, (32, 160), 32, (3, 3), (1, 1, 1, 1), (1, 1), (1, 1)),   # CRNN's first convolution
    (192, (2, 40), 19, (2, 1), (0, 0, 0, 0), (1, 1), (1, 1)),   # CRNN's last: a 2x1 kernel, one output row
    (1, (9, 8), 7, (3, 3), (1, 1, 1, 1), (1, 1), (1, 1)),
    (2, (6, 11), 13, (3, 3), (0, 1, 2, 0), (1, 1), (1, 1)),
    (3, (7, 16), 6, (3, 3), (1, 1, 1, 1), (2, 1), (1, 1)),
    (5, (5, 19), 1, (1, 3), (0, 0, 0, 0), (1, 1), (1, 1)),
    (4, (12, 17), 20, (5, 5), (2, 2, 2, 2), (1, 1), (1, 1)),
    (3, (11, 21), 9, (3, 3), (2, 2, 2, 2), (2, 1), (2, 2)),
    (16, (4, 42), 24, (3, 3), (1, 1, 1, 1), (1, 1), (1, 1)),
    (16, (80, 80), 32, (3, 3), (1, 1, 1, 1), (2, 2), (1, 1)),  # yolox_nano's dark2.down
    (32, (40, 40), 64, (3, 3), (1, 1, 1, 1), (2, 2), (1, 1)),  # yolox_nano's dark3.down
    (3, (9, 35), 7, (3, 3), (0, 0, 0, 0), (2, 2), (1, 1)),     # no padding: the phases still copied
    (2, (6, 34), 13, (3, 3), (0, 1, 2, 0), (1, 2), (1, 1)),    # left pad 1, an even row
    (4, (7, 33), 8, (3, 3), (1, 0, 0, 1), (2, 2), (1, 1)),     # left pad 0, an odd row
    (3, (5, 41), 9, (1, 5), (0, 2, 0, 2), (1, 2), (1, 2)),     # dilated taps at column stride 2: one phase
    (2, (8, 40), 6, (2, 4), (1, 1, 0, 2), (2, 2), (1, 1)),     # an even kernel width
    (5, (6, 70), 11, (3, 3), (1, 1, 1, 1), (1, 3), (1, 1)),    # column stride 3 (not the engine's)
    (3, (6, 21), 14, (3, 3), (1, 1, 1, 1), (2, 2), (1, 1)),    # 11 output columns: narrow tiles
]


@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"c{s[0]}h{s[1][0]}w{s[1][1]}o{s[2]}k{s[3][0]}x{s[3][1]}"
                                              for s in SHAPES])
def test_tapped_conv_against_numpy(shape, parts, fresh_rng):
    require_tool("regions", cpu_parallel.available()[1])
    channels, in_hw, out_channels, kernel, pads4, (stride_h, stride_w), dilations = shape
    for index, activation in enumerate(ACTIVATIONS):
        op = _op(channels, in_hw, out_channels, kernel, pads4, stride_h, dilations, activation,
                 bias=index % 2 == 0, batch=1 + index % 2, stride_w=stride_w)
        assert op.out_hw[1] >= cpu_tiles.NARROW
        got, want, _ = _run(op, pads4, parts, fresh_rng)
        _close(got, want)


def test_tapped_conv_reads_a_run_time_bias(fresh_rng):
    """A bias that is not a constant is copied into the padded one on every run."""
    require_tool("regions", cpu_parallel.available()[1])
    pads4 = (1, 1, 1, 1)
    op = _op(3, (6, 20), 11, (3, 3), pads4, activation=("relu", ()))
    got, want, (x, weight, bias, made) = _run(op, pads4, 2, fresh_rng, constant_bias=False)
    _close(got, want)
    bias[:] = fresh_rng.standard_normal(bias.shape).astype(np.float32)
    for work in made.work:
        work()
    _close(got, _want(op, x, weight, bias, pads4))


REGIONS = Engine(jit=True, regions=2, threads=2)


@pytest.mark.parametrize("op, constant, expected", [
    (_op(3, (32, 160), 32, (3, 3), (1, 1, 1, 1)), True, "tapped_region"),
    (_op(192, (2, 40), 192, (2, 1), (0, 0, 0, 0)), True, "tapped_region"),  # depth 384: at TAPPED_MAX_DEPTH
    (_op(3, (32, 160), 32, (3, 3), (1, 1, 1, 1), stride_h=2), True, "tapped_region"),  # stride along rows only
    (_op(3, (32, 160), 32, (3, 3), (1, 1, 1, 1)), False, "im2col_region"),  # run-time weights
    (_op(43, (16, 16), 32, (3, 3), (1, 1, 1, 1)), True, "packed_region"),  # depth 387: the register tile
    (_op(3, (32, 12), 32, (3, 3), (1, 1, 1, 1)), True, "im2col_region"),  # rows narrower than NR
    (_op(16, (80, 80), 32, (3, 3), (1, 1, 1, 1), 2, stride_w=2), True, "tapped_region"),  # stride 2: depth 144
    (_op(32, (80, 80), 64, (3, 3), (1, 1, 1, 1), 2, stride_w=2), True, "tapped_region"),  # depth 288, 40 columns
    (_op(32, (40, 40), 64, (3, 3), (1, 1, 1, 1), 2, stride_w=2), True, "packed_region"),  # 20 columns: not whole vectors
    (_op(32, (30, 30), 64, (3, 3), (1, 1, 1, 1), 2, stride_w=2), True, "packed_region"),  # 15 output columns
    (_op(5, (40, 70), 8, (3, 3), (1, 1, 1, 1), 1, stride_w=3), True, "im2col_region"),  # column stride 3
    # a 1x1 window at stride 2: not tapped; read in place by the 16-float register tile, else BLAS (depth 64)
    (_op(64, (56, 56), 128, (1, 1), (0, 0, 0, 0), 2, stride_w=2), True,
     "packed_region" if cpu_tiles.WIDE_IN_PLACE else "im2col_region"),
    (_op(8, (8, 36), 16, (3, 3), (1, 1, 1, 1), 2, stride_w=2), True, "packed_region"),  # 2^17 multiply-adds at stride 2
])
def test_engine_gives_the_tapped_tiles(op, constant, expected, monkeypatch):
    monkeypatch.setattr(cpu_engines, "PACKED_ANY_DEPTH_MACS", 0)  # not tapped: the register tile by depth, else BLAS
    assert REGIONS.conv(op, constant).kernel == expected


# (channels, size, kernel, stride, pads t/l/b/r, out channels, activation, bias): convolutions the
# engine gives the tapped tiles (run-time weights would not be)
MODELS = [(3, 20, 3, 1, [1, 1, 1, 1], 32, "relu", True), (1, 20, 5, 1, [2, 2, 2, 2], 8, None, False),
          (2, 17, 3, 1, [0, 1, 1, 0], 13, "silu", True), (40, 18, (2, 1), 1, [0, 0, 0, 0], 20, "relu6", True),
          (16, 64, 3, 2, [1, 1, 1, 1], 32, "silu", True), (8, 64, 3, 2, [0, 1, 1, 0], 40, None, False)]


@pytest.mark.parametrize("case", MODELS, ids=[f"c{c[0]}s{c[1]}o{c[5]}" for c in MODELS])
def test_tapped_convolutions_match_onnxruntime(case, monkeypatch, fresh_rng):
    require_tool("numba", cpu_jit.MISSING)
    require_tool("regions", cpu_parallel.available()[1])
    channels, size, kernel, stride, pads, out_channels, activation, bias = case
    calls = []
    monkeypatch.setattr(cpu_compiled, "_tapped_conv_region",
                        lambda *a, real=cpu_compiled._tapped_conv_region: calls.append(a) or real(*a))
    monkeypatch.setattr(cpu_engines, "WINOGRAD_PAYS", {k: (1 << 30, 1 << 30, 1e9) for k in cpu_engines.WINOGRAD_PAYS})
    model = _conv_model(channels, size, kernel, stride, 1, pads, 1, out_channels, activation, bias, fresh_rng)
    _both_ways_match_onnxruntime(model, (1, channels, size, size), fresh_rng)
    assert calls, "the tapped tiles were not used"
