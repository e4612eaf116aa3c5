"""precision="tf32": cuda's convolution and GEMM tiles on tensor cores, opt-in.

What runs without a GPU: the precision's vocabulary and refusals (``gpumnn.scheduler.precision``),
the planner's choice of TF32 tilings and its scheme label, a session that fell back to the cpu
computing float32. NVRTC compiles every TF32 variant for sm_80 and sm_90 in
tests/test_cuda_source.py. What needs an NVIDIA GPU (compute capability 8.0 or later) is here
too and skips elsewhere: the TF32 GEMMs and convolutions against float32, and zoo models against
ONNX Runtime within ``precision.TOLERANCES["tf32"]`` (``bench/gpu_session.sh tf32`` runs them).
"""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

import gpumnn
from conftest import onnxruntime_session, rel_l2, require_backend
from gpumnn import atomic as A
from gpumnn import zoo
from gpumnn.backends.base import TensorHandle
from gpumnn.backends.kernels.cl import planner as cl_plans
from gpumnn.scheduler import precision


@dataclasses.dataclass
class _Target:
    """A GPU as the OpenCL C planner sees it (cl_plans.PlannerTarget), none opened."""

    tf32: bool
    float16_tensor_cores: bool = False
    kernels: str = "tiled"
    is_gpu: bool = True
    compute_units: int = 132
    max_wg: int = 1024

    @staticmethod
    def is_constant(handle: TensorHandle) -> bool:
        return handle.buffer == "constants"


def _plan(target, op, shapes):
    handles = {n: TensorHandle("constants" if n == "w" else "pool", 0, s) for n, s in shapes.items()}
    return cl_plans.plan(target, op, [handles[n] for n in op.inputs], [handles[n] for n in op.outputs])


CONV = A.Conv2D(("x", "w"), ("y",), "conv", in_channels=64, in_hw=(28, 28), out_channels=128, out_hw=(28, 28),
                kernel=(3, 3), pads=(1, 1), scheme="im2col")
CONV_SHAPES = {"x": (1, 64, 28, 28), "w": (128, 64, 3, 3), "y": (1, 128, 28, 28)}


def test_precision_vocabulary_and_backend_options():
    assert precision.PRECISIONS == ("fp32", "tf32", "int8", "int4", "fp16")
    assert precision.backend_options("tf32", "cuda") == {"tf32": True}
    assert precision.backend_options("fp32", "opencl") == {} and precision.backend_options("int8", "cpu") == {}
    for backend in ("opencl", "vulkan", "gl", "cpu", "auto", ["cuda", "cpu"]):
        with pytest.raises(ValueError, match="precision='tf32' runs on backend='cuda' only"):
            precision.backend_options("tf32", backend)
    assert precision.precision_run("tf32", ["cuda", "cpu"]) == "tf32"
    assert precision.precision_run("tf32", ["cpu"]) == "fp32"
    assert precision.precision_run("int8", ["cpu"]) == "int8"


def test_tf32_leaves_the_program_as_it_is():
    """TF32 is a property of cuda's kernels: the atomic program is float32's, op for op."""
    net = gpumnn.load(zoo.build("squeezenet1_1"))
    program = gpumnn.geometry.lower(net.graph, {net.inputs[0].name: zoo.input_shape("squeezenet1_1")})
    assert precision.apply_precision(program, "tf32") is program


@pytest.mark.parametrize("backend", ["opencl", "vulkan", "gl", "cpu"])
def test_a_session_without_tf32_kernels_refuses_tf32(backend):
    net = gpumnn.load(zoo.build("mobilenet_v1"))
    with pytest.raises(ValueError, match="precision='fp32' runs there"):
        net.session(backend=backend, precision="tf32")


def test_a_cuda_session_that_fell_back_to_the_cpu_says_it_computes_fp32():
    if gpumnn.backends.probe("cuda") is None:
        pytest.skip("cuda starts here: nothing falls back")
    net = gpumnn.load(zoo.build("mobilenet_v1"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with net.session(backend="cuda", precision="tf32") as sess:
            assert sess.backend == "cpu" and sess.precision == "fp32"


def test_the_planner_puts_tf32_tiles_where_they_fit_and_says_so():
    """A cuda target with tf32 builds its convolution and GEMM tiles with -DGEMM_TF32 (64x64 and
    32x32 tilings; the 4-row tiling and the matrix-vector kernel stay float32) and the report's
    scheme says tf32; without it nothing changes."""
    fp32, tf32 = _plan(_Target(False), CONV, CONV_SHAPES), _plan(_Target(True), CONV, CONV_SHAPES)
    assert [ln.defines for ln in fp32.work] == [tuple(sorted(set(ln.defines) - {("GEMM_TF32", 1)})) for ln in tf32.work]
    assert all(("GEMM_TF32", 1) in ln.defines for ln in tf32.work)
    assert tf32.scheme == f"{fp32.scheme}/tf32" and "tf32" not in fp32.scheme
    skinny = A.MatMul(("x", "w"), ("y",), "fc", m=4, n=512, k=256)
    assert not any(("GEMM_TF32", 1) in ln.defines
                   for ln in _plan(_Target(True), skinny, {"x": (4, 256), "w": (256, 512), "y": (4, 512)}).work)
    gemv = dataclasses.replace(skinny, m=1, scheme="gemv")
    assert _plan(_Target(True), gemv, {"x": (1, 256), "w": (256, 512), "y": (1, 512)}).scheme.startswith("gemv")


def _tf32_tile(cfg: str) -> tuple[np.ndarray, np.ndarray, set[int], set[int]]:
    """gemm.cl's TF32 path for one K step of 16 over one tile, its index arithmetic written out
    with mma.sync m16n8k8's fragment layouts from the PTX ISA (A row-major 16 x 8: a0 (g, t),
    a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4); B 8 x 8: b0 (t, g), b1 (t + 4, g); C 16 x 8:
    c_r (g + 8 [r >= 2], 2 t + r % 2); g = lane / 4, t = lane % 4): (C as the tile stores it,
    As^T Bs, the banks of warp 0's A and B fragment loads)."""
    tm, tn, wm, wn, tk = cl_plans.GEMM_CONFIGS[cfg]
    nt = (tm // wm) * (tn // wn)
    row_blocks = tm // 16
    wcols = tn // ((nt // 32) // row_blocks)
    a_stride, b_stride = tm + 8, tn + 8  # AS, BS
    rng = np.random.default_rng(0)
    a_tile, b_tile = rng.standard_normal((tk, tm)), rng.standard_normal((tk, tn))  # As[k][m], Bs[k][n]
    As, Bs = np.zeros((tk, a_stride)), np.zeros((tk, b_stride))
    As[:, :tm], Bs[:, :tn] = a_tile, b_tile
    As, Bs = As.ravel(), Bs.ravel()
    c = np.full((tm, tn), np.nan)
    for warp in range(nt // 32):
        wr, wc = (warp % row_blocks) * 16, (warp // row_blocks) * wcols
        acc = np.zeros((32, wcols // 8, 4))
        for kk in range(0, tk, 8):
            for t in range(wcols // 8):
                fa, fb = np.zeros((16, 8)), np.zeros((8, 8))
                for lane in range(32):
                    g, m = lane // 4, lane % 4
                    k0r, k4r = (kk + m) * a_stride + wr + g, (kk + m + 4) * a_stride + wr + g
                    fa[g, m], fa[g + 8, m], fa[g, m + 4], fa[g + 8, m + 4] = As[k0r], As[k0r + 8], As[k4r], As[k4r + 8]
                    col = wc + t * 8 + g
                    fb[m, g], fb[m + 4, g] = Bs[(kk + m) * b_stride + col], Bs[(kk + m + 4) * b_stride + col]
                d = fa @ fb
                for lane in range(32):
                    g, m = lane // 4, lane % 4
                    acc[lane, t] += [d[g + 8 * (r // 2), 2 * m + r % 2] for r in range(4)]
        for lane in range(32):
            g, m = lane // 4, lane % 4
            for t in range(wcols // 8):
                for r in range(4):
                    row, col = wr + g + (r // 2) * 8, wc + t * 8 + 2 * m + r % 2
                    assert np.isnan(c[row, col]), f"{cfg}: C({row}, {col}) stored twice"
                    c[row, col] = acc[lane, t, r]
    banks_a = {((lane % 4) * a_stride + lane // 4) % 32 for lane in range(32)}
    banks_b = {((lane % 4) * b_stride + lane // 4) % 32 for lane in range(32)}
    return c, a_tile.T @ b_tile, banks_a, banks_b


@pytest.mark.parametrize("cfg", [c for c in cl_plans.GEMM_CONFIGS if cl_plans.gemm_tf32_fits(c)])
def test_the_tf32_tiles_warps_cover_each_output_once_without_bank_conflicts(cfg):
    """No GPU here: gemm.cl's TF32 index arithmetic, followed in NumPy for every tiling that has a
    TF32 variant, stores each element of the tile once, with the product's value, and each
    fragment load of a warp reads 32 different shared-memory banks."""
    c, expected, banks_a, banks_b = _tf32_tile(cfg)
    np.testing.assert_allclose(c, expected, atol=1e-12)
    assert len(banks_a) == len(banks_b) == 32


# -- on an NVIDIA GPU -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tf32_cuda():
    require_backend("cuda")
    from gpumnn.backends import create_backend
    try:
        be = create_backend("cuda", tf32=True)
    except gpumnn.errors.BackendOptionError as exc:  # a GPU before Ampere
        pytest.skip(str(exc))
    yield be
    be.close()


#: TF32 rounds each operand to 2^-11 relative; a product's error against float32 grows like
#: sqrt(K) of that: these ops stay far below 1e-2
OP_TOLERANCE = 1e-2


@pytest.mark.parametrize("name", ["matmul-tiles-fullbias", "matmul-trans-a-b", "conv-3x3-pad-bias-relu",
                                  "classifier-split-k"])
def test_tf32_ops_agree_with_float32(tf32_cuda, name):
    import test_atomic_ops as T
    cases = {"matmul-tiles-fullbias": lambda rng: T._matmul(rng, batch=1, m=70, n=130, k=100, bias="full", beta=0.5),
             "matmul-trans-a-b": lambda rng: T._matmul(rng, batch=2, m=66, n=40, k=77, trans_a=True, trans_b=True),
             "conv-3x3-pad-bias-relu": lambda rng: T._conv(rng, c=40, hw=(17, 15), oc=48, k=(3, 3), p=(1, 1),
                                                                    bias=True, act=("relu", ())),
             "classifier-split-k": lambda rng: T._matmul(rng, batch=1, m=16, n=300, k=2000, trans_b=True, bias="row",
                                                         const_b=True)}
    case = cases[name](np.random.default_rng(2))
    cpu = T.CpuBackend(threads=1)
    garbage = {n: np.zeros(s, np.float32) for n, s in case.outputs.items()}
    ref = T.run_case(cpu, case, garbage)
    pool, _, ins, outs = T._prepare(tf32_cuda, case, garbage)
    assert tf32_cuda.create_execution(case.op, ins, outs).scheme.endswith("/tf32")
    tf32_cuda.release(pool)
    got = T.run_case(tf32_cuda, case, garbage)
    for n in case.outputs:
        err = T.rel_err(got[n], ref[n])
        assert 0 < err < OP_TOLERANCE, f"{name}: relative L2 error {err:.2e} (0: no TF32 rounding happened)"


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v1", "squeezenet1_1"])
def test_tf32_models_match_onnxruntime_within_the_documented_tolerance(name, record_property):
    """The error is kept in the junit XML (``rel_l2``) for bench/RESULTS.md, and printed."""
    require_backend("cuda")
    model = zoo.build(name)
    x = np.random.default_rng(5).standard_normal(zoo.input_shape(name)).astype(np.float32)
    ref = onnxruntime_session(model).run(None, {"input": x})[0]
    try:
        sess = gpumnn.load(model).session(backend="cuda", precision="tf32", fallback=False)
    except gpumnn.errors.BackendOptionError as exc:
        pytest.skip(str(exc))
    with sess:
        assert sess.precision == "tf32"
        assert any(r["scheme"].endswith("/tf32") for r in sess.report_rows())
        err = rel_l2(sess.run({"input": x})["output"], ref)
    record_property("rel_l2", err)
    print(f"{name} tf32 relative L2 error vs ONNX Runtime fp32: {err:.2e}")
    assert err < precision.TOLERANCES["tf32"]
