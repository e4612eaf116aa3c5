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
from ..base import Execution, TensorHandle
from . import activations as cpu_activations, jit as cpu_jit, parallel as cpu_parallel, tiles as cpu_tiles
from .constants import PackedConstants, is_constant, made_once
from .elementwise import unary_function
from .engines import Engine
from .reference import strided, typed

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


@cpu_jit.inlined
def _lstm_cell(g, x, c, h_new, c_new, hidden):
    """The usual LSTM cell of one row: gates ``g`` and projection ``x`` [4H] (i, o, f, c), state C
    ``c`` [H] -> ``h_new``, ``c_new`` [H] (slices, so that the loop vectorises)."""
    for j in range(hidden):
        i = cpu_activations.sigmoid_value(g[j] + x[j])
        o = cpu_activations.sigmoid_value(g[hidden + j] + x[hidden + j])
        f = cpu_activations.sigmoid_value(g[2 * hidden + j] + x[2 * hidden + j])
        cell = f * c[j] + i * _tanh(g[3 * hidden + j] + x[3 * hidden + j])
        c_new[j] = cell
        h_new[j] = o * _tanh(cell)


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
            _lstm_cell(g, x, c, h_new, c_new, hidden)


def usual_lstm(op: A.RecurrentCell) -> bool:
    """Whether ``op`` is ONNX's default LSTM step (sigmoid, tanh, tanh; no clip, peephole, lengths
    or coupled gates): the step the compiled loops here take."""
    return (op.cell == "lstm" and op.clip == 0 and not (op.input_forget or op.has_peephole or op.has_lengths)
            and all(a[0] == name for a, name in zip(op.activations, ("sigmoid", "tanh", "tanh") * op.directions)))


def compiled_lstm_step(op: A.RecurrentCell, gates: np.ndarray, projection: np.ndarray, state: np.ndarray,
                       out: np.ndarray) -> Callable[[], None] | None:
    """The work of ``op`` as ``lstm_steps`` on flat float32 arrays (``projection``: the whole
    projection tensor), or None where the step is not the usual LSTM's or Numba is missing."""
    usual = usual_lstm(op)
    arrays = (gates, projection, state, out)
    if not usual or cpu_jit.numba is None or any(a.dtype != np.float32 or a.ndim != 1 for a in arrays):
        return None
    offsets = np.asarray(op.x_offsets, np.int64)
    args = (gates, projection, offsets, np.int64(op.x_row_stride), state, out, np.int64(op.directions),
            np.int64(op.batch), np.int64(op.hidden))
    compiled = cpu_jit.bind(lstm_steps, *args)
    return functools.partial(compiled, *args)


# -- a run of LSTM steps as one call --------------------------------------------------------------
# The lowering makes each step two ops, the recurrent product (a MatMul of the H block of the state
# by R^T) and the cell. Recorded one by one, a step is two calls of a few microseconds, each
# direction's product reading the whole of R from L2 on one thread. A run of such pairs, recorded
# together, is one call here: each direction's steps in one loop (its product on R^T packed once,
# then the cell), the directions on the region's threads, since no direction reads another's state.

_WIDE, _ROW = cpu_tiles.WIDE, cpu_tiles.ROW


def recurrent_blocks(r_t: np.ndarray) -> np.ndarray:
    """R^T ``r_t`` [D, H, 4H] laid [D, H * 4H] for ``_lstm_direction``: each WIDE columns one block
    [H, WIDE] after the other, then the columns left as one block [H, rest], so that a step's product
    reads each block as one run of memory (one stream for the prefetcher, not H rows 4H apart)."""
    d, h, width = r_t.shape
    full = width - width % _WIDE
    blocks = r_t[:, :, :full].reshape(d, h, full // _WIDE, _WIDE).transpose(0, 2, 1, 3).reshape(d, h * full)
    return np.ascontiguousarray(np.concatenate([blocks, r_t[:, :, full:].reshape(d, -1)], axis=1), np.float32)


@cpu_jit.inlined
def _lstm_direction(d, pool, state_offsets, out_offsets, x_offsets, row_stride, projection, weights, gates, batch,
                    hidden):
    """Direction ``d`` of every step p of a run: gates = H . R_d^T (``weights[d]``: R^T laid by
    ``recurrent_blocks``) into ``gates[d]``, then the usual LSTM cell, reading the state [2, D, B, H]
    at ``state_offsets[p]`` of ``pool`` and the projection's gate rows at ``x_offsets[p, d] + b *
    row_stride``, and writing (H', C') at ``out_offsets[p]`` of ``pool``."""
    width = 4 * hidden
    full = width - width % _WIDE  # columns in whole blocks of WIDE
    tail = width - full
    rows = x_offsets.shape[1] * batch
    w, g = weights[d], gates[d]
    w_at, g_at = w.ctypes.data, g.ctypes.data
    tail_at = w_at + 4 * full * hidden
    for p in range(state_offsets.shape[0]):
        s0, o0 = state_offsets[p], out_offsets[p]
        for b in range(batch):
            row = d * batch + b
            h_at = pool.ctypes.data + 4 * (s0 + row * hidden)
            for n0 in range(0, full, _WIDE):
                cpu_tiles.wide_product(h_at, 1, w_at + 4 * n0 * hidden, _WIDE, hidden, g_at + 4 * n0)
            n0 = full
            while n0 + _ROW <= width:
                cpu_tiles.row_product(h_at, 1, tail_at + 4 * (n0 - full), tail, hidden, g_at + 4 * n0)
                n0 += _ROW
            for j in range(n0, width):
                total = np.float32(0.0)
                for k in range(hidden):
                    total += pool[s0 + row * hidden + k] * w[full * hidden + k * tail + j - full]
                g[j] = total
            x0 = x_offsets[p, d] + b * row_stride
            c0 = s0 + (rows + row) * hidden
            h_new, c_new = o0 + row * hidden, o0 + (rows + row) * hidden
            _lstm_cell(g, projection[x0:x0 + width], pool[c0:c0 + hidden], pool[h_new:h_new + hidden],
                       pool[c_new:c_new + hidden], hidden)


@functools.partial(cpu_jit.compiled, error_model="numpy")
def lstm_sequence(pool, state_offsets, out_offsets, x_offsets, row_stride, projection, weights, gates, batch,
                  hidden):
    """A run of LSTM steps (``_lstm_direction``), the directions one after the other."""
    for d in range(x_offsets.shape[1]):
        _lstm_direction(d, pool, state_offsets, out_offsets, x_offsets, row_stride, projection, weights, gates,
                        batch, hidden)


def _lstm_sequence_region(pool, state_offsets, out_offsets, x_offsets, row_stride, projection, weights, gates,
                          batch, hidden):
    """A run of LSTM steps (``_lstm_direction``), each direction on a thread of the region."""
    for d in cpu_jit.numba.prange(x_offsets.shape[1]):
        _lstm_direction(d, pool, state_offsets, out_offsets, x_offsets, row_stride, projection, weights, gates,
                        batch, hidden)


lstm_sequence_region = (cpu_parallel.compiled_region(_lstm_sequence_region, error_model="numpy")
                        if cpu_jit.numba is not None else _lstm_sequence_region)


def _same(a: TensorHandle, b: TensorHandle) -> bool:
    return a.buffer is b.buffer and a.offset == b.offset and a.shape == b.shape


def _lstm_pair(product: Execution, cell: Execution) -> bool:
    """Whether ``product`` is the recurrent product whose gates the usual LSTM step ``cell`` reads,
    of the state the cell reads, all float32, by constant weights."""
    m, c = product.op, cell.op
    if not (isinstance(m, A.MatMul) and isinstance(c, A.RecurrentCell) and usual_lstm(c)):
        return False
    d, b, h = c.directions, c.batch, c.hidden
    gates, _, state = cell.inputs[:3]
    shape_ok = (m.batch == d and m.m == b and m.n == 4 * h and m.k == h and m.trans_b and not m.trans_a
                and not m.has_bias and m.activation is None and m.alpha == 1.0
                and m.a_batch_stride == b * h and (d == 1 or m.b_batch_stride == 4 * h * h))
    handles = [*product.inputs, *cell.inputs, *cell.outputs]
    return (shape_ok and all(x.dtype == A.FLOAT32 for x in handles) and len(product.inputs) == 2
            and is_constant(product.inputs[1])  # R
            and _same(product.outputs[0], gates) and product.inputs[0].buffer is state.buffer
            and product.inputs[0].offset == state.offset)


def _pairs_compatible(first: tuple[Execution, Execution], later: tuple[Execution, Execution]) -> bool:
    """Whether ``later`` is a step of the same recurrence as ``first``: the same sizes, weights and projection."""
    (m0, c0), (m1, c1) = first, later
    a, b = c0.op, c1.op
    return ((a.directions, a.batch, a.hidden, a.x_row_stride) == (b.directions, b.batch, b.hidden, b.x_row_stride)
            and _same(m0.inputs[1], m1.inputs[1]) and _same(c0.inputs[1], c1.inputs[1])
            and c1.outputs[0].buffer is c0.outputs[0].buffer)


def _apart(ranges: list[tuple[int, int]], others: list[tuple[int, int]] = ()) -> bool:
    """Whether ``ranges`` ([start, stop) element spans) are pairwise identical or disjoint and
    every one of ``others`` is disjoint from all of them: each direction's slices of a step's state
    and output are then no other direction's, so the directions may run apart."""
    spans = sorted(set(ranges))
    if any(spans[i][1] > spans[i + 1][0] for i in range(len(spans) - 1)):
        return False
    return all(s1 <= start or stop <= s0 for s0, s1 in others for start, stop in spans)


def lstm_runs(executions: list[Execution], engine: Engine,
              constants: PackedConstants | None) -> list[tuple[int, int, Callable[[], None]]]:
    """Runs [start, stop) of ``executions`` that are consecutive (recurrent product, usual LSTM
    step) pairs of one recurrence, each with the one call that computes it (``lstm_sequence``):
    what a recording puts in their place. The gates tensors are not written: each pair's cell is
    their only reader (``_read_later`` checks that no later execution reads what they leave)."""
    if not engine.jit:
        return []
    found, i = [], 0
    while i + 1 < len(executions):
        if not _lstm_pair(executions[i], executions[i + 1]):
            i += 1
            continue
        stop = i + 2
        while (stop + 1 < len(executions) and _lstm_pair(executions[stop], executions[stop + 1])
               and _pairs_compatible((executions[i], executions[i + 1]), (executions[stop], executions[stop + 1]))):
            stop += 2
        work = _lstm_run_work([(executions[k], executions[k + 1]) for k in range(i, stop, 2)], executions, stop,
                              engine, constants)
        if work is not None:
            found.append((i, stop, work))
        i = stop
    return found


def _overlaps(a: TensorHandle, b: TensorHandle) -> bool:
    return a.buffer is b.buffer and a.offset < b.offset + b.size and b.offset < a.offset + a.size


def _read_later(temporaries: list[TensorHandle], later: list[Execution]) -> bool:
    """Whether an execution of ``later`` (in run order) reads memory of ``temporaries`` before
    one writes it: the values a run of steps leaves there unwritten would be read."""
    pending = list(temporaries)
    for exe in later:
        if any(_overlaps(x, t) for x in exe.inputs for t in pending):
            return True
        pending = [t for t in pending if not any(_overlaps(y, t) and y.offset <= t.offset
                                                  and t.offset + t.size <= y.offset + y.size for y in exe.outputs)]
        if not pending:
            return False
    return False


def _lstm_run_work(pairs: list[tuple[Execution, Execution]], executions: list[Execution], after: int, engine: Engine,
                   constants: PackedConstants | None) -> Callable[[], None] | None:
    """The call computing ``pairs`` (``lstm_runs``; ``executions[after:]`` the executions recorded
    after them), or None where their tensors overlap in a way that ties the directions together,
    or a later execution reads a gates tensor before writing it."""
    first_product, first_cell = pairs[0]
    op = first_cell.op
    d, b, h = op.directions, op.batch, op.hidden
    pool_buffer = first_cell.outputs[0].buffer
    pool = typed(first_cell.outputs[0])
    if _read_later([cell.inputs[0] for _, cell in pairs], executions[after:]):
        return None
    states = [cell.inputs[2] for _, cell in pairs]
    outs = [cell.outputs[0] for _, cell in pairs]
    projection_handle = first_cell.inputs[1]
    read_only = [(projection_handle.offset, projection_handle.offset + projection_handle.size)] \
        if projection_handle.buffer is pool_buffer else []
    if any(s.buffer is not pool_buffer for s in states) or not _apart(
            [(x.offset, x.offset + x.size) for x in outs + states], read_only):
        return None
    weights_handle = first_product.inputs[1]
    product = first_product.op
    r = strided(weights_handle, 0, (d, 4 * h, h), (product.b_batch_stride, h, 1)).transpose(0, 2, 1)
    weights = made_once(constants, weights_handle, ("recurrent_blocks", r.shape, r.strides),
                        lambda: recurrent_blocks(r))
    args = (pool, np.array([s.offset for s in states], np.int64), np.array([o.offset for o in outs], np.int64),
            np.array([cell.op.x_offsets for _, cell in pairs], np.int64).reshape(len(pairs), d),
            np.int64(op.x_row_stride), typed(projection_handle)[projection_handle.offset:], weights,
            np.zeros((d, 4 * h), np.float32), np.int64(b), np.int64(h))
    kernel = lstm_sequence_region if engine.recurrence(d).kernel == "lstm_sequence_region" else lstm_sequence
    compiled = cpu_jit.bind(kernel, *args)
    return functools.partial(compiled, *args)
