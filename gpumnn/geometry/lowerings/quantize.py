"""Lowering of linear quantization: QuantizeLinear and DequantizeLinear (per tensor, per axis and
blocked), DynamicQuantizeLinear, and the helpers the quantized operators share.

Quantized values are held in their storage dtype (int8 and uint8 as themselves, int16 and uint16
as int32; int4/uint4 as int8/uint8 with their 4-bit range). Quantize computes in float32:
``x / scale``, rounded half to even (``round``), plus the zero point, clipped to the type's range,
converted to the storage dtype. Dequantize
is ``(q - zero_point) * scale``. Both fold on constants, so weights are dequantized at load.
"""
from __future__ import annotations

import numpy as np
import onnx

from ... import atomic as A
from ...errors import ModelError, UnsupportedOpError
from ...ir import Node
from ..context import LoweringContext
from ..emit import as_dtype, emit_binary, emit_unary, norm_axis, reorder
from ..registry import lowers

#: the integer quantized types and their ranges (4-bit ones held in the 8-bit dtype of their sign)
RANGES: dict[str, tuple[int, int]] = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
                                      "uint16": (0, 65535), "int4": (-8, 7), "uint4": (0, 15),
                                      "int32": (-2**31, 2**31 - 1)}
HELD_AS = {"int4": np.dtype(np.int8), "uint4": np.dtype(np.uint8)}


def quant_type(node: Node, dtype, what: str) -> tuple[np.dtype, tuple[int, int]]:
    """(the dtype the values are held as, their range) for a quantized type, else UnsupportedOpError."""
    name = np.dtype(dtype).name
    if name not in RANGES:
        raise UnsupportedOpError(node.op_type, node.name, f"{what} of type {name}: gpumnn quantizes to int8, uint8, "
                                 "int16, uint16, int4 and uint4 only (no float8, float4 or 2-bit types)")
    return HELD_AS.get(name, np.dtype(name)), RANGES[name]


def onnx_dtype(code: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(code)))


def const_input(ctx: LoweringContext, node: Node, index: int) -> str | None:
    """The node's input ``index`` if present; 4-bit constants become their 8-bit held dtype."""
    if len(node.inputs) <= index or not node.inputs[index]:
        return None
    name = node.inputs[index]
    value = ctx.value(name, node)
    if value.is_const and value.const.dtype.name in HELD_AS:
        held = ctx.temp(node, "held")
        ctx.set_const(held, value.const.astype(HELD_AS[value.const.dtype.name]))
        return held
    return name


def _const(ctx: LoweringContext, node: Node, value, dtype=np.float32) -> str:
    name = ctx.temp(node, "constant")
    ctx.set_const(name, np.array(value, dtype=dtype))
    return name


def broadcastable(ctx: LoweringContext, node: Node, param: str, x_shape, axis: int, block_size: int) -> str:
    """A scale or zero point viewed so that it broadcasts against ``x``: a scalar (per tensor), a
    vector along ``axis`` (per axis), or, with ``block_size``, each element repeated over its block."""
    shape = ctx.shape(param)
    rank = len(x_shape)
    size = int(np.prod(shape, dtype=np.int64))
    if block_size > 0:
        axis = norm_axis(axis, rank, node)
        blocks = -(-x_shape[axis] // block_size)
        want = tuple(blocks if i == axis else d for i, d in enumerate(x_shape))
        if tuple(shape) != want:
            raise ModelError(f"node {node.name!r} ({node.op_type}): blocked scale of shape {list(shape)} for an input "
                             f"of shape {list(x_shape)} and block_size {block_size}: expected {list(want)}")
        length = x_shape[axis]
        out = ctx.temp(node, "blocks")
        reorder(ctx, node, [param], lambda xs, f: [np.repeat(xs[0], block_size, axis=axis).take(
            np.arange(length), axis=axis)], [out], out_shapes=[x_shape])
        return out
    if len(shape) == 0 or size == 1 and len(shape) <= 1:
        if len(shape) == 0:
            return param
        out = ctx.temp(node, "scalar")
        ctx.alias(out, param, ())
        return out
    if len(shape) != 1:
        raise ModelError(f"node {node.name!r} ({node.op_type}): scale or zero point of shape {list(shape)} "
                         "is neither a scalar nor a vector (and block_size is not set)")
    axis = norm_axis(axis, rank, node)
    if shape[0] != x_shape[axis]:
        raise ModelError(f"node {node.name!r} ({node.op_type}): {shape[0]} scales for axis {axis} of length "
                         f"{x_shape[axis]}")
    out = ctx.temp(node, "per_axis")
    ctx.alias(out, param, (shape[0],) + (1,) * (rank - axis - 1))
    return out


def quantize(ctx: LoweringContext, node: Node, x: str, scale: str, zero_point: str | None, out: str,
             out_dtype, qrange: tuple[int, int], axis: int = 1, block_size: int = 0) -> None:
    """``out = clip(round_half_even(x / scale) + zero_point, qrange)`` held as ``out_dtype``."""
    x_shape = ctx.shape(x)
    xf = as_dtype(ctx, node, x, np.float32)
    scale = as_dtype(ctx, node, broadcastable(ctx, node, scale, x_shape, axis, block_size), np.float32)
    ratio = ctx.temp(node, "ratio")
    emit_binary(ctx, node, "div", xf, scale, ratio)
    rounded = ctx.temp(node, "rounded")
    emit_unary(ctx, node, "round", (), ratio, rounded)
    current = rounded
    if zero_point is not None:
        zp = as_dtype(ctx, node, broadcastable(ctx, node, zero_point, x_shape, axis, block_size), np.float32)
        shifted = ctx.temp(node, "shifted")
        emit_binary(ctx, node, "add", rounded, zp, shifted)
        current = shifted
    clipped = ctx.temp(node, "clipped")
    emit_unary(ctx, node, "clip", (float(qrange[0]), float(qrange[1])), current, clipped)
    value = ctx.value(clipped)
    if value.is_const:
        ctx.set_const(out, value.const.astype(out_dtype))
    else:  # clipped integers: the conversion loses nothing, so a round trip through ``out`` may go
        ctx.emit_exact_conversion(clipped, out, out_dtype, node.name)


def dequantize(ctx: LoweringContext, node: Node, x: str, scale: str, zero_point: str | None, out: str,
               axis: int = 1, block_size: int = 0, out_dtype=np.float32) -> None:
    """``out = (x - zero_point) * scale`` in float32 (integers below 2**24 convert exactly)."""
    x_shape = ctx.shape(x)
    xf = as_dtype(ctx, node, x, np.float32)
    current = xf
    if zero_point is not None and not _is_zero(ctx, zero_point):
        zp = as_dtype(ctx, node, broadcastable(ctx, node, zero_point, x_shape, axis, block_size), np.float32)
        centred = ctx.temp(node, "centred")
        emit_binary(ctx, node, "sub", xf, zp, centred)
        current = centred
    scale_b = broadcastable(ctx, node, scale, x_shape, axis, block_size)
    emit_binary(ctx, node, "mul", current, as_dtype(ctx, node, scale_b, np.float32), out,
                out_dtype=np.dtype(out_dtype))


def _is_zero(ctx: LoweringContext, name: str) -> bool:
    value = ctx.values[name]
    return value.is_const and not np.any(value.const.astype(np.int64))


def _axis(node: Node) -> int:
    return int(node.attr("axis", 1))


@lowers("QuantizeLinear")
def lower_quantize_linear(ctx: LoweringContext, node: Node, opset: int) -> None:
    zero_point = const_input(ctx, node, 2)
    if node.attr("output_dtype", 0):  # ONNX requires it to agree with the zero point's type where both are given
        declared = onnx_dtype(node.attr("output_dtype"))
    elif len(node.inputs) > 2 and node.inputs[2]:
        declared = ctx.dtype(node.inputs[2])
    else:
        declared = np.dtype(np.uint8)
    if declared.name == "int32":
        raise UnsupportedOpError(node.op_type, node.name, "quantization to int32 is not an ONNX quantized type")
    held, qrange = quant_type(node, declared, "output")
    precision = int(node.attr("precision", 0))
    if precision not in (0, onnx.TensorProto.FLOAT):
        raise UnsupportedOpError(node.op_type, node.name, f"precision {onnx_dtype(precision).name}: gpumnn divides "
                                 "in float32 only")
    if not (ctx.one_pass_quantize and _read_as_8bit(ctx, node) and _one_pass(ctx, node, declared, zero_point)):
        quantize(ctx, node, node.inputs[0], node.inputs[1], zero_point, node.outputs[0], held, qrange,
                 _axis(node), int(node.attr("block_size", 0)))


#: the nodes whose QDQ patterns the static int8 lowering (``lowerings.int8_products``) may take
#: on the 8-bit tensor a DequantizeLinear reads
INT8_PATTERN_NODES = frozenset({"Conv", "Gemm", "MatMul", "Add", "MaxPool", "GlobalMaxPool", "GlobalAveragePool",
                                "Flatten", "Reshape"})


def _read_as_8bit(ctx: LoweringContext, node: Node) -> bool:
    """Whether something may read QuantizeLinear ``node``'s output as the 8-bit tensor itself: the
    graph, a node other than a DequantizeLinear, or a static int8 pattern after one. Where only
    conversions back to float would read it, the lowering's five ops let it go unstored
    (``round_trips``)."""
    reads = ctx.graph_reads
    output = node.outputs[0]
    if reads is None or output in reads.outputs:
        return True
    for reader in reads.readers.get(output, []):
        if reader.op_type != "DequantizeLinear":
            return True
        if ctx.int8_ops and any(r.op_type in INT8_PATTERN_NODES for r in reads.readers.get(reader.outputs[0], [])):
            return True
    return False


def scalar_constant(ctx: LoweringContext, name: str | None) -> np.ndarray | None:
    """A constant of one element as a 0-d array, else None."""
    value = ctx.values.get(name) if name else None
    if value is None or not value.is_const or value.const.size != 1:
        return None
    return value.const.reshape(())


def _one_pass(ctx: LoweringContext, node: Node, declared: np.dtype, zero_point: str | None) -> bool:
    """A QuantizeLinear of run-time float32 values by one positive float32 scale and one zero point
    to int8 or uint8 as one ``Quantize`` op (asked for by ``LoweringContext.one_pass_quantize``);
    False (nothing emitted) elsewhere."""
    x = ctx.value(node.inputs[0], node)
    scale = scalar_constant(ctx, node.inputs[1])
    zp = np.zeros((), declared) if zero_point is None else scalar_constant(ctx, zero_point)
    if (x.is_const or x.dtype != np.float32 or declared.name not in ("int8", "uint8") or node.attr("block_size", 0)
            or scale is None or scale.dtype != np.float32 or not np.isfinite(scale) or scale <= 0 or zp is None):
        return False
    lo, hi = RANGES[declared.name]
    op = A.Quantize((node.inputs[0],), (node.outputs[0],), node.name, count=x.size, y_scale=float(scale),
                    y_zero_point=int(zp), out_dtype=declared.name, lo=lo, hi=hi)
    ctx.emit(op, x.shape, declared)
    return True


@lowers("DequantizeLinear")
def lower_dequantize_linear(ctx: LoweringContext, node: Node, opset: int) -> None:
    x = const_input(ctx, node, 0)
    quant_type(node, ctx.dtype(x), "input")
    out_dtype = ctx.dtype(node.inputs[1])
    if node.attr("output_dtype", 0):
        out_dtype = onnx_dtype(node.attr("output_dtype"))
    if out_dtype.kind != "f":
        raise UnsupportedOpError(node.op_type, node.name, f"output type {out_dtype.name}")
    target = node.outputs[0]
    if out_dtype != np.float32:  # float16 output: computed in float32, rounded to float16
        target = ctx.temp(node, "float32")
    dequantize(ctx, node, x, node.inputs[1], const_input(ctx, node, 2), target, _axis(node),
               int(node.attr("block_size", 0)))
    if target != node.outputs[0]:
        value = ctx.value(target)
        if value.is_const:
            ctx.set_const(node.outputs[0], value.const.astype(out_dtype))
        else:
            emit_unary(ctx, node, "identity", (), target, node.outputs[0], out_dtype=out_dtype)


# -- the integer and quantized operators ---------------------------------------------------------
# Integer products are computed as float32 products of the zero-point-shifted values: exact while
# every partial sum stays below 2**24 in magnitude (K * 255 * 255 for uint8), the same integers as
# an int32 accumulation; no backend's MatMul or Conv2D kernel takes int32.

def sub_node(ctx: LoweringContext, node: Node, op_type: str, inputs: list[str], outputs: list[str],
             opset: int, **attrs) -> None:
    """Lower a float op of the same name as ``node`` (its atomic ops keep the node's name)."""
    from ..registry import LOWERINGS
    LOWERINGS[op_type](ctx, Node(op_type, node.name, inputs, outputs, attrs), opset)


def shifted(ctx: LoweringContext, node: Node, q: str, zero_point: str | None, axis: int = 1) -> str:
    """``q - zero_point`` in float32 (a per-axis zero point along ``axis``)."""
    out = ctx.temp(node, "shifted")
    qf = as_dtype(ctx, node, q, np.float32)
    if zero_point is None or _is_zero(ctx, zero_point):
        return qf
    zp = as_dtype(ctx, node, broadcastable(ctx, node, zero_point, ctx.shape(q), axis, 0), np.float32)
    emit_binary(ctx, node, "sub", qf, zp, out)
    return out


def requantize(ctx: LoweringContext, node: Node, acc: str, multiplier: str, zero_point: str | None, out: str,
               out_dtype, qrange: tuple[int, int]) -> None:
    """``out = clip(round_half_even(acc * multiplier + zero_point), qrange)`` (``multiplier`` broadcast)."""
    scaled = ctx.temp(node, "scaled")
    emit_binary(ctx, node, "mul", acc, multiplier, scaled)
    current = scaled
    if zero_point is not None and not _is_zero(ctx, zero_point):
        current = ctx.temp(node, "with_zero_point")
        emit_binary(ctx, node, "add", scaled, as_dtype(ctx, node, zero_point, np.float32), current)
    rounded = ctx.temp(node, "rounded")
    emit_unary(ctx, node, "round", (), current, rounded)
    clipped = ctx.temp(node, "clipped")
    emit_unary(ctx, node, "clip", (float(qrange[0]), float(qrange[1])), rounded, clipped)
    to_int(ctx, node, clipped, out, out_dtype)


def to_int(ctx: LoweringContext, node: Node, x: str, out: str, out_dtype) -> None:
    """An integer-valued float tensor as ``out_dtype`` (int32 storage)."""
    value = ctx.value(x)
    if value.is_const:
        ctx.set_const(out, value.const.astype(out_dtype))
    else:
        ctx.emit(A.Unary((x,), (out,), node.name, op="identity", count=value.size), value.shape, out_dtype)


def binary(ctx: LoweringContext, node: Node, op: str, a: str, b: str) -> str:
    out = ctx.temp(node, op)
    emit_binary(ctx, node, op, a, b, out)
    return out


def _float_param(ctx: LoweringContext, node: Node, name: str) -> str:
    return as_dtype(ctx, node, name, np.float32)


def _input(node: Node, index: int) -> str | None:
    return node.inputs[index] if len(node.inputs) > index and node.inputs[index] else None


def uint8_range_parameters(ctx: LoweringContext, node: Node, x: str, outer: int,
                           empty_scale: float) -> tuple[str, str]:
    """(scale, zero point) of each of ``outer`` rows of ``x`` for uint8: scale (max(x, 0) - min(x, 0)) / 255
    (``empty_scale`` when both are 0) and zero point clip(-min / scale, 0, 255) rounded half to even, both
    float32 of shape ``[outer]`` (ONNX's DynamicQuantizeLinear and ONNX Runtime's dynamic quantization)."""
    size = ctx.value(x).size // outer
    if size == 0:
        raise ModelError(f"node {node.name!r} ({node.op_type}): an empty input has no range")
    zero = _const(ctx, node, 0.0)
    extremes = []
    for op in ("max", "min"):
        reduced = ctx.temp(node, op)
        ctx.emit(A.Reduce((x,), (reduced,), node.name, op=op, outer=outer, size=size, inner=1), (outer,))
        extremes.append(binary(ctx, node, op, reduced, zero))
    span = binary(ctx, node, "sub", extremes[0], extremes[1])
    empty = as_dtype(ctx, node, binary(ctx, node, "equal", span, zero), np.float32)
    if empty_scale * 255.0 != 1.0:
        empty = binary(ctx, node, "mul", empty, _const(ctx, node, empty_scale * 255.0))
    filled = binary(ctx, node, "add", span, empty)
    scale = binary(ctx, node, "div", filled, _const(ctx, node, 255.0))
    initial = binary(ctx, node, "sub", zero, binary(ctx, node, "div", extremes[1], scale))
    clipped = ctx.temp(node, "zero_point_clipped")
    emit_unary(ctx, node, "clip", (0.0, 255.0), initial, clipped)
    zp = ctx.temp(node, "zero_point")
    emit_unary(ctx, node, "round", (), clipped, zp)
    return scale, zp


@lowers("DynamicQuantizeLinear")
def lower_dynamic_quantize_linear(ctx: LoweringContext, node: Node, opset: int) -> None:
    """uint8 with scale (max(x, 0) - min(x, 0)) / 255 (1/255 when both are 0) and the zero point
    clip(-min / scale, 0, 255) rounded half to even, as the ONNX reference computes them."""
    x = as_dtype(ctx, node, node.inputs[0], np.float32)
    scale, zp = uint8_range_parameters(ctx, node, x, 1, 1.0 / 255.0)
    y, y_scale, y_zp = (node.outputs + ["", "", ""])[:3]
    quantize(ctx, node, x, scale, zp, y or ctx.temp(node, "y"), np.dtype(np.uint8), RANGES["uint8"])
    if y_scale:
        ctx.alias(y_scale, scale, ())
    if y_zp:
        vector = ctx.temp(node, "zero_point_uint8")
        to_int(ctx, node, zp, vector, np.dtype(np.uint8))
        ctx.alias(y_zp, vector, ())


def dynamic_uint8_centred(ctx: LoweringContext, node: Node, x: str, outer: int) -> tuple[str, str]:
    """Each of ``outer`` rows of the float tensor ``x`` quantized to uint8 at run time as ONNX Runtime's
    dynamic quantization does (scale 1 for an all-zero row), less its zero point: (the integer-valued
    float32 ``q - zero_point`` shaped as ``x``, the scales ``[outer]``)."""
    scale, zp = uint8_range_parameters(ctx, node, x, outer, 1.0)
    x_shape = ctx.shape(x)
    ratio = binary(ctx, node, "div", x, broadcastable(ctx, node, scale, x_shape, 0, 0))
    rounded = ctx.temp(node, "rounded")
    emit_unary(ctx, node, "round", (), ratio, rounded)
    zp_b = broadcastable(ctx, node, zp, x_shape, 0, 0)
    clipped = ctx.temp(node, "clipped")
    emit_unary(ctx, node, "clip", (0.0, 255.0), binary(ctx, node, "add", rounded, zp_b), clipped)
    return binary(ctx, node, "sub", clipped, zp_b), scale


def _matmul_zero_point(ctx: LoweringContext, node: Node, zp: str | None, shape, row: bool) -> str | None:
    """A MatMul operand's zero point made to broadcast: a vector per row of A ([M] -> [M, 1]) or per
    column of B ([N], as given)."""
    if zp is None:
        return None
    zshape = ctx.shape(zp)
    if row and len(zshape) == 1 and zshape[0] > 1 and len(shape) >= 2:
        view = ctx.temp(node, "per_row")
        ctx.alias(view, zp, (zshape[0], 1))
        return view
    return zp


def _shift_operand(ctx: LoweringContext, node: Node, q: str, zp: str | None, row: bool) -> str:
    qf = as_dtype(ctx, node, q, np.float32)
    zp = _matmul_zero_point(ctx, node, zp, ctx.shape(q), row)
    if zp is None or _is_zero(ctx, zp):
        return qf
    return binary(ctx, node, "sub", qf, as_dtype(ctx, node, zp, np.float32))


def _size_one(ctx: LoweringContext, name: str) -> bool:
    return name in ctx.values and ctx.value(name).size == 1 and len(ctx.shape(name)) <= 1


def _dequantizing_nodes(ctx: LoweringContext, node: Node) -> tuple[Node, Node, str] | None:
    """``quantize_dynamic``'s pattern after a MatMulInteger of a uint8 run-time x by a constant int8
    weight [K, N] with no weight zero point (or a zero one) and x's zero point a single value:
    ``Mul(Cast(product, to=float), Mul(x_scale, weight_scale))``, each intermediate read by the next
    node alone and no graph output, x_scale a float32 single value and weight_scale a float32
    constant, per tensor or per column: (the Cast, the Mul, x_scale, weight_scale), or None."""
    reads = ctx.graph_reads
    x, w, x_zp, w_zp = (node.inputs + ["", "", "", ""])[:4]
    if reads is None or not x or not w or x not in ctx.values or w not in ctx.values:
        return None
    xv, wv = ctx.value(x), ctx.value(w)
    if xv.is_const or xv.dtype != np.uint8 or len(xv.shape) < 2 or not wv.is_const or wv.dtype != np.int8:
        return None
    if len(wv.shape) != 2 or wv.shape[0] != xv.shape[-1] or not 0 < wv.shape[0] <= A.QUANTIZED_MAX_K:
        return None
    if x_zp and not (_size_one(ctx, x_zp) and ctx.dtype(x_zp) == np.uint8):
        return None
    if w_zp and not (w_zp in ctx.values and ctx.value(w_zp).is_const and not ctx.value(w_zp).const.any()):
        return None
    cast = reads.only_reader(node.outputs[0])
    if cast is None or cast.op_type != "Cast" or cast.domain not in ("", "ai.onnx"):
        return None
    if int(cast.attrs.get("to", 0)) != onnx.TensorProto.FLOAT:
        return None
    mul = reads.only_reader(cast.outputs[0])
    if mul is None or mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") or len(mul.inputs) != 2:
        return None
    others = [n for n in mul.inputs if n != cast.outputs[0]]
    scales = reads.producers.get(others[0]) if len(others) == 1 else None
    if scales is None or scales.op_type != "Mul" or scales.domain not in ("", "ai.onnx") or len(scales.inputs) != 2:
        return None
    n = wv.shape[1]
    for x_scale, w_scale in (scales.inputs, scales.inputs[::-1]):
        if not (_size_one(ctx, x_scale) and ctx.dtype(x_scale) == np.float32):
            continue
        if w_scale in ctx.values and ctx.value(w_scale).is_const and ctx.dtype(w_scale) == np.float32 \
                and tuple(ctx.shape(w_scale)) in ((), (1,), (n,)):
            return cast, mul, x_scale, w_scale
    return None


def _lower_dequantizing_product(ctx: LoweringContext, node: Node) -> bool:
    """``quantize_dynamic``'s MatMulInteger, Cast and scaling Mul (``_dequantizing_nodes``) as one
    prequantized ``QuantizedMatMul`` on the int8 kernels, writing the Mul's output; False (nothing
    emitted) where the nodes are not that pattern."""
    found = _dequantizing_nodes(ctx, node)
    if found is None:
        return False
    cast, mul, x_scale, w_scale = found
    x, w = node.inputs[0], node.inputs[1]
    x_zp = _input(node, 2)
    x_shape, (k, n) = ctx.shape(x), ctx.shape(w)
    out_shape = tuple(x_shape[:-1]) + (n,)
    if x_zp is None:
        x_zp = _const(ctx, node, [0], np.uint8)
    column_scales = ctx.temp(node, "weight_scale")
    ctx.set_const(column_scales, np.ascontiguousarray(np.broadcast_to(ctx.value(w_scale).const.reshape(-1), (n,)),
                                                      dtype=np.float32))
    m = int(np.prod(x_shape[:-1], dtype=np.int64))
    ctx.emit(A.QuantizedMatMul((x, w, column_scales, x_scale, x_zp), (mul.outputs[0],), node.name, m=m, n=n, k=k,
                               prequantized=True), out_shape, np.dtype(np.float32))
    ctx.absorb(cast, mul)
    return True


@lowers("MatMulInteger")
def lower_matmul_integer(ctx: LoweringContext, node: Node, opset: int) -> None:
    """The exact product of the shifted operands in float32 (integer-valued), converted to int32;
    ``quantize_dynamic``'s MatMulInteger -> Cast -> Mul by the scales on the int8 kernel instead."""
    if _lower_dequantizing_product(ctx, node):
        return
    a = _shift_operand(ctx, node, const_input(ctx, node, 0), const_input(ctx, node, 2), row=True)
    b = _shift_operand(ctx, node, const_input(ctx, node, 1), const_input(ctx, node, 3), row=False)
    product = ctx.temp(node, "product")
    sub_node(ctx, node, "MatMul", [a, b], [product], opset)
    to_int(ctx, node, product, node.outputs[0], np.dtype(np.int32))


CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _conv_attrs(node: Node) -> dict:
    return {k: node.attrs[k] for k in CONV_ATTRS if k in node.attrs}


@lowers("ConvInteger")
def lower_conv_integer(ctx: LoweringContext, node: Node, opset: int) -> None:
    x = shifted(ctx, node, const_input(ctx, node, 0), const_input(ctx, node, 2))
    w = shifted(ctx, node, const_input(ctx, node, 1), const_input(ctx, node, 3), axis=0)
    acc = ctx.temp(node, "accumulated")
    sub_node(ctx, node, "Conv", [x, w], [acc], opset, **_conv_attrs(node))
    ctx.exact_integer_sources.add(node.name)
    to_int(ctx, node, acc, node.outputs[0], np.dtype(np.int32))


def _out_type(node: Node, ctx: LoweringContext, zp: str | None, fallback: str) -> tuple[np.dtype, tuple[int, int]]:
    return quant_type(node, ctx.dtype(zp) if zp is not None else ctx.dtype(fallback), "output")


def lower_qlinear_conv(ctx: LoweringContext, node: Node, opset: int) -> None:
    """The int32 accumulation of the shifted operands (plus the int32 bias) as float ops, requantized
    by x_scale * w_scale / y_scale (per output channel where w_scale is); registered by
    ``int8_products``, which first tries the int8 op."""
    x_q, x_scale, x_zp = const_input(ctx, node, 0), node.inputs[1], const_input(ctx, node, 2)
    w_q, w_scale, w_zp = const_input(ctx, node, 3), node.inputs[4], const_input(ctx, node, 5)
    y_scale, y_zp = node.inputs[6], const_input(ctx, node, 7)
    x = shifted(ctx, node, x_q, x_zp)
    w = shifted(ctx, node, w_q, w_zp, axis=0)
    inputs = [x, w]
    bias = _input(node, 8)
    if bias is not None:
        inputs.append(as_dtype(ctx, node, bias, np.float32))
    acc = ctx.temp(node, "accumulated")
    sub_node(ctx, node, "Conv", inputs, [acc], opset, **_conv_attrs(node))
    ctx.exact_integer_sources.add(node.name)
    rank = len(ctx.shape(acc))
    w_scale = broadcastable(ctx, node, w_scale, (ctx.shape(acc)[1],) + (1,) * (rank - 2), 0, 0)
    multiplier = binary(ctx, node, "div", binary(ctx, node, "mul", _float_param(ctx, node, x_scale),
                                                  _float_param(ctx, node, w_scale)), _float_param(ctx, node, y_scale))
    out_dtype, qrange = _out_type(node, ctx, y_zp, x_q)
    requantize(ctx, node, acc, multiplier, y_zp, node.outputs[0], out_dtype, qrange)


def lower_qlinear_matmul(ctx: LoweringContext, node: Node, opset: int) -> None:
    """The product of the shifted operands as a float MatMul, requantized (registered by
    ``int8_products``, which first tries the int8 op)."""
    a_q, a_scale, a_zp = const_input(ctx, node, 0), node.inputs[1], const_input(ctx, node, 2)
    b_q, b_scale, b_zp = const_input(ctx, node, 3), node.inputs[4], const_input(ctx, node, 5)
    y_scale, y_zp = node.inputs[6], const_input(ctx, node, 7)
    a = _shift_operand(ctx, node, a_q, a_zp, row=True)
    b = _shift_operand(ctx, node, b_q, b_zp, row=False)
    acc = ctx.temp(node, "accumulated")
    sub_node(ctx, node, "MatMul", [a, b], [acc], opset)
    a_scale = _matmul_zero_point(ctx, node, a_scale, ctx.shape(a_q), row=True)
    multiplier = binary(ctx, node, "div", binary(ctx, node, "mul", _float_param(ctx, node, a_scale),
                                                  _float_param(ctx, node, b_scale)), _float_param(ctx, node, y_scale))
    out_dtype, qrange = _out_type(node, ctx, y_zp, a_q)
    requantize(ctx, node, acc, multiplier, y_zp, node.outputs[0], out_dtype, qrange)
