"""The cpu backend's squeeze-excitation blocks as one call (``cpu_excitation.excitation_runs``)
against ONNX Runtime.

A recording puts one compiled call in place of a global average pool, two one-pixel convolutions
and the scale per channel; these cases vary what that call's loops take apart: channel counts whose
products end in the wide tile, the 16-float one and single columns, the gates the convolutions
fold (hard-sigmoid) or apply after (sigmoid, hard-swish), the gate on either side of the product, the
pool as a ReduceMean, a clamp on the product, batches of one and more, the gate asked for as a model output, and blocks
large enough that their pool and scale are shared between threads, which stay four calls.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from gpumnn.backends.cpu import engines
from conftest import onnxruntime_session, rel_l2
from op_cases import model_proto

pytest.importorskip("numba")


def _block_model(batch: int, channels: int, squeezed: int, hw: tuple[int, int], squeeze_act: str = "Relu",
                 gate: str = "HardSigmoid", gate_first: bool = False, after: str | None = None,
                 gate_output: bool = False, reduce_mean: bool = False):
    """A depthwise 3x3 convolution (the block's input, as in a mobile network), then the block:
    GlobalAveragePool, a 1x1 convolution to ``squeezed`` channels and ``squeeze_act``, a 1x1
    convolution back and ``gate``, Mul of the input by the gate (``gate_first``: gate * x) and
    ``after`` on the product; and the feeds. ``reduce_mean``: the pool as ReduceMean over the
    spatial axes, as ``torch.onnx``'s dynamo exporter writes it."""
    rng = np.random.default_rng(zlib.crc32(f"{batch}/{channels}/{squeezed}/{hw}/{squeeze_act}/{gate}/{reduce_mean}".encode()))
    c, r = channels, squeezed
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in {
        "dw_w": rng.standard_normal((c, 1, 3, 3)) * 0.4, "dw_b": rng.standard_normal(c) * 0.1,
        "w1": rng.standard_normal((r, c, 1, 1)) * (2.0 / np.sqrt(c)), "b1": rng.standard_normal(r) * 0.2,
        "w2": rng.standard_normal((c, r, 1, 1)) * (2.0 / np.sqrt(r)), "b2": rng.standard_normal(c) * 0.5}.items()]
    nodes = [helper.make_node("Conv", ["X", "dw_w", "dw_b"], ["x"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMean", ["x"], ["pooled"], axes=[2, 3], keepdims=1) if reduce_mean
             else helper.make_node("GlobalAveragePool", ["x"], ["pooled"]),
             helper.make_node("Conv", ["pooled", "w1", "b1"], ["squeezed"])]
    if squeeze_act == "SiLU":
        nodes += [helper.make_node("Sigmoid", ["squeezed"], ["squeezed_s"]),
                  helper.make_node("Mul", ["squeezed", "squeezed_s"], ["hidden"])]
    else:
        nodes.append(helper.make_node(squeeze_act, ["squeezed"], ["hidden"]))
    nodes += [helper.make_node("Conv", ["hidden", "w2", "b2"], ["excited"]),
              helper.make_node(gate, ["excited"], ["gate"]),
              helper.make_node("Mul", ["gate", "x"] if gate_first else ["x", "gate"], ["scaled" if after else "Y"])]
    if after:
        nodes.append(helper.make_node(after, ["scaled"], ["Y"]))
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    if gate_output:
        outputs.append(helper.make_tensor_value_info("gate", TensorProto.FLOAT, None))
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, c, *hw])
    graph = helper.make_graph(nodes, "squeeze_excitation", [x], outputs, inits)
    return model_proto(graph, 14), {"X": rng.standard_normal((batch, c, *hw)).astype(np.float32)}


def _check(model, feeds, threads: int, expect_blocks: int) -> None:
    ref = onnxruntime_session(model).run(None, feeds)
    with gpumnn.load(model).session(backend="cpu", threads=threads, fallback=False) as sess:
        got = sess.run(feeds)
        items = sess.backends["cpu"].work_items(list(sess.shape_set().first_state.executions))
    fused = [group for group, _ in items if len(group) > 1]
    assert len(fused) == expect_blocks, f"{len(fused)} blocks made one call, {expect_blocks} expected"
    for output, value in zip(model.graph.output, ref):
        err = rel_l2(got[output.name], value)
        assert err < 1e-4, f"{output.name}: relative L2 error {err:.2e}"


@pytest.mark.parametrize("channels, squeezed", [(8, 4), (96, 24), (144, 40), (200, 72)])
@pytest.mark.parametrize("threads", [1, 2])
def test_blocks_match_onnxruntime_for_channel_counts(channels, squeezed, threads):
    model, feeds = _block_model(1, channels, squeezed, (3, 5))
    _check(model, feeds, threads, expect_blocks=1)


@pytest.mark.parametrize("squeeze_act, gate", [("Relu", "Sigmoid"), ("SiLU", "Sigmoid"), ("HardSwish", "HardSigmoid")])
def test_blocks_match_onnxruntime_for_gates_applied_after_the_product(squeeze_act, gate):
    model, feeds = _block_model(1, 40, 16, (4, 4), squeeze_act=squeeze_act, gate=gate)
    _check(model, feeds, threads=1, expect_blocks=1)


@pytest.mark.parametrize("gate_first", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
def test_blocks_match_onnxruntime_for_either_operand_order_and_batches(gate_first, batch):
    """At batch 3 the memory plan lays the product over the pooled and squeezed tensors, which the
    call must have read from its own copies before it writes the product."""
    model, feeds = _block_model(batch, 24, 8, (6, 2), gate_first=gate_first)
    _check(model, feeds, threads=2, expect_blocks=1)


@pytest.mark.parametrize("batch, channels, squeezed", [(1, 576, 144), (2, 384, 96)])
def test_blocks_whose_products_are_shared_match_onnxruntime(batch, channels, squeezed):
    """Products from ``EXCITATION_SHARED_MACS`` are shared between two threads: each takes a span of
    the squeezed columns, then of the gate's and those channels' rows of the product."""
    assert engines.Engine(jit=True, regions=2, threads=2).excitation(batch * channels * 12,
                                                                    batch * channels * squeezed) == 2
    model, feeds = _block_model(batch, channels, squeezed, (2, 6), after="Relu", gate_output=True)
    _check(model, feeds, threads=2, expect_blocks=1)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 2])
def test_blocks_pooled_by_reduce_mean_match_onnxruntime(threads, batch):
    model, feeds = _block_model(batch, 48, 16, (3, 7), reduce_mean=True)
    _check(model, feeds, threads, expect_blocks=1)


def test_a_clamp_on_the_product_is_applied_and_the_gate_asked_for_is_written():
    """The call writes every tensor the four ops wrote: a gate that is a model output keeps its values."""
    model, feeds = _block_model(1, 32, 8, (5, 5), after="Relu", gate_output=True)
    _check(model, feeds, threads=1, expect_blocks=1)


@pytest.mark.parametrize("threads", [1, 2])
def test_blocks_whose_pool_and_scale_are_shared_stay_four_calls(threads):
    """From ``REGION_MIN_ELEMENTS`` input values the pool and the scale are shared between two
    threads, so the block is left as four calls there; one thread takes it whole at any size."""
    side = 32
    assert 32 * side * side >= engines.REGION_MIN_ELEMENTS
    model, feeds = _block_model(1, 32, 8, (side, side))
    _check(model, feeds, threads, expect_blocks=1 if threads == 1 else 0)
