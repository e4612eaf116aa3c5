"""Lowering of the recurrent ops LSTM, GRU and RNN to atomic ops, MNN's way.

The input projection ``X . W^T + (Wb + Rb)`` of every time step and direction is one MatMul.
Then, for every step (in its direction's order) and direction, each gate is a small MatMul
``H_{t-1} . R_g^T`` whose bias operand is that step's slice of the projection and whose epilogue
applies the gate's activation where one atomic unary computes it; the cell's elementwise update is
Binary and Unary ops, and ``sequence_lens`` masks with Select. Rasters slice the projection and
weights and gather the per-step states into Y, Y_h and Y_c. Every backend thus runs recurrent
models with the kernels it already has.

Why a MatMul per gate rather than one for all gates: an atomic op reads each operand from its
start (the contract has no views at an offset), so gates that are later combined elementwise must
each be a tensor of their own. A MatMul per gate gives exactly that, with the projection's slice
as its bias; one MatMul for all gates would need a Raster per gate to split its output again.

Semantics are ONNX's, and ONNX Runtime's where ONNX leaves a choice: ``clip`` bounds every gate's
input to its activation (not the cell state before ``h``); ``input_forget`` couples ``f = 1 - i``;
``activation_alpha``/``activation_beta`` are consumed in order by the activations that take them,
with ONNX Runtime's defaults; a batch entry whose sequence length is 0 has zero final states.
With ``sequence_lens``, a step past an entry's length keeps its state and writes zeros to Y, so
the reverse direction starts at each entry's own last valid step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .. import atomic as A
from ..errors import ModelError, UnsupportedOpError
from ..ir import Node
from .compute import emit_binary, emit_unary
from .context import LoweringContext, PendingRaster
from .logic import emit_select
from .regions import IndexMap
from .registry import lowers
from .reorder import reorder


@dataclass(frozen=True)
class CellKind:
    """What distinguishes LSTM, GRU and RNN for the shared parts of the lowering."""

    gates: int  # gate blocks in W, R and each half of B
    activations: tuple[str, ...]  # the default activation list of one direction


KINDS: dict[str, CellKind] = {
    "RNN": CellKind(1, ("Tanh",)),
    "GRU": CellKind(3, ("Sigmoid", "Tanh")),
    "LSTM": CellKind(4, ("Sigmoid", "Tanh", "Tanh")),
}

# gate blocks in ONNX's weight order
LSTM_I, LSTM_O, LSTM_F, LSTM_C = range(4)
GRU_Z, GRU_R, GRU_H = range(3)
#: peephole blocks of P, in ONNX's order (i, o, f)
PEEPHOLE_OF_GATE = {LSTM_I: 0, LSTM_O: 1, LSTM_F: 2}

#: ONNX activation (lower case) -> (takes alpha, takes beta, default alpha, default beta); the defaults
#: are ONNX Runtime's (0 where the ONNX spec names none)
ACTIVATION_ARGS: dict[str, tuple[bool, bool, float, float]] = {
    "relu": (False, False, 0.0, 0.0), "tanh": (False, False, 0.0, 0.0), "sigmoid": (False, False, 0.0, 0.0),
    "affine": (True, True, 0.0, 0.0), "leakyrelu": (True, False, 0.01, 0.0),
    "thresholdedrelu": (True, False, 0.0, 0.0), "scaledtanh": (True, True, 0.0, 0.0),
    "hardsigmoid": (True, True, 0.2, 0.5), "elu": (True, False, 1.0, 0.0), "softsign": (False, False, 0.0, 0.0),
    "softplus": (False, False, 0.0, 0.0),
}


@dataclass(frozen=True)
class RnnActivation:
    """One entry of a recurrent op's ``activations`` list, with its alpha and beta."""

    name: str  # lower case
    alpha: float = 0.0
    beta: float = 0.0

    @property
    def unary(self) -> A.Activation:
        """The one atomic unary that computes it (an epilogue can apply it), or None for the
        composites Affine, ScaledTanh and Softsign."""
        a, b = self.alpha, self.beta
        return {"relu": ("relu", ()), "tanh": ("tanh", ()), "sigmoid": ("sigmoid", ()),
                "leakyrelu": ("leaky_relu", (a,)), "thresholdedrelu": ("thresholded_relu", (a,)),
                "hardsigmoid": ("hard_sigmoid", (a, b)), "elu": ("elu", (a,)),
                "softplus": ("softplus", ())}.get(self.name)


def parse_activations(node: Node, kind: CellKind, directions: int) -> list[tuple[RnnActivation, ...]]:
    """The activations of each direction, with alpha/beta consumed in order by those that take them."""
    names = list(node.attr("activations") or []) or list(kind.activations) * directions
    per = len(kind.activations)
    if len(names) == per:
        names = names * directions
    if len(names) < per * directions:
        raise ModelError(f"node {node.name!r} ({node.op_type}): {len(names)} activations for {directions} "
                         f"direction(s); {per} per direction expected")
    alphas = iter(float(v) for v in node.attr("activation_alpha", []) or [])
    betas = iter(float(v) for v in node.attr("activation_beta", []) or [])
    parsed = []
    for name in names[:per * directions]:
        key = str(name).lower()
        if key not in ACTIVATION_ARGS:
            raise UnsupportedOpError(node.op_type, node.name, f"activation {name!r} is not one of "
                                     "Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, "
                                     "HardSigmoid, Elu, Softsign, Softplus")
        takes_alpha, takes_beta, alpha, beta = ACTIVATION_ARGS[key]
        alpha = next(alphas, alpha) if takes_alpha else 0.0
        beta = next(betas, beta) if takes_beta else 0.0
        parsed.append(RnnActivation(key, alpha, beta))
    return [tuple(parsed[d * per:(d + 1) * per]) for d in range(directions)]


def strided_slice(ctx: LoweringContext, node: Node, source: str, offset: int, shape: Sequence[int],
                  strides: Sequence[int], hint: str) -> str:
    """``source`` (flat) read at ``offset + i . strides`` for every index ``i`` of ``shape``: a
    folded constant, or a Raster whose index map is built for the slice alone (not the source, which
    may be every step's projection)."""
    out = ctx.temp(node, hint)
    value = ctx.value(source, node)
    index_map = IndexMap.strided(offset, shape, strides)
    if value.is_const:
        ctx.set_const(out, value.const.reshape(-1)[index_map.full().idx])
    else:
        ctx.emit_raster(PendingRaster([source], index_map, out, None, node.name))
    return out


def _input(node: Node, index: int) -> str | None:
    """The node's optional input ``index``, or None when absent or given as the empty name."""
    return node.inputs[index] if len(node.inputs) > index and node.inputs[index] else None


def _output(node: Node, index: int) -> str | None:
    return node.outputs[index] if len(node.outputs) > index and node.outputs[index] else None


class SequenceLengths:
    """``sequence_lens``: absent (or every entry ``seq_length``), a constant, or known at run time only.

    ``step(t)`` says which batch entries step ``t`` updates: None (all), False (none, known now) or
    a bool ``[batch, 1]`` tensor; ``mask(shape, t_axis, b_axis)`` is the bool mask ``t < len[b]``
    broadcast over ``shape`` (None when all true).
    """

    def __init__(self, ctx: LoweringContext, node: Node, name: str | None, seq: int, batch: int):
        self.ctx, self.node, self.seq, self.batch = ctx, node, seq, batch
        self.name, self.lengths = name, None
        self._steps: dict[int, str] = {}
        if name is None:
            return
        value = ctx.value(name, node)
        if value.shape != (batch,):
            raise ModelError(f"node {node.name!r} ({node.op_type}): sequence_lens of shape {list(value.shape)} "
                             f"for a batch of {batch}")
        if value.is_const:
            lengths = np.asarray(value.const, dtype=np.int64)
            if lengths.min(initial=0) < 0 or lengths.max(initial=0) > seq:
                raise ModelError(f"node {node.name!r} ({node.op_type}): sequence_lens {lengths.tolist()} must lie "
                                 f"in [0, {seq}]")
            self.lengths = lengths
            if np.all(lengths == seq):
                self.name = None  # every sequence is whole: nothing to mask

    @property
    def masked(self) -> bool:
        return self.name is not None

    def _const(self, value, dtype, hint: str) -> str:
        name = self.ctx.temp(self.node, hint)
        self.ctx.set_const(name, np.asarray(value, dtype=dtype))
        return name

    def _compare(self, lengths_shape: Sequence[int], other: np.ndarray, hint: str) -> str:
        """``len > other`` (bool), with the lengths seen with ``lengths_shape``."""
        view = self.ctx.temp(self.node, "lengths")
        self.ctx.alias(view, self.name, tuple(lengths_shape))
        out = self.ctx.temp(self.node, hint)
        emit_binary(self.ctx, self.node, "greater", view, self._const(other, np.int32, "positions"), out)
        return out

    def step(self, t: int) -> None | bool | str:
        if not self.masked:
            return None
        if self.lengths is not None:
            valid = t < self.lengths
            if valid.all():
                return None
            if not valid.any():
                return False
        if t not in self._steps:  # one mask per step, shared by the directions
            self._steps[t] = (self._compare((self.batch, 1), np.array(t), "step_mask") if self.lengths is None
                              else self._const(valid.reshape(self.batch, 1), bool, "step_mask"))
        return self._steps[t]

    def mask(self, shape: Sequence[int], t_axis: int | None, b_axis: int) -> str | None:
        """``t < len[b]`` (or ``len[b] > 0`` when ``t_axis`` is None) over ``shape``, 1 on the other axes."""
        if not self.masked:
            return None
        view = [1] * len(shape)
        view[b_axis] = self.batch
        positions = np.zeros([1] * len(shape), dtype=np.int32)
        if t_axis is not None:
            steps = [1] * len(shape)
            steps[t_axis] = self.seq
            positions = np.arange(self.seq, dtype=np.int32).reshape(steps)
        if self.lengths is not None:
            valid = self.lengths.reshape(view) > positions
            return None if valid.all() else self._const(valid, bool, "mask")
        return self._compare(view, positions, "mask")


@dataclass
class Recurrence:
    """One LSTM/GRU/RNN node being lowered: its geometry, and the emitters its cells share."""

    ctx: LoweringContext
    node: Node
    kind: CellKind
    seq: int
    batch: int
    hidden: int
    directions: int
    layout: int
    dtype: np.dtype
    clip: float | None
    activations: list[tuple[RnnActivation, ...]]
    projection: str = ""
    _slices: dict[tuple[str, int], str] = field(default_factory=dict)

    @property
    def width(self) -> int:
        """Columns of the projection: every direction's gate blocks."""
        return self.directions * self.kind.gates * self.hidden

    # -- small emitters ------------------------------------------------------------------------
    def const(self, value, hint: str) -> str:
        name = self.ctx.temp(self.node, hint)
        self.ctx.set_const(name, np.asarray(value, dtype=self.dtype))
        return name

    def binary(self, op: str, a: str, b: str, activation: A.Activation = None) -> str:
        out = self.ctx.temp(self.node, op)
        emit_binary(self.ctx, self.node, op, a, b, out, activation)
        return out

    def matmul(self, a: str, weight: str, bias: str | None, activation: A.Activation) -> str:
        """``a [batch, hidden] . weight^T [hidden, hidden] (+ bias [batch, hidden] or [hidden])``."""
        out = self.ctx.temp(self.node, "gate")
        inputs = (a, weight) + ((bias,) if bias else ())
        bias_strides = (self.hidden, 1) if bias and len(self.ctx.shape(bias)) == 2 else (0, 1)
        self.ctx.emit(A.MatMul(inputs, (out,), self.node.name, m=self.batch, n=self.hidden, k=self.hidden,
                               trans_b=True, has_bias=bias is not None, bias_strides=bias_strides,
                               activation=activation), (self.batch, self.hidden))
        return out

    def apply(self, act: RnnActivation, x: str) -> str:
        """``act(x)``: one Unary, or the composites from Binary and Unary ops."""
        if act.unary is not None:
            out = self.ctx.temp(self.node, act.name)
            emit_unary(self.ctx, self.node, act.unary[0], act.unary[1], x, out)
            return out
        if act.name == "affine":
            scaled = self.binary("mul", x, self.const(act.alpha, "alpha"))
            return self.binary("add", scaled, self.const(act.beta, "beta"))
        if act.name == "scaledtanh":
            scaled = self.binary("mul", x, self.const(act.beta, "beta"), ("tanh", ()))
            return self.binary("mul", scaled, self.const(act.alpha, "alpha"))
        # softsign: x / (1 + |x|)
        magnitude = self.ctx.temp(self.node, "abs")
        emit_unary(self.ctx, self.node, "abs", (), x, magnitude)
        return self.binary("div", x, self.binary("add", magnitude, self.const(1.0, "one")))

    def activate(self, emit_last: Callable[[A.Activation], str], act: RnnActivation) -> str:
        """``act(clip(pre))`` where ``emit_last(epilogue)`` emits the op that finishes ``pre``: the
        clip, or else the activation when one unary computes it, rides on that op's epilogue."""
        if self.clip is not None:
            return self.apply(act, emit_last(("clip", (-self.clip, self.clip))))
        if act.unary is not None:
            return emit_last(act.unary)
        return self.apply(act, emit_last(None))

    # -- slices --------------------------------------------------------------------------------
    def step_input(self, t: int, d: int, gate: int) -> str:
        """Step ``t``'s slice ``[batch, hidden]`` of the projection for one direction and gate."""
        column = (d * self.kind.gates + gate) * self.hidden
        if self.layout == 0:  # rows are (t, b)
            offset, row_stride = t * self.batch * self.width + column, self.width
        else:  # rows are (b, t)
            offset, row_stride = t * self.width + column, self.seq * self.width
        return strided_slice(self.ctx, self.node, self.projection, offset, (self.batch, self.hidden),
                             (row_stride, 1), "step_input")

    def block(self, source: str, offset: int, shape: tuple[int, ...], hint: str) -> str:
        """A contiguous block of a weight (R, P, B): sliced once per node, not per step (folded when constant)."""
        if (source, offset) not in self._slices:
            strides = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
            self._slices[source, offset] = strided_slice(self.ctx, self.node, source, offset, shape, strides, hint)
        return self._slices[source, offset]

    def weight(self, d: int, gate: int) -> str:
        """R's block ``[hidden, hidden]`` of one direction and gate."""
        return self.block(self.node.inputs[2], (d * self.kind.gates + gate) * self.hidden * self.hidden,
                          (self.hidden, self.hidden), "recurrence")

    def gate(self, t: int, d: int, gate: int, h: str, act: RnnActivation, extra: str | None = None) -> str:
        """``act(clip(x_t . W_g^T + h . R_g^T + biases [+ extra]))``."""
        x = self.step_input(t, d, gate)
        if extra is None:
            return self.activate(lambda epilogue: self.matmul(h, self.weight(d, gate), x, epilogue), act)
        pre = self.matmul(h, self.weight(d, gate), x, None)
        return self.activate(lambda epilogue: self.binary("add", pre, extra, epilogue), act)

    def state(self, name: str | None, d: int, hint: str) -> str:
        """Direction ``d``'s ``[batch, hidden]`` part of initial_h/initial_c, or zeros."""
        if name is None:
            return self.const(np.zeros((self.batch, self.hidden)), hint)
        self.expect(name, (self.directions, self.batch, self.hidden) if self.layout == 0
                    else (self.batch, self.directions, self.hidden), hint)
        if self.layout == 0:
            offset, strides = d * self.batch * self.hidden, (self.hidden, 1)
        else:
            offset, strides = d * self.hidden, (self.directions * self.hidden, 1)
        return strided_slice(self.ctx, self.node, name, offset, (self.batch, self.hidden), strides, hint)

    def expect(self, name: str, shape: tuple[int, ...], what: str) -> None:
        got = self.ctx.value(name, self.node).shape
        if tuple(got) != shape:
            raise ModelError(f"node {self.node.name!r} ({self.node.op_type}): {what} of shape {list(got)}, "
                             f"expected {list(shape)}")

    # -- whole-sequence parts ------------------------------------------------------------------
    def project(self, x: str, w: str, b: str | None, keep_recurrent_bias: np.ndarray | None) -> None:
        """The input projection of every step and direction: ``[rows, width]``, rows ordered as X's."""
        ctx, node = self.ctx, self.node
        rows = self.seq * self.batch
        x2d, w2d = ctx.temp(node, "inputs"), ctx.temp(node, "input_weights")
        ctx.alias(x2d, x, (rows, ctx.shape(x)[2]))
        ctx.alias(w2d, w, (self.width, ctx.shape(w)[2]))
        inputs: tuple[str, ...] = (x2d, w2d)
        if b is not None:
            half = self.kind.gates * self.hidden
            w_bias = strided_slice(ctx, node, b, 0, (self.directions, half), (2 * half, 1), "input_bias")
            r_bias = strided_slice(ctx, node, b, half, (self.directions, half), (2 * half, 1), "recurrent_bias")
            if keep_recurrent_bias is not None:  # GRU's linear_before_reset adds Rbh inside the reset product
                r_bias = self.binary("mul", r_bias, self.const(keep_recurrent_bias, "keep"))
            bias = ctx.temp(node, "bias")
            ctx.alias(bias, self.binary("add", w_bias, r_bias), (self.width,))
            inputs += (bias,)
        self.projection = ctx.temp(node, "projection")
        ctx.emit(A.MatMul(inputs, (self.projection,), node.name, m=rows, n=self.width, k=ctx.shape(x)[2],
                          trans_b=True, has_bias=b is not None, bias_strides=(0, 1)), (rows, self.width))

    def gather(self, sources: list[str], arrange: Callable[[np.ndarray], np.ndarray], out: str) -> None:
        """``out = arrange(stack(sources))``, as one Raster (or a folded constant)."""
        unique = list(dict.fromkeys(sources))
        positions = [unique.index(s) for s in sources]
        reorder(self.ctx, self.node, unique, lambda xs, f: [arrange(np.stack([xs[p] for p in positions]))], [out])

    def finish(self, out: str, mask: str | None, build: Callable[[str], None]) -> None:
        """``out = build()`` where ``mask`` is true, else 0."""
        if mask is None:
            build(out)
            return
        raw = self.ctx.temp(self.node, "unmasked")
        build(raw)
        emit_select(self.ctx, self.node, mask, raw, self.const(0.0, "zero"), out)


# -- the cells -------------------------------------------------------------------------------------

Cell = Callable[[Recurrence, int, int, tuple[str, ...]], tuple[str, ...]]


def rnn_cell(r: Recurrence, t: int, d: int, state: tuple[str, ...]) -> tuple[str, ...]:
    """``H = f(x W^T + H R^T + Wb + Rb)``."""
    (f,) = r.activations[d]
    return (r.gate(t, d, 0, state[0], f),)


def gru_cell(r: Recurrence, t: int, d: int, state: tuple[str, ...]) -> tuple[str, ...]:
    """``z, r = f(...)``; ``h~ = g(x Wh^T + (r . H) Rh^T + Wbh + Rbh)`` or, with linear_before_reset,
    ``g(x Wh^T + r . (H Rh^T + Rbh) + Wbh)``; ``H' = h~ + z . (H - h~)``."""
    (h,) = state
    f, g = r.activations[d]
    z = r.gate(t, d, GRU_Z, h, f)
    reset = r.gate(t, d, GRU_R, h, f)
    if r.node.attr("linear_before_reset", 0):
        linear = r.matmul(h, r.weight(d, GRU_H), gru_recurrent_bias(r, d), None)
        gated = r.binary("mul", reset, linear)
        x = r.step_input(t, d, GRU_H)
        candidate = r.activate(lambda epilogue: r.binary("add", x, gated, epilogue), g)
    else:
        candidate = r.gate(t, d, GRU_H, r.binary("mul", reset, h), g)
    return (r.binary("add", candidate, r.binary("mul", z, r.binary("sub", h, candidate))),)


def gru_recurrent_bias(r: Recurrence, d: int) -> str | None:
    """Rbh of direction ``d`` (``[hidden]``), or None without B."""
    b = _input(r.node, 3)
    if b is None:
        return None
    half = r.kind.gates * r.hidden
    return r.block(b, 2 * half * d + half + GRU_H * r.hidden, (r.hidden,), "rbh")


def lstm_cell(r: Recurrence, t: int, d: int, state: tuple[str, ...]) -> tuple[str, ...]:
    """``i, f = f(... + P . C)``, ``g = g(...)``, ``C' = f . C + i . g``, ``o = f(... + Po . C')``,
    ``H' = o . h(C')``; with input_forget ``f = 1 - i``."""
    h, c = state
    f_act, g_act, h_act = r.activations[d]
    p = _input(r.node, 7)

    def peephole(gate: int, cell: str) -> str | None:
        if p is None:
            return None
        return r.binary("mul", cell, r.block(p, (3 * d + PEEPHOLE_OF_GATE[gate]) * r.hidden, (r.hidden,), "peephole"))
    i = r.gate(t, d, LSTM_I, h, f_act, peephole(LSTM_I, c))
    if r.node.attr("input_forget", 0):
        f = r.binary("sub", r.const(1.0, "one"), i)
    else:
        f = r.gate(t, d, LSTM_F, h, f_act, peephole(LSTM_F, c))
    g = r.gate(t, d, LSTM_C, h, g_act)
    c_new = r.binary("add", r.binary("mul", f, c), r.binary("mul", i, g))
    o = r.gate(t, d, LSTM_O, h, f_act, peephole(LSTM_O, c_new))
    return r.binary("mul", o, r.apply(h_act, c_new)), c_new


CELLS: dict[str, Cell] = {"RNN": rnn_cell, "GRU": gru_cell, "LSTM": lstm_cell}


# -- the lowering ----------------------------------------------------------------------------------

@lowers("LSTM", "GRU", "RNN")
def lower_recurrent(ctx: LoweringContext, node: Node, opset: int) -> None:
    kind = KINDS[node.op_type]
    x, w, rec = node.inputs[0], node.inputs[1], node.inputs[2]
    x_shape = ctx.shape(x)
    if len(x_shape) != 3:
        raise ModelError(f"node {node.name!r} ({node.op_type}): X of shape {list(x_shape)} must be 3-D")
    layout = int(node.attr("layout", 0)) if opset >= 14 else 0
    if layout not in (0, 1):
        raise ModelError(f"node {node.name!r} ({node.op_type}): layout {layout} is not 0 or 1")
    seq, batch, inputs = (x_shape[0], x_shape[1], x_shape[2]) if layout == 0 else (x_shape[1], x_shape[0], x_shape[2])
    direction = node.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ModelError(f"node {node.name!r} ({node.op_type}): direction {direction!r} is not forward, reverse "
                         "or bidirectional")
    directions = 2 if direction == "bidirectional" else 1
    if seq == 0 or batch == 0:
        raise UnsupportedOpError(node.op_type, node.name, f"X of shape {list(x_shape)} holds no sequence step")
    r_shape = ctx.shape(rec)
    hidden = int(node.attr("hidden_size", r_shape[-1] if r_shape else 0))
    clip = node.attr("clip")
    if clip is not None and not float(clip) > 0:
        raise ModelError(f"node {node.name!r} ({node.op_type}): clip {clip} must be positive")
    r = Recurrence(ctx, node, kind, seq, batch, hidden, directions, layout, ctx.dtype(x),
                   None if clip is None else float(clip), parse_activations(node, kind, directions))
    gates = kind.gates * hidden
    r.expect(w, (directions, gates, inputs), "W")
    r.expect(rec, (directions, gates, hidden), "R")
    b, p = _input(node, 3), _input(node, 7) if node.op_type == "LSTM" else None
    if b is not None:
        r.expect(b, (directions, 2 * gates), "B")
    if p is not None:
        r.expect(p, (directions, 3 * hidden), "P")
    lengths = SequenceLengths(ctx, node, _input(node, 4), seq, batch)
    keep = None
    if node.op_type == "GRU" and node.attr("linear_before_reset", 0):
        keep = np.ones((kind.gates, hidden))
        keep[GRU_H] = 0.0
        keep = keep.reshape(-1)
    r.project(x, w, b, keep)

    cell = CELLS[node.op_type]
    state_inputs = [_input(node, 5)] + ([_input(node, 6)] if node.op_type == "LSTM" else [])
    outputs: dict[tuple[int, int], str] = {}  # (t, d) -> H after step t
    finals: list[tuple[str, ...]] = []
    for d in range(directions):
        state = tuple(r.state(name, d, hint) for name, hint in zip(state_inputs, ("initial_h", "initial_c")))
        reverse = direction == "reverse" or d == 1
        for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
            valid = lengths.step(t)
            if valid is not False:
                new = cell(r, t, d, state)
                if valid is not None:  # entries past their length keep their state
                    new = tuple(_select(ctx, node, valid, a, old) for a, old in zip(new, state))
                state = new
            outputs[t, d] = state[0]
        finals.append(state)

    s, n, h = seq, directions, hidden
    if _output(node, 0):
        order = [outputs[t, d] for t in range(s) for d in range(n)]
        arrange = (lambda a: a.reshape(s, n, batch, h)) if layout == 0 else \
            (lambda a: a.reshape(s, n, batch, h).transpose(2, 0, 1, 3))
        shape = (s, n, batch, h) if layout == 0 else (batch, s, n, h)
        mask = lengths.mask(shape, 0 if layout == 0 else 1, 2 if layout == 0 else 0)
        r.finish(node.outputs[0], mask, lambda out: r.gather(order, arrange, out))
    final_shape = (n, batch, h) if layout == 0 else (batch, n, h)
    final_mask = lengths.mask(final_shape, None, 1 if layout == 0 else 0)
    arrange_final = (lambda a: a) if layout == 0 else (lambda a: a.transpose(1, 0, 2))
    for k in range(len(state_inputs)):
        if _output(node, 1 + k):
            states = [final[k] for final in finals]
            r.finish(node.outputs[1 + k], final_mask, lambda out: r.gather(states, arrange_final, out))


def _select(ctx: LoweringContext, node: Node, cond: str, a: str, b: str) -> str:
    out = ctx.temp(node, "kept")
    emit_select(ctx, node, cond, a, b, out)
    return out
