"""Session.run's fast path: inputs that are already what the full checks would make of them skip
those checks, every other input still takes them (converted or refused with InputError), and
the locks it takes instead (run slots, run-state lending) still bound and exclude."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from onnx import TensorProto, helper

import gpumnn
from gpumnn.errors import InputError, SessionClosedError
from gpumnn.runtime.run_states import RunSlots, RunStatePool
from gpumnn.runtime.session import Session


def relu_net() -> gpumnn.Net:
    """Relu on an [N, 8] float input (N symbolic, 8 static)."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])])
    return gpumnn.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))


@pytest.fixture
def counted_checks(monkeypatch):
    """The number of runs that went through the full input checks."""
    calls = [0]
    full = Session._check_inputs

    def counting(self, inputs):
        calls[0] += 1
        return full(self, inputs)
    monkeypatch.setattr(Session, "_check_inputs", counting)
    return calls


@pytest.mark.parametrize("record", [True, False])
def test_ready_inputs_skip_the_full_checks_and_others_are_converted(counted_checks, record):
    x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    with relu_net().session(backend="cpu", record=record) as sess:
        ready = np.ascontiguousarray(x[:, :8])
        np.testing.assert_array_equal(sess.run({"x": ready})["y"], np.maximum(ready, 0))
        assert counted_checks[0] == 0
        for given in (x[:, ::2], x.reshape(4, 8)[::2], np.asfortranarray(x[:, 8:])):  # strided, rows apart, Fortran
            np.testing.assert_array_equal(sess.run({"x": given})["y"], np.maximum(given, 0))
        assert counted_checks[0] == 3
        if record:  # both paths key the shape set alike: one prepared, found again by every run
            assert sess.stats["prepares"] == 1 and sess.stats["cache_hits"] == 3


def gather_net() -> gpumnn.Net:
    """Rows of a constant table picked by an int64 [1, N] input (a byte model's embedding)."""
    table = helper.make_tensor("table", TensorProto.FLOAT, [4, 2], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"])], "gather",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "N"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "N", 2])], [table])
    return gpumnn.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))


def test_int64_inputs_are_converted_on_the_fast_path_and_out_of_range_values_refused(counted_checks):
    table = np.arange(8, dtype=np.float32).reshape(4, 2)
    with gather_net().session(backend="cpu") as sess:
        for ids in (np.array([[3, 0, 2]], np.int64), np.array([[1, 1]], np.int64), np.array([[3, 0, 2]], np.int64)):
            np.testing.assert_array_equal(sess.run({"ids": ids})["y"], table[ids])
        assert counted_checks[0] == 0
        assert sess.stats["prepares"] == 2 and sess.stats["cache_hits"] == 1
        with pytest.raises(InputError, match="values must lie in"):
            sess.run({"ids": np.array([[1, 2 ** 40]], np.int64)})
        ids = np.array([[3, 0, 2, 1]], np.int64)[:, ::2]  # strided: the full checks convert it
        np.testing.assert_array_equal(sess.run({"ids": ids})["y"], table[ids])
        assert counted_checks[0] == 1


def test_float64_inputs_are_converted_on_the_fast_path(counted_checks):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu64",
                              [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["N", 8])])
    net = gpumnn.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    x = np.random.default_rng(2).standard_normal((3, 8))
    with net.session(backend="cpu") as sess:
        for _ in range(2):
            y = sess.run({"x": x})["y"]
            assert y.dtype == np.float64
            np.testing.assert_array_equal(y, np.maximum(x.astype(np.float32), 0))
        assert counted_checks[0] == 0


@pytest.mark.parametrize("feed, message", [
    ({"x": np.zeros((2, 9), np.float32)}, "dimension 1 is fixed at 8"),
    ({"x": np.zeros((2, 1, 8), np.float32)}, "has rank 3"),
    ({"x": np.zeros((2, 8), np.int32)}, "has dtype int32"),
    ({"x": np.zeros((2, 8), np.float64)}, "has dtype float64"),
    ({"z": np.zeros((2, 8), np.float32)}, "unknown: \\['z'\\]"),
    ({"x": np.zeros((2, 8), np.float32), "z": np.zeros(1, np.float32)}, "unknown"),
    ({}, "missing: \\['x'\\]"),
])
def test_wrong_inputs_still_raise_input_error(counted_checks, feed, message):
    with relu_net().session(backend="cpu") as sess:
        sess.run({"x": np.ones((2, 8), np.float32)})
        with pytest.raises(InputError, match=message):
            sess.run(feed)
        assert counted_checks[0] == 1


def test_shapes_alternating_on_the_fast_path_reuse_their_shape_sets(counted_checks):
    with relu_net().session(backend="cpu") as sess:
        for batch in (1, 3, 1, 3, 1):
            x = np.full((batch, 8), -1.0 + batch, np.float32)
            np.testing.assert_array_equal(sess.run({"x": x})["y"], np.maximum(x, 0))
        assert counted_checks[0] == 0
        assert sess.stats["prepares"] == 2 and sess.stats["cache_hits"] == 3


def test_outputs_are_the_callers_own_arrays():
    with relu_net().session(backend="cpu") as sess:
        first = sess.run({"x": np.ones((1, 8), np.float32)})["y"]
        sess.run({"x": np.full((1, 8), 5.0, np.float32)})
        np.testing.assert_array_equal(first, np.ones((1, 8), np.float32))


def test_run_slots_bound_holders_and_let_every_waiter_through():
    slots, inside, most, lock = RunSlots(2), [0], [0], threading.Lock()

    def hold():
        with slots:
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.02)
            with lock:
                inside[0] -= 1
    threads = [threading.Thread(target=hold) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not any(thread.is_alive() for thread in threads)
    assert most[0] == 2 and inside[0] == 0


def test_run_state_pool_lends_each_state_to_one_borrower_and_close_stops_waiters():
    pool: RunStatePool[object] = RunStatePool(1, first=object())
    state = pool.take(object)
    got: list = []

    def borrow():
        try:
            got.append(pool.take(object))
        except SessionClosedError as exc:
            got.append(exc)
    waiter = threading.Thread(target=borrow)
    waiter.start()
    time.sleep(0.05)
    assert got == []  # the only state is lent: the second borrower waits
    pool.give_back(state)
    waiter.join(5)
    assert got == [state]
    pool.give_back(state)

    pool.take(object)
    waiter = threading.Thread(target=borrow)
    waiter.start()
    time.sleep(0.05)
    closer = threading.Thread(target=pool.close)
    closer.start()
    waiter.join(5)
    assert isinstance(got[-1], SessionClosedError)
    assert closer.is_alive()  # close waits for the lent state
    pool.give_back(state)
    closer.join(5)
    assert not closer.is_alive()
