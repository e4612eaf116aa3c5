"""The cpu backend's runs of LSTM steps as one call (``cpu_recurrent.lstm_runs``) against ONNX Runtime.

A recording puts one compiled call in place of each run of (recurrent product, LSTM step) pairs;
these cases vary what that call's loops take apart: hidden sizes whose gate rows (4H) end in the
wide tile, the 16-float one and single columns (R^T laid in blocks of the wide tile, then the
columns left: 4H = 120 takes all three), each direction alone and both (on a region's threads, and
on one thread), sequences of one step up, batches of one and more, initial states
given and absent, and two stacked layers, whose tensors the memory plan lays over each other.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from gpumnn import atomic as A
from gpumnn.backends.base import Execution, KernelWork, TensorHandle
from gpumnn.backends.cpu import recurrent as cpu_recurrent
from conftest import onnxruntime_session, rel_l2
from op_cases import model_proto

pytest.importorskip("numba")
INPUT = 5


def _lstm_model(seq: int, batch: int, hidden: int, direction: str, initial: str, layers: int = 1,
                outputs: tuple[str, ...] = ("Y", "Y_h", "Y_c")):
    """``layers`` stacked LSTMs (each layer's Y, directions side by side, the next one's X), and
    the feeds; ``outputs`` of the last layer are the model's. ``initial``: the initial states
    "absent", "constant" (initializers) or graph "input"s."""
    rng = np.random.default_rng(zlib.crc32(f"{seq}/{batch}/{hidden}/{direction}/{initial}/{layers}".encode()))
    d = 2 if direction == "bidirectional" else 1
    nodes, inits, width = [], [], INPUT
    x = "X"
    feeds = {"X": rng.standard_normal((seq, batch, INPUT)).astype(np.float32)}
    graph_inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [seq, batch, INPUT])]
    for layer in range(layers):
        names = {key: f"l{layer}_{key}" for key in ("W", "R", "B", "h0", "c0")}
        weights = {"W": rng.standard_normal((d, 4 * hidden, width)) * 0.4,
                   "R": rng.standard_normal((d, 4 * hidden, hidden)) * 0.4,
                   "B": rng.standard_normal((d, 8 * hidden)) * 0.3}
        if initial != "absent":
            weights["h0"] = rng.standard_normal((d, batch, hidden))
            weights["c0"] = rng.standard_normal((d, batch, hidden))
        fed = {k: weights.pop(k).astype(np.float32) for k in ("h0", "c0") if initial == "input"}
        inits += [numpy_helper.from_array(v.astype(np.float32), names[k]) for k, v in weights.items()]
        graph_inputs += [helper.make_tensor_value_info(names[k], TensorProto.FLOAT, list(v.shape)) for k, v in fed.items()]
        feeds.update({names[k]: v for k, v in fed.items()})
        states = [names["h0"], names["c0"]] if initial != "absent" else []
        outs = [f"l{layer}_{o}" for o in ("Y", "Y_h", "Y_c")]
        nodes.append(helper.make_node("LSTM", [x, names["W"], names["R"], names["B"], "", *states], outs,
                                      name=f"lstm{layer}", hidden_size=hidden, direction=direction))
        if layer + 1 < layers:  # Y [T, D, B, H] -> [T, B, D*H]
            shape = numpy_helper.from_array(np.array([seq, batch, d * hidden], np.int64), f"l{layer}_shape")
            inits.append(shape)
            nodes += [helper.make_node("Transpose", [outs[0]], [f"l{layer}_t"], perm=[0, 2, 1, 3]),
                      helper.make_node("Reshape", [f"l{layer}_t", shape.name], [f"l{layer}_x"])]
            x, width = f"l{layer}_x", d * hidden
    wanted = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs
              if o.split("_", 1)[1] in outputs]
    graph = helper.make_graph(nodes, "lstm_runs", graph_inputs, wanted, inits)
    return model_proto(graph, 14), feeds


def _check(model, feeds, threads: int, expect_runs: int) -> None:
    ref = onnxruntime_session(model).run(None, feeds)
    with gpumnn.load(model).session(backend="cpu", threads=threads, fallback=False) as sess:
        got = sess.run(feeds)
        backend = sess.backends["cpu"]
        items = backend.work_items(list(sess.shape_set().first_state.executions))
    fused = [group for group, _ in items if len(group) > 1]
    assert len(fused) == expect_runs, f"{len(fused)} runs of LSTM steps made one call, {expect_runs} expected"
    names = [o.name for o in model.graph.output]
    assert set(got) == set(names)
    for name, value in zip(names, ref):
        err = rel_l2(got[name], value)
        assert err < 1e-4, f"{name}: relative L2 error {err:.2e}"


@pytest.mark.parametrize("hidden", [1, 5, 16, 17, 30, 33])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("threads", [1, 2])
def test_lstm_runs_match_onnxruntime_for_hidden_sizes_and_directions(hidden, direction, threads):
    model, feeds = _lstm_model(seq=4, batch=2, hidden=hidden, direction=direction, initial="input")
    _check(model, feeds, threads, expect_runs=1)


@pytest.mark.parametrize("seq", [1, 2, 3, 7])
@pytest.mark.parametrize("initial", ["absent", "constant", "input"])
@pytest.mark.parametrize("batch", [1, 3])
def test_lstm_runs_match_onnxruntime_for_lengths_batches_and_initial_states(seq, initial, batch):
    model, feeds = _lstm_model(seq=seq, batch=batch, hidden=7, direction="bidirectional", initial=initial)
    # with constant initial states (or none) the first step's product is folded: that step stays alone
    _check(model, feeds, threads=2, expect_runs=1 if seq > 1 or initial == "input" else 0)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_stacked_lstm_layers_each_run_as_one_call(direction):
    model, feeds = _lstm_model(seq=9, batch=1, hidden=12, direction=direction, initial="absent", layers=2)
    _check(model, feeds, threads=2, expect_runs=2)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_lstm_runs_when_only_the_last_state_is_asked_for(direction):
    """Without Y each step's state is dead after the next step reads it, and the memory plan may
    lay later steps' tensors over it: the run is computed as one call only where that is safe,
    and matches either way."""
    model, feeds = _lstm_model(seq=12, batch=2, hidden=9, direction=direction, initial="input", outputs=("Y_h",))
    ref = onnxruntime_session(model).run(None, feeds)[0]
    with gpumnn.load(model).session(backend="cpu", threads=2, fallback=False) as sess:
        got = sess.run(feeds)["l0_Y_h"]
    assert rel_l2(got, ref) < 1e-4


def _handle(buffer: np.ndarray, offset: int, size: int) -> TensorHandle:
    return TensorHandle(buffer, offset, (size,), A.FLOAT32)


def test_a_later_read_of_an_unwritten_gates_tensor_is_seen():
    """The run leaves its gates tensors unwritten: a later reader before any writer refuses the run."""
    pool = np.zeros(64, np.float32)
    gates = _handle(pool, 8, 8)
    op = A.Unary(("a",), ("b",), "test", op="relu")

    def exe(inputs, outputs):
        return Execution(op, inputs, outputs, KernelWork())
    assert cpu_recurrent._read_later([gates], [exe([_handle(pool, 12, 4)], [_handle(pool, 32, 4)])])
    assert not cpu_recurrent._read_later([gates], [exe([_handle(pool, 32, 4)], [_handle(pool, 8, 8)]),
                                                   exe([_handle(pool, 8, 8)], [_handle(pool, 40, 4)])])
    assert not cpu_recurrent._read_later([gates], [exe([_handle(pool, 16, 8)], [_handle(pool, 40, 4)])])


def test_overlapping_states_keep_the_directions_together():
    """States and outputs that overlap other than exactly would let one direction's writes reach another's reads."""
    assert cpu_recurrent._apart([(0, 8), (0, 8), (8, 16)])
    assert not cpu_recurrent._apart([(0, 8), (4, 12)])
    assert not cpu_recurrent._apart([(0, 8)], [(6, 20)])


def test_recurrent_weights_are_laid_in_blocks_of_the_wide_tile():
    """``recurrent_blocks``: each WIDE columns of R^T one [H, WIDE] block after the other, then the
    columns left as one [H, rest] block."""
    from gpumnn.backends.cpu.recurrent import recurrent_blocks
    from gpumnn.backends.cpu.tiles import WIDE

    d, h, width = 2, 3, 2 * WIDE + 5
    r_t = np.arange(d * h * width, dtype=np.float32).reshape(d, h, width)
    laid = recurrent_blocks(r_t)
    assert laid.shape == (d, h * width) and laid.dtype == np.float32 and laid.flags.c_contiguous
    for block in range(2):
        np.testing.assert_array_equal(laid[:, block * h * WIDE:(block + 1) * h * WIDE].reshape(d, h, WIDE),
                                      r_t[:, :, block * WIDE:(block + 1) * WIDE])
    np.testing.assert_array_equal(laid[:, 2 * h * WIDE:].reshape(d, h, 5), r_t[:, :, 2 * WIDE:])


def _step_copies(backend) -> list[tuple]:
    """The packed-constant keys of the recurrent weights laid [K, N] for the step products
    (``_make_matmul``'s small products: one [H, 4H] block per direction)."""
    return [key for key in backend._packed._made if key[2][0] == "rows" and key[2][1][0] == 2]


@pytest.mark.parametrize("record", [True, False])
def test_step_products_lay_their_weights_only_when_a_run_calls_them(record):
    """A recorded session computes the steps as one call, which reads R^T in blocks: the step
    products' own copy of R^T is never made. An eager run calls the products, which lay it then."""
    model, feeds = _lstm_model(seq=5, batch=1, hidden=16, direction="bidirectional", initial="input")
    ref = onnxruntime_session(model).run(None, feeds)
    with gpumnn.load(model).session(backend="cpu", threads=1, fallback=False, record=record) as sess:
        got = sess.run(feeds)
        backend = sess.backends["cpu"]
        if record:
            executions = list(sess.shape_set().first_state.executions)
            products = [exe for exe in executions if isinstance(exe.op, A.MatMul) and exe.op.batch == 2]
            assert products and all(exe.scheme == "small product" for exe in products)
        assert bool(_step_copies(backend)) == (not record)
    for name, value in zip([o.name for o in model.graph.output], ref):
        assert rel_l2(got[name], value) < 1e-4
