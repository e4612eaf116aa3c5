"""Lowering of the recurrent ops LSTM, GRU and RNN to atomic ops, MNN's way.

The input projection ``X . W^T + (Wb + Rb)`` of every time step and direction is one MatMul.
Then each time step of every direction at once is two atomic ops: a batched MatMul (one batch per
direction) ``H_{t-1} . R^T`` of all gates, and a :class:`~gpumnn.atomic.RecurrentCell` that adds
the step's slice of the projection (it reads the whole projection at an offset, so no Raster cuts
the slice), applies the activations and writes the new state (``[2, D, B, H]``: H then C for
LSTM). GRU without ``linear_before_reset`` needs ``r . H`` before its candidate's product: four
ops a step (MatMul of z and r, the ``gru_reset`` cell, the candidate's MatMul, the cell). Rasters
gather the per-step states into Y, Y_h and Y_c at the end.

Why a cell op of its own, where MNN-style lowering gets by with Binary and Unary ops: measured on
a bidirectional LSTM (seq 32, batch 1, input 64, hidden 128), the elementwise lowering was 836
atomic ops, dispatch-bound, several times ONNX Runtime's time; with the cell it is 2 ops a step
for both directions (figures: bench/RESULTS.md).

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

from ... import atomic as A
from ...errors import ModelError, UnsupportedOpError
from ...ir import Node
from ..context import LoweringContext, PendingRaster
from .logic import emit_select
from ..regions import IndexMap
from ..registry import lowers
from ..emit import emit_binary, reorder


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

# GRU's gate blocks in ONNX's weight order
GRU_Z, GRU_R, GRU_H = range(3)

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

    ``cell_input(steps)`` is what a step's cell reads; ``mask(shape, t_axis, b_axis)`` is the bool
    mask ``t < len[b]`` broadcast over ``shape`` (None when all true).
    """

    def __init__(self, ctx: LoweringContext, node: Node, name: str | None, seq: int, batch: int):
        self.ctx, self.node, self.seq, self.batch = ctx, node, seq, batch
        self.name, self.lengths = name, None
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

    def cell_input(self, steps: Sequence[int]) -> None | bool | str:
        """What a cell at time index ``steps[d]`` of each direction reads for the lengths: None (every
        entry is inside its sequence), False (none is, in any direction: the step is skipped) or the
        lengths tensor."""
        if not self.masked:
            return None
        if self.lengths is not None:
            valid = np.asarray(steps).reshape(-1, 1) < self.lengths.reshape(1, -1)
            if valid.all():
                return None
            if not valid.any():
                return False
        return self.name

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
    """One LSTM/GRU/RNN node being lowered: its geometry, and the emitters its steps share."""

    ctx: LoweringContext
    node: Node
    kind: CellKind
    seq: int
    batch: int
    hidden: int
    directions: int
    reverse: tuple[bool, ...]  # per direction: does it run from the last step to the first
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

    @property
    def state_blocks(self) -> int:
        """Blocks ``[D, B, H]`` of a state tensor: H, and C for LSTM."""
        return 2 if self.node.op_type == "LSTM" else 1

    def const(self, value, hint: str) -> str:
        name = self.ctx.temp(self.node, hint)
        self.ctx.set_const(name, np.asarray(value, dtype=self.dtype))
        return name

    def binary(self, op: str, a: str, b: str) -> str:
        out = self.ctx.temp(self.node, op)
        emit_binary(self.ctx, self.node, op, a, b, out)
        return out

    def block(self, source: str, offset: int, shape: tuple[int, ...], strides: tuple[int, ...], hint: str) -> str:
        """A block of a weight (R, B): sliced once per node, not per step (folded when constant)."""
        if (source, offset) not in self._slices:
            self._slices[source, offset] = strided_slice(self.ctx, self.node, source, offset, shape, strides, hint)
        return self._slices[source, offset]

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
            inputs += (self.projection_bias(b, keep_recurrent_bias),)
        self.projection = ctx.temp(node, "projection")
        ctx.emit(A.MatMul(inputs, (self.projection,), node.name, m=rows, n=self.width, k=ctx.shape(x)[2],
                          trans_b=True, has_bias=b is not None, bias_strides=(0, 1)), (rows, self.width))

    def projection_bias(self, b: str, keep_recurrent_bias: np.ndarray | None) -> str:
        """``Wb + Rb`` of every direction as one vector ``[width]`` (Rbh left out where GRU's
        linear_before_reset adds it inside the reset product)."""
        ctx, node = self.ctx, self.node
        half = self.kind.gates * self.hidden
        w_bias = strided_slice(ctx, node, b, 0, (self.directions, half), (2 * half, 1), "input_bias")
        r_bias = strided_slice(ctx, node, b, half, (self.directions, half), (2 * half, 1), "recurrent_bias")
        if keep_recurrent_bias is not None:
            r_bias = self.binary("mul", r_bias, self.const(keep_recurrent_bias, "keep"))
        bias = ctx.temp(node, "bias")
        ctx.alias(bias, self.binary("add", w_bias, r_bias), (self.width,))
        return bias

    def initial_state(self, names: Sequence[str | None]) -> str:
        """``[S, D, B, H]`` from initial_h (and initial_c), zeros where absent: one Raster, or a constant."""
        d, b, h = self.directions, self.batch, self.hidden
        given = (d, b, h) if self.layout == 0 else (b, d, h)
        sources = []
        for name, hint in zip(names, ("initial_h", "initial_c")):
            if name is None:
                sources.append(self.const(np.zeros(given), hint))
            else:
                self.expect(name, given, hint)
                sources.append(name)
        out = self.ctx.temp(self.node, "state")
        self.gather(sources, (lambda a: a) if self.layout == 0 else (lambda a: a.transpose(0, 2, 1, 3)), out)
        return out

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

    # -- one step ------------------------------------------------------------------------------
    def product(self, a: str, weight: str, n: int, weight_stride: int) -> str:
        """``a[d] . weight[d]^T`` for every direction d: ``[D, B, n]``, ``a`` read as ``[D, B, H]`` (the
        H block of a state), ``weight[d]`` ``[n, H]`` at ``d * weight_stride``."""
        out = self.ctx.temp(self.node, "gates")
        d, b, h = self.directions, self.batch, self.hidden
        self.ctx.emit(A.MatMul((a, weight), (out,), self.node.name, batch=d, m=b, n=n, k=h, a_batch_stride=b * h,
                               b_batch_stride=weight_stride, trans_b=True), (d, b, n))
        return out

    def cell(self, cell: str, inputs: tuple[str, ...], steps: tuple[int, ...], lengths: str | None,
             out_blocks: int, **flags) -> str:
        """A RecurrentCell over every direction at time indices ``steps``."""
        d, b, h, width = self.directions, self.batch, self.hidden, self.width
        gates = self.kind.gates
        if self.layout == 0:  # projection rows are (t, b)
            offsets, row_stride = [t * b * width + k * gates * h for k, t in enumerate(steps)], width
        else:  # rows are (b, t)
            offsets, row_stride = [t * width + k * gates * h for k, t in enumerate(steps)], self.seq * width
        per = A.CELLS[cell][1]
        acts = tuple((a.name, a.alpha, a.beta) for direction in self.activations for a in direction[:per])
        out = self.ctx.temp(self.node, cell)
        op = A.RecurrentCell(inputs + ((lengths,) if lengths else ()), (out,), self.node.name, cell=cell,
                             directions=d, batch=b, hidden=h, x_offsets=tuple(offsets), x_row_stride=row_stride,
                             steps=steps, activations=acts, clip=self.clip or 0.0, has_lengths=lengths is not None,
                             **flags)
        assert len(op.inputs) == len(op.input_roles()), (op.inputs, op.input_roles())
        self.ctx.emit(op, (out_blocks, d, b, h))
        return out

    def step(self, state: str, steps: tuple[int, ...], lengths: str | None) -> str:
        """The state after time indices ``steps`` (one per direction)."""
        node, h, g = self.node, self.hidden, self.kind.gates
        rec = node.inputs[2]
        if node.op_type == "LSTM":
            p = _input(node, 7)
            gates = self.product(state, rec, g * h, g * h * h)
            return self.cell("lstm", (gates, self.projection, state) + ((p,) if p else ()), steps, lengths, 2,
                             has_peephole=p is not None, input_forget=bool(node.attr("input_forget", 0)))
        if node.op_type == "RNN":
            return self.cell("rnn", (self.product(state, rec, h, h * h), self.projection, state), steps, lengths, 1)
        b = _input(node, 3)
        if node.attr("linear_before_reset", 0):
            extra = ()
            if b is not None:  # Rbh of each direction
                extra = (self.block(b, g * h + GRU_H * h, (self.directions, h), (2 * g * h, 1), "rbh"),)
            gates = self.product(state, rec, g * h, g * h * h)
            return self.cell("gru", (gates, self.projection, state) + extra, steps, lengths, 1,
                             linear_before_reset=True, has_recurrent_bias=b is not None)
        zr = self.product(state, rec, 2 * h, g * h * h)
        reset = self.cell("gru_reset", (zr, self.projection, state), steps, None, 1)
        weight = self.block(rec, GRU_H * h * h, (self.directions, h, h), (g * h * h, h, 1), "candidate_weights")
        candidate = self.product(reset, weight, h, h * h)
        return self.cell("gru", (zr, self.projection, state, candidate), steps, lengths, 1)


# -- the lowering ----------------------------------------------------------------------------------

@lowers("LSTM", "GRU", "RNN")
def lower_recurrent(ctx: LoweringContext, node: Node, opset: int) -> None:
    lower_recurrence(ctx, node, opset, Recurrence)


def lower_recurrence(ctx: LoweringContext, node: Node, opset: int, make: Callable[..., Recurrence]) -> None:
    """Lower an LSTM, GRU or RNN node with the projection and products of the Recurrence ``make`` builds."""
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
    reverse = (direction == "reverse",) if directions == 1 else (False, True)
    r = make(ctx, node, kind, seq, batch, hidden, directions, reverse, layout, ctx.dtype(x),
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

    state_inputs = [_input(node, 5)] + ([_input(node, 6)] if node.op_type == "LSTM" else [])
    state = r.initial_state(state_inputs)
    states: list[str] = []  # the state after each step k (time index k forward, seq-1-k reverse)
    for k in range(seq):
        steps = tuple(seq - 1 - k if rev else k for rev in reverse)
        valid = lengths.cell_input(steps)
        if valid is not False:
            state = r.step(state, steps, valid)
        states.append(state)

    s, n, h = seq, directions, hidden
    if _output(node, 0):
        # Y[t, d] is H after the step at time index t of direction d
        step_of = np.array([[s - 1 - t if rev else t for rev in reverse] for t in range(s)])
        arrange = (lambda a: a[step_of, 0, np.arange(n)[None, :]]) if layout == 0 else \
            (lambda a: a[step_of, 0, np.arange(n)[None, :]].transpose(2, 0, 1, 3))
        shape = (s, n, batch, h) if layout == 0 else (batch, s, n, h)
        mask = lengths.mask(shape, 0 if layout == 0 else 1, 2 if layout == 0 else 0)
        r.finish(node.outputs[0], mask, lambda out: r.gather(states, arrange, out))
    final_shape = (n, batch, h) if layout == 0 else (batch, n, h)
    final_mask = lengths.mask(final_shape, None, 1 if layout == 0 else 0)
    for k in range(r.state_blocks):
        if _output(node, 1 + k):
            pick = (lambda a, k=k: a[0, k]) if layout == 0 else (lambda a, k=k: a[0, k].transpose(1, 0, 2))
            r.finish(node.outputs[1 + k], final_mask, lambda out, pick=pick: r.gather([state], pick, out))
