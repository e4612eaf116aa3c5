"""If, Loop and Scan on every backend against ONNX Runtime (relative L2 < 1e-4).

gpumnn resolves control flow at session creation (gpumnn/geometry/lowerings/control_flow.py): an If whose
condition folds becomes its chosen branch, a run-time condition computes both branches and
selects, Loop and Scan are unrolled. The graphs here read outer tensors from their subgraphs by
name, as exported models do, so the importer and the optimiser's passes are checked to keep them.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from conftest import onnxruntime_session, rel_l2
from op_cases import model_proto
from gpumnn.atomic import Select

TOLERANCE = 1e-4
F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "control_flow", inputs, outputs, list(initializers))
    return model_proto(graph, opset)


def _branch(name, nodes, outputs, initializers=()):
    return helper.make_graph(nodes, name, [], outputs, list(initializers))


def _info(name, elem=F, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _check(model, feed_sets, backend):
    """Run one session on every feed set in turn (fresh inputs each) against ONNX Runtime."""
    reference = onnxruntime_session(model)
    names = [o.name for o in reference.get_outputs()]
    shapes = {k: v.shape for k, v in feed_sets[0].items()}
    with gpumnn.load(model).session(backend=backend, input_shapes=shapes, fallback=False) as sess:
        for feeds in feed_sets:
            want = dict(zip(names, reference.run(None, feeds)))
            got = sess.run(feeds)
            assert set(got) == set(want)
            for name, value in want.items():
                assert got[name].shape == value.shape, f"{name}: shape {got[name].shape} != {value.shape}"
                err = rel_l2(got[name].astype(np.float64), value.astype(np.float64))
                assert err < TOLERANCE, f"{name}: relative L2 error {err:.2e} on {backend}"


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _if_model(cond_nodes, cond_inputs=(), shape=(2, 3), initializers=(), width=3):
    """Y = If(cond) then Relu(X) * W else X - T, where W (an initializer) and T = Sigmoid(X) (an
    Identity's output, read by nothing but the branch) are outer tensors the branches read."""
    then_branch = _branch("then", [helper.make_node("Relu", ["X"], ["r"]), helper.make_node("Mul", ["r", "W"], ["ty"])],
                          [_info("ty")])
    else_branch = _branch("else", [helper.make_node("Sub", ["X", "T"], ["ey"])], [_info("ey")])
    nodes = [helper.make_node("Sigmoid", ["X"], ["s"]), helper.make_node("Identity", ["s"], ["T"]), *cond_nodes,
             helper.make_node("If", ["cond"], ["Y"], then_branch=then_branch, else_branch=else_branch)]
    w = _const("W", _x(width, seed=9))
    return _model(nodes, [_info("X", F, list(shape)), *cond_inputs], [_info("Y")], [w, *initializers])


@pytest.mark.parametrize("value", [True, False])
def test_if_with_a_constant_condition(backend, value):
    model = _if_model([], initializers=[_const("cond", np.array(value))])
    _check(model, [{"X": _x(2, 3, seed=s)} for s in (1, 2)], backend)


@pytest.mark.parametrize("width", [3, 4])
def test_if_with_a_condition_computed_from_a_shape(backend, width):
    """cond = Shape(X)[1] == 4, which folds at session creation: only the chosen branch runs."""
    cond_nodes = [helper.make_node("Shape", ["X"], ["shape"]),
                  helper.make_node("Gather", ["shape", "one"], ["width"], axis=0),
                  helper.make_node("Equal", ["width", "four"], ["cond"])]
    model = _if_model(cond_nodes, shape=(2, "w"), width=width,
                      initializers=[_const("one", np.array(1, np.int64)), _const("four", np.array(4, np.int64))])
    sess = gpumnn.load(model).session(backend=backend, input_shapes={"X": (2, width)}, fallback=False)
    assert not any(isinstance(op, Select) for op in sess.program.ops), "a folded condition selects nothing at run time"
    sess.close()
    _check(model, [{"X": _x(2, width, seed=s)} for s in (1, 2)], backend)


def test_if_with_a_run_time_condition(backend):
    """One session, the condition an input: both truth values in turn, each with fresh data."""
    model = _if_model([], cond_inputs=[_info("cond", B, [])])
    feeds = [{"X": _x(2, 3, seed=s), "cond": np.array(c)} for s, c in ((1, True), (2, False), (3, True), (4, False))]
    _check(model, feeds, backend)


def test_if_branches_read_outer_tensors_that_fold(backend):
    """The branch reads an outer tensor the optimiser folds (Shape -> Cast) and one that only
    the branch keeps alive (Neg of the input): folding and dead-code removal must keep both."""
    then_branch = _branch("then", [helper.make_node("Add", ["neg", "width_f"], ["ty"])], [_info("ty")])
    else_branch = _branch("else", [helper.make_node("Mul", ["neg", "X"], ["ey"])], [_info("ey")])
    nodes = [helper.make_node("Neg", ["X"], ["neg"]),
             helper.make_node("Shape", ["C"], ["cshape"]), helper.make_node("Cast", ["cshape"], ["width_f"], to=F),
             helper.make_node("If", ["cond"], ["Y"], then_branch=then_branch, else_branch=else_branch)]
    model = _model(nodes, [_info("X", F, [2, 3]), _info("cond", B, [])], [_info("Y")],
                   [_const("C", np.zeros((3,), np.float32))])
    net = gpumnn.load(model)
    assert [n.op_type for n in net.graph.nodes] == ["Neg", "If"]
    _check(model, [{"X": _x(2, 3, seed=s), "cond": np.array(c)} for s, c in ((1, True), (2, False))], backend)


def test_nested_if(backend):
    """An If inside a run-time If's branch, its condition from a shape, reading the outer
    branch's own tensor and the model's input."""
    inner_then = _branch("inner_then", [helper.make_node("Add", ["b", "X"], ["it"])], [_info("it")])
    inner_else = _branch("inner_else", [helper.make_node("Sub", ["b", "X"], ["ie"])], [_info("ie")])
    outer_then = _branch("outer_then", [
        helper.make_node("Tanh", ["X"], ["b"]),
        helper.make_node("Size", ["X"], ["size"]),
        helper.make_node("Greater", ["size", "five"], ["inner_cond"]),
        helper.make_node("If", ["inner_cond"], ["ot"], then_branch=inner_then, else_branch=inner_else)],
        [_info("ot")], [_const("five", np.array(5, np.int64))])
    outer_else = _branch("outer_else", [helper.make_node("Abs", ["X"], ["oe"])], [_info("oe")])
    nodes = [helper.make_node("If", ["cond"], ["Y"], then_branch=outer_then, else_branch=outer_else)]
    model = _model(nodes, [_info("X", F, [2, 3]), _info("cond", B, [1])], [_info("Y")])
    _check(model, [{"X": _x(2, 3, seed=s), "cond": np.array([c])} for s, c in ((1, True), (2, False))], backend)


def test_if_with_a_run_time_condition_and_differently_shaped_branches_is_refused():
    then_branch = _branch("then", [helper.make_node("ReduceSum", ["X"], ["ty"], keepdims=0)], [_info("ty")])
    else_branch = _branch("else", [helper.make_node("Neg", ["X"], ["ey"])], [_info("ey")])
    nodes = [helper.make_node("If", ["cond"], ["Y"], name="pick", then_branch=then_branch, else_branch=else_branch)]
    model = _model(nodes, [_info("X", F, [2, 3]), _info("cond", B, [])], [_info("Y")])
    with pytest.raises(gpumnn.UnsupportedOpError) as info:
        gpumnn.load(model).session(backend="cpu")
    text = str(info.value)
    assert "'pick'" in text and "run time" in text and "then_branch gives float32[] and else_branch float32[2, 3]" in text


def _loop_model(run_time: str = "", trips: int = 4, limit: int = 10):
    """y_{i+1} = y_i + X * i (i as float), with scan output y_{i+1} * 2; M = ``trips``, a condition
    input true, and a body condition i < ``limit`` that folds each iteration; ``run_time`` names
    the one of M and the condition input that is a graph input instead."""
    body = helper.make_graph([
        helper.make_node("Cast", ["i"], ["fi"], to=F),
        helper.make_node("Mul", ["X", "fi"], ["step"]),
        helper.make_node("Add", ["y_in", "step"], ["y_out"]),
        helper.make_node("Mul", ["y_out", "two"], ["scan"]),
        helper.make_node("Less", ["i", "ten"], ["cond_out"])],
        "body", [_info("i", I64, []), _info("cond_in", B, []), _info("y_in", F, [2, 3])],
        [_info("cond_out", B, []), _info("y_out", F, [2, 3]), _info("scan", F, [2, 3])],
        [_const("two", np.array(2.0, np.float32)), _const("ten", np.array(limit, np.int64))])
    nodes = [helper.make_node("Loop", ["M", "keep_going", "Y0"], ["Y", "S"], name="loop", body=body)]
    inputs = [_info("X", F, [2, 3]), _info("Y0", F, [2, 3])]
    inits = []
    for name, elem, value in (("M", I64, np.array(trips, np.int64)), ("keep_going", B, np.array(True))):
        if name == run_time:
            inputs.append(_info(name, elem, []))
        else:
            inits.append(_const(name, value))
    return _model(nodes, inputs, [_info("Y"), _info("S")], inits)


@pytest.mark.parametrize("trips,limit", [(4, 10), (4, 2), (0, 10)])
def test_loop_with_a_known_trip_count(backend, trips, limit):
    """Unrolled: M iterations, or fewer where the body's condition folds to false (limit 2: three);
    zero trips give the initial values and an empty scan output of one iteration's shape."""
    feeds = [{"X": _x(2, 3, seed=s), "Y0": _x(2, 3, seed=s + 10)} for s in (1, 2)]
    _check(_loop_model(trips=trips, limit=limit), feeds, backend)


@pytest.mark.parametrize("run_time,values", [("M", [4, 2, 4]), ("keep_going", [True, False, True])])
def test_loop_with_a_trip_count_known_only_at_run_time_is_bound_per_value(backend, run_time, values):
    """A trip count (or first condition) given as a graph input decides the loop's unrolling: the
    session binds its value into the shape-set key, so each value prepares once and replays after."""
    dtype = np.int64 if run_time == "M" else np.bool_
    feeds = [{"X": _x(2, 3, seed=i), "Y0": _x(2, 3, seed=i + 10), run_time: np.array(v, dtype)}
             for i, v in enumerate(values)]
    _check(_loop_model(run_time=run_time), feeds, backend)
    with gpumnn.load(_loop_model(run_time=run_time)).session(backend=backend, fallback=False) as sess:
        for f in feeds:
            sess.run(f)
        assert run_time in sess.bound_inputs
        assert (sess.stats["prepares"], sess.stats["cache_hits"]) == (2, 1), sess.stats


def _scan_model(reverse: bool, length: int) -> onnx.ModelProto:
    """A running sum over axis 1 of X (scan_input_axes), emitted along the last axis of the
    output (scan_output_axes), forward or backward in both directions; two states, one outer tensor."""
    body = helper.make_graph([
        helper.make_node("Add", ["sum_in", "x_t"], ["sum_out"]),
        helper.make_node("Mul", ["x_t", "x_t"], ["sq"]),
        helper.make_node("Add", ["sq_in", "sq"], ["sq_out"]),
        helper.make_node("Mul", ["sum_out", "W"], ["y_t"])],
        "body", [_info("sum_in", F, [2, 4]), _info("sq_in", F, [2, 4]), _info("x_t", F, [2, 4])],
        [_info("sum_out", F, [2, 4]), _info("sq_out", F, [2, 4]), _info("y_t", F, [2, 4])])
    direction = [int(reverse)]
    nodes = [helper.make_node("Scan", ["S0", "Q0", "X"], ["S", "Q", "Y"], body=body, num_scan_inputs=1,
                              scan_input_axes=[1], scan_output_axes=[-1], scan_input_directions=direction,
                              scan_output_directions=direction)]
    return _model(nodes, [_info("S0", F, [2, 4]), _info("Q0", F, [2, 4]), _info("X", F, [2, length, 4])],
                  [_info("S"), _info("Q"), _info("Y")], [_const("W", _x(4, seed=3))])


def _scan_feeds(length: int, seed: int) -> dict[str, np.ndarray]:
    return {"S0": _x(2, 4, seed=seed), "Q0": _x(2, 4, seed=seed + 1), "X": _x(2, length, 4, seed=seed + 2)}


@pytest.mark.parametrize("reverse", [False, True])
def test_scan(backend, reverse):
    _check(_scan_model(reverse, 5), [_scan_feeds(5, seed) for seed in (1, 5)], backend)


def test_scan_over_an_empty_sequence(backend):
    """Zero iterations: the states come back unchanged and the scan output is empty, of one
    iteration's shape (ONNX Runtime and onnx's reference evaluator both refuse this case, so the
    expectation is ONNX's definition, written out)."""
    feeds = _scan_feeds(0, seed=1)
    with gpumnn.load(_scan_model(False, 0)).session(backend=backend, input_shapes={k: v.shape for k, v in feeds.items()},
                                                    fallback=False) as sess:
        got = sess.run(feeds)
    np.testing.assert_array_equal(got["S"], feeds["S0"])
    np.testing.assert_array_equal(got["Q"], feeds["Q0"])
    assert got["Y"].shape == (2, 4, 0) and got["Y"].dtype == np.float32


def test_info_lists_control_flow_ops():
    assert {"If", "Loop", "Scan"} <= set(gpumnn.supported_ops())
