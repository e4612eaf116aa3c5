"""Sessions that follow their inputs' shapes (issue 12, MNN's resizeSession): a conv net with a
symbolic width run at several widths in alternation, against ONNX Runtime, on every backend;
the shape-set cache's counters, its bound (evicted sets free their pools and constants), threads
with two shapes, lazy preparation, fixed dims refused by name, and ``gpumnn run --shape``."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from conftest import onnxruntime_session, rel_l2
from op_cases import model_proto
from gpumnn.tools.cli import main

WIDTHS = (5, 12, 20)
MAX_WIDTH = 32


def width_net() -> onnx.ModelProto:
    """x [1, 3, 8, W] -> Conv+Relu, plus a positional table sliced to W (a constant folded at each
    width: shape-dependent), -> Conv -> y [1, 4, 8, W] and its mean over H, z [1, 4, W]."""
    rng = np.random.default_rng(3)
    weights = {"w1": rng.standard_normal((8, 3, 3, 3)) * 0.3, "b1": rng.standard_normal(8) * 0.1,
               "w2": rng.standard_normal((4, 8, 3, 3)) * 0.3, "table": rng.standard_normal((1, 8, 8, MAX_WIDTH)),
               "three": np.array(3), "zero": np.array([0]), "axis3": np.array([3])}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "three"], ["width"]),
        helper.make_node("Unsqueeze", ["width", "zero"], ["end"]),
        helper.make_node("Slice", ["table", "zero", "end", "axis3"], ["position"]),
        helper.make_node("Add", ["r1", "position"], ["a"]),
        helper.make_node("Conv", ["a", "w2"], ["y"], pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMean", ["y"], ["z"], axes=[2], keepdims=0),
    ]
    inits = [numpy_helper.from_array(np.asarray(v, np.int64 if v.dtype.kind == "i" else np.float32), k)
             for k, v in weights.items()]
    graph = helper.make_graph(nodes, "width_net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, "W"]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, "W"])], inits)
    model = model_proto(graph, 17)
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.fixture(scope="module")
def model():
    proto = width_net()
    return gpumnn.load(proto), onnxruntime_session(proto)


def _check(sess, reference, width: int, seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal((1, 3, 8, width)).astype(np.float32)
    got = sess.run({"x": x})
    want = dict(zip(("y", "z"), reference.run(None, {"x": x})))
    for name in ("y", "z"):
        assert got[name].shape == want[name].shape
        assert rel_l2(got[name], want[name]) < 1e-3, (name, width)


@pytest.mark.parametrize("record", [True, False], ids=["recorded", "eager"])
def test_alternating_widths_are_prepared_once_each(backend, model, record):
    net, reference = model
    with net.session(backend=backend, fallback=False, record=record) as sess:  # no input_shapes: the runs say
        assert sess.stats["prepares"] == 0 and sess.shape_sets == []
        for i, width in enumerate(WIDTHS):
            _check(sess, reference, width, seed=i)
        assert (sess.stats["prepares"], sess.stats["cache_hits"]) == (3, 0)
        built = {b: c["programs_built"] for b, c in sess.counters.items()}
        recorded = {b: c["recordings_made"] for b, c in sess.counters.items()}
        for i, width in enumerate(WIDTHS * 2):
            _check(sess, reference, width, seed=10 + i)
        stats = sess.stats
        assert (stats["prepares"], stats["cache_hits"], stats["evictions"], stats["cached"]) == (3, 6, 0, 3)
        # the weights were uploaded for the first width and reused by the others
        assert stats["constant_reuses"] >= 2 * 3
        assert {b: c["programs_built"] for b, c in sess.counters.items()} == built  # nothing compiled again
        if record:  # a cache hit records nothing either
            assert {b: c["recordings_made"] for b, c in sess.counters.items()} == recorded
        assert sess.shape_sets == [{"x": (1, 3, 8, w)} for w in WIDTHS]


def test_the_cache_bound_evicts_and_frees_pools_and_constants(backend, model):
    net, reference = model
    with net.session(backend=backend, fallback=False, shape_cache=2) as sess:
        live: dict[int, object] = {}  # pool buffers allocated and not yet released, by id
        for b in sess.backends.values():
            allocate, release = b.allocate, b.release

            def spy_allocate(nbytes, allocate=allocate):
                buf = allocate(nbytes)
                live[id(buf)] = buf
                return buf

            def spy_release(buf, release=release):
                live.pop(id(buf), None)
                release(buf)
            b.allocate, b.release = spy_allocate, spy_release
        for i, width in enumerate(WIDTHS * 2):
            _check(sess, reference, width, seed=20 + i)
        stats = sess.stats
        assert (stats["prepares"], stats["cache_hits"], stats["evictions"], stats["cached"]) == (6, 0, 4, 2)
        assert sess.shape_sets == [{"x": (1, 3, 8, w)} for w in WIDTHS[1:]]
        kept = [sess.shape_set(shapes) for shapes in sess.shape_sets]
        # the pools of the kept sets' run states, and nothing else, are still allocated
        assert len(live) == sum(len(s.memory) * s.run_states for s in kept)
        # weights stay (shared), the table slices of the evicted widths went with their sets
        distinct = {(b, id(h.buffer), h.offset) for s in kept for (b, _), h in s._constants.items()}
        assert sess._parts.constants.held == len(distinct)
        _check(sess, reference, WIDTHS[2], seed=30)
        assert sess.stats["cache_hits"] == 1


def test_threads_with_two_shapes_get_their_own_answers(backend, model):
    net, reference = model
    widths = WIDTHS[:2]
    inputs = [np.random.default_rng(40 + i).standard_normal((1, 3, 8, widths[i % 2])).astype(np.float32)
              for i in range(8)]
    expected = [reference.run(None, {"x": x})[0] for x in inputs]
    # shape_cache=1: every change of shape evicts the other set, often while a run still uses it
    for shape_cache in (1, 4):
        with net.session(backend=backend, fallback=False, shape_cache=shape_cache, max_concurrent_runs=4) as sess:
            barrier = threading.Barrier(4)

            def worker(start: int) -> list[float]:
                barrier.wait()
                return [rel_l2(sess.run({"x": inputs[(start + k) % 8]})["y"], expected[(start + k) % 8])
                        for k in range(6)]

            with ThreadPoolExecutor(4) as pool:
                errors = [e for result in pool.map(worker, range(4)) for e in result]
            assert max(errors) < 1e-3, (shape_cache, errors)
            assert sess.stats["cached"] <= shape_cache
            if shape_cache == 4:
                assert sess.stats["prepares"] == 2


def test_input_shapes_prepare_at_creation_and_runs_still_follow(model):
    net, reference = model
    with net.session(input_shapes={"x": (1, 3, 8, 12)}) as sess:
        assert sess.stats["prepares"] == 1 and sess.input_shapes == {"x": (1, 3, 8, 12)}
        _check(sess, reference, 5, seed=50)
        assert sess.stats["prepares"] == 2 and sess.input_shapes == {"x": (1, 3, 8, 5)}
        assert sess.output_shapes == {"y": (1, 4, 8, 5), "z": (1, 4, 5)}
        # introspection describes the most recent set, or the one asked for
        assert "input shapes x [1, 3, 8, 5]" in sess.report()
        assert "input shapes x [1, 3, 8, 12]" in sess.report({"x": (1, 3, 8, 12)})
        assert sess.report_rows({"x": (1, 3, 8, 12)})[-1]["output"][-1] == 12
        assert sess.stats["prepares"] == 2  # both were kept


def test_fixed_dims_and_rank_are_refused_by_name(model):
    net, _ = model
    sess = net.session()
    with pytest.raises(gpumnn.InputError, match=r"dimension 2 is fixed at 8 by the model, got 9"):
        sess.run({"x": np.zeros((1, 3, 9, 5), np.float32)})
    with pytest.raises(gpumnn.InputError, match=r"rank 3, the model expects rank 4"):
        sess.run({"x": np.zeros((3, 8, 5), np.float32)})
    with pytest.raises(gpumnn.InputError, match=r"dimension 1 is fixed at 3"):
        net.session(input_shapes={"x": (1, 4, 8, 5)})
    assert sess.stats["prepares"] == 0


def test_static_models_prepare_at_creation():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    proto = model_proto(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "static", [x], [y]))
    with gpumnn.load(proto).session() as sess:
        assert sess.stats["prepares"] == 1 and sess.input_shapes == {"x": (2, 3)}
        with pytest.raises(gpumnn.InputError, match=r"\[2, 4\].*dimension 1 is fixed at 3"):
            sess.run({"x": np.zeros((2, 4), np.float32)})


def test_shape_cache_zero_fixes_the_first_shapes(model):
    net, reference = model
    with pytest.raises(ValueError, match="shape_cache"):
        net.session(shape_cache=-1)
    with net.session(shape_cache=0) as sess:
        _check(sess, reference, 12, seed=60)  # the first run fixes the width
        with pytest.raises(gpumnn.InputError, match=r"shape_cache=0.*fixes"):
            sess.run({"x": np.zeros((1, 3, 8, 5), np.float32)})
        _check(sess, reference, 12, seed=61)
        assert (sess.stats["prepares"], sess.stats["cache_hits"]) == (1, 1)


def test_cli_shape_option(tmp_path, capsys, model):
    path = tmp_path / "width.onnx"
    onnx.save(width_net(), path)
    assert main(["run", str(path), "--shape", "x=1,3,8,11"]) == 0
    assert "y: shape [1, 4, 8, 11]" in capsys.readouterr().out
    assert main(["run", str(path), "--shape", "1", "3", "8", "7", "--report"]) == 0  # the first input's dims alone
    out = capsys.readouterr().out
    assert "z: shape [1, 4, 7]" in out and "input shapes x [1, 3, 8, 7]" in out
    assert main(["run", str(path)]) == 1
    assert "gpumnn run MODEL --shape x=1,3,8,N" in capsys.readouterr().err
    x = np.random.default_rng(70).standard_normal((1, 3, 8, 9)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(path), "--input", str(tmp_path / "x.npy")]) == 0  # the array says the width
    assert "y: shape [1, 4, 8, 9]" in capsys.readouterr().out


def test_a_scalar_input_keeps_its_shape():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    proto = model_proto(helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "scalar", [x], [y]))
    with gpumnn.load(proto).session() as sess:
        for value in (1.5, -2.0):
            got = sess.run({"x": np.array(value, np.float32)})["y"]
            assert got.shape == () and got == -value
        assert (sess.stats["prepares"], sess.stats["cache_hits"]) == (1, 2)


def test_the_shape_set_cache_closes_an_evicted_set_once_and_hands_a_leased_one_to_close():
    """An evicted set still leased is closed by its last lease, exactly once; a session closing
    meanwhile gets it back too (to wait for its run), and then the lease no longer closes it."""
    import threading

    from gpumnn.runtime.shape_set_cache import ShapeSetCache

    closed = []
    cache = ShapeSetCache(1, lambda key: key, closed.append, threading.RLock())
    with cache.lease("a"):
        with cache.lease("b"):  # evicts "a", which is still leased
            assert closed == []
        assert closed == []
    assert closed == ["a"]
    with cache.lease("c"):  # evicts idle "b" at once
        assert closed == ["a", "b"]
    with cache.lease("d"):
        with cache.lease("e"):  # "d" evicted while leased
            pass
        assert sorted(cache.close()) == ["d", "e"]  # the closer gets the draining set as well
    assert closed == ["a", "b", "c"]  # "d" was not closed by its lease: the closer does it


def test_a_fixed_session_refuses_other_shapes_even_from_its_first_runs():
    import threading

    from gpumnn.runtime.shape_set_cache import ShapeSetCache

    cache = ShapeSetCache(1, lambda key: key, lambda value: None, threading.RLock(),
                          fixed=lambda key, held: ValueError(f"{key} is not {held}"))
    with cache.lease("a"):
        with pytest.raises(ValueError, match="b is not a"):
            with cache.lease("b"):
                pass
