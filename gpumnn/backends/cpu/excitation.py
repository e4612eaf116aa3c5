"""Squeeze-excitation blocks as one compiled call.

A block is four ops: a global average pool of x (or a mean over its spatial axes), a one-pixel
convolution (the squeeze) and a second one (the excitation, often a hard-sigmoid gate), and x
scaled by the gate per channel. On the small planes of a mobile network's late stages each op is so
short that a run spent about as much time entering the four calls as computing them
(bench/RESULTS.md, s18). A recording puts one call in their place (``excitation_runs``), on the
calling thread or, for large products, on the region's threads (``Engine.excitation``). It writes
every tensor the four wrote, so no later reader, a model output among them, is left without its values.
"""
from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from ... import atomic as A
from ..base import Execution, TensorHandle
from ...numerics.strides import contiguous_strides, merge_dims
from . import jit as cpu_jit, parallel as cpu_parallel, tiles as cpu_tiles
from .compiled import _activation_kind, _bounds, _row_broadcast, one_pixel_operands, row_value_index
from .constants import PackedConstants, is_constant, made_once
from .engines import Engine
from .parallel import finish_span
from .reference import _compiled_clamp, _spans, view
from .rows import ROW_FAST, _row_sum

numba = cpu_jit.numba


def _same_memory(a: TensorHandle, b: TensorHandle) -> bool:
    return a.buffer is b.buffer and a.offset == b.offset and a.size == b.size


def _global_average(exe: Execution) -> tuple[int, int] | None:
    """(rows, width) where ``exe`` takes the mean of each row of its float32 input seen as [rows,
    width]: a global average pool (rows its images' channels) or a ReduceMean over an NCHW tensor's
    spatial axes (as ``torch.onnx``'s newer exporter writes the squeeze), else None."""
    op = exe.op
    if exe.inputs[0].dtype != A.FLOAT32:
        return None
    if (isinstance(op, A.Pool2D) and op.op == "avg" and op.kernel == op.in_hw and op.out_hw == (1, 1)
            and not any(op.pads)):
        return op.batch * op.channels, op.in_hw[0] * op.in_hw[1]
    if isinstance(op, A.Reduce) and op.op == "mean" and op.inner == 1:
        return op.outer, op.size
    return None


def _one_pixel(exe: Execution, source: TensorHandle, channels: int, engine: Engine) -> bool:
    """Whether ``exe`` is a one-pixel convolution of ``source`` (``channels`` deep) on constant
    weights that the engine runs as ``small_product``."""
    op = exe.op
    if not (isinstance(op, A.Conv2D) and op.in_channels == channels and not op.has_residual
            and _same_memory(exe.inputs[0], source) and is_constant(exe.inputs[1])):
        return False
    return engine.conv(op, True).kernel == "small_product"


def excitation_runs(executions: list[Execution], engine: Engine,
                    constants: PackedConstants | None) -> list[tuple[int, int, Callable[[], None]]]:
    """Runs [start, stop) of ``executions`` that are one squeeze-excitation block (the module's
    docstring) the engine runs as one call (``Engine.excitation``), each with the call that computes it."""
    if not engine.jit:
        return []
    found, i = [], 0
    while i + 4 <= len(executions):
        work = _block_work(executions[i:i + 4], engine, constants)
        if work is None:
            i += 1
            continue
        found.append((i, i + 4, work))
        i += 4
    return found


def _block_work(block: list[Execution], engine: Engine,
                constants: PackedConstants | None) -> Callable[[], None] | None:
    """The call computing ``block`` (pool, squeeze, excitation, scale), or None where the four are
    not one squeeze-excitation block the engine runs as one call."""
    pool, squeeze, excite, scale = block
    pooling = _global_average(pool)
    if pooling is None or not isinstance(squeeze.op, A.Conv2D):
        return None
    rows, width = pooling
    n, channels = squeeze.op.batch, squeeze.op.in_channels
    if not (rows == n * channels and _one_pixel(squeeze, pool.outputs[0], channels, engine)
            and _one_pixel(excite, squeeze.outputs[0], squeeze.op.out_channels, engine)
            and excite.op.out_channels == channels and excite.op.batch == n):
        return None
    op = scale.op
    if not (isinstance(op, A.Binary) and op.op == "mul" and cpu_jit.clamp_of(op.activation) is not None
            and all(x.dtype == A.FLOAT32 for x in (*scale.inputs, *scale.outputs))):
        return None
    dims = merge_dims(op.out_shape, contiguous_strides(op.out_shape), op.a_strides, op.b_strides)
    for dense, values, side in ((0, 1, 2), (1, 0, 1)):  # the gate may be either operand
        if (_same_memory(scale.inputs[dense], pool.inputs[0]) and _same_memory(scale.inputs[values], excite.outputs[0])
                and _row_broadcast(dims, side) and dims[-1][0] == width
                and np.array_equal(row_value_index(dims, side), np.arange(rows))):
            break
    else:
        return None
    parts = engine.excitation(rows * width, max(exe.op.macs() for exe in (squeeze, excite)))
    if not parts:
        return None
    x = view(pool.inputs[0]).reshape(rows, width)
    out = view(scale.outputs[0]).reshape(rows, width)
    lo, hi, _ = _compiled_clamp(op.activation)
    products = []
    for exe in (squeeze, excite):
        c, oc = exe.op.in_channels, exe.op.out_channels
        weight = view(exe.inputs[1]).reshape(oc, c, 1, 1)  # as the convolution's own kernel sees it: one laid copy
        bias = view(exe.inputs[2]).reshape(oc) if exe.op.has_bias else None
        once = functools.partial(made_once, constants, exe.inputs[1])
        laid, bias1, activation = one_pixel_operands(exe.op, weight, bias, bias is None or is_constant(exe.inputs[2]),
                                                     once)
        act_lo, act_hi, after = _compiled_clamp(activation)
        kind = -1 if after is None else _activation_kind(activation)
        if after is not None and kind < 0:  # an activation the kernel has no kind for
            return None
        products += [laid, np.zeros(oc, np.float32) if bias1 is None else bias1,
                     view(exe.outputs[0]).reshape(n, oc), act_lo, act_hi, np.int64(kind)]
    # each thread's columns a whole number of ``cpu_tiles.ROW`` (the product's tiles stay whole) but the last
    squeezed = _bounds(_spans(squeeze.op.out_channels, parts, align=cpu_tiles.ROW))
    excited = _bounds(_spans(channels, parts, align=cpu_tiles.ROW))
    args = (x, view(pool.outputs[0]).reshape(n, channels), *products, out, lo, hi,
            np.empty((parts, cpu_tiles.WIDE), np.float32), np.empty((parts, rows), np.float32),
            np.empty((n, squeeze.op.out_channels), np.float32), squeezed, excited)
    compiled = cpu_jit.bind(squeeze_excitation if parts > 1 else cpu_parallel.alone(squeeze_excitation), *args)
    return functools.partial(compiled, *args)


def _squeeze_excitation(x, pooled, w1, b1, hidden, lo1, hi1, kind1, w2, b2, gate, lo2, hi2, kind2, out, lo, hi,
                        accs, pools, squeezed_rows, squeezed, excited):
    """One block: pooled = the mean of each row of x [N*C, HW]; hidden = act1(pooled @ w1 + b1);
    gate = act2(hidden @ w2 + b2) (each act a clamp to [lo, hi] then ``cpu_parallel.ACTIVATION_KINDS``'
    kind, none where < 0); out = clamp(x * gate per row) to [lo, hi]. w1 [C, R] and w2 [R, C] are
    laid as ``cpu_tiles.small_product`` reads them. Thread j takes the columns [squeezed[j],
    squeezed[j + 1]) of hidden, then [excited[j], excited[j + 1]) of the gate and those channels' rows
    of out, with accs[j] its product's scratch. Each thread pools every row into pools[j], so that
    none waits for another's pool, and the products read the scratch copies (pools, squeezed_rows),
    not the tensors: the memory plan may lay out over pooled and hidden, which are dead by then."""
    rows, width = x.shape
    n, channels = pooled.shape
    inv = np.float32(1.0) / np.float32(width)
    flat_pooled = pooled.reshape(rows)
    for j in numba.prange(squeezed.shape[0] - 1):
        mine = pools[j]
        for r in range(rows):
            mine[r] = _row_sum(x[r]) * inv
        if j == 0:
            flat_pooled[:] = mine
        c0, c1 = squeezed[j], squeezed[j + 1]
        for i in range(n):
            cpu_tiles.product_row(mine[i * channels:(i + 1) * channels], w1, b1, squeezed_rows[i], lo1, hi1, accs[j],
                                  c0, c1)
            if kind1 >= 0:
                finish_span(kind1, squeezed_rows[i, c0:c1], np.float32(0.0), lo1, hi1)
            hidden[i, c0:c1] = squeezed_rows[i, c0:c1]
    for j in numba.prange(excited.shape[0] - 1):
        c0, c1 = excited[j], excited[j + 1]
        for i in range(n):
            cpu_tiles.product_row(squeezed_rows[i], w2, b2, gate[i], lo2, hi2, accs[j], c0, c1)
            if kind2 >= 0:
                finish_span(kind2, gate[i, c0:c1], np.float32(0.0), lo2, hi2)
        for i in range(n):
            for c in range(c0, c1):
                value, source, target = gate[i, c], x[i * channels + c], out[i * channels + c]
                for k in range(width):
                    target[k] = min(max(source[k] * value, lo), hi)


#: summing the pool's rows in any order (``ROW_FAST``), with NumPy's float error model; a block on
#: one thread calls it as a plain loop (``cpu_parallel.alone``)
squeeze_excitation = cpu_parallel.compiled_region(_squeeze_excitation, fastmath=ROW_FAST, error_model="numpy")
