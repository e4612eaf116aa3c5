"""Lowering of comparisons, logic, selection and index-valued ops (bool and integer results).

Comparisons (Equal, Less, ...) and logic (And, Or, Xor) are Binary ops with an int32 0/1 output,
Not is a Unary, Where a Select; ArgMax/ArgMin are Reduce ops whose output is an index; CumSum is
its own atomic op. The int64 and bool results of these ops are held as int32 on every backend
(see ``gpumnn.atomic``), and their model dtypes are kept so ``run`` returns what the model says.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ... import atomic as A
from ...errors import UnsupportedOpError
from ...ir import Node
from ...numerics.strides import merge_dims
from ..context import LoweringContext
from ..registry import lowers
from ..emit import as_dtype, broadcast_strides, emit_binary, emit_unary, norm_axis, reorder

COMPARE_ONNX = {"Equal": "equal", "Less": "less", "LessOrEqual": "less_equal", "Greater": "greater",
                "GreaterOrEqual": "greater_equal", "And": "and", "Or": "or", "Xor": "xor"}


@lowers(*COMPARE_ONNX)
def lower_compare(ctx: LoweringContext, node: Node, opset: int) -> None:
    emit_binary(ctx, node, COMPARE_ONNX[node.op_type], node.inputs[0], node.inputs[1], node.outputs[0])


@lowers("Not")
def lower_not(ctx: LoweringContext, node: Node, opset: int) -> None:
    emit_unary(ctx, node, "not", (), node.inputs[0], node.outputs[0])


@lowers("Mod")
def lower_mod(ctx: LoweringContext, node: Node, opset: int) -> None:
    """Mod: fmod=1 is C's fmod (the sign of the dividend), fmod=0 Python's % (the sign of the
    divisor; for floats too, as Mod-28 defines it)."""
    fmod = int(node.attr("fmod", 0))
    emit_binary(ctx, node, "fmod" if fmod else "mod", node.inputs[0], node.inputs[1], node.outputs[0])


def emit_select(ctx: LoweringContext, node: Node, cond: str, a: str, b: str, out: str) -> None:
    """``out = cond ? a : b`` with ONNX broadcasting of all three (Where)."""
    if ctx.dtype(cond) != np.bool_ and A.storage_dtype(ctx.dtype(cond)) != A.INT32:
        raise UnsupportedOpError(node.op_type, node.name, f"condition of dtype {ctx.dtype(cond)}, not bool")
    b_converted = as_dtype(ctx, node, b, ctx.dtype(a))
    shapes = [ctx.shape(n) for n in (cond, a, b_converted)]
    try:
        out_shape = tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise UnsupportedOpError(node.op_type, node.name, f"shapes {[list(s) for s in shapes]} do not broadcast") from None
    strides = [broadcast_strides(out_shape, s) for s in shapes]
    merged = merge_dims(out_shape, *strides)
    if len(merged) > A.RANK:  # too many interleaved broadcast dims: materialise the condition first
        expanded = ctx.temp(node, "broadcast_condition")
        reorder(ctx, node, [cond], lambda xs, f: [np.broadcast_to(xs[0], out_shape)], [expanded])
        emit_select(ctx, node, expanded, a, b_converted, out)
        return
    merged = [(1, 0, 0, 0)] * (A.RANK - len(merged)) + merged
    column = lambda k: tuple(m[k] for m in merged)  # noqa: E731
    ctx.emit(A.Select((cond, a, b_converted), (out,), node.name, out_shape=column(0), c_strides=column(1),
                      a_strides=column(2), b_strides=column(3)), out_shape, ctx.dtype(a))


@lowers("Where")
def lower_where(ctx: LoweringContext, node: Node, opset: int) -> None:
    emit_select(ctx, node, node.inputs[0], node.inputs[1], node.inputs[2], node.outputs[0])


def _outer_size_inner(shape: Sequence[int], axis: int) -> tuple[int, int, int]:
    return (int(np.prod(shape[:axis], dtype=np.int64)), int(shape[axis]), int(np.prod(shape[axis + 1:], dtype=np.int64)))


@lowers("ArgMax", "ArgMin")
def lower_arg_extreme(ctx: LoweringContext, node: Node, opset: int) -> None:
    """The index of the first (or, with select_last_index, the last) extreme along an axis. The
    last one is the first one of the axis read backwards (a Raster with a negative stride),
    counted back from the end: ``size - 1 - index``."""
    x = node.inputs[0]
    shape = list(ctx.shape(x))
    axis = norm_axis(int(node.attr("axis", 0)), len(shape), node)
    if shape[axis] == 0:
        raise UnsupportedOpError(node.op_type, node.name, "an empty axis has no extreme")
    outer, size, inner = _outer_size_inner(shape, axis)
    kept = shape[:axis] + [1] + shape[axis + 1:]
    final = kept if node.attr("keepdims", 1) else shape[:axis] + shape[axis + 1:]
    op = "argmax" if node.op_type == "ArgMax" else "argmin"
    last = bool(node.attr("select_last_index", 0))
    source = x
    if last:
        source = ctx.temp(node, "reversed")
        reorder(ctx, node, [x], lambda xs, f: [np.flip(xs[0], axis=axis)], [source])
    found = ctx.temp(node, "index") if last else node.outputs[0]
    ctx.emit(A.Reduce((source,), (found,), node.name, op=op, outer=outer, size=size, inner=inner), final)
    if last:
        top = ctx.temp(node, "last_position")
        ctx.set_const(top, np.array(size - 1, dtype=np.int64))
        emit_binary(ctx, node, "sub", top, found, node.outputs[0])


@lowers("CumSum")
def lower_cumsum(ctx: LoweringContext, node: Node, opset: int) -> None:
    x = node.inputs[0]
    shape = list(ctx.shape(x))
    axis_value = np.asarray(ctx.const(node.inputs[1], node, "axis")).reshape(-1)
    axis = norm_axis(int(axis_value[0]), len(shape), node)
    outer, size, inner = _outer_size_inner(shape, axis)
    ctx.emit(A.CumSum((x,), (node.outputs[0],), node.name, outer=outer, size=size, inner=inner,
                      exclusive=bool(node.attr("exclusive", 0)), reverse=bool(node.attr("reverse", 0))), shape)
