"""Lowering of normalisations: BatchNormalization, LayerNormalization, InstanceNormalization
(Normalize + per-channel mul/add), Softmax / LogSoftmax and LRN (square -> channel-window
average pool -> (bias + alpha*x)^beta -> divide)."""
from __future__ import annotations

import math

import numpy as np

from ... import atomic as A
from ...errors import ModelError, UnsupportedOpError
from ...ir import Node
from ..context import LoweringContext
from ..registry import lowers
from ..emit import emit_binary, emit_unary, fused_activation, norm_axis


# -- normalisation and softmax -------------------------------------------------------------------

def _channel_param(ctx: LoweringContext, node: Node, name: str, rank: int, what: str) -> str:
    """A per-channel vector as a [C, 1, ...] tensor that broadcasts over NC... data."""
    value = ctx.const(name, node, what)
    view = ctx.temp(node, what)
    ctx.set_const(view, value.astype(np.float32).reshape((-1,) + (1,) * (rank - 2)))
    return view


@lowers("BatchNormalization")
def lower_batch_norm(ctx: LoweringContext, node: Node, opset: int) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    if len(node.inputs) != 5 or rank < 2:
        raise ModelError(f"node {node.name!r} (BatchNormalization) needs X, scale, B, mean and var, and X of rank 2 "
                         f"or more; got inputs {node.inputs} and X of shape {list(shape)}")
    params = [ctx.value(n, node) for n in node.inputs[1:5]]
    if any(p.shape != (shape[1],) for p in params):
        raise ModelError(f"node {node.name!r} (BatchNormalization): scale, B, mean and var of shapes "
                         f"{[list(p.shape) for p in params]} for {shape[1]} channels")
    training = bool(node.attr("training_mode", 0)) if opset >= 14 else False
    if training or any(o for o in node.outputs[1:]) or not all(p.is_const for p in params):
        _lower_batch_norm_ops(ctx, node, training)
        return
    gamma, beta, mean, var = (ctx.const(n, node, w).astype(np.float64) for n, w in
                              zip(node.inputs[1:5], ("scale", "bias", "mean", "var")))
    scale = gamma / np.sqrt(var + float(node.attr("epsilon", 1e-5)))
    shift = beta - mean * scale
    scale_name, shift_name = ctx.temp(node, "scale"), ctx.temp(node, "shift")
    ctx.set_const(scale_name, scale.astype(np.float32).reshape((-1,) + (1,) * (rank - 2)))
    ctx.set_const(shift_name, shift.astype(np.float32).reshape((-1,) + (1,) * (rank - 2)))
    scaled = ctx.temp(node, "scaled")
    emit_binary(ctx, node, "mul", x, scale_name, scaled)
    emit_binary(ctx, node, "add", scaled, shift_name, node.outputs[0], fused_activation(node))


def _lower_batch_norm_ops(ctx: LoweringContext, node: Node, training: bool) -> None:
    """BatchNormalization from Reduce, Unary and Binary ops: run-time scale/B/mean/var, and training mode.

    ``y = x * k + (B - mean * k)`` with ``k = scale / sqrt(var + eps)`` per channel (constant parts
    fold at session creation). In training mode mean and var are the batch's (population variance
    over every axis but the channel), and the optional outputs are the running statistics
    ``input * momentum + batch * (1 - momentum)``.
    """
    x = node.inputs[0]
    shape = ctx.shape(x)
    n, c, rank = shape[0], shape[1], len(shape)
    spatial = math.prod(shape[2:])
    scale, bias, mean, var = node.inputs[1:5]

    def const(value: float) -> str:
        name = ctx.temp(node, "coefficient")
        ctx.set_const(name, np.array(value, dtype=np.float32))
        return name

    def binary(op: str, a: str, b: str, out: str | None = None) -> str:
        out = out or ctx.temp(node, op)
        emit_binary(ctx, node, op, a, b, out)
        return out

    def per_channel(name: str) -> str:  # [C] seen as [C, 1, ...], which broadcasts over N C ... data
        view = ctx.temp(node, "per_channel")
        ctx.alias(view, name, (c,) + (1,) * (rank - 2))
        return view

    def channel_mean(name: str) -> str:  # [N, C, ...] -> [C]: the mean over every axis but the channel
        planes = ctx.temp(node, "planes")
        ctx.alias(planes, name, (n * c, spatial))
        rows = ctx.temp(node, "plane_means")
        ctx.emit(A.Reduce((planes,), (rows,), node.name, op="mean", outer=n * c, size=spatial, inner=1), (n, c))
        out = ctx.temp(node, "channel_mean")
        ctx.emit(A.Reduce((rows,), (out,), node.name, op="mean", outer=1, size=n, inner=c), (c,))
        return out

    if training:
        batch_mean = channel_mean(x)
        centred = binary("sub", x, per_channel(batch_mean))
        squares = ctx.temp(node, "squares")
        emit_unary(ctx, node, "square", (), centred, squares)
        batch_var = channel_mean(squares)
        momentum = float(node.attr("momentum", 0.9))
        for i, (given, batch) in enumerate(((mean, batch_mean), (var, batch_var)), start=1):
            if len(node.outputs) > i and node.outputs[i]:
                binary("add", binary("mul", given, const(momentum)), binary("mul", batch, const(1.0 - momentum)),
                       node.outputs[i])
        mean, var = batch_mean, batch_var
    std = ctx.temp(node, "std")
    emit_unary(ctx, node, "sqrt", (), binary("add", var, const(float(node.attr("epsilon", 1e-5)))), std)
    k = binary("div", scale, std)
    shift = binary("sub", bias, binary("mul", mean, k))
    scaled = binary("mul", x, per_channel(k))
    emit_binary(ctx, node, "add", scaled, per_channel(shift), node.outputs[0], fused_activation(node))


@lowers("LayerNormalization")
def lower_layer_norm(ctx: LoweringContext, node: Node, opset: int) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    axis = norm_axis(node.attr("axis", -1), len(shape), node)
    size = int(np.prod(shape[axis:], dtype=np.int64))
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    params = []
    for i, what in ((1, "scale"), (2, "bias")):
        if len(node.inputs) > i and node.inputs[i]:
            value = ctx.values[node.inputs[i]]
            if value.is_const:
                name = ctx.temp(node, what)
                ctx.set_const(name, np.ascontiguousarray(np.broadcast_to(value.const.astype(np.float32), shape[axis:])))
            elif value.shape == tuple(shape[axis:]):
                name = node.inputs[i]
            else:
                raise UnsupportedOpError("LayerNormalization", node.name, f"run-time {what} must have shape {list(shape[axis:])}")
        else:
            name = ctx.temp(node, what)
            ctx.set_const(name, np.full(shape[axis:], 1.0 if what == "scale" else 0.0, dtype=np.float32))
        params.append(name)
    ctx.emit(A.Normalize((x, params[0], params[1]), (node.outputs[0],), node.name, outer=outer, size=size,
                         eps=float(node.attr("epsilon", 1e-5)), has_affine=True), shape)
    if any(o for o in node.outputs[1:]):
        _layer_norm_statistics(ctx, node, outer, size, axis)


def _layer_norm_statistics(ctx: LoweringContext, node: Node, outer: int, size: int, axis: int) -> None:
    """LayerNormalization's optional Mean and InvStdDev outputs (shape ``X.shape[:axis] + [1, ...]``):
    a Reduce mean, then the mean of squared deviations, ``+ eps``, sqrt and reciprocal."""
    x = node.inputs[0]
    shape = ctx.shape(x)
    stat_shape = tuple(shape[:axis]) + (1,) * (len(shape) - axis)
    rows = ctx.temp(node, "rows")
    ctx.alias(rows, x, (outer, size))
    mean = ctx.temp(node, "mean")
    ctx.emit(A.Reduce((rows,), (mean,), node.name, op="mean", outer=outer, size=size, inner=1), (outer, 1))
    centred, squares, var = ctx.temp(node, "centred"), ctx.temp(node, "squares"), ctx.temp(node, "var")
    emit_binary(ctx, node, "sub", rows, mean, centred)
    emit_unary(ctx, node, "square", (), centred, squares)
    ctx.emit(A.Reduce((squares,), (var,), node.name, op="mean", outer=outer, size=size, inner=1), (outer, 1))
    eps = ctx.temp(node, "epsilon")
    ctx.set_const(eps, np.array(float(node.attr("epsilon", 1e-5)), dtype=np.float32))
    shifted, std, inv = ctx.temp(node, "var_eps"), ctx.temp(node, "std"), ctx.temp(node, "inv_std")
    emit_binary(ctx, node, "add", var, eps, shifted)
    emit_unary(ctx, node, "sqrt", (), shifted, std)
    emit_unary(ctx, node, "reciprocal", (), std, inv)
    for output, value in zip(node.outputs[1:3], (mean, inv)):
        if output:
            ctx.alias(output, value, stat_shape)


@lowers("InstanceNormalization")
def lower_instance_norm(ctx: LoweringContext, node: Node, opset: int) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    outer, size = shape[0] * shape[1], math.prod(shape[2:])
    normed = ctx.temp(node, "normalized")
    ctx.emit(A.Normalize((x,), (normed,), node.name, outer=outer, size=size,
                         eps=float(node.attr("epsilon", 1e-5))), shape)
    scaled = ctx.temp(node, "scaled")
    emit_binary(ctx, node, "mul", normed, _channel_operand(ctx, node, node.inputs[1], len(shape), "scale"), scaled)
    emit_binary(ctx, node, "add", scaled, _channel_operand(ctx, node, node.inputs[2], len(shape), "bias"), node.outputs[0])


def _channel_operand(ctx: LoweringContext, node: Node, name: str, rank: int, what: str) -> str:
    """A per-channel vector, constant or run-time, seen as [C, 1, ...] (broadcasts over NC... data)."""
    if ctx.value(name, node).is_const:
        return _channel_param(ctx, node, name, rank, what)
    view = ctx.temp(node, what)
    ctx.alias(view, name, (ctx.value(name, node).size,) + (1,) * (rank - 2))
    return view


@lowers("Softmax", "LogSoftmax")
def lower_softmax(ctx: LoweringContext, node: Node, opset: int) -> None:
    shape = ctx.shape(node.inputs[0])
    if opset >= 13:
        axis = norm_axis(node.attr("axis", -1), len(shape), node)
        outer, size, inner = (int(np.prod(shape[:axis], dtype=np.int64)), shape[axis],
                              int(np.prod(shape[axis + 1:], dtype=np.int64)))
    else:  # opsets 11-12 coerce the input to 2D at ``axis``
        axis = norm_axis(node.attr("axis", 1), len(shape), node)
        outer, size, inner = int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64)), 1
    ctx.emit(A.Softmax((node.inputs[0],), (node.outputs[0],), node.name, outer=outer, size=size, inner=inner,
                       log=node.op_type == "LogSoftmax"), shape)


# -- the rest ------------------------------------------------------------------------------------

@lowers("LRN")
def lower_lrn(ctx: LoweringContext, node: Node, opset: int) -> None:
    """LRN = x / (bias + alpha * mean of squares over a channel window)^beta, from atomic ops."""
    x = node.inputs[0]
    n, c, h, w = ctx.shape(x)
    if node.attr("size") is None or int(node.attr("size")) < 1:
        raise ModelError(f"node {node.name!r} (LRN): the size attribute must be a positive integer, "
                         f"got {node.attr('size')!r}")
    size = int(node.attr("size"))
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    squares = ctx.temp(node, "squares")
    emit_unary(ctx, node, "square", (), x, squares)
    planes = ctx.temp(node, "channel_planes")
    ctx.alias(planes, squares, (n, 1, c, h * w))
    window = ctx.temp(node, "window_mean")
    ctx.emit(A.Pool2D((planes,), (window,), node.name, op="avg", batch=n, channels=1, in_hw=(c, h * w),
                      out_hw=(c, h * w), kernel=(size, 1), pads=(before, 0, after, 0), count_include_pad=True),
             (n, 1, c, h * w))
    denom = ctx.temp(node, "denominator")
    ctx.emit(A.Unary((window,), (denom,), node.name, op="affine_pow",
                     params=(float(node.attr("bias", 1.0)), float(node.attr("alpha", 1e-4)), float(node.attr("beta", 0.75))),
                     count=n * c * h * w), (n, 1, c, h * w))
    denom4 = ctx.temp(node, "denominator4d")
    ctx.alias(denom4, denom, (n, c, h, w))
    emit_binary(ctx, node, "div", x, denom4, node.outputs[0])
