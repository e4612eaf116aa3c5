"""Placement by the cost model: backend="auto", restricted lists, pins, the dynamic programme,
calibration and its cache, visible fallback, and ``gpumnn plan``."""
from __future__ import annotations

import dataclasses
import functools
import itertools

import numpy as np
import onnxruntime as ort
import pytest

import gpumnn
from conftest import rel_l2, require_backend
from gpumnn import atomic as A
from gpumnn import zoo
from gpumnn.backends import backend_class, create_backend
from gpumnn.tools.cli import main
from gpumnn.errors import InputError
from gpumnn.scheduler import calibration as C
from gpumnn.scheduler.cost import HOST
from gpumnn.scheduler.placement import assign, estimate

TOLERANCE = 1e-3
MODEL = "squeezenet1_1"
#: a 1x1 convolution (pinned to another backend, its neighbours' tensors cross twice)
SQUEEZE = "features.3.squeeze"


@functools.lru_cache(maxsize=None)
def _model_and_reference():
    model = zoo.build(MODEL)
    x = np.random.default_rng(3).standard_normal(zoo.input_shape(MODEL)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    return gpumnn.load(model), x, ref


def _check(sess) -> None:
    net, x, ref = _model_and_reference()
    out = sess.run({"input": x})["output"]
    assert rel_l2(out, ref) < TOLERANCE


@pytest.fixture(autouse=True)
def _calibration_cache(tmp_path_factory, monkeypatch):
    """One calibration cache for this module's sessions (measured quickly once per backend)."""
    monkeypatch.setenv("GPUMNN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "placement-cache"))
    C.forget()
    yield
    C.forget()


# -- the dynamic programme ------------------------------------------------------------------------

class _TableModel:
    """Synthetic costs: a copy costs ``copy`` ms between devices; host copies and segments are free."""

    def __init__(self, copy: float):
        self.copy = copy

    def segment_ms(self, backend: str) -> float:
        return 0.0

    def transfer_ms(self, nbytes: int, source: str, target: str) -> float:
        return 0.0 if HOST in (source, target) or source == target else self.copy


def _chain(n: int) -> A.AtomicProgram:
    names = [f"t{i}" for i in range(n + 1)]
    ops = [A.Unary(inputs=(names[i],), outputs=(names[i + 1],), source=f"n{i}", op="relu", count=4) for i in range(n)]
    return A.AtomicProgram(ops, {t: (4,) for t in names}, {}, [names[0]], [names[-1]])


def _greedy(allowed, table, model) -> list[str]:
    """Per op, the cheapest backend given the previous op's choice (what the DP must beat)."""
    chosen = []
    for i, backends in enumerate(allowed):
        prev = chosen[-1] if chosen else HOST
        chosen.append(min(backends, key=lambda b: table[i][b] + model.transfer_ms(16, prev, b)))
    return chosen


def test_dynamic_programme_beats_greedy_and_matches_exhaustive_search():
    program = _chain(3)
    allowed = [["a", "b"]] * 3
    table = [{"a": 1.0, "b": 2.0}, {"a": 5.0, "b": 1.0}, {"a": 5.0, "b": 1.0}]
    model = _TableModel(copy=3.0)
    greedy = _greedy(allowed, table, model)
    dp = assign(program, allowed, table, model)
    assert greedy == ["a", "b", "b"] and estimate(program, greedy, table, model).total_ms == 1 + 3 + 1 + 1
    assert dp == ["b", "b", "b"] and estimate(program, dp, table, model).total_ms == 4
    best = min(estimate(program, list(c), table, model).total_ms for c in itertools.product("ab", repeat=3))
    assert estimate(program, dp, table, model).total_ms == best


def test_dynamic_programme_is_exact_on_chains():
    rng = np.random.default_rng(0)
    program = _chain(6)
    allowed = [["a", "b", "c"]] * 6
    model = _TableModel(copy=1.5)
    for _ in range(20):
        table = [{b: float(rng.uniform(0, 4)) for b in "abc"} for _ in range(6)]
        dp = estimate(program, assign(program, allowed, table, model), table, model).total_ms
        best = min(estimate(program, list(c), table, model).total_ms for c in itertools.product("abc", repeat=6))
        assert dp == pytest.approx(best)


class _AnyBackend:
    def unsupported_reason(self, op) -> None:
        return None


@pytest.mark.parametrize("middle, split", [(0.9, False), (0.1, True)])
def test_a_split_must_be_estimated_clearly_faster_than_one_backend(monkeypatch, middle, split):
    """The middle op of a chain is cheaper on ``b``; moving it there (free copies) saves 3% of the
    estimate in one case (within the model's error: one backend is kept) and 30% in the other."""
    from gpumnn.scheduler import placement as P
    table = [{"a": 1.0, "b": 1.2}, {"a": 1.0, "b": middle}, {"a": 1.0, "b": 1.2}]
    monkeypatch.setattr(P, "cost_table", lambda program, allowed, model: table)
    model = _TableModel(copy=0.0)
    model.record, model.host_devices, model.sources = True, frozenset(), dict
    placed = P.place(_chain(3), dict.fromkeys(["cpu", "a", "b"], _AnyBackend()), ["a", "b"], model)
    assert placed.op_backends == (["a", "b", "a"] if split else ["a", "a", "a"])
    assert placed.fallback_reasons == [None] * 3


# -- sessions -------------------------------------------------------------------------------------

def test_auto_agrees_with_onnxruntime_and_uses_only_available_backends():
    net, _, _ = _model_and_reference()
    sess = net.session(backend="auto")
    assert sess.backend == "auto" and set(sess.candidates) == set(gpumnn.available_backends())
    assert set(sess.placement.op_backends) <= set(sess.candidates)
    assert all(source != C.PAPER for source in sess.placement.cost_sources.values())  # quick calibration
    _check(sess)
    report = sess.report()
    assert "estimated total" in report and "moved" in report and "costs: " in report


def test_restricted_list(backend):
    net, _, _ = _model_and_reference()
    sess = net.session(backend=[backend, "cpu"])
    assert sess.candidates == list(dict.fromkeys([backend, "cpu"]))
    assert set(sess.placement.op_backends) <= {backend, "cpu"}
    _check(sess)


def test_pin_by_node_name_splits_the_graph_and_a_run_allocates_nothing(backend):
    other = _other(backend)
    net, _, _ = _model_and_reference()
    sess = net.session(backend=backend, placement={SQUEEZE: other})
    where = {r["node"]: r["backend"] for r in sess.report_rows()}
    assert where[SQUEEZE] == other and set(sess.placement.op_backends) == {backend, other}
    copies = [s for s in sess.placement.steps if s.kind == "copy"]
    assert {(s.source, s.backend) for s in copies} == {(backend, other), (other, backend)}
    _check(sess)
    before = sess.counters
    _check(sess)
    after = sess.counters
    for name in before:
        for counter in ("buffers_allocated", "programs_built", "executions_created", "recordings_made"):
            assert after[name][counter] == before[name][counter], f"{name}.{counter} changed during a recorded run"


def test_eager_split_agrees_with_onnxruntime(backend):
    other = _other(backend)
    net, _, _ = _model_and_reference()
    sess = net.session(backend=backend, record=False, placement={SQUEEZE: other})
    assert {r["backend"] for r in sess.report_rows() if r["node"] == SQUEEZE} == {other}
    _check(sess)


def test_placement_names_unknown_nodes():
    net, _, _ = _model_and_reference()
    with pytest.raises(InputError, match="no_such_node"):
        net.session(backend="cpu", placement={"no_such_node": "cpu"})


def _other(backend: str) -> str:
    """The second backend of a split with ``backend``."""
    other = "cpu" if backend != "cpu" else "opencl"
    require_backend(other)
    return other


def test_a_split_chosen_by_the_cost_model_agrees_with_onnxruntime(backend, monkeypatch):
    """Calibrations that make ``backend`` fast at GEMMs and another fast at everything else: the
    convolutions go to ``backend``, pooling to the other, with copies between."""
    other = _other(backend)

    def fake(be, measure=False):
        gemm, memory = (1e15, 1e-3) if be.name == backend else (1e6, 1e6)
        return dataclasses.replace(C.paper_constants(be), source=C.MEASURED,
                                   kernels={k: [0.0, gemm] for k in C.KERNELS},
                                   memory_gbs={s: memory for s in C.STREAMS},
                                   upload_gbs=1e6, download_gbs=1e6)

    monkeypatch.setattr(gpumnn.runtime.session, "calibration_for", fake)
    net, _, _ = _model_and_reference()
    sess = net.session(backend=[backend, other])
    kinds = {r["op"]: set() for r in sess.report_rows()}
    for r in sess.report_rows():
        kinds[r["op"]].add(r["backend"])
    assert kinds["conv2d"] == {backend} and kinds["pool2d"] == {other}
    _check(sess)


def test_a_run_activates_only_the_backends_its_placement_uses(monkeypatch):
    """A session offered the CPU and OpenGL that places every op on the CPU never makes the
    OpenGL context current during a run (nor takes its lock)."""
    require_backend("gl")

    def fake(be, measure=False):
        gemm, memory = (1e15, 1e6) if be.name == "cpu" else (1e3, 1e-3)
        return dataclasses.replace(C.paper_constants(be), source=C.MEASURED,
                                   kernels={k: [0.0, gemm] for k in C.KERNELS},
                                   memory_gbs={s: memory for s in C.STREAMS})

    monkeypatch.setattr(gpumnn.runtime.session, "calibration_for", fake)
    net, _, _ = _model_and_reference()
    sess = net.session(backend=["cpu", "gl"])
    assert set(sess.placement.op_backends) == {"cpu"}
    entered = []
    gl = sess.backends["gl"]
    original = gl.activate
    monkeypatch.setattr(gl, "activate", lambda: (entered.append(1), original())[1])
    _check(sess)
    assert entered == []


def test_fallback_stays_visible(backend, monkeypatch):
    """A backend without a max-pooling kernel: those ops go to the CPU, with the reason, and the
    answer stays right."""
    require_backend(backend)
    cls = backend_class(backend)
    monkeypatch.setattr(cls, "op_names", {**cls.op_names, A.Pool2D: frozenset({"avg"})})
    net, _, _ = _model_and_reference()
    if backend == "cpu":
        with pytest.raises(gpumnn.UnsupportedOpError, match="Pool2D 'max'"):
            net.session(backend="cpu")
        return
    sess = net.session(backend=backend, fallback=False)
    rows = sess.report_rows()
    pools = [r for r in rows if r["op"] == "pool2d" and r["scheme"] != "global"]
    assert pools and all(r["backend"] == "cpu" and "Pool2D 'max'" in r["fallback"] for r in pools)
    assert {r["backend"] for r in rows if r["op"] == "conv2d"} == {backend}
    assert "cpu fallback" in sess.report()
    _check(sess)


# -- calibration ----------------------------------------------------------------------------------

def test_calibration_cache_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUMNN_CACHE_DIR", str(tmp_path))
    backend = create_backend("cpu")
    assert C.calibration_for(backend).source == C.PAPER  # nothing stored: the paper's constants
    measured = C.calibrate(backend, quick=True)
    assert measured.source == C.QUICK and measured.matmul_macs > 0 and measured.upload_gbs > 0
    C.forget()
    assert C.stored(backend) == measured  # from disk
    assert C.calibration_for(backend, measure=True) == measured  # not measured again
    path = C.cache_path(backend)
    path.write_bytes(path.read_bytes()[:-3])  # damaged: a miss, never a wrong number
    C.forget()
    assert C.stored(backend) is None


def test_calibration_measures_every_family_and_the_winograd_kernel_where_a_backend_has_one(tmp_path, monkeypatch):
    """Memory-bound ops of each family (``STREAMS``) and every multiplying kernel get numbers of
    their own; the CPU's Winograd kernel is measured, a backend without one is not, and the
    matrix-vector kernel only where a backend has one (the GPU kernel family)."""
    monkeypatch.setenv("GPUMNN_CACHE_DIR", str(tmp_path))
    cpu = C.calibrate(create_backend("cpu"), quick=True)
    assert set(cpu.memory_gbs) == set(C.STREAMS) and all(v > 0 for v in cpu.memory_gbs.values())
    assert set(cpu.kernels) == set(C.KERNELS) - {"gemv"}
    assert all(fixed >= 0 and rate > 0 for fixed, rate in cpu.kernels.values())
    require_backend("opencl")
    simd = C.calibrate(create_backend("opencl", kernels="simd"), quick=True).kernels
    assert "winograd" not in simd and "gemv" not in simd
    fixed, rate = C.calibrate(create_backend("opencl", kernels="tiled"), quick=True).kernels["gemv"]
    assert fixed >= 0 and rate > 0


def test_a_gemv_is_priced_by_its_kernel_or_else_the_gemm():
    """A ``gemv`` MatMul costs the matrix-vector kernel's numbers; a calibration without them (a
    backend without the kernel, or one measured before it existed) prices it as the GEMM."""
    from gpumnn.scheduler.cost import CostModel
    base = dataclasses.replace(C.paper_constants(create_backend("cpu")), source=C.MEASURED, dispatch_ms=0.0,
                               memory_gbs={s: float("inf") for s in C.STREAMS})
    with_gemv = dataclasses.replace(base, kernels={**{k: [0.0, 1e9] for k in C.KERNELS}, "gemv": [0.0, 1e10]})
    without = dataclasses.replace(base, kernels={k: [0.0, 1e9] for k in C.KERNELS if k != "gemv"})
    fc = A.MatMul(inputs=("x", "w"), outputs=("y",), source="fc", m=1, n=1000, k=512, trans_b=True, scheme="gemv")
    assert CostModel({"cpu": with_gemv}).op_ms(fc, "cpu", 0) == pytest.approx(fc.macs() / 1e7)
    assert CostModel({"cpu": without}).op_ms(fc, "cpu", 0) == pytest.approx(fc.macs() / 1e6)


def test_cost_follows_the_scheme_multiplications_and_the_family_bandwidth():
    """A Winograd convolution is priced by the multiplications of its tile (Eq. 2), an erf at the
    transcendental bandwidth, a pooling at the pooling bandwidth."""
    from gpumnn.scheduler import schemes
    from gpumnn.scheduler.cost import CostModel, stream_of
    cal = dataclasses.replace(C.paper_constants(create_backend("cpu")), source=C.MEASURED, dispatch_ms=0.0,
                              kernels={k: [0.0, 1e9] for k in C.KERNELS},
                              memory_gbs={"elementwise": 10.0, "transcendental": 1.0, "rows": 2.0, "pool": 4.0})
    model = CostModel({"cpu": cal})
    conv = A.Conv2D(inputs=("x", "w"), outputs=("y",), source="c", in_channels=64, in_hw=(56, 56), out_channels=64,
                    out_hw=(56, 56), kernel=(3, 3), pads=(1, 1))
    sliding = model.op_ms(dataclasses.replace(conv, scheme="im2col"), "cpu", 0)
    wino = dataclasses.replace(conv, scheme="winograd", winograd_tile=4)
    assert sliding == pytest.approx(conv.macs() / 1e6)
    assert model.op_ms(wino, "cpu", 0) == pytest.approx(schemes.conv_cost(conv, 4) / 1e6)
    assert model.op_ms(wino, "cpu", 0) < sliding / 2
    erf = A.Unary(inputs=("x",), outputs=("y",), source="e", op="erf", count=1 << 20)
    relu = dataclasses.replace(erf, op="relu")
    pool = A.Pool2D(inputs=("x",), outputs=("y",), source="p", kernel=(3, 3))
    assert [stream_of(op) for op in (erf, relu, pool)] == ["transcendental", "elementwise", "pool"]
    assert model.op_ms(erf, "cpu", 8 << 20) == pytest.approx(10 * model.op_ms(relu, "cpu", 8 << 20))
    assert model.op_ms(pool, "cpu", 8 << 20) == pytest.approx(2.5 * model.op_ms(relu, "cpu", 8 << 20))
    gelu_conv = dataclasses.replace(conv, scheme="im2col", activation=("gelu", ()))  # a pass at 1 GB/s over its output
    assert model.op_ms(gelu_conv, "cpu", 0, 1 << 20) == pytest.approx(sliding + 2 * (1 << 20) / 1e6)


def test_calibrate_and_info_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPUMNN_CACHE_DIR", str(tmp_path))
    assert main(["info"]) == 0
    assert "not calibrated: paper constants" in capsys.readouterr().out
    assert main(["calibrate", "--backend", "cpu", "--quick"]) == 0
    assert "GMAC/s" in capsys.readouterr().out
    C.forget()
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "quick calibration" in out.split("\n  opencl")[0]


def test_plan_cli_prints_estimated_beside_measured(tmp_path, capsys):
    png = tmp_path / "plan.png"
    assert main(["plan", MODEL, "--backend", "cpu", "--runs", "1", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    net, _, _ = _model_and_reference()
    rows = [line for line in out.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert len(rows) == len(net.session().program.ops)
    assert "est ms" in out and "meas ms" in out and "total: estimated" in out
    assert png.stat().st_size > 1000
