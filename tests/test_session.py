"""Pre-inference behaviour: recorded runs do no work twice, memory is shared, placement splits visibly."""
from __future__ import annotations

import time

import numpy as np
import pytest

import gpumnn
from conftest import onnxruntime_session, rel_l2
from gpumnn import atomic as A
from gpumnn import zoo
from gpumnn.backends import REGISTRY
from gpumnn.backends.cpu.backend import CpuBackend


@pytest.fixture(scope="module")
def resnet():
    model = zoo.build("resnet18")
    x = np.random.default_rng(3).standard_normal((1, 3, 224, 224)).astype(np.float32)
    return gpumnn.load(model), x


def test_recorded_run_builds_allocates_and_records_nothing(backend):
    net = gpumnn.load(zoo.build("mobilenet_v2"))
    sess = net.session(backend=backend, fallback=False)
    x = np.random.default_rng(4).standard_normal((1, 3, 224, 224)).astype(np.float32)
    sess.run({"input": x})
    before = sess.counters
    first = sess.run({"input": x})["output"]
    second = sess.run({"input": x})["output"]
    after = sess.counters
    for name in before:
        for counter in ("buffers_allocated", "programs_built", "executions_created", "recordings_made"):
            assert after[name][counter] == before[name][counter], f"{name}.{counter} changed during a recorded run"
    assert after[backend]["submits"] > before[backend]["submits"]
    np.testing.assert_array_equal(first, second)


def test_eager_run_repeats_preparation(backend):
    net = gpumnn.load(zoo.build("squeezenet1_1"))
    sess = net.session(backend=backend, record=False, fallback=False)
    x = np.random.default_rng(5).standard_normal((1, 3, 224, 224)).astype(np.float32)
    sess.run({"input": x})
    before = sess.counters[backend]
    sess.run({"input": x})
    after = sess.counters[backend]
    assert after["executions_created"] - before["executions_created"] == len(sess.program.ops)
    assert after["buffers_allocated"] > before["buffers_allocated"]


def test_counters_mean_the_same_on_every_backend(backend):
    """Counted in Backend's template methods, never by a backend itself (base.COUNTERS): from the
    first recorded run on, a run submits each recording once and creates nothing; an eager run
    creates and submits one execution per op, and records nothing."""
    net = gpumnn.load(zoo.build("squeezenet1_1"))
    x = np.random.default_rng(6).standard_normal((1, 3, 224, 224)).astype(np.float32)
    with net.session(backend=backend, fallback=False) as sess:
        created = sess.counters[backend]
        assert created["executions_created"] == len(sess.program.ops)
        assert created["recordings_made"] >= 1 and created["submits"] == 0 and created["buffers_allocated"] >= 1
        for runs in (1, 2):
            sess.run({"input": x})
            assert sess.counters[backend] == dict(created, submits=runs * created["recordings_made"])
    with net.session(backend=backend, record=False, fallback=False) as sess:
        ops = len(sess.program.ops)
        for runs in (1, 2):
            before = sess.counters[backend]
            sess.run({"input": x})
            after = sess.counters[backend]
            delta = {k: after[k] - before[k] for k in after}
            assert delta["executions_created"] == delta["submits"] == ops
            assert delta["recordings_made"] == 0 and delta["buffers_allocated"] >= 1


def test_pool_layout_shares_memory_and_never_overlaps_live_tensors(resnet):
    net, _ = resnet
    sess = net.session()
    summary = sess.memory_summary()["cpu"]
    # resnet18's 24 tensors (its residual adds fused into their convolutions) share a pool under 2/5 of their sum
    assert summary["pool_bytes"] < summary["naive_bytes"] * 0.4
    layout = sess.memory["cpu"]
    lifetimes = sess.placement.lifetimes["cpu"]
    for i, a in enumerate(lifetimes):
        for b in lifetimes[i + 1:]:
            if a.first <= b.last and b.first <= a.last:
                a0, b0 = layout.offsets[a.name], layout.offsets[b.name]
                assert a0 + a.nbytes <= b0 or b0 + b.nbytes <= a0, f"{a.name} and {b.name} overlap while both live"


def test_session_creation_time_is_reported_and_report_lists_every_op(resnet):
    """prepare_seconds is measured, within the creation's own wall time (its speed is bench/'s to
    measure: a bound here fails on a busy machine, not on a slow change)."""
    net, _ = resnet
    started = time.perf_counter()
    sess = net.session()
    wall = time.perf_counter() - started
    assert 0 < sess.prepare_seconds <= wall
    rows = sess.report_rows()
    assert len(rows) == len(sess.program.ops)
    schemes = {r["scheme"] for r in rows if r["op"] == "conv2d"}
    assert "im2col" in schemes and schemes <= {"im2col", "gemm1x1", "depthwise", "winograd", "direct", "tapped"}  # cpu: Winograd where it pays, the stem direct
    text = sess.report()
    assert "memory[cpu]" in text and "conv2d" in text


def test_threads_option_is_honoured(resnet):
    net, x = resnet
    one = net.session(threads=1).run({"input": x})["output"]
    two = net.session(threads=2).run({"input": x})["output"]
    np.testing.assert_allclose(one, two, rtol=1e-4, atol=1e-4)


class PickyBackend(CpuBackend):
    """A backend that cannot run Softmax or Pool2D: the session must place those on the cpu."""

    name = "picky"

    def unsupported_reason(self, op):
        if isinstance(op, (A.Softmax, A.Pool2D)):
            return f"{op.kind} is not implemented on picky"
        return None


def test_ops_a_backend_cannot_run_go_to_the_cpu_with_copies(monkeypatch):
    monkeypatch.setitem(REGISTRY, "picky", ("test_session", "PickyBackend"))
    model = zoo.build("squeezenet1_1")
    x = np.random.default_rng(6).standard_normal((1, 3, 224, 224)).astype(np.float32)
    sess = gpumnn.load(model).session(backend="picky", fallback=False)
    placed = {(r["op"], r["backend"]) for r in sess.report_rows()}
    assert ("pool2d", "cpu") in placed and ("conv2d", "picky") in placed
    assert any(step.kind == "copy" for step in sess.placement.steps)
    assert "cpu fallback: pool2d is not implemented on picky" in sess.report()
    ref = onnxruntime_session(model).run(None, {"input": x})[0]
    assert rel_l2(sess.run({"input": x})["output"], ref) < 1e-3


def test_infer_shapes_gives_concrete_shapes():
    net = gpumnn.load(zoo.build("transformer_encoder"))
    shapes = net.infer_shapes()
    assert shapes["output"] == (1, 128, 256)
    assert all(all(isinstance(d, int) for d in s) for s in shapes.values())


def test_weights_are_hashed_once_per_process_not_per_session(monkeypatch):
    """A second session of a model (or one after it is closed) finds its weights' digests known:
    hashing ResNet-18's weights is most of a new session's time; a weight that dies is forgotten."""
    from gpumnn.runtime import shared as session_shared

    hashed = []
    real = session_shared.hashlib.sha256
    monkeypatch.setattr(session_shared.hashlib, "sha256", lambda data: hashed.append(len(data)) or real(data))
    net = gpumnn.load(zoo.build("squeezenet1_1"))
    x = np.random.default_rng(5).standard_normal((1, 3, 224, 224)).astype(np.float32)
    with net.session(backend="cpu") as first:
        want = first.run({"input": x})["output"]
    assert len(hashed) > 10  # every weight once (and the shape set's folded constants)
    hashed.clear()
    with net.session(backend="cpu") as second:
        np.testing.assert_array_equal(second.run({"input": x})["output"], want)
    assert sum(hashed) < 1024, f"{len(hashed)} arrays ({sum(hashed)} bytes) hashed again"
    weight = np.arange(6, dtype=np.float32)
    key = session_shared.content_key(weight[2:])
    assert session_shared.content_key(weight[2:]) == key and len(session_shared._memo) > 0
    held = len(session_shared._memo)
    del weight
    assert len(session_shared._memo) == held - 1  # forgotten with its owner
