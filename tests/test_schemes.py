"""Computation schemes (paper Section 3.2-3.3): the Winograd generator, selection by cost, the
backends' scheme tables, and Winograd / Strassen rewritten into atomic ops, checked against ONNX
Runtime on every backend (relative L2 < 1e-4)."""
from __future__ import annotations

import dataclasses
import random
from fractions import Fraction

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from conftest import onnxruntime_session, rel_l2, require_backend
from gpumnn import atomic as A
from gpumnn.backends.cpu import tiles as cpu_tiles
from gpumnn.backends.cpu.backend import CpuBackend
from gpumnn.scheduler import schemes
from gpumnn.scheduler.calibration import calibration_for
from gpumnn.numerics.winograd import (axis_tiles, direct_tile_2d, exact_matrices, measured_error, winograd_matrices,
                                       winograd_tile_2d)

TOLERANCE = 1e-4


# -- the generator -------------------------------------------------------------------------------

@pytest.mark.parametrize("n", range(2, 7))
@pytest.mark.parametrize("k", range(2, 8))
def test_generator_is_exact_and_matches_direct_convolution(n, k):
    a, b, g = exact_matrices(n, k)
    alpha = n + k - 1
    rng = random.Random(n * 10 + k)
    for _ in range(3):  # 1D, exact rationals: y = A^T [(G g) * (B^T d)] is the correlation
        d = [Fraction(rng.randint(-9, 9)) for _ in range(alpha)]
        w = [Fraction(rng.randint(-9, 9)) for _ in range(k)]
        gw = [sum(g[t][j] * w[j] for j in range(k)) for t in range(alpha)]
        bd = [sum(b[s][t] * d[s] for s in range(alpha)) for t in range(alpha)]
        y = [sum(a[t][i] * gw[t] * bd[t] for t in range(alpha)) for i in range(n)]
        assert y == [sum(w[j] * d[i + j] for j in range(k)) for i in range(n)]
    m = winograd_matrices(n, k)
    assert m.A.shape == (alpha, n) and m.B.shape == (alpha, alpha) and m.G.shape == (alpha, k)
    x = np.random.default_rng(n + k).uniform(-1, 1, (3, 4, alpha, alpha))
    w2 = np.random.default_rng(k).standard_normal((5, 4, k, k))
    ref = direct_tile_2d(x, w2, n)
    assert np.abs(winograd_tile_2d(x, w2, n) - ref).max() < 1e-9 * np.abs(ref).max()  # Eq. 6 in float64


def test_points_follow_eq8():
    _, b, _ = exact_matrices(2, 3)  # alpha 4: points 0, 1/2, -1/2 and infinity
    bt_last = [b[s][3] for s in range(4)]  # coefficients of x (x - 1/2)(x + 1/2) = x^3 - x/4
    assert bt_last == [0, Fraction(-1, 4), 0, 1]


def test_allowed_tiles_are_accurate_in_float32():
    for k in range(2, 8):
        for n in schemes.winograd_tiles(k):
            worst, _ = measured_error(n, k, np.float32)
            assert worst <= 1e-5, f"F({n}, {k}) float32 error {worst:.1e}"
    assert schemes.winograd_tiles(3) == [2, 3, 4, 5, 6] and schemes.winograd_tiles(7) == [2]
    for k in range(2, 8):  # 1D tiles (a 1xk or kx1 kernel's): alpha up to MAX_ALPHA_1D
        for n in schemes.winograd_tiles((1, k)):
            worst, _ = measured_error(n, k, np.float32, dims=1)
            assert worst <= 1e-5, f"F({n}, {k}) in 1D: float32 error {worst:.1e}"
    assert schemes.winograd_tiles((1, 7)) == schemes.winograd_tiles((7, 1)) == [2, 3, 4]
    assert schemes.winograd_tiles((3, 5)) == [2, 3, 4]  # 2D: alpha <= 8 along both axes


# -- selection by cost ---------------------------------------------------------------------------

def _conv_op(k, ic, oc, size, **kw):
    p = (k - 1) // 2
    out = size + 2 * p - k + 1
    return A.Conv2D(("x", "w"), ("y",), "conv", in_channels=ic, out_channels=oc, in_hw=(size, size),
                    out_hw=(out, out), kernel=(k, k), pads=(p, p), **kw)


def test_table1_choices():
    assert schemes.conv_candidates(_conv_op(2, 3, 16, 224), True)[0][0] == "im2col"  # few channels: sliding
    scheme, tile, _ = schemes.conv_candidates(_conv_op(2, 512, 512, 16), True)[0]
    assert scheme == "winograd" and 2 < tile < 6  # a 15x15 output wastes F(6)'s partial tiles
    scheme, tile, _ = schemes.conv_candidates(_conv_op(3, 64, 64, 112), True)[0]
    assert scheme == "winograd" and tile == 6
    # Eq. 2-3 choose n_hat = argmin C(n); C(1) is the sliding window
    _, costs = schemes.best_tile(_conv_op(3, 64, 64, 112))
    assert costs[1] == 112 * 112 * 64 * 64 * 9 and min(costs, key=costs.get) == 6


def test_geometry_rules():
    assert schemes.conv_candidates(_conv_op(3, 8, 8, 10, groups=8), True)[0][0] == "depthwise"
    assert schemes.conv_candidates(_conv_op(1, 8, 4, 10), True)[0][0] == "gemm1x1"
    assert schemes.conv_candidates(_conv_op(3, 64, 64, 56), False)[0][0] == "im2col"  # run-time weights
    assert schemes.conv_candidates(_conv_op(3, 64, 64, 56, strides=(2, 2)), True)[0][0] == "im2col"


def test_strassen_levels_follow_eq9():
    assert schemes.strassen_saves(1024, 1024, 1024) and not schemes.strassen_saves(16, 16, 16)
    assert schemes.strassen_levels(256, 256, 256) == 0
    assert schemes.strassen_levels(512, 512, 512) == 1
    assert schemes.strassen_levels(1024, 1024, 1024) == 2
    assert schemes.strassen_levels(64, 64, 64, min_block=1) == 2  # Eq. 9 alone stops at 16x16 blocks


# -- backends build what op.scheme names ---------------------------------------------------------

class NoDepthwise(CpuBackend):
    name = "nodw"
    schemes = {A.Conv2D: frozenset({"im2col", "gemm1x1"}), A.MatMul: frozenset({"gemm"})}


def _program_with(op):
    return A.AtomicProgram([op], {"x": (1, op.in_channels) + op.in_hw, "y": (1, op.out_channels) + op.out_hw},
                           {"w": np.zeros(1)}, ["x"], ["y"])


def test_scheme_step_asks_the_backend():
    op = _conv_op(3, 8, 8, 10, groups=8)
    assert schemes.select_schemes(_program_with(op), CpuBackend()).ops[0].scheme == "depthwise"
    chosen = schemes.select_schemes(_program_with(op), NoDepthwise()).ops[0]
    assert chosen.scheme == "im2col"
    assert NoDepthwise().unsupported_reason(chosen) is None
    reason = NoDepthwise().unsupported_reason(dataclasses.replace(chosen, scheme="depthwise"))
    assert reason is not None and "depthwise" in reason


def test_a_kernel_going_image_by_image_counts_one_images_tiles():
    """The cpu backend's Winograd kernels take one image at a time, so a batch must not make one
    pay where it does not for an image (ResNet-18's 7x7 layer at batch 32 on one thread was 1.3x
    slower per image in Winograd than in the sliding window)."""
    class WholeBatch(CpuBackend):
        winograd_per_image = False

    cpu, whole = CpuBackend(threads=1), WholeBatch(threads=1)
    image = _conv_op(3, 512, 512, 7)
    batch = dataclasses.replace(image, batch=32)
    tile = schemes.best_tile(image)[0]
    assert schemes.winograd_tile_count(batch, tile) == 32 * schemes.winograd_tile_count(batch, tile, per_image=True)
    assert not schemes.winograd_kernel_pays(cpu, image, tile)
    assert not schemes.winograd_kernel_pays(cpu, batch, tile)  # as for one image
    assert schemes.winograd_kernel_pays(whole, batch, tile)  # a whole-batch kernel has the batch's tiles
    for backend in (cpu, whole):
        backend.close()


def test_the_kernel_cost_prices_the_transforms_on_the_register_tiles():
    """Without transform tiles the kernel's cost is Eq. 2's; with them each tile's input
    transform costs two square x square products per input channel (a 1D tile's one row-wide
    product) and its output transform mr-row products per output channel, whatever alpha."""
    op = _conv_op(3, 64, 32, 10)
    for n in (1, 2, 4):
        assert schemes.winograd_kernel_cost(op, n, None) == schemes.conv_cost(op, n)
    tiles = (8, 16, 6)
    # F(2x2, 3x3): alpha 4, 5 x 5 tiles over a 10 x 10 output
    assert schemes.winograd_kernel_cost(op, 2, tiles) == 25 * (64 * 8 * 8 * (4 + 4) + 64 * 32 * 16 + 32 * 6 * 4 * (4 + 2))
    assert schemes.winograd_kernel_cost(op, 2, tiles) > schemes.conv_cost(op, 2)
    assert schemes.winograd_kernel_cost(op, 1, tiles) == schemes.conv_cost(op, 1)
    wide = A.Conv2D(("x", "w"), ("y",), "conv", in_channels=16, out_channels=8, in_hw=(5, 20), out_hw=(5, 20),
                    kernel=(1, 7), pads=(0, 3))
    nh, nw = axis_tiles(4, (1, 7))  # F(1x4, 1x7): alpha 1 x 10
    assert (nh, nw) == (1, 4)
    assert schemes.winograd_kernel_cost(wide, 4, tiles) == 5 * 5 * (16 * 16 * 10 + 16 * 8 * 10 + 8 * 6 * 1 * 10)
    tall = dataclasses.replace(wide, in_hw=(20, 5), out_hw=(20, 5), kernel=(7, 1), pads=(3, 0))
    assert schemes.winograd_kernel_cost(tall, 4, tiles) == 5 * 5 * (16 * 16 * 10 + 16 * 8 * 10 + 8 * 6 * 10 * 1)


def test_the_register_tile_gate_keeps_small_tiles_for_many_channels():
    """On the cpu's regions, F(2x2) and F(3x3) over 64 channels at 10 x 10 (their transforms cost
    as much per channel as a large tile's) give way to the sliding window; over 512 channels at
    7 x 7 (ResNet's last stage) F(2x2) stays where the im2col tile is 8-float (on AVX-512's
    two-vector tile the sliding window keeps it: test_cpu_engines), as do the large tiles at 20 x 20."""
    cpu = CpuBackend(threads=2)
    try:
        if not cpu.regions:
            pytest.skip("the cpu backend has no native regions here (no Numba threading layer)")
        assert cpu.winograd_transform_tiles is not None
        small = _conv_op(3, 64, 64, 10)
        assert not any(schemes.winograd_kernel_pays(cpu, small, n) for n in (2, 3))
        assert schemes.select_schemes(_program_with(small), cpu).ops[0].scheme == "im2col"
        deep = _conv_op(3, 512, 512, 7)
        chosen = schemes.select_schemes(_program_with(deep), cpu).ops[0]
        wide_tile = cpu_tiles.WIDE_IN_PLACE
        assert (chosen.scheme, chosen.winograd_tile) == (("im2col", 0) if wide_tile else ("winograd", 2))
        wide = schemes.select_schemes(_program_with(_conv_op(3, 64, 64, 20)), cpu).ops[0]
        assert wide.scheme == "winograd" and wide.winograd_tile >= 4
    finally:
        cpu.close()
    threads = CpuBackend(threads=2, regions=False)
    try:
        assert threads.winograd_transform_tiles is None  # BLAS transforms: Eq. 2's counts
    finally:
        threads.close()


def test_the_register_tile_gate_takes_few_large_tiles_where_the_tiles_with_enough_save_little():
    """On the cpu's regions a plane a few rows high (crnn's 128 -> 192 at 4 x 40) takes F(4) with
    fewer tiles than the gate's least, as it saves ``FEW_TILES_GAIN`` times what F(2) (the largest
    tile with enough) saves; it matches ONNX Runtime. ResNet's 256 -> 256 at 14 x 14 keeps F(4)
    (F(5)'s 9 tiles save too little more) and a 1 x 3 over 129 channels at 1 x 33 (voice_activity's
    encoder) keeps the sliding window."""
    cpu = CpuBackend(threads=2)
    try:
        if not cpu.regions:
            pytest.skip("the cpu backend has no native regions here (no Numba threading layer)")
        low = A.Conv2D(("x", "w"), ("y",), "conv", in_channels=128, out_channels=192, in_hw=(4, 40),
                       out_hw=(4, 40), kernel=(3, 3), pads=(1, 1))
        assert schemes.winograd_tile_count(low, 4, True) < cpu.winograd_min_tiles
        chosen = schemes.select_schemes(_program_with(low), cpu).ops[0]
        assert (chosen.scheme, chosen.winograd_tile) == ("winograd", 4)
        resnet = schemes.select_schemes(_program_with(_conv_op(3, 256, 256, 14)), cpu).ops[0]
        assert (resnet.scheme, resnet.winograd_tile) == ("winograd", 4)
        encoder = A.Conv2D(("x", "w"), ("y",), "conv", in_channels=129, out_channels=128, in_hw=(1, 33),
                           out_hw=(1, 33), kernel=(1, 3), pads=(0, 1))
        assert schemes.select_schemes(_program_with(encoder), cpu).ops[0].scheme == "im2col"
    finally:
        cpu.close()
    model, shape = _conv_model(3, 128, 192, 4, [1, 1, 1, 1], True, "Relu", hw=40)
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    checked = _check(model, {"x": x}, "cpu")
    op = next(op for op in checked.program.ops if isinstance(op, A.Conv2D))
    assert (op.scheme, op.winograd_tile) == ("winograd", 4)


def test_the_rewrite_keeps_to_the_largest_tile_a_backend_allows():
    """A GPU device whose kernels run Winograd's rewrite best at small tiles (the GLSL family:
    ``Backend.winograd_rewrite_max_tile``) gets the cheapest tile Eq. 2 allows up to that size;
    one without a limit gets Eq. 2's tile."""
    class Gpu:
        kernel_table = {A.Raster: None, A.MatMul: None, A.Conv2D: None}
        schemes = {A.Conv2D: frozenset({"im2col", "gemm1x1", "depthwise"}), A.MatMul: frozenset({"gemm"})}
        cost_model_expansions = frozenset({"winograd", "strassen"})
        winograd_rewrite_max_tile = None

    class SmallTiles(Gpu):
        winograd_rewrite_max_tile = 2

    op = dataclasses.replace(_conv_op(3, 64, 64, 56), inputs=("x", "w"), has_bias=False)
    n_hat, _ = schemes.best_tile(op)
    assert n_hat > 2
    assert schemes.select_schemes(_program_with(op), Gpu()).ops[0].winograd_tile == n_hat
    chosen = schemes.select_schemes(_program_with(op), SmallTiles()).ops[0]
    assert (chosen.scheme, chosen.winograd_tile) == ("winograd", 2)
    with schemes.forced_schemes(conv=("winograd", 4)):
        assert schemes.select_schemes(_program_with(op), SmallTiles()).ops[0].winograd_tile == 4


def test_report_shows_the_scheme_of_every_conv_and_matmul(backend):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="wino", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w2"], ["b"], name="dw", pads=[1, 1, 1, 1], group=32),
             helper.make_node("Conv", ["b", "w3"], ["c"], name="pw"),
             helper.make_node("Flatten", ["c"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "w4"], ["y"], name="fc")]
    inits = {"w1": (32, 32, 3, 3), "w2": (32, 1, 3, 3), "w3": (8, 32, 1, 1), "w4": (8 * 20 * 20, 10)}
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 20, 20])],
                              [helper.make_empty_tensor_value_info("y")],
                              [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.1, n)
                               for n, s in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sess = gpumnn.load(model).session(backend=backend, fallback=False)
    # the cpu's cost model leaves the rewrite out; its own kernel takes 32 input channels at 20 x 20
    # on the register tile (native regions) and not on the Python threads' BLAS products; a GPU
    # whose calibration times its own Winograd kernel slower per saved multiplication leaves it out
    be = sess.backends[backend]
    expands = "winograd" in be.cost_model_expansions
    wino = "winograd" if expands or getattr(be, "regions", 0) else "im2col"
    calibration = calibration_for(be)
    if calibration.calibrated and not be.winograd_min_saving and schemes.builds_kernel(be, A.Conv2D, "winograd"):
        gate = schemes.winograd_min_saving(be, calibration)
        conv = _conv_op(3, 32, 32, 20)
        wino = "winograd" if any(schemes.winograd_kernel_pays(be, conv, n, gate) for s, n, _ in
                                 schemes.conv_candidates(conv, True) if s == "winograd") else "im2col"
    # a product of one row takes the matrix-vector kernel where the backend has one (GPU families)
    fc = "gemv" if schemes.builds_kernel(be, A.MatMul, "gemv") else "gemm"
    chosen = {d.node: d.scheme for d in sess.program.decisions}
    assert chosen == {"wino": wino, "dw": "depthwise", "pw": "gemm1x1", "fc": fc}
    text = sess.report()
    for node, scheme in chosen.items():
        assert f"{node}: " in text and f"-> {scheme}" in text
    # a GPU backend with Winograd kernels of its own (the OpenCL C family) builds it, not the rewrite
    own = schemes.builds_kernel(sess.backends[backend], A.Conv2D, "winograd")
    rewritten = not any(isinstance(op, A.Conv2D) and op.source == "wino" for op in sess.program.ops)
    assert rewritten == (expands and not own and wino == "winograd")
    sess.close()


# -- Winograd and Strassen on every backend, against ONNX Runtime ----------------------------------

def _conv_model(k, ic, oc, size, pads, bias, act, hw=None):
    kh, kw = (k, k) if isinstance(k, int) else k
    rng = np.random.default_rng(kh * 100 + kw * 10 + ic)
    inits = [numpy_helper.from_array((rng.standard_normal((oc, ic, kh, kw)) / np.sqrt(ic * kh * kw)).astype(np.float32), "w")]
    inputs = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(oc).astype(np.float32), "b"))
        inputs.append("b")
    nodes = [helper.make_node("Conv", inputs, ["c" if act else "y"], name="conv", pads=pads)]
    if act:
        nodes.append(helper.make_node(act, ["c"], ["y"], name="act"))
    shape = [2, ic, size, hw or size] if hw else [1, ic, size, size]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_empty_tensor_value_info("y")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), shape


def _check(model, feeds, backend, **force):
    ref = onnxruntime_session(model).run(None, feeds)[0]
    with schemes.forced_schemes(**force):
        sess = gpumnn.load(model).session(backend=backend, fallback=False)
    with sess:
        got = sess.run(feeds)["y"]
        err = rel_l2(got, ref)
        assert err < TOLERANCE, f"relative L2 {err:.2e} on {backend}"
        return Checked(sess.program, sess.backends[backend].cost_model_expansions, sess.backends[backend])


@dataclasses.dataclass
class Checked:
    """What a closed session's checks read: its program (decisions, ops) and the cost model's reach."""

    program: A.AtomicProgram
    cost_model_expansions: frozenset
    backend: object


def _kernel_gate_passes(backend, program: A.AtomicProgram, ic: int) -> bool:
    """Whether ``backend`` builds Winograd as a kernel and its gate passes for one of the tiles
    cheaper than the sliding window."""
    op = next(op for op in program.ops if isinstance(op, A.Conv2D))
    assert op.in_channels == ic
    if not schemes.builds_kernel(backend, A.Conv2D, "winograd"):
        return False
    gate = schemes.winograd_min_saving(backend, calibration_for(backend))  # a GPU's from its calibration
    return any(schemes.winograd_kernel_pays(backend, op, n, gate)
               for scheme, n, _ in schemes.conv_candidates(op, True) if scheme == "winograd")


WINOGRAD_CASES = {  # id: (k, ic, oc, size, pads, bias, activation, tile, width for a 2-image batch)
    "F2-k3-pad1-bias-relu": (3, 8, 6, 13, [1, 1, 1, 1], True, "Relu", 2, None),
    "F4-k3-batch2-nonsquare": (3, 5, 7, 9, [1, 1, 1, 1], True, None, 4, 14),
    "F6-k3": (3, 4, 4, 17, [1, 1, 1, 1], False, None, 6, None),
    "F3-k5-asym-pads": (5, 3, 4, 11, [2, 1, 0, 2], True, "Sigmoid", 3, None),
    "F5-k2-valid": (2, 6, 5, 12, [0, 0, 0, 0], False, "Relu", 5, None),
    "F2-k7": (7, 2, 3, 10, [3, 3, 3, 3], True, None, 2, None),
    # rectangular kernels: 1D tiles along the long axis (alpha up to 10), 2D with an alpha per axis
    "F4-k1x7-bias-relu": ((1, 7), 6, 5, 12, [0, 3, 0, 3], True, "Relu", 4, None),
    "F3-k7x1-batch2-nonsquare": ((7, 1), 4, 6, 11, [3, 0, 3, 0], False, None, 3, 9),
    "F2-k3x5": ((3, 5), 3, 4, 10, [1, 2, 1, 2], True, None, 2, None),
    # few tiles and many channels (a late stage)
    "F4-k3-few-tiles": (3, 16, 128, 7, [1, 1, 1, 1], True, "Relu", 4, None),
    # the paper's Table 1 settings at reduced spatial size, with the scheme step's own choice
    "table1-2-3-16": (2, 3, 16, 24, [0, 0, 0, 0], True, None, 0, None),
    "table1-2-512-512": (2, 512, 512, 6, [0, 0, 0, 0], True, None, 0, None),
    "table1-3-64-64": (3, 64, 64, 14, [1, 1, 1, 1], True, None, 0, None),
}


@pytest.mark.parametrize("case", list(WINOGRAD_CASES), ids=list(WINOGRAD_CASES))
def test_winograd_matches_onnxruntime(case, backend):
    k, ic, oc, size, pads, bias, act, tile, hw = WINOGRAD_CASES[case]
    model, shape = _conv_model(k, ic, oc, size, pads, bias, act, hw)
    x = np.random.default_rng(len(case)).standard_normal(shape).astype(np.float32)
    sess = _check(model, {"x": x}, backend, **({"conv": ("winograd", tile)} if tile else {}))
    decision = sess.program.decisions[0]
    expected = "im2col" if case == "table1-2-3-16" else "winograd"  # Table 1: few input channels slide
    own = schemes.builds_kernel(sess.backend, A.Conv2D, "winograd")
    if not tile and (own or "winograd" not in sess.cost_model_expansions):
        # the cost model's own choice, on a backend with a Winograd kernel of its own or that leaves
        # the rewrite out: that kernel where the convolution passes its gate, else the sliding window
        expected = "winograd" if expected == "winograd" and _kernel_gate_passes(sess.backend, sess.program, ic) else "im2col"
    assert decision.scheme == expected, decision.describe()


@pytest.mark.parametrize("case", [c for c, v in WINOGRAD_CASES.items() if v[7]], ids=[c for c, v in WINOGRAD_CASES.items() if v[7]])
@pytest.mark.parametrize("backend", ["opencl", "vulkan", "gl"])
def test_winograd_kernels_of_the_gpu_family_match_onnxruntime(case, backend):
    """The GPU kernel families' own Winograd kernels (winograd.cl around the tiled GEMM: what cuda
    and opencl on a GPU choose; winograd.comp, one kernel, on vulkan and gl), forced on PoCL,
    lavapipe and llvmpipe: one op, no rewrite, the tile asked for."""
    require_backend(backend)
    k, ic, oc, size, pads, bias, act, tile, hw = WINOGRAD_CASES[case]
    model, shape = _conv_model(k, ic, oc, size, pads, bias, act, hw)
    x = np.random.default_rng(len(case)).standard_normal(shape).astype(np.float32)
    ref = onnxruntime_session(model).run(None, {"x": x})[0]
    with schemes.forced_schemes(conv=("winograd", tile)):
        sess = gpumnn.load(model).session(backend=backend, kernels="tiled", fallback=False)
    with sess:
        err = rel_l2(sess.run({"x": x})["y"], ref)
        convs = [op for op in sess.program.ops if isinstance(op, A.Conv2D)]
        chosen = sess.shape_set().schemes
    assert err < TOLERANCE, f"relative L2 {err:.2e}"
    assert len(convs) == 1 and convs[0].winograd_tile == tile, "the convolution was rewritten instead"
    assert [s for s in chosen if s.startswith("winograd F(")], chosen


def _matmul_model(m, k, n, trans_a=False, trans_b=False, const_b=False, bias=False, act=None):
    rng = np.random.default_rng(m + k + n)
    a_shape, b_shape = ([k, m] if trans_a else [m, k]), ([n, k] if trans_b else [k, n])
    inits, inputs = [], [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape)]
    if const_b:
        inits.append(numpy_helper.from_array(rng.standard_normal(b_shape).astype(np.float32), "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, b_shape))
    names = ["a", "b"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal((1, n)).astype(np.float32), "c"))
        names.append("c")
    nodes = [helper.make_node("Gemm", names, ["t" if act else "y"], name="gemm", transA=int(trans_a),
                              transB=int(trans_b), alpha=0.75, beta=1.25)]
    if act:
        nodes.append(helper.make_node(act, ["t"], ["y"], name="act"))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_empty_tensor_value_info("y")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = {"a": rng.standard_normal(a_shape).astype(np.float32)}
    if not const_b:
        feeds["b"] = rng.standard_normal(b_shape).astype(np.float32)
    return model, feeds


STRASSEN_CASES = {  # id: (m, k, n, levels, options)
    "1-level-even": (48, 64, 40, 1, {}),
    "1-level-odd-padded": (37, 45, 29, 1, {}),
    "2-levels-transA": (44, 36, 52, 2, {"trans_a": True}),
    "1-level-const-transB-bias-relu": (40, 48, 56, 1, {"trans_b": True, "const_b": True, "bias": True, "act": "Relu"}),
}


@pytest.mark.parametrize("case", list(STRASSEN_CASES), ids=list(STRASSEN_CASES))
def test_strassen_matches_onnxruntime(case, backend):
    m, k, n, levels, options = STRASSEN_CASES[case]
    model, feeds = _matmul_model(m, k, n, **options)
    sess = _check(model, feeds, backend, strassen=levels)
    assert sess.program.decisions[0].scheme == "strassen"
    assert not any(isinstance(op, A.MatMul) and (op.m, op.n, op.k) == (m, n, k) for op in sess.program.ops)


def test_strassen_by_eq9_on_a_large_product(backend):
    model, feeds = _matmul_model(512, 512, 512)
    sess = _check(model, feeds, backend)
    decision = sess.program.decisions[0]
    if "strassen" in sess.cost_model_expansions:
        assert decision.scheme == "strassen" and decision.detail.startswith("1 level"), decision.describe()
    else:  # the cpu's plain BLAS GEMM measured faster than the rewrite
        assert decision.scheme == "gemm", decision.describe()


def test_winograd_needs_a_constant_bias():
    """The bias is folded into the output transform at session creation: a run-time bias keeps
    the sliding window, even when Winograd is forced (it used to end in a raw KeyError)."""
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.1).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [8])],
                              [helper.make_empty_tensor_value_info("y")], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = {"x": rng.standard_normal((1, 8, 12, 12)).astype(np.float32), "b": rng.standard_normal(8).astype(np.float32)}
    sess = _check(model, feeds, "cpu", conv=("winograd", 2))
    assert sess.program.decisions[0].scheme == "im2col", sess.program.decisions[0].describe()


def test_the_gpu_family_runs_winograd_in_few_launches():
    """ResNet-18 with Winograd forced on every 3x3 convolution it fits, on the OpenCL C GPU family:
    each stays one op of its own kernels (input transform, batched product, output transform,
    and a split-K sum where the product's tiles are few) where the rewrite made 7 ops, and no
    Raster copies; the report counts the launches."""
    from gpumnn import zoo
    net = gpumnn.load(zoo.build("resnet18"))
    with schemes.forced_schemes(conv=("winograd", 2)):
        sess = net.session(backend="opencl", kernels="tiled", fallback=False)
    with sess:
        rows = sess.report_rows()
        line = sess.shape_set().launch_line()
    wino = [r for r in rows if r["scheme"].startswith("winograd F(2x2, 3x3)")]
    assert len(wino) == 13 and all(3 <= r["launches"] <= 4 for r in wino)
    # the 8 residual adds are in their convolutions' epilogues (schemes.fuse_residuals): 31 ops become 23
    assert len(rows) == 23 and not any(r["op"] == "raster" for r in rows)
    total = sum(r["launches"] for r in rows)
    assert total <= 49 and line == f"kernel launches per run: {total}; Raster copies: 0 bytes in 0 ops"


@pytest.mark.parametrize("backend", ["vulkan", "gl"])
def test_the_glsl_family_runs_winograd_in_one_launch(backend):
    """The same on the GLSL GPU family: each Winograd convolution is one dispatch of winograd.comp
    (the rewrite made 7 ops of it), its residual add in the epilogue: 23 ops, 23 launches."""
    require_backend(backend)
    from gpumnn import zoo
    net = gpumnn.load(zoo.build("resnet18"))
    with schemes.forced_schemes(conv=("winograd", 2)):
        sess = net.session(backend=backend, kernels="tiled", fallback=False)
    with sess:
        rows = sess.report_rows()
    wino = [r for r in rows if r["scheme"].startswith("winograd F(2x2, 3x3)")]
    assert len(wino) == 13 and all(r["launches"] == 1 for r in wino)
    # the other convolutions split K (two launches each) where the device has many compute units
    split = sum("/split-K" in r["scheme"] for r in rows)
    assert len(rows) == 23 and sum(r["launches"] for r in rows) == 23 + split


# -- matrix-vector products (scheme gemv) --------------------------------------------------------

def _matmul_program(batch: int, m: int, shared: bool) -> A.AtomicProgram:
    op = A.MatMul(("x", "w"), ("y",), "fc", batch=batch, m=m, n=10, k=16, a_batch_stride=m * 16,
                  b_batch_stride=0 if shared else 160, trans_b=True)
    return A.AtomicProgram([op], {"x": (batch, m, 16), "y": (batch, m, 10)}, {"w": np.zeros((10, 16), np.float32)},
                           ["x"], ["y"])


class GpuFamily(CpuBackend):
    """A backend that lists a matrix-vector kernel, as the GPU kernel families do."""
    name = "gpufamily"
    schemes = {**CpuBackend.schemes, A.MatMul: frozenset({"gemm", "gemv"})}


@pytest.mark.parametrize("batch,m,shared,expected", [
    (1, 1, True, "gemv"), (3, 1, False, "gemv"), (4, 1, True, "gemv"),
    (5, 1, True, "gemm"), (1, 2, True, "gemm")])
def test_one_row_products_are_gemv_where_a_backend_has_the_kernel(batch, m, shared, expected):
    program = _matmul_program(batch, m, shared)
    assert schemes.select_schemes(program, GpuFamily()).ops[0].scheme == expected
    assert schemes.select_schemes(_matmul_program(batch, m, shared), CpuBackend()).ops[0].scheme == "gemm"
    with schemes.forced_schemes(strassen=0):  # "no Strassen" keeps the matrix-vector kernel
        assert schemes.select_schemes(_matmul_program(batch, m, shared), GpuFamily()).ops[0].scheme == expected


@pytest.mark.parametrize("backend_name", ["opencl", "vulkan", "gl"])
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v1"])
def test_the_gpu_families_run_the_classifier_as_gemv(backend_name, name):
    """A zoo model's batch-1 classifier on the GPU variant of each kernel family is one ``gemv``
    launch (the report says so), and the model still matches ONNX Runtime."""
    from conftest import require_backend
    from gpumnn import zoo
    require_backend(backend_name)
    model = zoo.build(name)
    x = np.random.default_rng(3).standard_normal(zoo.input_shape(name)).astype(np.float32)
    ref = onnxruntime_session(model).run(None, {"input": x})[0]
    with gpumnn.load(model).session(backend=backend_name, kernels="tiled", fallback=False) as sess:
        rows = [r for r in sess.report_rows() if r["op"] == "matmul"]
        assert [(r["scheme"], r["launches"]) for r in rows] == [("gemv", 1)]
        out = sess.run({"input": x})["output"]
    assert rel_l2(out, ref) < 1e-3


def test_gemv_under_vulkan_validation(vulkan_validation):
    """The matrix-vector shader's bindings, barriers and shared memory pass the Khronos validation
    layer, its synchronization checks included (mobilenet_v1 on the tiled kernels, recorded and eager)."""
    from gpumnn import zoo
    model = zoo.build("mobilenet_v1")
    x = np.random.default_rng(4).standard_normal(zoo.input_shape("mobilenet_v1")).astype(np.float32)
    ref = onnxruntime_session(model).run(None, {"input": x})[0]
    net = gpumnn.load(model)
    for record in (True, False):
        with net.session(backend="vulkan", kernels="tiled", record=record, fallback=False) as sess:
            assert [r["scheme"] for r in sess.report_rows() if r["op"] == "matmul"] == ["gemv"]
            for _ in range(2):
                assert rel_l2(sess.run({"input": x})["output"], ref) < 1e-3
    vulkan_validation.check()


def _calibration(winograd_rate: float, source: str = "calibrated"):
    from gpumnn.scheduler.calibration import Calibration
    rates = {"gemm": 2e12, "conv3x3": 2e12, "conv1x1": 2e12, "depthwise": 5e11, "winograd": winograd_rate, "gemv": 5e11}
    return Calibration("gpu", "a GPU", "a driver", source, kernels={k: [0.01, r] for k, r in rates.items()},
                       memory_gbs={"elementwise": 1e3, "transcendental": 1e3, "rows": 1e3, "pool": 1e3},
                       dispatch_ms=0.002, submit_ms=0.01, eager_ms=0.02, upload_gbs=10.0, download_gbs=10.0,
                       transfer_ms=0.01)


def test_a_calibrated_gpu_takes_its_winograd_kernel_only_where_the_device_runs_it_faster():
    """A GPU backend sets no Winograd gate of its own; its calibration gives one: a kernel 20 times
    slower per multiplication than the sliding window (the GLSL family's on NVIDIA's drivers) is
    left out, one faster per multiplication taken, and the paper's constants or a gate the backend
    measured itself keep their say."""
    from gpumnn.scheduler.calibration import PAPER
    from gpumnn.scheduler.device_profile import PlanningTarget
    gpu = PlanningTarget("gpu", {A.Conv2D: None, A.MatMul: None, A.Raster: None},
                         {A.Conv2D: frozenset({"im2col", "gemm1x1", "depthwise", "winograd"}), A.MatMul: frozenset({"gemm"})},
                         frozenset())
    op = _conv_op(3, 64, 64, 56)
    assert schemes.best_tile(op)[0] > 1  # Eq. 2 alone takes Winograd
    slow, fast = _calibration(1e11), _calibration(4e12)
    assert schemes.winograd_min_saving(gpu, slow) == pytest.approx(20.0)
    assert schemes.winograd_min_saving(gpu, fast) == pytest.approx(0.5)
    chosen = {name: schemes.select_schemes(_program_with(op), gpu, calibration).ops[0].scheme
              for name, calibration in (("slow", slow), ("fast", fast), ("none", None),
                                        ("paper", _calibration(1e11, PAPER)))}
    assert chosen == {"slow": "im2col", "fast": "winograd", "none": "winograd", "paper": "winograd"}
    gated = dataclasses.replace(gpu, winograd_min_saving=1.5)
    assert schemes.winograd_min_saving(gated, slow) == 1.5
    assert schemes.select_schemes(_program_with(op), gated, slow).ops[0].scheme == "winograd"
