"""LSTM, GRU and RNN on every backend against ONNX Runtime (relative L2 < 1e-4).

Each case is one model holding the op three times, forward, reverse and bidirectional, on one
input X, so that one session per backend covers the three directions. The cases vary what the
directions share: the optional inputs (B, initial_h/initial_c, P, sequence_lens), the opset (7,
converted at load; 14; 22), layout 1, the activations with their alpha/beta, clip, GRU's
linear_before_reset, LSTM's input_forget, weights given at run time, and only Y_h asked for.

ONNX Runtime refuses layout 1 ("Batchwise recurrent operations are not supported"), so a layout-1
case is checked against ONNX Runtime running the same weights at layout 0 on the transposed X and
initial states, its outputs transposed back: what layout 1 means.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from conftest import onnxruntime_session, rel_l2
from op_cases import model_proto

TOLERANCE = 1e-4
SEQ, BATCH, INPUT, HIDDEN = 5, 3, 4, 6
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
OUTPUTS = {"LSTM": ("Y", "Y_h", "Y_c"), "GRU": ("Y", "Y_h"), "RNN": ("Y", "Y_h")}
DIRECTIONS = ("forward", "reverse", "bidirectional")


@dataclass(frozen=True)
class RnnCase:
    id: str
    op: str
    opset: int = 14
    bias: bool = True
    initial: bool = True  # initial_h, and initial_c for LSTM
    peepholes: bool = False
    layout: int = 0
    activations: tuple[str, ...] = ()  # one direction's list (repeated for bidirectional)
    alpha: tuple[float, ...] = ()  # one direction's alphas, likewise
    beta: tuple[float, ...] = ()
    attrs: dict = field(default_factory=dict)
    lengths: tuple[int, ...] | None = None
    runtime: bool = False  # weights, states and lengths as graph inputs (else initializers)
    outputs: tuple[str, ...] = ()  # default: every output of the op

    def data(self, direction: str) -> dict[str, np.ndarray]:
        """Inputs of one direction's node at layout 0 (weights, states), seeded by case and direction."""
        rng = np.random.default_rng(zlib.crc32(f"{self.id}/{direction}".encode()))
        d, g = 2 if direction == "bidirectional" else 1, GATES[self.op]
        data = {"W": rng.standard_normal((d, g * HIDDEN, INPUT)) * 0.5,
                "R": rng.standard_normal((d, g * HIDDEN, HIDDEN)) * 0.5}
        if self.bias:
            data["B"] = rng.standard_normal((d, 2 * g * HIDDEN)) * 0.5
        if self.initial:
            data["initial_h"] = rng.standard_normal((d, BATCH, HIDDEN))
            if self.op == "LSTM":
                data["initial_c"] = rng.standard_normal((d, BATCH, HIDDEN))
        if self.peepholes:
            data["P"] = rng.standard_normal((d, 3 * HIDDEN)) * 0.5
        return {k: v.astype(np.float32) for k, v in data.items()}

    def model(self, layout: int) -> onnx.ModelProto:
        """The three-direction model at ``layout`` (X and states transposed for layout 1)."""
        x_shape = [SEQ, BATCH, INPUT] if layout == 0 else [BATCH, SEQ, INPUT]
        inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)]
        initializers, nodes, outputs = [], [], []
        if self.lengths is not None:
            lengths = np.array(self.lengths, dtype=np.int32)
            if self.runtime:
                inputs.append(helper.make_tensor_value_info("lengths", TensorProto.INT32, [BATCH]))
            else:
                initializers.append(numpy_helper.from_array(lengths, "lengths"))
        for direction in DIRECTIONS:
            d = 2 if direction == "bidirectional" else 1
            names = {}
            for key, value in self.data(direction).items():
                if key.startswith("initial") and layout == 1:
                    value = value.transpose(1, 0, 2)
                names[key] = f"{direction}_{key}"
                if self.runtime:
                    inputs.append(helper.make_tensor_value_info(names[key], TensorProto.FLOAT, list(value.shape)))
                else:
                    initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), names[key]))
            order = ["X", "W", "R", "B", "lengths", "initial_h", "initial_c", "P"][:8 if self.op == "LSTM" else 6]
            node_inputs = ["X" if k == "X" else "lengths" if k == "lengths" and self.lengths is not None
                           else names.get(k, "") for k in order]
            while not node_inputs[-1]:
                node_inputs.pop()
            wanted = self.outputs or OUTPUTS[self.op]
            node_outputs = [f"{direction}_{o}" if o in wanted else "" for o in OUTPUTS[self.op]]
            while not node_outputs[-1]:
                node_outputs.pop()
            attrs = dict(hidden_size=HIDDEN, direction=direction, **self.attrs)
            if layout:
                attrs["layout"] = layout
            if self.activations:
                attrs["activations"] = list(self.activations) * d
            if self.alpha:
                attrs["activation_alpha"] = list(self.alpha) * d
            if self.beta:
                attrs["activation_beta"] = list(self.beta) * d
            nodes.append(helper.make_node(self.op, node_inputs, node_outputs, name=f"{self.op}_{direction}", **attrs))
            outputs += [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in node_outputs if o]
        graph = helper.make_graph(nodes, self.id, inputs, outputs, initializers)
        return model_proto(graph, self.opset)

    def feeds(self, layout: int) -> dict[str, np.ndarray]:
        x = np.random.default_rng(zlib.crc32(self.id.encode())).standard_normal((SEQ, BATCH, INPUT))
        feeds = {"X": (x if layout == 0 else x.transpose(1, 0, 2)).astype(np.float32)}
        if self.runtime:
            if self.lengths is not None:
                feeds["lengths"] = np.array(self.lengths, dtype=np.int32)
            for direction in DIRECTIONS:
                for key, value in self.data(direction).items():
                    if key.startswith("initial") and layout == 1:
                        value = value.transpose(1, 0, 2)
                    feeds[f"{direction}_{key}"] = np.ascontiguousarray(value)
        return feeds


def _cases() -> list[RnnCase]:
    lstm_peep = dict(peepholes=True)
    return [
        # LSTM
        RnnCase("lstm_plain_opset7", "LSTM", opset=7, bias=False, initial=False),
        RnnCase("lstm_full_opset22", "LSTM", opset=22, **lstm_peep),
        RnnCase("lstm_layout1", "LSTM", layout=1, **lstm_peep),
        RnnCase("lstm_activations_clip_yh_only", "LSTM", activations=("HardSigmoid", "ScaledTanh", "Softsign"),
                alpha=(0.3, 0.8), beta=(0.4, 1.2), attrs=dict(clip=0.9), outputs=("Y_h",)),
        RnnCase("lstm_input_forget", "LSTM", activations=("Sigmoid", "Tanh", "Relu"),
                attrs=dict(input_forget=1), **lstm_peep),
        RnnCase("lstm_lengths_const", "LSTM", lengths=(5, 2, 0), **lstm_peep),
        RnnCase("lstm_lengths_runtime", "LSTM", lengths=(3, 5, 1), runtime=True, **lstm_peep),
        # GRU
        RnnCase("gru_plain_opset7", "GRU", opset=7, bias=False, initial=False),
        RnnCase("gru_full_opset22", "GRU", opset=22),
        RnnCase("gru_layout1", "GRU", layout=1, attrs=dict(linear_before_reset=1)),
        RnnCase("gru_activations_clip_yh_only", "GRU", activations=("LeakyRelu", "Affine"), alpha=(0.05, 0.7),
                beta=(0.1,), attrs=dict(clip=0.9), outputs=("Y_h",)),
        RnnCase("gru_linear_before_reset", "GRU", activations=("Sigmoid", "Softplus"),
                attrs=dict(linear_before_reset=1)),
        RnnCase("gru_lengths_const", "GRU", lengths=(5, 2, 4), attrs=dict(linear_before_reset=1)),
        RnnCase("gru_lengths_runtime", "GRU", lengths=(3, 5, 1), runtime=True),
        # RNN
        RnnCase("rnn_plain_opset7", "RNN", opset=7, bias=False, initial=False),
        RnnCase("rnn_full_opset22", "RNN", opset=22),
        RnnCase("rnn_layout1", "RNN", layout=1),
        RnnCase("rnn_activations_clip_yh_only", "RNN", activations=("Elu",), alpha=(0.5,), attrs=dict(clip=0.9),
                outputs=("Y_h",)),
        RnnCase("rnn_lengths_const", "RNN", lengths=(5, 2, 4), activations=("ThresholdedRelu",), alpha=(0.1,)),
        RnnCase("rnn_lengths_runtime", "RNN", lengths=(3, 5, 1), runtime=True, activations=("Relu",)),
    ]


CASES = _cases()


def _reference(case: RnnCase) -> dict[str, np.ndarray]:
    """ONNX Runtime's outputs, at layout 0 (transposed to layout 1's order for a layout-1 case)."""
    sess = onnxruntime_session(case.model(0))
    outputs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, case.feeds(0))))
    if case.layout == 1:
        outputs = {k: v.transpose(2, 0, 1, 3) if v.ndim == 4 else v.transpose(1, 0, 2) for k, v in outputs.items()}
    return outputs


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_recurrent_matches_onnxruntime(case, backend):
    ref = _reference(case)
    with gpumnn.load(case.model(case.layout)).session(backend=backend, fallback=False) as sess:
        got = sess.run(case.feeds(case.layout))
    assert set(got) == set(ref)
    for name, value in ref.items():
        assert np.std(value) > 0, f"{name}: the reference is constant"
        err = rel_l2(got[name], value)
        assert err < TOLERANCE, f"{name}: relative L2 error {err:.2e} on {backend}"


def test_sequence_lengths_zero_the_steps_past_each_end():
    """Y is zero past each entry's length (the runs above compare with ONNX Runtime; this says what
    the comparison covers), and a reverse direction's last step is the entry's own first."""
    case = next(c for c in CASES if c.id == "lstm_lengths_const")
    got = gpumnn.load(case.model(0)).session(backend="cpu").run(case.feeds(0))
    for direction in DIRECTIONS:
        y = got[f"{direction}_Y"]
        for b, length in enumerate(case.lengths):
            assert not np.any(y[length:, :, b]), f"{direction}: batch entry {b} has output past its length"
            assert length == 0 or np.all(np.any(y[:length, :, b] != 0, axis=-1))
    assert not np.any(got["forward_Y_h"][:, 2]) and not np.any(got["forward_Y_c"][:, 2])  # length 0
    np.testing.assert_array_equal(got["reverse_Y_h"][0, 1], got["reverse_Y"][0, 0, 1])


def _single(op: str, **attrs) -> onnx.ModelProto:
    case = RnnCase("single", op)
    model = case.model(0)
    del model.graph.node[1:]
    model.graph.node[0].attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
    del model.graph.output[len(OUTPUTS[op]):]
    return model


def test_unknown_activation_is_refused_by_name():
    with pytest.raises(gpumnn.UnsupportedOpError, match=r"LSTM_forward.*activation 'Swish'"):
        gpumnn.load(_single("LSTM", activations=["Sigmoid", "Swish", "Tanh"])).session(backend="cpu")


def test_weights_of_the_wrong_shape_are_refused_by_name():
    model = _single("GRU")
    hidden = next(a for a in model.graph.node[0].attribute if a.name == "hidden_size")
    hidden.i = HIDDEN + 1
    with pytest.raises(gpumnn.ModelError, match=r"GRU_forward.*W of shape"):
        gpumnn.load(model).session(backend="cpu")
