"""The RecurrentCell atomic op in NumPy: the reference semantics of one LSTM/GRU/RNN time step.

:func:`cell_step` computes on arrays (views the NumPy backend cuts out of its pools); the op's
contract is the docstring of :class:`gpumnn.atomic.RecurrentCell`, which this follows line by line.
The arrays are small (a step of one sequence is a few hundred elements), so the time goes to
NumPy's per-call overhead: every direction is computed by the same calls where the directions
share their activations (the usual case), and gates that share an activation are one call.
"""
from __future__ import annotations

import functools
from typing import Callable, Mapping

import numpy as np

from ... import atomic as A
from . import activations as cpu_activations, jit as cpu_jit
from .elementwise import unary_function

F32 = np.float32
Fn = Callable[[np.ndarray], np.ndarray]


#: cell activations that are Unary ops too (``cpu_math``): name there, and how many of the cell's
#: (alpha, beta) they take as parameters
AS_UNARY: dict[str, tuple[str, int]] = {
    "relu": ("relu", 0), "tanh": ("tanh", 0), "sigmoid": ("sigmoid", 0), "leakyrelu": ("leaky_relu", 1),
    "thresholdedrelu": ("thresholded_relu", 1), "hardsigmoid": ("hard_sigmoid", 2), "elu": ("elu", 1),
    "softplus": ("softplus", 0)}


def _activation(name: str, alpha: float, beta: float) -> Fn:
    """One of ``atomic.CELL_ACTIVATIONS`` as a float32 NumPy function that overwrites its argument
    (always a temporary) and returns it: the Unary op's own function where ONNX's RNN list and
    the Unary ops share one, else here (affine, scaled tanh and softsign are cell-only)."""
    if name in AS_UNARY:
        unary, count = AS_UNARY[name]
        fn = unary_function(unary, (alpha, beta)[:count], np.dtype(np.float32))

        def in_place(x: np.ndarray) -> np.ndarray:
            fn(x, x)
            return x
        return in_place
    a, b = F32(alpha), F32(beta)
    table: dict[str, Fn] = {
        "affine": lambda x: np.add(np.multiply(x, a, out=x), b, out=x),
        "scaledtanh": lambda x: np.multiply(np.tanh(np.multiply(x, b, out=x), out=x), a, out=x),
        "softsign": lambda x: np.divide(x, F32(1) + np.abs(x), out=x),
    }
    return table[name]


def direction_groups(op: A.RecurrentCell) -> list[tuple[slice, list[Fn]]]:
    """Runs of directions computed together (all of them when they share their activations), each
    with its activation functions (``f``, ``g``, ``h`` as the cell takes them)."""
    per = A.CELLS[op.cell][1]
    lists = [op.activations[d * per:(d + 1) * per] for d in range(op.directions)]
    if all(entries == lists[0] for entries in lists):
        return [(slice(0, op.directions), [_activation(*e) for e in lists[0]])]
    return [(slice(d, d + 1), [_activation(*e) for e in entries]) for d, entries in enumerate(lists)]


def cell_step(op: A.RecurrentCell, groups, gates: np.ndarray, x: np.ndarray, state: np.ndarray,
              extra: Mapping[str, np.ndarray], out: np.ndarray) -> None:
    """One step: ``gates`` ``[D, B, G, H]``, ``x`` ``[D, B, P, H]`` (the projection's step slices, P
    its gate blocks), ``state`` ``[S, D, B, H]``, ``extra`` the optional inputs by role (candidate
    ``[D, B, H]``, recurrent_bias ``[D, 1, H]``, peephole ``[D, 1, 3, H]``, lengths ``[B]``), ``out``
    ``[O, D, B, H]`` (never the memory of an input)."""
    clip = F32(op.clip)
    bound = (lambda v: np.clip(v, -clip, clip, out=v)) if op.clip > 0 else (lambda v: v)
    lengths = extra.get("lengths")
    for ds, fns in groups:
        g, xd, h = gates[ds], x[ds], state[0, ds]
        # where the new state goes: out itself, or (with lengths) temporaries merged into it below
        merge = lengths is not None and op.cell != "gru_reset"
        dest = np.empty_like(out[:, ds]) if merge else out[:, ds]
        if op.cell == "rnn":
            np.copyto(dest[0], fns[0](bound(np.add(g[:, :, 0], xd[:, :, 0]))))
        elif op.cell == "gru_reset":
            np.multiply(fns[0](bound(np.add(g[:, :, 1], xd[:, :, 1]))), h, out=dest[0])
        elif op.cell == "gru":
            zr = fns[0](bound(np.add(g[:, :, :2], xd[:, :, :2])))
            z, r = zr[:, :, 0], zr[:, :, 1]
            if op.linear_before_reset:
                recurrent = g[:, :, 2] + extra["recurrent_bias"][ds] if op.has_recurrent_bias else g[:, :, 2]
                n = fns[1](bound(np.add(xd[:, :, 2], r * recurrent)))
            else:
                n = fns[1](bound(np.add(xd[:, :, 2], extra["candidate"][ds])))
            np.subtract(h, n, out=dest[0])  # H' = n + z (H - n)
            dest[0] *= z
            dest[0] += n
        else:
            _lstm(op, fns, bound, np.add(g, xd), state[1, ds], extra.get("peephole"), ds, dest)
        if merge:  # rows past their length keep their state
            steps = np.asarray(op.steps[ds], dtype=np.int64).reshape(-1, 1, 1)
            keep = lengths.reshape(1, -1, 1) <= steps
            np.copyto(dest, state[:op.output_blocks, ds], where=keep)
            np.copyto(out[:, ds], dest)


def _lstm(op: A.RecurrentCell, fns: list[Fn], bound, pre: np.ndarray, c: np.ndarray, peephole, ds: slice,
          dest: np.ndarray) -> None:
    """(H', C') into ``dest`` from the gates' pre-activations ``pre`` ``[D, B, 4, H]`` (i, o, f, c; a
    temporary) and C."""
    f_act, g_act, h_act = fns
    if peephole is None:  # i, o, f share f: one call
        iof = f_act(bound(pre[:, :, :3]))
        i, o, f = iof[:, :, 0], iof[:, :, 1], iof[:, :, 2]
    else:
        p = peephole[ds]
        i = f_act(bound(pre[:, :, 0] + p[:, :, 0] * c))
        f = f_act(bound(pre[:, :, 2] + p[:, :, 2] * c))
    if op.input_forget:
        f = F32(1) - i
    c_new = dest[1]
    np.multiply(f, c, out=c_new)
    candidate = g_act(bound(pre[:, :, 3]))
    candidate *= i
    c_new += candidate
    if peephole is not None:
        o = f_act(bound(pre[:, :, 1] + peephole[ds][:, :, 1] * c_new))
    np.copyto(dest[0], c_new)
    np.multiply(h_act(dest[0]), o, out=dest[0])


# -- one compiled pass for the usual LSTM step ----------------------------------------------------
# ONNX's default LSTM (sigmoid, tanh, tanh; no clip, peephole, lengths or coupled gates) is what
# exporters write. As NumPy calls a step costs a dozen calls of a few hundred elements, each
# mostly its fixed cost; as one loop it is a pass over the step's gates.

_ONE, _TWO = np.float32(1.0), np.float32(2.0)


@cpu_jit.inlined
def _tanh(v):
    """tanh(v) = sign(v) (1 - e^-2|v|) / (1 + e^-2|v|) (absolute error about 1e-7; NaN passes)."""
    e = cpu_activations.exp_neg(_TWO * abs(v))
    t = (_ONE - e) / (_ONE + e)
    return t if v >= 0 else (-t if v < 0 else v)


@functools.partial(cpu_jit.compiled, error_model="numpy")  # no zero test per division: the loop vectorises
def lstm_steps(gates, projection, x_offsets, row_stride, state, out, directions, batch, hidden):
    """RecurrentCell's ``lstm`` with the default activations: ``gates`` [D, B, 4, H], the
    projection's gate rows of direction d and row b at ``x_offsets[d] + b * row_stride``,
    ``state`` [2, D, B, H] (H, C), ``out`` [2, D, B, H] (H', C'), all flat float32."""
    rows = directions * batch
    for d in range(directions):
        for b in range(batch):
            row = d * batch + b
            g = gates[row * 4 * hidden:(row + 1) * 4 * hidden]
            x0 = x_offsets[d] + b * row_stride
            x = projection[x0:x0 + 4 * hidden]
            c = state[(rows + row) * hidden:(rows + row + 1) * hidden]
            h_new = out[row * hidden:(row + 1) * hidden]
            c_new = out[(rows + row) * hidden:(rows + row + 1) * hidden]
            for j in range(hidden):
                i = cpu_activations.sigmoid_value(g[j] + x[j])
                o = cpu_activations.sigmoid_value(g[hidden + j] + x[hidden + j])
                f = cpu_activations.sigmoid_value(g[2 * hidden + j] + x[2 * hidden + j])
                cell = f * c[j] + i * _tanh(g[3 * hidden + j] + x[3 * hidden + j])
                c_new[j] = cell
                h_new[j] = o * _tanh(cell)


def compiled_lstm_step(op: A.RecurrentCell, gates: np.ndarray, projection: np.ndarray, state: np.ndarray,
                       out: np.ndarray) -> Callable[[], None] | None:
    """The work of ``op`` as ``lstm_steps`` on flat float32 arrays (``projection``: the whole
    projection tensor), or None where the step is not the usual LSTM's or Numba is missing."""
    usual = (op.cell == "lstm" and op.clip == 0 and not (op.input_forget or op.has_peephole or op.has_lengths)
             and all(a[0] == name for a, name in zip(op.activations, ("sigmoid", "tanh", "tanh") * op.directions)))
    arrays = (gates, projection, state, out)
    if not usual or cpu_jit.numba is None or any(a.dtype != np.float32 or a.ndim != 1 for a in arrays):
        return None
    offsets = np.asarray(op.x_offsets, np.int64)
    args = (gates, projection, offsets, np.int64(op.x_row_stride), state, out, np.int64(op.directions),
            np.int64(op.batch), np.int64(op.hidden))
    compiled = cpu_jit.bind(lstm_steps, *args)
    return lambda: compiled(*args)
