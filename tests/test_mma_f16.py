"""precision="fp16" on cuda's tensor cores, checked without a GPU: gemm.cl's own index arithmetic
for mma.sync m16n8k16, evaluated in Python and run through a model of the instruction.

gemm.cl places every fragment element with one-line ``inline int`` functions (f16_a_at, f16_b_at,
mma_warp_row, mma_c_row, ...). This file reads them out of the source as the CUDA build sees it
(a small preprocessor for gemm.cl's #if/#define lines, the GEMM defines of each tiling), turns
their C integer arithmetic into Python (all operands are non-negative: ``/`` is ``//``), and
follows one tile through a warp-level model of the instruction written from the PTX ISA's fragment
tables (below, independently of gemm.cl): which lane's register holds which element of A, B and
the sums. A wrong row, k or column in gemm.cl gives a wrong product here. What the model cannot
check is the hardware itself: that ``pack_half2(lo, hi)`` puts ``lo`` in the low half (the
prelude's PTX says so) and that the instruction is encoded as named; NVRTC compiles it in
tests/test_cuda_source.py, and ``bench/gpu_session.sh verify`` runs it on a GPU (tests/test_fp16.py
and the planner check below on cuda)."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import gpumnn
from gpumnn import atomic as A, zoo
from gpumnn.backends.kernels.cl import planner as cl_plans
from gpumnn.scheduler import precision
from test_tf32 import _Target as TiledGpu, _plan

from conftest import onnxruntime_session, rel_l2, require_backend


# -- the PTX ISA's fragment layouts of mma.m16n8k16 with .f16 operands and .f32 sums ------------------
# groupID = lane >> 2, threadID_in_group = lane % 4; A's 8 halves a0..a7 are 4 .f16x2 registers
# (a0, a1 the first, the lower index in the lower half), B's 4 halves b0..b3 two, C's 4 floats c0..c3.

def isa_a(lane: int, i: int) -> tuple[int, int]:
    """(row, column) of A (16 x 16) that lane's element a_i holds."""
    group, member = lane >> 2, lane % 4
    row = group if (i < 2 or 4 <= i < 6) else group + 8
    col = member * 2 + (i & 1) if i < 4 else member * 2 + (i & 1) + 8
    return row, col


def isa_b(lane: int, i: int) -> tuple[int, int]:
    """(row, column) of B (16 x 8) that lane's element b_i holds."""
    group, member = lane >> 2, lane % 4
    row = member * 2 + (i & 1) if i < 2 else member * 2 + (i & 1) + 8
    return row, group


def isa_c(lane: int, i: int) -> tuple[int, int]:
    """(row, column) of C and D (16 x 8) that lane's element c_i holds (m16n8k8 .tf32 alike)."""
    group, member = lane >> 2, lane % 4
    return (group if i < 2 else group + 8), member * 2 + (i & 1)


def mma_m16n8k16(a_regs, b_regs, c_regs) -> np.ndarray:
    """The warp's D = A B + C as the instruction reads its registers: ``a_regs`` [32][4] pairs of
    halves (lower, upper), ``b_regs`` [32][2] pairs, ``c_regs`` [32][4] floats; D as [32][4]. Every
    element of A and B must be held by exactly one lane."""
    a, b = np.full((16, 16), np.nan), np.full((16, 8), np.nan)
    for lane in range(32):
        for i in range(8):
            r, c = isa_a(lane, i)
            assert np.isnan(a[r, c]), f"A({r}, {c}) held twice"
            a[r, c] = a_regs[lane][i // 2][i % 2]
        for i in range(4):
            r, c = isa_b(lane, i)
            assert np.isnan(b[r, c]), f"B({r}, {c}) held twice"
            b[r, c] = b_regs[lane][i // 2][i % 2]
    assert not np.isnan(a).any() and not np.isnan(b).any()
    d = a @ b
    return np.array([[c_regs[lane][i] + d[isa_c(lane, i)] for i in range(4)] for lane in range(32)])


# -- gemm.cl's index functions, as the CUDA build with given defines compiles them --------------------

def _c_expr(text: str) -> str:
    """A C integer/boolean expression of gemm.cl's as Python (non-negative operands)."""
    text = text.replace("||", " or ").replace("&&", " and ")
    text = re.sub(r"!(?!=)", " not ", text)
    return re.sub(r"(?<![/*])/(?![/*])", "//", text)


def gemm_functions(defines: dict[str, int]) -> dict[str, object]:
    """gemm.cl's object-like macros and one-line ``inline int`` functions (after tile.cl's, which
    it includes), live under ``defines`` (the #if / #ifdef / #ifndef / #elif / #else / #endif lines
    followed), as Python values and functions."""
    text = "\n".join((cl_plans.SHADER_DIR / name).read_text() for name in ("tile.cl", "gemm.cl"))
    source = re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)
    space: dict[str, object] = dict(defines)
    stack: list[tuple[bool, bool]] = []  # (this branch live, some branch of the #if taken)

    def live() -> bool:
        return all(branch for branch, _ in stack)

    def value(expr: str) -> object:
        return eval(_c_expr(expr), {}, space)  # noqa: S307 -- gemm.cl's own arithmetic

    for line in source.splitlines():
        line = line.strip()
        if m := re.match(r"#(ifndef|ifdef)\s+(\w+)", line):
            taken = (m.group(2) in space) == (m.group(1) == "ifdef")
            stack.append((taken, taken))
        elif m := re.match(r"#if\s+(.*)", line):
            taken = live() and bool(value(m.group(1)))
            stack.append((taken, taken))
        elif m := re.match(r"#elif\s+(.*)", line):
            _, done = stack.pop()
            outer = live()
            taken = outer and not done and bool(value(m.group(1)))
            stack.append((taken, done or taken))
        elif line.startswith("#else"):
            _, done = stack.pop()
            stack.append((not done, True))
        elif line.startswith("#endif"):
            stack.pop()
        elif not live():
            continue
        elif m := re.match(r"#define\s+(\w+)\s+(.+)", line):
            try:
                space[m.group(1)] = value(m.group(2))
            except Exception:  # a macro that is not arithmetic (GEMM_ARGS, ...): not an index
                pass
        elif m := re.match(r"inline int (\w+)\(([^)]*)\)\s*\{\s*return (.*);\s*\}$", line):
            params = ", ".join(p.split()[-1] for p in m.group(2).split(","))
            space[m.group(1)] = eval(f"lambda {params}: {_c_expr(m.group(3))}", space)  # noqa: S307 -- resolved in space when called
    assert not stack, "unbalanced #if in gemm.cl"
    return space


F16_CFGS = [c for c in cl_plans.GEMM_CONFIGS if cl_plans.gemm_f16_fits(c)]


def _defines(cfg: str, **extra: int) -> dict[str, int]:
    return dict(zip(("TM", "TN", "WM", "WN", "TK"), cl_plans.GEMM_CONFIGS[cfg]), HALF=1, **extra)


def _f16_tile(cfg: str, f: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One tile of gemm.cl's -DGEMM_F16 path: As and Bs staged as gemm_body stages them (As[kk * AS
    + mm], Bs[kk * BS + nn]) with float16 values, every warp's K steps of 16 through the instruction's
    model, its sums stored where the epilogue stores them. (C as stored, the exact product, gemm.cl's
    product). ``f``: gemm.cl's functions for the tiling, or others in their place."""
    f = f or gemm_functions(_defines(cfg, GEMM_F16=1))
    tm, tn, tk, nt = f["TM"], f["TN"], f["TK"], f["NT"]
    rng = np.random.default_rng(16)
    a_tile = rng.standard_normal((tk, tm)).astype(np.float16).astype(np.float64)  # As[k][m]
    b_tile = rng.standard_normal((tk, tn)).astype(np.float16).astype(np.float64)  # Bs[k][n]
    As, Bs = np.full(tk * f["AS"], np.nan), np.full(tk * f["BS"], np.nan)  # padding never read
    for kk in range(tk):
        As[kk * f["AS"]:kk * f["AS"] + tm] = a_tile[kk]
        Bs[kk * f["BS"]:kk * f["BS"] + tn] = b_tile[kk]
    c = np.full((tm, tn), np.nan)
    for warp in range(nt // 32):
        wr, wc = f["mma_warp_row"](warp), f["mma_warp_col"](warp)
        acc = np.zeros((32, f["NTILES"], 4))
        for kk in range(0, tk, 16):
            a = [[(As[f["f16_a_at"](kk, wr, lane, 2 * r)], As[f["f16_a_at"](kk, wr, lane, 2 * r + 1)])
                  for r in range(4)] for lane in range(32)]
            for t in range(f["NTILES"]):
                b = [[(Bs[f["f16_b_at"](kk, wc + t * 8, lane, 2 * r)], Bs[f["f16_b_at"](kk, wc + t * 8, lane, 2 * r + 1)])
                      for r in range(2)] for lane in range(32)]
                acc[:, t] = mma_m16n8k16(a, b, acc[:, t])
        for lane in range(32):
            for t in range(f["NTILES"]):
                for r in range(4):
                    row, col = wr + f["mma_c_row"](lane, r), wc + t * 8 + f["mma_c_col"](lane, r)
                    assert np.isnan(c[row, col]), f"{cfg}: C({row}, {col}) stored twice"
                    c[row, col] = acc[lane, t, r]
    return c, a_tile.T @ b_tile


def test_the_kernel_builds_its_fragments_with_the_functions_checked_here():
    """The -DGEMM_F16 loop of gemm_body reads As and Bs through f16_a_at and f16_b_at (register r
    from elements 2r and 2r + 1, B 8 columns per product) and stores through mma_c_row / mma_c_col:
    what this file's model follows."""
    body = (cl_plans.SHADER_DIR / "gemm.cl").read_text()
    for call in ("pack_half2(As[f16_a_at(kk, wr, lane, 2 * r)], As[f16_a_at(kk, wr, lane, 2 * r + 1)])",
                 "pack_half2(Bs[f16_b_at(kk, wc + t * 8, lane, 2 * r)], Bs[f16_b_at(kk, wc + t * 8, lane, 2 * r + 1)])",
                 "mma_f16_m16n8k16(acc[t], a, b)", "for (int kk = 0; kk < TK; kk += 16)",
                 "m0 + wr + mma_c_row(lane, r), n0 + wc + t * 8 + mma_c_col(lane, r)",
                 "const int wr = mma_warp_row(warp), wc = mma_warp_col(warp)"):
        assert call in body, call
    prelude = (cl_plans.SHADER_DIR / "prelude_cuda.h").read_text()
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in prelude
    assert "return (uint)l | ((uint)h << 16);" in prelude  # lo (the lower fragment index) in the low half


@pytest.mark.parametrize("cfg", F16_CFGS)
def test_the_f16_tiles_compute_the_product_once_per_element(cfg):
    """For every tiling with a float16 variant, gemm.cl's index functions through the instruction's
    model give each element of the tile exactly once, with the product of the staged tiles (float16
    values: float32 sums of exact products; here exactly the float64 product)."""
    c, expected = _f16_tile(cfg)
    assert not np.isnan(c).any(), f"{cfg}: elements never stored"
    np.testing.assert_allclose(c, expected, rtol=0, atol=1e-9)


@pytest.mark.parametrize("cfg", F16_CFGS)
def test_the_f16_fragment_loads_are_free_of_bank_conflicts(cfg):
    """Each shared-memory load of a fragment element (one per element and register half) reads 32
    different banks across the warp, for every warp of the tile."""
    f = gemm_functions(_defines(cfg, GEMM_F16=1))
    for warp in range(f["NT"] // 32):
        wr, wc = f["mma_warp_row"](warp), f["mma_warp_col"](warp)
        for j in range(8):
            assert len({f["f16_a_at"](0, wr, lane, j) % 32 for lane in range(32)}) == 32, (cfg, warp, "A", j)
        for j in range(4):
            assert len({f["f16_b_at"](0, wc, lane, j) % 32 for lane in range(32)}) == 32, (cfg, warp, "B", j)


def test_a_wrong_fragment_function_is_caught():
    """The model is not blind: with A's row and k swapped, or B's k off by one register, the tile
    comes out wrong (or an element is read twice)."""
    cfg = F16_CFGS[0]
    f = gemm_functions(_defines(cfg, GEMM_F16=1))
    swapped_a = lambda kk, wr, lane, j: (kk + f["f16_a_row"](lane, j)) * f["AS"] + wr + f["f16_a_k"](lane, j)  # noqa: E731
    shifted_b = lambda kk, c0, lane, j: (kk + (f["f16_b_k"](lane, j) + 8) % 16) * f["BS"] + c0 + lane // 4  # noqa: E731
    for name, wrong in (("f16_a_at", swapped_a), ("f16_b_at", shifted_b)):
        try:
            c, expected = _f16_tile(cfg, {**f, name: wrong})
        except AssertionError:
            continue
        assert not np.allclose(c, expected), name


def test_the_tf32_build_places_its_warps_and_sums_as_the_isa_says():
    """The warp placement and C-fragment functions are shared with -DGEMM_TF32 (m16n8k8 has the same
    float32 sums layout): the TF32 build's functions agree with the ISA's table and cover the tile."""
    for cfg in (c for c in cl_plans.GEMM_CONFIGS if cl_plans.gemm_tf32_fits(c)):
        f = gemm_functions(dict(zip(("TM", "TN", "WM", "WN", "TK"), cl_plans.GEMM_CONFIGS[cfg]), GEMM_TF32=1))
        assert "f16_a_at" not in f and f["AS"] == f["TM"] + 8
        assert all((f["mma_c_row"](lane, i), f["mma_c_col"](lane, i)) == isa_c(lane, i)
                   for lane in range(32) for i in range(4))
        corners = {(f["mma_warp_row"](w), f["mma_warp_col"](w)) for w in range(f["NT"] // 32)}
        assert len(corners) == f["NT"] // 32 and {r for r, _ in corners} == set(range(0, f["TM"], 16))
        assert {c for _, c in corners} == set(range(0, f["TN"], f["WCOLS"]))


# -- the planner and the precision decision ---------------------------------------------------------

def _Target(capability: int):
    """A cuda GPU of compute ``capability`` as the OpenCL C planner sees it, none opened."""
    return TiledGpu(tf32=False, float16_tensor_cores=cl_plans.tensor_cores("fp16", capability))


CONV = A.Conv2D(("x", "w"), ("y",), "conv", in_channels=64, in_hw=(28, 28), out_channels=128, out_hw=(28, 28),
                kernel=(3, 3), pads=(1, 1), scheme="im2col", dtype=A.FLOAT16)
CONV_SHAPES = {"x": (1, 64, 28, 28), "w": (128, 64, 3, 3), "y": (1, 128, 28, 28)}


def test_fp16_tensor_cores_from_compute_capability_8():
    """Ampere and later multiply fp16 (and tf32) tiles on tensor cores; Turing and older do not (fp16
    sessions there keep float16 storage with float32 products); no other precision has them."""
    assert [cl_plans.tensor_cores("fp16", cc) for cc in (61, 70, 75, 80, 86, 89, 90)] == [False] * 3 + [True] * 4
    assert cl_plans.tensor_cores("tf32", 80) and not cl_plans.tensor_cores("tf32", 75)
    assert not any(cl_plans.tensor_cores(p, 90) for p in ("fp32", "int8"))


def test_the_planner_puts_f16_tiles_on_float16_storage_where_they_fit():
    """On sm_80+ a float16-storage convolution's tiles take -DGEMM_F16 and its scheme says so; on
    sm_75 the same op keeps the float32 products; float32 storage never takes them; the 4-row
    tiling and the matrix-vector kernel stay as they were."""
    ampere, turing = _plan(_Target(80), CONV, CONV_SHAPES), _plan(_Target(75), CONV, CONV_SHAPES)
    assert all(("GEMM_F16", 1) in ln.defines and ("HALF", 1) in ln.defines for ln in ampere.work)
    assert [ln.defines for ln in turing.work] == [tuple(d for d in ln.defines if d != ("GEMM_F16", 1)) for ln in ampere.work]
    assert ampere.scheme == f"{turing.scheme}/{cl_plans.F16_MMA_LABEL}" and "mma" not in turing.scheme
    float32 = _plan(_Target(90), dataclasses.replace(CONV, dtype=A.FLOAT32), CONV_SHAPES)
    assert not any(("GEMM_F16", 1) in ln.defines for ln in float32.work)
    skinny = A.MatMul(("x", "w"), ("y",), "fc", m=4, n=512, k=256, dtype=A.FLOAT16)
    assert not any(("GEMM_F16", 1) in ln.defines
                   for ln in _plan(_Target(90), skinny, {"x": (4, 256), "w": (256, 512), "y": (4, 512)}).work)


def test_gpumnn_info_says_how_fp16_multiplies_on_cuda():
    class Cuda:
        name, dtypes = "cuda", cl_plans.TILED_DTYPES

        def __init__(self, capability):
            self.compute_capability = capability
            self.float16_tensor_cores = cl_plans.tensor_cores("fp16", capability)

    assert "tensor cores (mma.sync m16n8k16" in precision.float16_summary(Cuda(90))
    older = precision.float16_summary(Cuda(75))
    assert "float32 arithmetic" in older and "need compute capability 8.0; this GPU has 7.5" in older


# -- on an NVIDIA GPU of compute capability 8.0 or later (bench/gpu_session.sh verify runs these first) --

def _cuda_fp16_session(model):
    """An fp16 session on cuda whose GEMM tiles multiply on tensor cores, or a skip saying why not."""
    require_backend("cuda")
    sess = gpumnn.load(model).session(backend="cuda", precision="fp16", fallback=False)
    if not sess.backends["cuda"].float16_tensor_cores:
        sess.close()
        pytest.skip(f"no float16 tensor cores: {precision.float16_summary(sess.backends['cuda'])}")
    return sess


def _products_model(rng):
    """A MatMul over the 64x64 tiling (70 x 100 by 100 x 130, a full bias) and a Gemm of few tiles and
    a deep K (split-K: 16 x 2000 by a transposed 300 x 2000), float16-exact inputs and weights."""
    from onnx import TensorProto, helper, numpy_helper
    from op_cases import model_proto

    def rounded(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float16).astype(np.float32)

    weights = {"w": rounded(100, 130, scale=0.1), "b": rounded(70, 130), "v": rounded(300, 2000, scale=0.03),
               "c": rounded(300)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"]),
             helper.make_node("Gemm", ["z", "v", "c"], ["g"], transB=1)]
    graph = helper.make_graph(nodes, "products", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [70, 100]),
                                                  helper.make_tensor_value_info("z", TensorProto.FLOAT, [16, 2000])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [70, 130]),
                               helper.make_tensor_value_info("g", TensorProto.FLOAT, [16, 300])],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return model_proto(graph), {"x": rounded(70, 100), "z": rounded(16, 2000)}


def test_cuda_fp16_products_on_tensor_cores_match_numpy():
    """float16 operands multiply exactly and sum in float32: each output within test_fp16's bound of
    one float16 rounding (OP_TOLERANCE) of NumPy's float64 on the same values, the split-K one too."""
    from test_fp16 import OP_TOLERANCE

    model, feed = _products_model(np.random.default_rng(29))
    with _cuda_fp16_session(model) as sess:
        assert sum(r["scheme"].endswith(f"/{cl_plans.F16_MMA_LABEL}") for r in sess.report_rows()) >= 2
        got = sess.run(feed)
    ref = onnxruntime_session(model).run(None, feed)
    for name, r in zip(("y", "g"), ref):
        r = r.astype(np.float64)
        np.testing.assert_allclose(got[name], r, rtol=OP_TOLERANCE, atol=OP_TOLERANCE * np.abs(r).max(), err_msg=name)


@pytest.mark.parametrize("name", ["resnet18", "squeezenet1_1", "mobilenet_v2", "transformer_encoder"])
def test_cuda_fp16_models_on_tensor_cores_match_onnxruntime(name, record_property):
    """Within the fp16 bound of each zoo model (test_fp16.ZOO_FP16_ERROR: about 3x the worst error
    measured for float16 storage; the tensor-core products add no rounding of their own), the error
    kept in the junit XML (``rel_l2``) and printed."""
    from test_fp16 import ZOO_FP16_ERROR

    model = zoo.build(name)
    x = np.random.default_rng(5).standard_normal(zoo.input_shape(name)).astype(np.float32)
    ref = onnxruntime_session(model).run(None, {"input": x})[0]
    with _cuda_fp16_session(model) as sess:
        assert any(r["scheme"].endswith(f"/{cl_plans.F16_MMA_LABEL}") for r in sess.report_rows())
        err = rel_l2(next(iter(sess.run({"input": x}).values())), ref)
    record_property("rel_l2", err)
    print(f"{name} fp16 (tensor cores) relative L2 error vs ONNX Runtime fp32: {err:.2e}")
    assert err < ZOO_FP16_ERROR[name]
