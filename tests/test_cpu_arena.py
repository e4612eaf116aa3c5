"""The cpu backend's scratch arena (``gpumnn.backends.cpu.arena``): the convolutions of one run
state share their scratch and zero-bordered copies, every run reuses them, and two run states
(two threads' runs at once) each have their own. Scratch is made full of NaN here, so that a
kernel reading scratch it did not write in this run shows in its output."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from conftest import onnxruntime_session, rel_l2, require_tool
from op_cases import model_proto
from gpumnn.backends.cpu import arena as cpu_arena, backend as cpu_backend, engines as cpu_engines
from gpumnn.backends.cpu import parallel as cpu_parallel

#: (in channels, out channels, stride, pads t/l/b/r, activation) of a chain of 3x3 convolutions on
#: a 15x15 image: two of one geometry (one arena plane), stride 2 to an odd size, uneven padding
CHAIN = [(16, 16, 1, [1, 1, 1, 1], "silu"), (16, 16, 1, [1, 1, 1, 1], None), (16, 24, 2, [1, 1, 1, 1], "relu"),
         (24, 24, 1, [1, 0, 2, 1], None), (24, 24, 1, [1, 1, 1, 1], "silu"), (24, 24, 1, [1, 1, 1, 1], None)]


def _chain_model(rng):
    nodes, inits, name = [], [], "x"
    for i, (c, oc, stride, pads, activation) in enumerate(CHAIN):
        w = numpy_helper.from_array((rng.standard_normal((oc, c, 3, 3)) * 0.2).astype(np.float32), f"w{i}")
        b = numpy_helper.from_array(rng.standard_normal(oc).astype(np.float32), f"b{i}")
        inits += [w, b]
        conv = f"c{i}"
        nodes.append(helper.make_node("Conv", [name, f"w{i}", f"b{i}"], [conv], kernel_shape=[3, 3],
                                      strides=[stride, stride], pads=pads))
        name = conv
        if activation == "silu":
            nodes += [helper.make_node("Sigmoid", [conv], [f"s{i}"]), helper.make_node("Mul", [conv, f"s{i}"], [f"a{i}"])]
            name = f"a{i}"
        elif activation == "relu":
            nodes.append(helper.make_node("Relu", [conv], [f"a{i}"]))
            name = f"a{i}"
    nodes.append(helper.make_node("Identity", [name], ["y"]))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16, 15, 15])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return model_proto(graph, 13)


def _nan_scratch(monkeypatch):
    monkeypatch.setattr(cpu_backend, "RunStateArenas", lambda: cpu_arena.RunStateArenas(fill=np.nan))


# the kernels that take their scratch from the arena: Winograd (each tile the scheme step ranks),
# the register tile's im2col, BLAS's im2col
SCHEMES = [("winograd", 2, {}), ("winograd", 4, {}), ("im2col", 0, {"PACKED_MIN_DEPTH": 1, "IN_PLACE_MIN_DEPTH": 1}),
           ("im2col", 0, {"PACKED_MIN_DEPTH": 1 << 30, "IN_PLACE_MIN_DEPTH": 1 << 30, "PACKED_ANY_DEPTH_MACS": 0})]


@pytest.mark.parametrize("record", [True, False], ids=["recorded", "eager"])
@pytest.mark.parametrize("scheme", SCHEMES, ids=["winogradF2", "winogradF4", "packed", "blas-im2col"])
def test_convolutions_sharing_scratch_match_onnxruntime_on_every_run(scheme, record, monkeypatch, fresh_rng):
    from gpumnn.scheduler import schemes

    require_tool("regions", cpu_parallel.available()[1])
    family, tile, constants = scheme
    for name, value in constants.items():
        monkeypatch.setattr(cpu_engines, name, value)
    _nan_scratch(monkeypatch)
    model = _chain_model(fresh_rng)
    ref = onnxruntime_session(model)
    with schemes.forced_schemes(conv=(family, tile)):
        sess = gpumnn.load(model).session(backend="cpu", threads=2, record=record)
    report = sess.report()
    assert (("winograd" in report) == (family == "winograd")), report
    for _ in range(3):  # a recorded state's runs reuse its arena, whatever the last run left there
        feed = {"x": fresh_rng.standard_normal((2, 16, 15, 15)).astype(np.float32)}
        got = sess.run(feed)["y"]
        assert np.isfinite(got).all()
        assert rel_l2(got, ref.run(None, feed)[0]) < 1e-4
    arenas = sess.backends["cpu"].arenas
    assert len(arenas) == (1 if record else 0)  # an eager run's arena goes with its pool


def test_ops_share_one_arena_per_run_state(fresh_rng):
    """Two convolutions of one geometry share their zero-bordered plane and scratch; another run
    state has buffers of its own."""
    require_tool("regions", cpu_parallel.available()[1])
    backend = cpu_backend.CpuBackend(threads=2)
    pools = [backend.allocate(1 << 16), backend.allocate(1 << 16)]
    arenas = [backend.arenas.of(pool) for pool in pools]
    assert arenas[0] is backend.arenas.of(pools[0]) and arenas[0] is not arenas[1]
    a = arenas[0].plane(("winograd plane", 16, 15, 15), 4096)
    assert a is arenas[0].plane(("winograd plane", 16, 15, 15), 4096)
    assert a is not arenas[1].plane(("winograd plane", 16, 15, 15), 4096)
    assert a is not arenas[0].plane(("winograd plane", 16, 15, 14), 4096)
    assert not a.any()
    small, large = arenas[0].thread_rows("products", 2, 100), arenas[0].thread_rows("products", 2, 120)
    assert np.shares_memory(small, large)  # one size class
    assert not np.shares_memory(small, arenas[0].thread_rows("panels", 2, 100))  # one op's two buffers never overlap
    for rows in (small, large):  # each thread's row a whole THREAD_ROW_FLOATS apart: no line shared or prefetched
        assert rows.flags.c_contiguous and rows.ctypes.data % (4 * cpu_engines.THREAD_ROW_FLOATS) == 0
        assert rows.strides[0] % (4 * cpu_engines.THREAD_ROW_FLOATS) == 0
    assert backend.arenas.of(backend.constant(np.ones(4, np.float32)).buffer) is None
    del arenas, a, small, large, rows
    pools.pop()
    import gc
    gc.collect()
    assert len(backend.arenas) == 1  # the dropped pool's arena went with it


@pytest.mark.parametrize("family, tile", [("winograd", 4), ("im2col", 0)], ids=["winograd", "im2col"])
def test_two_run_states_at_once_keep_their_own_scratch(family, tile, monkeypatch, fresh_rng):
    """Runs on two threads at once (two run states) each get ONNX Runtime's outputs for their own
    inputs: neither writes the other's scratch."""
    from gpumnn.scheduler import schemes

    require_tool("regions", cpu_parallel.available()[1])
    _nan_scratch(monkeypatch)
    model = _chain_model(fresh_rng)
    ref = onnxruntime_session(model)
    with schemes.forced_schemes(conv=(family, tile)):
        sess = gpumnn.load(model).session(backend="cpu", threads=2, max_concurrent_runs=2)
    feeds = [{"x": fresh_rng.standard_normal((2, 16, 15, 15)).astype(np.float32)} for _ in range(2)]
    expected = [ref.run(None, feed)[0] for feed in feeds]
    errors: list[str] = []
    start = threading.Barrier(2)

    def runs(index: int) -> None:
        start.wait()
        for _ in range(15):
            got = sess.run(feeds[index])["y"]
            if not np.isfinite(got).all() or rel_l2(got, expected[index]) >= 1e-4:
                errors.append(f"thread {index}: {rel_l2(got, expected[index]):.2e}")
    threads = [threading.Thread(target=runs, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert 1 <= sess.run_states <= 2 and len(sess.backends["cpu"].arenas) == sess.run_states


def test_thread_scratch_rows_are_a_thread_row_apart():
    """``compiled._thread_scratch``: each thread's row starts on a multiple of THREAD_ROW_FLOATS and
    fills whole ones, so two threads never write lines the prefetchers pair, and keeps its fill."""
    from gpumnn.backends.cpu import compiled as cpu_compiled

    rows = cpu_compiled._thread_scratch(3, 27, -np.inf)
    step = cpu_engines.THREAD_ROW_FLOATS
    assert rows.shape == (3, step) and rows.ctypes.data % (4 * step) == 0 and rows.strides[0] == 4 * step
    assert np.isneginf(rows).all()
