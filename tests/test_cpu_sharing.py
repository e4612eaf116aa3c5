"""A cpu recording on several threads holds two ways to run its ops (shared between the regions'
threads as planned, or each on the calling thread) and takes the faster, by its runs' own times
(``cpu_sharing``): the policy on a fake clock, and both ways against ONNX Runtime."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from gpumnn.backends.cpu import jit as cpu_jit, sharing
from gpumnn.backends.cpu.sharing import BURST, EXPLORE_MAX_SECONDS, EXPLORE_RUNS, EXPLORE_SECONDS, RECENT, SharingChoice

from conftest import require_tool
from op_cases import model_proto


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _runs(choice: SharingChoice, clock: Clock, times: dict[bool, float], count: int) -> list[bool]:
    """``count`` runs, each way taking its time in ``times``; the ways taken."""
    ways = []
    for _ in range(count):
        way = choice.shared()
        clock.now += times[way]
        choice.note(way, times[way])
        ways.append(way)
    return ways


def test_the_shared_way_runs_first_and_a_faster_burst_takes_over():
    clock = Clock()
    choice = SharingChoice(clock)
    ways = _runs(choice, clock, {True: 2e-3, False: 1e-3}, EXPLORE_RUNS)
    assert all(ways)  # the planned way until the first burst
    ways = _runs(choice, clock, {True: 2e-3, False: 1e-3}, BURST + 5)
    assert ways[:BURST] == [False] * BURST and choice.way is False and not any(ways[BURST:])
    assert choice.means == pytest.approx({"one thread": 1e-3, "shared": 2e-3})
    _runs(choice, clock, {True: 2e-3, False: 1e-3}, RECENT)  # its trial passed: the shared way is the other
    assert choice.way is False and choice.means == pytest.approx({"one thread": 1e-3, "shared": 2e-3})


def test_a_slower_burst_leaves_the_running_way_and_bursts_wait_for_time_and_runs():
    clock = Clock()
    choice = SharingChoice(clock)
    times = {True: 1e-3, False: 3e-3}
    _runs(choice, clock, times, EXPLORE_RUNS + BURST)
    assert choice.way is True
    ways = _runs(choice, clock, times, 2 * EXPLORE_RUNS)  # well under EXPLORE_SECONDS: no burst
    assert all(ways)
    clock.now += 2 * EXPLORE_SECONDS  # the first burst lost: the next waits twice as long
    ways = _runs(choice, clock, times, BURST + 1)
    assert ways == [False] * BURST + [True] and choice.way is True


def test_a_way_that_stalls_now_and_then_loses_on_its_mean():
    """Shared runs fast in most runs but stalled in one of four (a region waiting for a thread
    another process displaced): its median beats one thread, its mean does not."""
    clock = Clock()
    choice = SharingChoice(clock)
    stalls = iter(([4e-3] + [0.5e-3] * 3) * 100)

    def run(count):
        ways = []
        for _ in range(count):
            way = choice.shared()
            seconds = next(stalls) if way else 0.7e-3
            clock.now += seconds
            choice.note(way, seconds)
            ways.append(way)
        return ways

    run(EXPLORE_RUNS + BURST)
    assert choice.way is False  # the burst of one thread beat the stalling shared runs
    assert choice.means["one thread"] < choice.means["shared"]


def test_losing_bursts_come_less_often_and_a_way_that_fails_its_trial_goes_back():
    clock = Clock()
    choice = SharingChoice(clock)
    times = {True: 1e-3, False: 3e-3}
    _runs(choice, clock, times, EXPLORE_RUNS + BURST)  # the first burst loses
    waits = []
    for _ in range(5):  # each losing burst doubles the wait for the next, up to the cap
        start = clock.now
        ways = _runs(choice, clock, times, 1)
        while ways[-1]:
            ways = _runs(choice, clock, times, 1)
        waits.append(clock.now - start)
        _runs(choice, clock, times, BURST - 1)
    assert waits[0] >= 2 * EXPLORE_SECONDS and waits[1] >= 4 * EXPLORE_SECONDS
    assert waits[3] < 2 * EXPLORE_MAX_SECONDS and waits[4] < 2 * EXPLORE_MAX_SECONDS
    # a burst that wins by luck puts its way on trial: RECENT runs that do not bear it out take it back
    _runs(choice, clock, times, EXPLORE_RUNS)
    clock.now += EXPLORE_MAX_SECONDS
    for i in range(BURST):
        way = choice.shared()
        assert way is False
        choice.note(way, 0.2e-3 if i else 5e-3)
    assert choice.way is False
    _runs(choice, clock, times, RECENT)
    assert choice.way is True and _runs(choice, clock, times, EXPLORE_RUNS) == [True] * EXPLORE_RUNS
    assert choice.means["shared"] == pytest.approx(1e-3) and choice.means["one thread"] > 2e-3


def test_the_first_run_of_a_burst_is_not_counted():
    """A one-thread run after shared ones would carry the change's cost: only the runs after it count."""
    clock = Clock()
    choice = SharingChoice(clock)
    _runs(choice, clock, {True: 1e-3, False: 1e-3}, EXPLORE_RUNS)
    for i in range(BURST):
        way = choice.shared()
        assert way is False
        choice.note(way, 1.0 if i == 0 else 0.5e-3)  # a slow first run would hide the gain
    assert choice.way is False


def _model(rng):
    """A 1x1 convolution and a depthwise convolution large enough to share, and a residual sum."""
    c, hw = 64, 28
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array((rng.standard_normal((c, c, 1, 1)) * 0.1).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((c, 1, 3, 3)) * 0.3).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["d"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["d", "x"], ["y"])]
    return model_proto(helper.make_graph(nodes, "shared", [x], [y], inits), 13)


def test_both_ways_match_onnxruntime_and_one_thread_sessions_have_one(fresh_rng):
    require_tool("numba", cpu_jit.MISSING)
    import onnxruntime as ort
    model = _model(fresh_rng)
    x = fresh_rng.standard_normal((1, 64, 28, 28)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    net = gpumnn.load(model)
    with net.session(backend="cpu", threads=2) as sess:
        if sess.backends["cpu"].regions < 2:
            pytest.skip("the regions run on one thread here: nothing to choose")
        (recording,) = sess.shape_set().first_state.recordings.values()
        assert recording.solo is not None and recording.choice is not None
        for way in (True, False, True):
            recording.choice.way = way
            got = sess.run({"x": x})["y"]
            assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
            assert recording.choice._previous is way  # the run took the way asked for
    with net.session(backend="cpu", threads=1) as sess:
        (recording,) = sess.shape_set().first_state.recordings.values()
        assert recording.solo is None and recording.choice is None
        got = sess.run({"x": x})["y"]
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


def test_a_recording_of_one_op_keeps_the_planned_way():
    """Calibration and ``gpumnn plan`` record and time single ops as planned."""
    require_tool("numba", cpu_jit.MISSING)
    recording = sharing.Recording([lambda: None], None)
    assert recording.next_shared() and recording.choice is None
