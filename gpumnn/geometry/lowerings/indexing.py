"""Lowering of index-driven ops: GatherElements, GatherND, ScatterElements, ScatterND, OneHot,
Trilu, TopK and NonZero.

None of these needs a kernel of its own. Every run-time index becomes a *flat position* in the
data, computed with integer Binary ops (``mod`` by the axis size wraps negative indices, ``mul``
by a stride, ``add`` of a constant offset for the other coordinates) and, for index tuples, an
integer Reduce sum; one atomic Gather (or Scatter) then moves the elements. When the indices are
constants the same ops fold at creation (``LoweringContext.emit``), and the move becomes a Raster
(``reorder``) or, with constant data too, a constant. OneHot and Trilu are Selects against
constant patterns; TopK is its atomic op plus the Gather of its values.

Run-time indices out of range wrap (``mod``) where ONNX would raise: a GPU kernel cannot raise
mid-run. Constant indices out of range are refused at creation.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ... import atomic as A
from ...errors import ModelError, UnsupportedOpError
from ...ir import Node
from ...numerics.strides import contiguous_strides
from ..context import LoweringContext
from .logic import emit_select
from ..registry import lowers
from ..emit import as_dtype, emit_binary, norm_axis, reorder

SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


# -- flat positions ------------------------------------------------------------------------------

def _const(ctx: LoweringContext, node: Node, array, hint: str) -> str:
    name = ctx.temp(node, hint)
    ctx.set_const(name, np.asarray(array))
    return name


def _binary(ctx: LoweringContext, node: Node, op: str, a: str, b: str) -> str:
    out = ctx.temp(node, op)
    emit_binary(ctx, node, op, a, b, out)
    return out


def _check_constant_indices(ctx: LoweringContext, node: Node, indices: str, dims: Sequence[int]) -> None:
    """Constant indices must lie in [-dim, dim) of the dimension they index (``dims`` broadcast
    against the indices: one dim, or one per component of an index tuple)."""
    value = ctx.value(indices, node)
    if not value.is_const or value.size == 0:
        return
    idx = value.const.astype(np.int64)
    bound = np.broadcast_to(np.asarray(dims, dtype=np.int64), idx.shape)
    if np.any((idx < -bound) | (idx >= bound)):
        raise ModelError(f"node {node.name!r} ({node.op_type}): constant indices out of range for dimension(s) "
                         f"{list(dims)}")


def _coordinate_offsets(index_shape: Sequence[int], data_shape: Sequence[int], axis: int) -> np.ndarray:
    """For each element of an index tensor, the flat position in the data of its coordinates on
    every axis but ``axis`` (the index itself supplies that one)."""
    strides = contiguous_strides(tuple(data_shape))
    offset = np.zeros(tuple(index_shape), dtype=np.int64)
    for d, (size, stride) in enumerate(zip(index_shape, strides)):
        if d != axis and size > 1:
            shape = [1] * len(index_shape)
            shape[d] = size
            offset = offset + (np.arange(size, dtype=np.int64) * stride).reshape(shape)
    return offset


def element_positions(ctx: LoweringContext, node: Node, indices: str, data_shape: Sequence[int], axis: int,
                      wrap: bool = True) -> str:
    """Flat positions in the data of GatherElements-style indices along ``axis``: ``mod(index,
    n) * stride + offset of the other coordinates`` (``wrap`` makes negative indices count from
    the end; indices known to be in range skip it)."""
    ishape = ctx.shape(indices)
    if len(ishape) != len(data_shape) or any(i > d for k, (i, d) in enumerate(zip(ishape, data_shape)) if k != axis):
        raise ModelError(f"node {node.name!r} ({node.op_type}): indices of shape {list(ishape)} do not fit data of "
                         f"shape {list(data_shape)} (same rank, no larger outside axis {axis})")
    _check_constant_indices(ctx, node, indices, [data_shape[axis]])
    position = indices
    if wrap:
        position = _binary(ctx, node, "mod", position, _const(ctx, node, np.int64(data_shape[axis]), "axis_size"))
    stride = math.prod(data_shape[axis + 1:])
    if stride != 1:
        position = _binary(ctx, node, "mul", position, _const(ctx, node, np.int64(stride), "stride"))
    offsets = _coordinate_offsets(ishape, data_shape, axis)
    if offsets.any():
        position = _binary(ctx, node, "add", position, _const(ctx, node, offsets, "offsets"))
    return position


def tuple_rows(ctx: LoweringContext, node: Node, indices: str, data_shape: Sequence[int],
               batch_dims: int = 0) -> tuple[str, int, int]:
    """GatherND/ScatterND: (row of each index tuple in the data seen as ``[rows, inner]``, rows,
    inner). Indices ``[..., q]`` address the ``q`` dims after the ``batch_dims`` leading ones;
    a row is ``batch * prod(those dims) + sum_j mod(index_j, dim_j) * row_stride_j``."""
    ishape = ctx.shape(indices)
    b = batch_dims
    if not ishape or not 0 <= b < len(ishape) or tuple(ishape[:b]) != tuple(data_shape[:b]):
        raise ModelError(f"node {node.name!r} ({node.op_type}): indices of shape {list(ishape)} do not match data of "
                         f"shape {list(data_shape)} with batch_dims {b}")
    q = ishape[-1]
    if b + q > len(data_shape):
        raise ModelError(f"node {node.name!r} ({node.op_type}): index tuples of length {q} address more than the "
                         f"{len(data_shape) - b} dims of data {list(data_shape)} after batch_dims {b}")
    dims = list(data_shape[b:b + q])
    _check_constant_indices(ctx, node, indices, dims)
    tuples = ishape[:-1]
    if q == 0:
        rows = _const(ctx, node, np.zeros(tuples, dtype=np.int64), "rows")
    else:
        wrapped = _binary(ctx, node, "mod", indices, _const(ctx, node, np.array(dims, dtype=np.int64), "dims"))
        strides = np.array(contiguous_strides(dims), dtype=np.int64)
        scaled = wrapped if q == 1 else _binary(ctx, node, "mul", wrapped, _const(ctx, node, strides, "row_strides"))
        rows = ctx.temp(node, "rows")
        if q == 1:
            ctx.alias(rows, scaled, tuples)
        else:
            ctx.emit(A.Reduce((scaled,), (rows,), node.name, op="sum", outer=math.prod(tuples), size=q, inner=1),
                     tuples)
    if b and math.prod(tuples[:b]) > 1:
        per_batch = math.prod(dims)
        first = (np.arange(math.prod(tuples[:b]), dtype=np.int64) * per_batch).reshape(
            tuple(tuples[:b]) + (1,) * (len(tuples) - b))
        rows = _binary(ctx, node, "add", rows, _const(ctx, node, first, "batch_rows"))
    return rows, math.prod(data_shape[:b + q]), math.prod(data_shape[b + q:])


def gather_rows(ctx: LoweringContext, node: Node, data: str, rows: int, inner: int, positions: str, out: str,
                out_shape: Sequence[int]) -> None:
    """``out`` = rows ``positions`` (non-negative) of ``data`` seen as ``[rows, inner]``: a Gather,
    or a Raster when the positions are constants and the data is not (a constant if both are)."""
    table = ctx.temp(node, "rows_view")
    ctx.alias(table, data, (rows, inner))
    pos = ctx.value(positions, node)
    if pos.is_const and not ctx.value(table).is_const:
        where = pos.const.astype(np.int64).reshape(-1)
        reorder(ctx, node, [table], lambda xs, f: [np.take(xs[0], where, axis=0).reshape(out_shape)], [out],
                out_shapes=[out_shape])
        return
    ctx.emit(A.Gather((table, positions), (out,), node.name, outer=1, axis=rows, inner=inner, count=pos.size),
             out_shape)


# -- gathers -------------------------------------------------------------------------------------

@lowers("GatherElements")
def lower_gather_elements(ctx: LoweringContext, node: Node, opset: int) -> None:
    data, indices = node.inputs[0], node.inputs[1]
    shape = ctx.shape(data)
    axis = norm_axis(int(node.attr("axis", 0)), len(shape), node)
    positions = element_positions(ctx, node, indices, shape, axis)
    gather_rows(ctx, node, data, math.prod(shape), 1, positions, node.outputs[0], ctx.shape(indices))


@lowers("GatherND")
def lower_gather_nd(ctx: LoweringContext, node: Node, opset: int) -> None:
    data, indices = node.inputs[0], node.inputs[1]
    shape = ctx.shape(data)
    b = int(node.attr("batch_dims", 0))
    rows, count, inner = tuple_rows(ctx, node, indices, shape, b)
    out_shape = tuple(ctx.shape(indices)[:-1]) + tuple(shape[b + ctx.shape(indices)[-1]:])
    gather_rows(ctx, node, data, count, inner, rows, node.outputs[0], out_shape)


# -- scatters ------------------------------------------------------------------------------------

def _reduction(node: Node) -> str:
    reduction = node.attr("reduction", "none")
    if reduction not in SCATTER_REDUCTIONS:
        raise UnsupportedOpError(node.op_type, node.name, f"reduction {reduction!r} is not one of "
                                 f"{', '.join(SCATTER_REDUCTIONS)}")
    return reduction


def _emit_scatter(ctx: LoweringContext, node: Node, positions: str, rows: int, inner: int,
                  updates_shape: Sequence[int]) -> None:
    data, updates = node.inputs[0], node.inputs[2]
    if tuple(ctx.shape(updates)) != tuple(updates_shape):
        raise ModelError(f"node {node.name!r} ({node.op_type}): updates of shape {list(ctx.shape(updates))}, "
                         f"expected {list(updates_shape)}")
    updates = as_dtype(ctx, node, updates, ctx.dtype(data))
    ctx.emit(A.Scatter((data, positions, updates), (node.outputs[0],), node.name, rows=rows, inner=inner,
                       count=ctx.value(positions).size, reduction=_reduction(node)), ctx.shape(data))


@lowers("ScatterElements", "Scatter")
def lower_scatter_elements(ctx: LoweringContext, node: Node, opset: int) -> None:
    """ScatterElements (and its deprecated name Scatter): each update goes to one element."""
    data, indices = node.inputs[0], node.inputs[1]
    shape = ctx.shape(data)
    axis = norm_axis(int(node.attr("axis", 0)), len(shape), node)
    positions = element_positions(ctx, node, indices, shape, axis)
    _emit_scatter(ctx, node, positions, math.prod(shape), 1, ctx.shape(indices))


@lowers("ScatterND")
def lower_scatter_nd(ctx: LoweringContext, node: Node, opset: int) -> None:
    data, indices = node.inputs[0], node.inputs[1]
    shape = ctx.shape(data)
    rows, count, inner = tuple_rows(ctx, node, indices, shape)
    ishape = ctx.shape(indices)
    _emit_scatter(ctx, node, rows, count, inner, tuple(ishape[:-1]) + tuple(shape[ishape[-1]:]))


# -- patterns ------------------------------------------------------------------------------------

def _scalar_input(ctx: LoweringContext, node: Node, name: str, what: str) -> np.generic:
    value = np.asarray(ctx.const(name, node, what))
    if value.size != 1:
        raise ModelError(f"node {node.name!r} ({node.op_type}): {what} must be a single number, got shape "
                         f"{list(value.shape)}")
    return value.reshape(-1)[0]


@lowers("OneHot")
def lower_one_hot(ctx: LoweringContext, node: Node, opset: int) -> None:
    """``out = (index == t or index == t - depth) ? on : off`` for each t in ``range(depth)`` along
    ``axis``: negative indices count from the end; indices out of [-depth, depth) match nothing."""
    indices, values = node.inputs[0], node.inputs[2]
    depth = int(_scalar_input(ctx, node, node.inputs[1], "depth"))
    if depth < 1:
        raise ModelError(f"node {node.name!r} (OneHot): depth {depth} must be positive")
    ishape = list(ctx.shape(indices))
    axis = norm_axis(int(node.attr("axis", -1)), len(ishape) + 1, node)
    if ctx.value(values, node).size != 2:
        raise ModelError(f"node {node.name!r} (OneHot): values must hold [off_value, on_value], got shape "
                         f"{list(ctx.shape(values))}")
    spread = ctx.temp(node, "indices")
    ctx.alias(spread, indices, ishape[:axis] + [1] + ishape[axis:])
    targets = np.arange(depth, dtype=np.int64).reshape((depth,) + (1,) * (len(ishape) - axis))
    hit = _binary(ctx, node, "equal", spread, _const(ctx, node, targets, "targets"))
    hit_negative = _binary(ctx, node, "equal", spread, _const(ctx, node, targets - depth, "negative_targets"))
    cond = _binary(ctx, node, "or", hit, hit_negative)
    off, on = ctx.temp(node, "off_value"), ctx.temp(node, "on_value")
    reorder(ctx, node, [values], lambda xs, f: [xs[0].reshape(-1)[:1], xs[0].reshape(-1)[1:2]], [off, on])
    emit_select(ctx, node, cond, on, off, node.outputs[0])


@lowers("Trilu")
def lower_trilu(ctx: LoweringContext, node: Node, opset: int) -> None:
    """Keep the upper (or lower) triangle of the last two dims from diagonal ``k``: a Select
    against a constant mask."""
    x = node.inputs[0]
    shape = ctx.shape(x)
    if len(shape) < 2:
        raise ModelError(f"node {node.name!r} (Trilu): the input must have rank 2 or more, got {list(shape)}")
    k = int(_scalar_input(ctx, node, node.inputs[1], "k")) if len(node.inputs) > 1 and node.inputs[1] else 0
    ones = np.ones(shape[-2:], dtype=bool)
    mask = np.triu(ones, k) if node.attr("upper", 1) else np.tril(ones, k)
    if mask.all():
        ctx.alias(node.outputs[0], x, shape)
        return
    zero = _const(ctx, node, np.zeros((), dtype=ctx.dtype(x)), "zero")
    emit_select(ctx, node, _const(ctx, node, mask, "mask"), x, zero, node.outputs[0])


# -- selection -----------------------------------------------------------------------------------

@lowers("TopK")
def lower_topk(ctx: LoweringContext, node: Node, opset: int) -> None:
    """The k largest (or smallest) along an axis, always in sorted order (what ``sorted=0``
    allows too): TopK gives the indices, a flat Gather of them the values."""
    x = node.inputs[0]
    shape = list(ctx.shape(x))
    axis = norm_axis(int(node.attr("axis", -1)), len(shape), node)
    k = int(_scalar_input(ctx, node, node.inputs[1], "K"))
    if not 0 <= k <= shape[axis]:
        raise ModelError(f"node {node.name!r} (TopK): K={k} is outside [0, {shape[axis]}] (the axis size)")
    values_out, indices_out = node.outputs[0], node.outputs[1] if len(node.outputs) > 1 else ""
    out_shape = shape[:axis] + [k] + shape[axis + 1:]
    found = indices_out or ctx.temp(node, "indices")
    ctx.emit(A.TopK((x,), (found,), node.name, outer=math.prod(shape[:axis]), size=shape[axis],
                    inner=math.prod(shape[axis + 1:]), k=k, largest=bool(node.attr("largest", 1))), out_shape)
    if values_out:
        positions = element_positions(ctx, node, found, shape, axis, wrap=False)
        gather_rows(ctx, node, x, math.prod(shape), 1, positions, values_out, out_shape)


@lowers("NonZero")
def lower_nonzero(ctx: LoweringContext, node: Node, opset: int) -> None:
    """The coordinates of the non-zero elements: known only for a constant input, since the
    output's shape is the number of non-zero elements."""
    x = ctx.const(node.inputs[0], node, "the input (NonZero's output shape is its count of non-zero elements)")
    ctx.set_const(node.outputs[0], np.array(np.nonzero(np.atleast_1d(x)), dtype=np.int64))


def gather_constant_indices(ctx: LoweringContext, node: Node, axis: int, indices: np.ndarray) -> None:
    """Gather with indices known now is a pure reorder (a Raster, or a folded constant)."""
    dim = ctx.shape(node.inputs[0])[axis]
    idx = np.asarray(indices, dtype=np.int64)
    if np.any((idx < -dim) | (idx >= dim)):
        raise UnsupportedOpError("Gather", node.name, f"indices out of range for axis of size {dim}")
    idx = np.where(idx < 0, idx + dim, idx)
    shape = ctx.shape(node.inputs[0])
    out_shape = [*shape[:axis], *idx.shape, *shape[axis + 1:]]
    reorder(ctx, node, node.inputs[:1], lambda xs, f: [np.take(xs[0], idx, axis=axis)], node.outputs,
            out_shapes=[out_shape], kept=[(a, a if a < axis else a + idx.ndim - 1) for a in range(len(shape)) if a != axis])


# -- shape computations (always folded) ----------------------------------------------------------


@lowers("Gather")
def lower_gather(ctx: LoweringContext, node: Node, opset: int) -> None:
    data, indices = node.inputs[0], node.inputs[1]
    shape = ctx.shape(data)
    axis = norm_axis(node.attr("axis", 0), len(shape), node)
    idx_value = ctx.value(indices, node)
    if idx_value.is_const:
        gather_constant_indices(ctx, node, axis, idx_value.const)
        return
    out_shape = list(shape[:axis]) + list(idx_value.shape) + list(shape[axis + 1:])
    ctx.emit(A.Gather((data, indices), (node.outputs[0],), node.name,
                      outer=int(np.prod(shape[:axis], dtype=np.int64)), axis=shape[axis],
                      inner=int(np.prod(shape[axis + 1:], dtype=np.int64)), count=idx_value.size), out_shape)
