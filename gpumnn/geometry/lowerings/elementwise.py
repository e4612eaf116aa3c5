"""Lowering of elementwise ops: unary functions (Clip and tanh-GELU among them), binary ops with
broadcasting (Sum and Mean of many inputs), Cast and CastLike."""
from __future__ import annotations

import numpy as np
import onnx

from ... import atomic as A
from ...errors import UnsupportedOpError
from ...ir import Node
from ..context import LoweringContext
from ..registry import lowers
from ..emit import BINARY_ONNX, UNARY_ONNX, as_dtype, emit_binary, emit_unary, fused_activation, unary_spec


@lowers(*UNARY_ONNX)
def lower_unary(ctx: LoweringContext, node: Node, opset: int) -> None:
    spec = unary_spec(node, lambda n: ctx.values[n].const if n in ctx.values else None)
    if spec is None and node.op_type == "Clip":
        _lower_clip_runtime_bounds(ctx, node)
        return
    if spec is None and node.op_type == "Gelu" and node.attr("approximate", "none") == "tanh":
        _lower_gelu_tanh(ctx, node)
        return
    if spec is None:
        raise UnsupportedOpError(node.op_type, node.name, "attributes or data-dependent bounds not supported")
    emit_unary(ctx, node, spec[0], spec[1], node.inputs[0], node.outputs[0])


def _lower_clip_runtime_bounds(ctx: LoweringContext, node: Node) -> None:
    """Clip whose min or max is a run-time tensor: max(x, min), then min(., max) (max wins when min > max)."""
    current = node.inputs[0]
    bounds = [(i, op) for i, op in ((1, "max"), (2, "min")) if len(node.inputs) > i and node.inputs[i]]
    if not bounds:
        ctx.alias(node.outputs[0], current, ctx.shape(current))
        return
    for k, (i, op) in enumerate(bounds):
        target = node.outputs[0] if k == len(bounds) - 1 else ctx.temp(node, "lower_bounded")
        emit_binary(ctx, node, op, current, node.inputs[i], target)
        current = target


def _lower_gelu_tanh(ctx: LoweringContext, node: Node) -> None:
    """Gelu(approximate="tanh") = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), from atomic ops."""
    x = node.inputs[0]

    def const(value: float) -> str:
        name = ctx.temp(node, "coefficient")
        ctx.set_const(name, np.array(value, dtype=np.float32))
        return name

    def unary(op: str, a: str) -> str:
        out = ctx.temp(node, op)
        emit_unary(ctx, node, op, (), a, out)
        return out

    def binary(op: str, a: str, b: str) -> str:
        out = ctx.temp(node, op)
        emit_binary(ctx, node, op, a, b, out)
        return out
    cube = binary("mul", unary("square", x), x)
    inner = binary("add", x, binary("mul", cube, const(0.044715)))
    gate = binary("add", unary("tanh", binary("mul", inner, const(float(np.sqrt(2.0 / np.pi))))), const(1.0))
    emit_binary(ctx, node, "mul", binary("mul", x, const(0.5)), gate, node.outputs[0])


@lowers(*[k for k in BINARY_ONNX if k not in ("Sum",)], "Sum", "Mean")
def lower_binary(ctx: LoweringContext, node: Node, opset: int) -> None:
    inputs = [n for n in node.inputs if n]
    act = fused_activation(node)
    if node.op_type == "Pow":
        exponent = ctx.values[inputs[1]].const
        if exponent is not None and exponent.size == 1 and float(exponent.reshape(-1)[0]) in (1.0, 2.0, 0.5):
            e = float(exponent.reshape(-1)[0])
            op = {1.0: "identity", 2.0: "square", 0.5: "sqrt"}[e]
            if np.broadcast_shapes(ctx.shape(inputs[0]), exponent.shape) == ctx.shape(inputs[0]):
                emit_unary(ctx, node, op, (), inputs[0], node.outputs[0])
                return
    op = BINARY_ONNX.get(node.op_type, "add")
    if len(inputs) == 1:
        ctx.alias(node.outputs[0], inputs[0], ctx.shape(inputs[0]))
        return
    current = inputs[0]
    for i, other in enumerate(inputs[1:]):
        last = i == len(inputs) - 2 and node.op_type != "Mean"
        target = node.outputs[0] if last else ctx.temp(node, f"partial{i}")
        emit_binary(ctx, node, op, current, other, target, act if last else None)
        current = target
    if node.op_type == "Mean":
        scale = ctx.temp(node, "inv_count")
        ctx.set_const(scale, np.array(1.0 / len(inputs), dtype=np.float32))
        emit_binary(ctx, node, "mul", current, scale, node.outputs[0])


@lowers("Cast", "CastLike")
def lower_cast(ctx: LoweringContext, node: Node, opset: int) -> None:
    """Cast between the dtypes gpumnn holds. float16, int8 and uint8 have storage of their own: a
    Cast to them converts (float16 rounds to nearest even; int8/uint8 wrap, a float truncated
    toward zero first). Wider float types share float32, the other integer types and bool int32:
    a Cast to bool tests for non-zero, float to integer truncates toward zero, and int16/uint16
    wrap; int4/uint4 values, held in int8/uint8, wrap to 4 bits."""
    if node.op_type == "CastLike":
        target = ctx.dtype(node.inputs[1])
    else:
        target = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(node.attr("to"))))
    source, out = node.inputs[0], node.outputs[0]
    value = ctx.value(source, node)
    held, bits = FOUR_BIT_HELD.get(target.name, (target, 8 * target.itemsize))
    if value.is_const:
        ctx.set_const(out, value.const.astype(target).astype(held))
        return
    if held is not target:  # int4/uint4: truncated toward zero and wrapped to 4 bits (as ml_dtypes casts)
        _emit_wrap(ctx, node, source, out, held, bits)
        return
    try:
        storage = A.storage_dtype(target)
    except TypeError:
        raise UnsupportedOpError(node.op_type, node.name, f"cast of run-time data to {target}: gpumnn holds float, "
                                 "integer and bool tensors only") from None
    if target == np.bool_:
        emit_unary(ctx, node, "nonzero", (), source, out, out_dtype=bool)
        return
    # int16/uint16 are held in int32, so a value outside their range must wrap here
    wraps = storage == A.INT32 and target.itemsize < 4 and not np.can_cast(value.dtype, target)
    if not wraps and A.storage_dtype(value.dtype) == storage:
        ctx.alias(out, source, value.shape, target)
        return
    if not wraps:
        ctx.emit(A.Unary((source,), (out,), node.name, op="identity", count=value.size), value.shape, target)
        return
    _emit_wrap(ctx, node, source, out, target, bits)


#: the 4-bit types a Cast may name: the dtype their values are held in, and their width
FOUR_BIT_HELD: dict[str, tuple[np.dtype, int]] = {"int4": (np.dtype(np.int8), 4), "uint4": (np.dtype(np.uint8), 4)}


def _emit_wrap(ctx: LoweringContext, node: Node, source: str, out: str, target: np.dtype, bits: int) -> None:
    """``out`` (held as ``target``) = ``source`` truncated toward zero and wrapped to ``bits`` bits:
    ((x + offset) mod 2^bits) - offset, offset 2^(bits-1) for a signed ``target``."""
    wide = as_dtype(ctx, node, source, np.int64)
    span = 1 << bits
    offset = span // 2 if target.kind == "i" else 0

    def const(v: int) -> str:
        name = ctx.temp(node, "wrap")
        ctx.set_const(name, np.array(v, dtype=np.int64))
        return name
    shifted = wide
    if offset:
        shifted = ctx.temp(node, "shifted")
        emit_binary(ctx, node, "add", wide, const(offset), shifted)
    if not offset:
        emit_binary(ctx, node, "mod", shifted, const(span), out, out_dtype=target)
        return
    wrapped = ctx.temp(node, "wrapped")
    emit_binary(ctx, node, "mod", shifted, const(span), wrapped)
    emit_binary(ctx, node, "sub", wrapped, const(offset), out, out_dtype=target)
