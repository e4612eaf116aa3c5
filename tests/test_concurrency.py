"""Several threads calling one session, sessions used from threads other than their creator's:
every result is compared with ONNX Runtime on fresh random inputs, on every backend."""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import gpumnn
from conftest import onnxruntime_session, rel_l2
from gpumnn.zoo.builder import GraphBuilder

THREADS, RUNS = 4, 6
SHAPE = (1, 3, 32, 32)


def small_cnn() -> "gpumnn.Net":
    """Conv-BN-ReLU, a two-branch block joined by Concat, pooling, Gemm and Softmax: enough
    tensors in the pool that two runs sharing it would overwrite each other."""
    g = GraphBuilder("threads_cnn", SHAPE, seed=11)
    y = g.conv_bn_act("input", "stem", 3, 16, 3, stride=1)
    y = g.max_pool(y, "pool1", 2, 2)
    a = g.conv_bn_act(y, "branch_a", 16, 16, 1)
    b = g.conv_bn_act(y, "branch_b", 16, 16, 3)
    y = g.node("Concat", [a, b], "join", axis=1)
    y = g.conv_bn_act(y, "mix", 32, 24, 3, stride=2)
    y = g.global_avg_pool(y, "gap")
    y = g.flatten(y, "flatten")
    y = g.gemm(y, "fc", 24, 10)
    g.node("Softmax", [y], "softmax", output="output", axis=1)
    return g.finish("output", (1, 10))


@pytest.fixture(scope="module")
def model():
    proto = small_cnn()
    return gpumnn.load(proto), onnxruntime_session(proto)


def _check_runs(sess, reference, seed: int, runs: int) -> list[float]:
    """``runs`` runs on fresh inputs; the relative L2 error of each against ONNX Runtime."""
    rng = np.random.default_rng(seed)
    errors = []
    for _ in range(runs):
        x = rng.standard_normal(SHAPE).astype(np.float32)
        got = sess.run({"input": x})["output"]
        errors.append(rel_l2(got, reference.run(None, {"input": x})[0]))
    return errors


@pytest.mark.parametrize("record", [True, False], ids=["recorded", "eager"])
def test_threads_share_one_session(backend, model, record):
    net, reference = model
    # as many overlapping runs as the backend allows (its default may be fewer, where overlap does not pay)
    with net.session(backend=backend, record=record, fallback=False, max_concurrent_runs=THREADS) as sess:
        barrier = threading.Barrier(THREADS)

        def worker(seed: int) -> list[float]:
            barrier.wait()  # start together, so runs really overlap
            return _check_runs(sess, reference, seed, RUNS)

        with ThreadPoolExecutor(THREADS) as pool:
            errors = [e for errs in pool.map(worker, range(THREADS)) for e in errs]
        assert len(errors) == THREADS * RUNS
        wrong = [e for e in errors if e > 1e-4]
        assert not wrong, f"{len(wrong)} of {len(errors)} concurrent runs were wrong on {backend}: {wrong[:4]}"
        if record:  # recorded states are kept for later runs; eager ones are freed after each run
            assert 1 <= sess.run_states <= sess.max_concurrent_runs


@pytest.mark.parametrize("record", [True, False], ids=["recorded", "eager"])
def test_vulkan_staging_path_under_threads(model, record):
    """Discrete GPUs write and read through staging buffers: each submit lane has its own."""
    from conftest import require_backend
    require_backend("vulkan")
    net, reference = model
    with net.session(backend="vulkan", record=record, fallback=False, force_staging=True,
                     max_concurrent_runs=THREADS) as sess:
        assert sess.max_concurrent_runs == 2
        with ThreadPoolExecutor(THREADS) as pool:
            errors = [e for errs in pool.map(lambda seed: _check_runs(sess, reference, seed, 3), range(THREADS))
                      for e in errs]
    assert max(errors) < 1e-4


def test_sessions_on_their_own_threads(backend, model):
    """Three sessions of one backend, each created, run and closed on its own thread, at once."""
    net, reference = model
    barrier = threading.Barrier(3)

    def life(seed: int) -> list[float]:
        sess = net.session(backend=backend, fallback=False)
        try:
            barrier.wait()
            return _check_runs(sess, reference, seed, 4)
        finally:
            sess.close()

    with ThreadPoolExecutor(3) as pool:
        errors = [e for errs in pool.map(life, range(100, 103)) for e in errs]
    assert max(errors) < 1e-4


def test_session_moves_between_threads(backend, model):
    """Created on one thread, run on others (one after another), closed on yet another: the
    OpenGL context follows the caller instead of staying bound to its creator."""
    net, reference = model
    holder = {}
    creator = threading.Thread(target=lambda: holder.setdefault("sess", net.session(backend=backend, fallback=False)))
    creator.start()
    creator.join()
    sess = holder["sess"]
    for seed in range(3):
        with ThreadPoolExecutor(1) as pool:
            assert max(pool.submit(_check_runs, sess, reference, 200 + seed, 2).result()) < 1e-4
    assert max(_check_runs(sess, reference, 300, 1)) < 1e-4  # and on this thread too
    closer = threading.Thread(target=sess.close)
    closer.start()
    closer.join()
    with pytest.raises(gpumnn.SessionClosedError):
        sess.run({"input": np.zeros(SHAPE, np.float32)})


def test_close_waits_for_runs_in_flight(model):
    """close() called while a run is inside the session returns only after that run has finished:
    the run is held until close() has been entered and given time to return, and the order in
    which the two finish is recorded."""
    net, reference = model
    sess = net.session(backend="cpu")
    started, release, close_entered = threading.Event(), threading.Event(), threading.Event()
    finished: list[str] = []
    shape_set = sess.shape_set()
    original = shape_set._run

    def slow_run(*args):
        started.set()
        release.wait(5)
        try:
            return original(*args)
        finally:
            finished.append("run")

    def close():
        close_entered.set()
        sess.close()
        finished.append("close")

    shape_set._run = slow_run
    x = np.random.default_rng(7).standard_normal(SHAPE).astype(np.float32)
    with ThreadPoolExecutor(2) as pool:
        result = pool.submit(sess.run, {"input": x})
        assert started.wait(5)
        closing = pool.submit(close)
        assert close_entered.wait(5)
        time.sleep(0.3)  # a close that does not wait returns in this time, before the run is let go
        release.set()
        closing.result(5)
        assert rel_l2(result.result(5)["output"], reference.run(None, {"input": x})[0]) < 1e-4
    assert finished == ["run", "close"], f"close() returned before the run in flight finished: {finished}"
    sess.close()  # idempotent
    with pytest.raises(gpumnn.SessionClosedError):
        sess.run({"input": x})


def test_max_concurrent_runs_is_bounded(model):
    net, _ = model
    with pytest.raises(ValueError, match="at least 1"):
        net.session(backend="cpu", max_concurrent_runs=0)
    with net.session(backend="cpu", max_concurrent_runs=1) as sess:
        assert sess.max_concurrent_runs == 1
    with net.session(backend="cpu", max_concurrent_runs=8) as sess:
        assert sess.max_concurrent_runs == 2  # the cpu backend's safe bound
    with net.session(backend="cpu", threads=1) as sess:  # one run leaves cores idle: overlap by default
        assert sess.max_concurrent_runs == min(2, os.cpu_count() or 1)
