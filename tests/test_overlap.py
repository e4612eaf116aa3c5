"""Independent branches on different backends run at once: a segment whose backend the next
step does not touch is submitted without waiting (``Backend.submit_async``) and waited for just
before a later step touches that backend (``gpumnn.scheduler.overlap``)."""
from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import gpumnn
from conftest import onnxruntime_session, rel_l2, require_backend
from gpumnn.backends import REGISTRY, backend_class
from gpumnn.scheduler.overlap import Sync, overlapped_ms, synchronisation
from gpumnn.scheduler.placement import Step
from gpumnn.zoo.builder import GraphBuilder

TOLERANCE = 1e-3
SHAPE = (1, 8, 16, 16)
DEVICES = [b for b in REGISTRY if b != "cpu"]
BRANCH_A, BRANCH_B = ("a1", "a2"), ("b1", "b2")


@functools.lru_cache(maxsize=None)
def _model():
    """stem -> (a1 -> a2) and (b1 -> b2) -> Concat: two branches that need nothing of each other,
    in this node order."""
    g = GraphBuilder("two_branches", SHAPE, seed=5)
    stem = g.conv("input", "stem", 8, 8, 3, bias=True)
    a = g.conv(g.conv(stem, "a1", 8, 8, 3, bias=True), "a2", 8, 8, 1, bias=True)
    b = g.conv(g.conv(stem, "b1", 8, 8, 1, bias=True), "b2", 8, 8, 3, bias=True)
    g.node("Concat", [a, b], "join", output="output", axis=1)
    proto = g.finish("output", (1, 16, 16, 16))
    return gpumnn.load(proto), onnxruntime_session(proto)


def _inputs(seed: int) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)}


def _check(sess, seed: int) -> None:
    _, ref = _model()
    x = _inputs(seed)
    assert rel_l2(sess.run(x)["output"], ref.run(None, x)[0]) < TOLERANCE


def _session(hub: str, branch: str, record: bool = True, **options):
    """``hub`` runs the stem, branch b and the join; ``branch`` runs branch a (pinned)."""
    net, _ = _model()
    return net.session(backend=hub, record=record, placement={n: branch for n in BRANCH_A}, **options)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    require_backend(request.param)
    return request.param


@pytest.mark.parametrize("record", [True, False], ids=["recorded", "eager"])
@pytest.mark.parametrize("device_hub", [False, True], ids=["cpu-hub", "device-hub"])
def test_branches_on_two_backends_agree_with_onnxruntime(device, device_hub, record):
    hub, branch = (device, "cpu") if device_hub else ("cpu", device)
    sess = _session(hub, branch, record)
    where = {r["node"]: r["backend"] for r in sess.report_rows()}
    assert {where[n] for n in BRANCH_A} == {branch} and {where[n] for n in (*BRANCH_B, "stem")} == {hub}
    before = sess.counters
    for seed in (1, 2):
        _check(sess, seed)
    after = sess.counters
    asynchronous = {b: after[b]["async_submits"] - before[b]["async_submits"] for b in after}
    if not record:
        assert sess.placement.sync is None and not any(asynchronous.values())
        return
    # branch a's segment is followed by branch b's on the other backend: it is handed over without waiting
    detached = [s.backend for s, d in zip(sess.placement.steps, sess.placement.sync.detached) if d]
    assert branch in detached
    assert asynchronous[branch] == 2 * detached.count(branch)
    for b in after:  # a recorded run allocates nothing, async submits included
        assert after[b]["buffers_allocated"] == before[b]["buffers_allocated"], b


def test_cpu_hub_overlaps_the_device_branch_with_the_cpu_branch(device):
    """With the fork and the join on the CPU, the device's branch runs while the CPU computes the
    other: submitted without waiting, waited for only by the copy of its result."""
    sess = _session("cpu", device)
    steps, sync = sess.placement.steps, sess.placement.sync
    kinds = [(s.kind, s.backend) for s in steps]
    assert kinds == [("run", "cpu"), ("copy", device), ("run", device), ("run", "cpu"), ("copy", "cpu"),
                     ("run", "cpu")]
    assert sync.detached == (False, False, True, False, False, False)
    assert sync.waits[4] == (device,) and sync.final == ()
    assert "1 segment(s) submitted without waiting" in sess.report()


def test_runs_from_several_threads_overlap_correctly(device):
    """Two run states in flight, each with its own submission in flight on the device: every
    result right (a ticket, and the submit lane behind it, belongs to one run)."""
    sess = _session("cpu", device, max_concurrent_runs=2)
    before = sess.counters[device]["async_submits"]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda seed: _check(sess, seed), range(12)))
    assert sess.counters[device]["async_submits"] - before == 12


@pytest.mark.parametrize("record", [True])
def test_a_missing_wait_would_give_stale_results(device, monkeypatch, record):
    """A backend whose ``submit_async`` does nothing until ``wait``: the run is right only
    because it waits before it reads the branch's result, and no read comes before that wait."""
    cls = backend_class(device)
    pending: list = []
    log: list[str] = []

    def deferred_submit(self, recording):
        pending.append(lambda: self._submit(recording))
        return len(pending)

    def deferred_wait(self, ticket):
        log.append("wait")
        pending.pop()()

    original_read = cls.read_into

    def logged_read(self, handle, out):
        log.append("read" if not pending else "read while pending")
        original_read(self, handle, out)

    monkeypatch.setattr(cls, "_submit_async", deferred_submit)
    monkeypatch.setattr(cls, "_wait", deferred_wait)
    monkeypatch.setattr(cls, "read_into", logged_read)
    sess = _session("cpu", device)
    for seed in (3, 4):  # the second run would see the first run's branch result without the wait
        log.clear()
        _check(sess, seed)
        assert "wait" in log and "read while pending" not in log and not pending


# -- the rule itself ---------------------------------------------------------------------------------

def _steps(*spec: str) -> list[Step]:
    """'x': a segment on x; 'x>y': a copy from x to y."""
    return [Step("copy", s[2:], source=s[0]) if ">" in s else Step("run", s, ops=[0]) for s in spec]


def test_synchronisation_waits_where_a_later_step_touches_the_backend():
    sync = synchronisation(_steps("g", "c", "g>c", "c", "g", "c"))
    assert sync.detached == (True, False, False, True, True, False)
    assert sync.waits == ((), (), ("g",), (), (), ("c",))
    assert sync.final == ("g",)
    # a segment followed by a step on its own backend (a copy out of it) waits at once
    assert synchronisation(_steps("g", "g>c", "c")).detached == (False, False, False)


def test_overlapped_time_is_the_longest_path_on_separate_devices_only():
    steps = _steps("g", "c", "g>c", "c")
    sync = synchronisation(steps)
    ms = [5.0, 3.0, 1.0, 2.0]
    assert overlapped_ms(steps, sync, ms, host_devices=()) == 5.0 + 1.0 + 2.0  # c's 3 ms under g's 5
    assert overlapped_ms(steps, sync, ms, host_devices=("g", "c")) == sum(ms)  # one set of cores
    assert overlapped_ms(steps, Sync(((),) * 4, (False,) * 4, ()), ms, ()) == sum(ms)
