"""Lowering of compute ops to atomic ops (Unary, Binary, Reduce, MatMul, Conv2D, ...).

Each function reads the concrete input shapes, computes the output shapes (this *is* shape
inference) and emits atomic ops. Ops that MNN would treat as compositions are lowered as such:
LRN becomes square -> channel-window average pool -> (bias + alpha*x)^beta -> divide, InstanceNorm
becomes Normalize + per-channel mul/add, 1D convolution is a 2D one on a free view.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import onnx

from ... import atomic as A
from ...errors import ModelError, UnsupportedOpError
from ...ir import Node
from ..context import LoweringContext
from ...numerics.strides import contiguous_strides, merge_dims
from ..registry import lowers
from .reorder import gather_constant_indices, norm_axis, reorder

ConstLookup = Callable[[str], "np.ndarray | None"]

UNARY_ONNX: dict[str, str] = {
    "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Exp": "exp", "Log": "log",
    "Sqrt": "sqrt", "Neg": "neg", "Abs": "abs", "Reciprocal": "reciprocal", "Floor": "floor",
    "Ceil": "ceil", "Round": "round", "Softplus": "softplus", "Sign": "sign", "HardSwish": "hard_swish",
    "LeakyRelu": "leaky_relu", "HardSigmoid": "hard_sigmoid", "Elu": "elu", "Gelu": "gelu", "Clip": "clip",
    "Selu": "selu", "Celu": "celu", "Mish": "mish", "ThresholdedRelu": "thresholded_relu",
}

BINARY_ONNX: dict[str, str] = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow",
                               "Max": "max", "Min": "min", "Sum": "add", "PRelu": "prelu"}


def unary_spec(node: Node, lookup: ConstLookup) -> tuple[str, tuple[float, ...]] | None:
    """The atomic unary (name, params) an ONNX activation node computes, or None if it cannot
    be expressed (e.g. Clip with data-dependent bounds). Shared by lowering and fusion."""
    op = node.op_type
    if op not in UNARY_ONNX:
        return None
    name = UNARY_ONNX[op]
    if op == "LeakyRelu":
        return name, (_scalar(node, "alpha", node.attr("alpha", 0.01)),)
    if op == "HardSigmoid":
        return name, (_scalar(node, "alpha", node.attr("alpha", 0.2)), _scalar(node, "beta", node.attr("beta", 0.5)))
    if op in ("Elu", "Celu", "ThresholdedRelu"):
        return name, (_scalar(node, "alpha", node.attr("alpha", 1.0)),)
    if op == "Selu":
        return name, (_scalar(node, "alpha", node.attr("alpha", 1.67326319217681884765625)),
                      _scalar(node, "gamma", node.attr("gamma", 1.05070102214813232421875)))
    if op == "Gelu":
        return (name, ()) if node.attr("approximate", "none") == "none" else None
    if op == "Clip":
        bounds = []
        for i, default, attr in ((1, -np.inf, "min"), (2, np.inf, "max")):
            if len(node.inputs) > i and node.inputs[i]:
                value = lookup(node.inputs[i])
                if value is None:
                    return None
                bounds.append(_scalar(node, attr, value))
            else:
                bounds.append(_scalar(node, attr, node.attr(attr, default)))
        if bounds == [0.0, np.inf]:
            return "relu", ()
        # ONNX defines Clip as min(max(x, lo), hi): with lo > hi every output is hi. OpenCL's and
        # GLSL's clamp() leave that case undefined, so it never reaches them.
        return name, (min(bounds), bounds[1])
    return name, ()


def _scalar(node: Node, what: str, value) -> float:
    """One number from an attribute or a one-element constant, else a ModelError naming the node."""
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind not in "biuf":
        raise ModelError(f"node {node.name!r} ({node.op_type}): {what} must be a single number, got {value!r}")
    return float(array.reshape(-1)[0])


def fused_activation(node: Node) -> A.Activation:
    act = node.attr("gpumnn_activation")
    return None if act is None else (act[0], tuple(act[1]))


# -- elementwise ---------------------------------------------------------------------------------

def broadcast_strides(out_shape: Sequence[int], in_shape: Sequence[int]) -> list[int]:
    """Element strides of ``in_shape`` read as if broadcast to ``out_shape`` (0 on broadcast dims)."""
    in_shape = [1] * (len(out_shape) - len(in_shape)) + list(in_shape)
    strides = contiguous_strides(tuple(in_shape))
    return [0 if d == 1 and o != 1 else s for d, o, s in zip(in_shape, out_shape, strides)]


def collapse_binary(out_shape, a_strides, b_strides, node: Node):
    """Merge dims contiguous in output and both inputs so any broadcast fits in RANK dims."""
    merged = merge_dims(out_shape, a_strides, b_strides)
    if len(merged) > A.RANK:
        raise UnsupportedOpError(node.op_type, node.name, f"broadcast over shape {list(out_shape)} needs more than {A.RANK} dims")
    merged = [(1, 0, 0)] * (A.RANK - len(merged)) + merged
    return tuple(m[0] for m in merged), tuple(m[1] for m in merged), tuple(m[2] for m in merged)


def as_dtype(ctx: LoweringContext, node: Node, name: str, dtype) -> str:
    """``name`` converted to ``dtype``'s storage: itself when it is held so already, else a
    converted constant or a converting Unary (ONNX Pow takes an integer exponent for a float base)."""
    value = ctx.value(name, node)
    dtype = np.dtype(dtype)
    if A.storage_dtype(value.dtype) == A.storage_dtype(dtype):
        return name
    converted = ctx.temp(node, f"as_{dtype.name}")
    if value.is_const:
        ctx.set_const(converted, value.const.astype(dtype))
    else:
        ctx.emit(A.Unary((name,), (converted,), node.name, op="identity", count=value.size), value.shape, dtype)
    return converted


def emit_binary(ctx: LoweringContext, node: Node, op: str, a: str, b: str, out: str,
                activation: A.Activation = None, out_dtype=None) -> None:
    b = as_dtype(ctx, node, b, ctx.dtype(a))  # the result has the first operand's type
    sa, sb = ctx.shape(a), ctx.shape(b)
    try:
        out_shape = tuple(np.broadcast_shapes(sa, sb))
    except ValueError:
        raise UnsupportedOpError(node.op_type, node.name, f"shapes {list(sa)} and {list(sb)} do not broadcast") from None
    try:
        shape4, a4, b4 = collapse_binary(out_shape, broadcast_strides(out_shape, sa), broadcast_strides(out_shape, sb), node)
    except UnsupportedOpError:
        # too many interleaved broadcast dims for RANK: materialise the smaller operand (a Raster) and retry
        small = a if ctx.value(a).size <= ctx.value(b).size else b
        expanded = ctx.temp(node, "broadcast")
        reorder(ctx, node, [small], lambda xs, f: [np.broadcast_to(xs[0], out_shape)], [expanded])
        a, b = (expanded, b) if small == a else (a, expanded)
        emit_binary(ctx, node, op, a, b, out, activation, out_dtype)
        return
    ctx.emit(A.Binary((a, b), (out,), node.name, op=op, out_shape=shape4, a_strides=a4, b_strides=b4,
                      activation=activation), out_shape, out_dtype)


def emit_unary(ctx: LoweringContext, node: Node, op: str, params: tuple[float, ...], x: str, out: str,
               out_dtype=None) -> None:
    ctx.emit(A.Unary((x,), (out,), node.name, op=op, params=params, count=ctx.value(x).size), ctx.shape(x), out_dtype)


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
    """Cast between the dtypes gpumnn holds. Float types share float32 storage (a Cast to float16
    rounds to float16's precision), integer types and bool share int32: a Cast to bool tests for
    non-zero, float to integer truncates toward zero, and a narrower integer type wraps."""
    if node.op_type == "CastLike":
        target = ctx.dtype(node.inputs[1])
    else:
        target = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(node.attr("to"))))
    source, out = node.inputs[0], node.outputs[0]
    value = ctx.value(source, node)
    if value.is_const:
        ctx.set_const(out, value.const.astype(target))
        return
    try:
        storage = A.storage_dtype(target)
    except TypeError:
        raise UnsupportedOpError(node.op_type, node.name, f"cast of run-time data to {target}: gpumnn holds float, "
                                 "integer and bool tensors only") from None
    if target == np.bool_:
        emit_unary(ctx, node, "nonzero", (), source, out, out_dtype=bool)
        return
    if target == np.float16:
        converted = as_dtype(ctx, node, source, np.float32)
        emit_unary(ctx, node, "round_f16", (), converted, out, out_dtype=np.float16)
        return
    narrow = storage == A.INT32 and target.itemsize < 4
    if A.storage_dtype(value.dtype) == storage and not (narrow and target.itemsize < value.dtype.itemsize):
        ctx.alias(out, source, value.shape, target)
        return
    if not narrow:
        ctx.emit(A.Unary((source,), (out,), node.name, op="identity", count=value.size), value.shape, target)
        return
    # int8/uint8/int16/uint16 wrap: ((x + offset) mod 2^bits) - offset, offset 2^(bits-1) for signed
    wide = as_dtype(ctx, node, source, np.int64)
    span = 1 << (8 * target.itemsize)
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


# -- convolution ---------------------------------------------------------------------------------

def _conv_geometry(node: Node, in_hw, kernel, strides, dilations, pads):
    """(pads_begin, out_hw) for Conv, honouring auto_pad."""
    auto_pad = node.attr("auto_pad", "NOTSET")
    out = []
    begins = []
    for i in range(2):
        eff = dilations[i] * (kernel[i] - 1) + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-in_hw[i] // strides[i])
            total = max(0, (o - 1) * strides[i] + eff - in_hw[i])
            begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        elif auto_pad == "VALID":
            begin, total = 0, 0
            o = (in_hw[i] - eff) // strides[i] + 1
        else:
            begin, total = pads[i], pads[i] + pads[i + 2]
            o = (in_hw[i] + total - eff) // strides[i] + 1
        out.append(o)
        begins.append(begin)
    return tuple(begins), tuple(out)


def _spatial_view(ctx: LoweringContext, node: Node, name: str) -> tuple[str, tuple[int, ...], bool]:
    """A 4D name for a 3D (1D-conv) or 4D tensor; 1D convolution runs as 2D with H=1."""
    shape = ctx.shape(name)
    if len(shape) == 4:
        return name, shape, False
    if len(shape) == 3:
        view = ctx.temp(node, "as2d")
        ctx.alias(view, name, (shape[0], shape[1], 1, shape[2]))
        return view, ctx.shape(view), True
    raise UnsupportedOpError(node.op_type, node.name, f"only 1D and 2D spatial inputs are supported, got shape {list(shape)}")


def _pair(values, default, is1d: bool, node: Node | None = None, what: str = "") -> tuple[int, int]:
    if values is None:
        return (default, default)
    values = _int_list(node, what, values, 1 if is1d else 2)
    return (1 if default == 1 else 0, values[0]) if is1d else (values[0], values[1])


def _pads4(node: Node, is1d: bool) -> list[int]:
    """The node's pads as [top, left, bottom, right] (a 1D op pads only its width)."""
    pads = _int_list(node, "pads", node.attr("pads", [0, 0] if is1d else [0, 0, 0, 0]), 2 if is1d else 4)
    return [0, pads[0], 0, pads[1]] if is1d else pads


def _int_list(node: Node | None, what: str, values, length: int) -> list[int]:
    """An ints attribute of the expected length, else a ModelError naming the node."""
    try:
        values = [int(v) for v in values]
    except (TypeError, ValueError):
        values = None
    if values is None or len(values) != length:
        where = f"node {node.name!r} ({node.op_type})" if node is not None else "a window op"
        raise ModelError(f"{where}: {what} must be {length} integers, got {node.attr(what) if node else values!r}")
    return values


def _check_window(node: Node, in_hw, kernel, strides, dilations, pads, out_hw=None) -> None:
    """Refuse a convolution or pooling window that is empty, never moves, or does not fit its input.

    Called before the geometry is computed (strides of 0 would divide by zero) and again with
    the output size, which must be at least 1: ONNX Runtime rounds a negative span up to one
    output element, which would read only padding, so gpumnn names the node instead.
    """
    where = f"node {node.name!r} ({node.op_type})"
    for what, values, low in (("kernel", kernel, 1), ("strides", strides, 1), ("dilations", dilations, 1),
                              ("pads", pads, 0)):
        if len(values) not in (2, 4) or any(int(v) < low for v in values):
            raise ModelError(f"{where}: {what} {list(values)} must be {'positive' if low else 'non-negative'} "
                             "(one value per spatial axis)")
        if any(int(v) >= 2**31 for v in values):
            raise ModelError(f"{where}: {what} {list(values)} exceed the 32-bit range of gpumnn's kernels")
    if out_hw is not None and any(o < 1 for o in out_hw):
        raise ModelError(f"{where}: a window of {list(kernel)} (dilations {list(dilations)}, strides {list(strides)}) "
                         f"does not fit the input of {list(in_hw)} padded by {list(pads)}: "
                         f"the output would be {list(out_hw)}")


def _check_bias(ctx: LoweringContext, node: Node, inputs: list[str], channels: int) -> None:
    """A convolution's optional third input must hold one value per output channel."""
    if len(inputs) == 3 and tuple(ctx.shape(inputs[2])) != (channels,):
        raise ModelError(f"node {node.name!r} ({node.op_type}): bias of shape {list(ctx.shape(inputs[2]))} for "
                         f"{channels} output channels")


@lowers("Conv")
def lower_conv(ctx: LoweringContext, node: Node, opset: int) -> None:
    w_name = node.inputs[1]
    w_shape = ctx.shape(w_name)
    if len(w_shape) != len(ctx.shape(node.inputs[0])):
        raise ModelError(f"node {node.name!r} (Conv): weights of shape {list(w_shape)} do not fit an input of shape "
                         f"{list(ctx.shape(node.inputs[0]))} (their ranks differ)")
    x, x_shape, is1d = _spatial_view(ctx, node, node.inputs[0])
    if is1d:
        w4 = ctx.temp(node, "w2d")
        ctx.alias(w4, w_name, (w_shape[0], w_shape[1], 1, w_shape[2]))
        w_name, w_shape = w4, ctx.shape(w4)
    n, c, h, w = x_shape
    groups = int(node.attr("group", 1))
    if groups < 1 or w_shape[0] % groups:
        raise ModelError(f"node {node.name!r} (Conv): group {groups} does not divide the {w_shape[0]} output channels")
    if c != w_shape[1] * groups:
        raise UnsupportedOpError("Conv", node.name, f"input has {c} channels, weights expect {w_shape[1] * groups}")
    kernel = tuple(w_shape[2:])
    declared = node.attr("kernel_shape")
    if declared is not None and list(declared) != list(kernel[-len(declared):] if is1d else kernel):
        raise ModelError(f"node {node.name!r} (Conv): kernel_shape {list(declared)} disagrees with the weights "
                         f"{list(ctx.shape(node.inputs[1]))}")
    strides = _pair(node.attr("strides"), 1, is1d, node, "strides")
    dilations = _pair(node.attr("dilations"), 1, is1d, node, "dilations")
    pads4 = _pads4(node, is1d)
    _check_window(node, (h, w), kernel, strides, dilations, pads4)
    pads, out_hw = _conv_geometry(node, (h, w), kernel, strides, dilations, pads4)
    _check_window(node, (h, w), kernel, strides, dilations, pads4, out_hw)
    inputs = [x, w_name] + ([node.inputs[2]] if len(node.inputs) > 2 and node.inputs[2] else [])
    _check_bias(ctx, node, inputs, w_shape[0])
    out = node.outputs[0] if not is1d else ctx.temp(node, "out2d")
    op = A.Conv2D(tuple(inputs), (out,), node.name, batch=n, in_channels=c, in_hw=(h, w),
                  out_channels=w_shape[0], out_hw=out_hw, kernel=kernel, strides=strides, pads=pads,
                  dilations=dilations, groups=groups, has_bias=len(inputs) == 3,
                  activation=fused_activation(node))
    ctx.emit(op, (n, w_shape[0]) + out_hw)
    if is1d:
        ctx.alias(node.outputs[0], out, (n, w_shape[0], out_hw[1]))


@lowers("ConvTranspose")
def lower_conv_transpose(ctx: LoweringContext, node: Node, opset: int) -> None:
    x, x_shape, is1d = _spatial_view(ctx, node, node.inputs[0])
    n, c, h, w = x_shape
    w_name = node.inputs[1]
    w_shape = ctx.shape(w_name)
    if is1d:  # a 1D transposed convolution runs as 2D with H=1, like Conv
        w4 = ctx.temp(node, "w2d")
        ctx.alias(w4, w_name, (w_shape[0], w_shape[1], 1, w_shape[2]))
        w_name, w_shape = w4, ctx.shape(w4)
    groups = int(node.attr("group", 1))
    if len(w_shape) != 4 or groups < 1 or w_shape[0] != c:
        raise ModelError(f"node {node.name!r} (ConvTranspose): weights of shape {list(w_shape)} with group {groups} "
                         f"do not fit an input of shape {list(x_shape)}")
    oc = w_shape[1] * groups
    kernel = tuple(w_shape[2:])
    strides = _pair(node.attr("strides"), 1, is1d, node, "strides")
    dilations = _pair(node.attr("dilations"), 1, is1d, node, "dilations")
    out_pad = list(_pair(node.attr("output_padding"), 0, is1d, node, "output_padding"))
    pads = _pads4(node, is1d)
    _check_window(node, (h, w), kernel, strides, dilations, pads)
    full = [strides[i] * ((h, w)[i] - 1) + out_pad[i] + dilations[i] * (kernel[i] - 1) + 1 for i in range(2)]
    if node.attr("output_shape") is not None:
        target = [1, list(node.attr("output_shape"))[-1]] if is1d else list(node.attr("output_shape"))[-2:]
        upper = node.attr("auto_pad", "NOTSET") == "SAME_UPPER"
        for i in range(2):
            total = full[i] - target[i]
            pads[i] = total // 2 if upper else total - total // 2
            pads[i + 2] = total - pads[i]
    elif node.attr("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
        for i in range(2):
            target = (h, w)[i] * strides[i]
            total = max(0, full[i] - target)
            pads[i] = total // 2 if node.attr("auto_pad") == "SAME_UPPER" else total - total // 2
            pads[i + 2] = total - pads[i]
    out_hw = (full[0] - pads[0] - pads[2], full[1] - pads[1] - pads[3])
    # output_shape may ask for more than the window covers: negative end pads, which extend the output
    _check_window(node, (h, w), kernel, strides, dilations, pads[:2] + [max(p, 0) for p in pads[2:]], out_hw)
    inputs = [x, w_name] + ([node.inputs[2]] if len(node.inputs) > 2 and node.inputs[2] else [])
    _check_bias(ctx, node, inputs, oc)
    out = node.outputs[0] if not is1d else ctx.temp(node, "out2d")
    op = A.ConvTranspose2D(tuple(inputs), (out,), node.name, batch=n, in_channels=c, in_hw=(h, w),
                           out_channels=oc, out_hw=out_hw, kernel=kernel, strides=strides,
                           pads=(pads[0], pads[1]), dilations=dilations, groups=groups,
                           has_bias=len(inputs) == 3, activation=fused_activation(node))
    ctx.emit(op, (n, oc) + out_hw)
    if is1d:
        ctx.alias(node.outputs[0], out, (n, oc, out_hw[1]))


# -- pooling -------------------------------------------------------------------------------------

def pool_output_size(size: int, kernel: int, stride: int, begin: int, end: int, ceil_mode: bool) -> int:
    span = size + begin + end - kernel
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + begin:
        out -= 1  # the last window must start inside the input or its leading padding
    return out


@lowers("MaxPool", "AveragePool")
def lower_pool(ctx: LoweringContext, node: Node, opset: int) -> None:
    if len(node.outputs) > 1 and node.outputs[1]:
        raise UnsupportedOpError(node.op_type, node.name, "the Indices output is not supported")
    x, (n, c, h, w), is1d = _spatial_view(ctx, node, node.inputs[0])
    if node.attr("kernel_shape") is None:
        raise ModelError(f"node {node.name!r} ({node.op_type}) has no kernel_shape attribute, which ONNX requires")
    kernel = _pair(node.attr("kernel_shape"), 1, is1d, node, "kernel_shape")
    strides = _pair(node.attr("strides"), 1, is1d, node, "strides")
    if any(d != 1 for d in node.attr("dilations", [1, 1])):
        raise UnsupportedOpError(node.op_type, node.name, "dilated pooling is not supported")
    pads4 = _pads4(node, is1d)
    _check_window(node, (h, w), kernel, strides, (1, 1), pads4)
    if any(p >= kernel[i % 2] for i, p in enumerate(pads4)):  # as ONNX Runtime: a window of padding only
        raise ModelError(f"node {node.name!r} ({node.op_type}): pads {pads4} must be smaller than the kernel "
                         f"{list(kernel)}")
    ceil_mode = bool(node.attr("ceil_mode", 0))
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER", "VALID"):
        (top, left), out_hw = _conv_geometry(node, (h, w), kernel, strides, (1, 1), pads4)
        bottom = max(0, (out_hw[0] - 1) * strides[0] + kernel[0] - h - top)
        right = max(0, (out_hw[1] - 1) * strides[1] + kernel[1] - w - left)
        pads = (top, left, bottom, right)
    else:
        pads = tuple(pads4)
        out_hw = (pool_output_size(h, kernel[0], strides[0], pads[0], pads[2], ceil_mode),
                  pool_output_size(w, kernel[1], strides[1], pads[1], pads[3], ceil_mode))
    _check_window(node, (h, w), kernel, strides, (1, 1), pads, out_hw)
    out = node.outputs[0] if not is1d else ctx.temp(node, "out2d")
    op = A.Pool2D((x,), (out,), node.name, op="max" if node.op_type == "MaxPool" else "avg", batch=n,
                  channels=c, in_hw=(h, w), out_hw=out_hw, kernel=kernel, strides=strides, pads=pads,
                  count_include_pad=bool(node.attr("count_include_pad", 0)))
    ctx.emit(op, (n, c) + out_hw)
    if is1d:
        ctx.alias(node.outputs[0], out, (n, c, out_hw[1]))


@lowers("GlobalAveragePool", "GlobalMaxPool")
def lower_global_pool(ctx: LoweringContext, node: Node, opset: int) -> None:
    shape = ctx.shape(node.inputs[0])
    n, c = shape[:2]
    spatial = math.prod(shape[2:])
    x = ctx.temp(node, "planes")
    ctx.alias(x, node.inputs[0], (n, c, 1, spatial))
    out = ctx.temp(node, "pooled")
    op = A.Pool2D((x,), (out,), node.name, op="max" if node.op_type == "GlobalMaxPool" else "avg", batch=n,
                  channels=c, in_hw=(1, spatial), out_hw=(1, 1), kernel=(1, spatial))
    ctx.emit(op, (n, c, 1, 1))
    ctx.alias(node.outputs[0], out, (n, c) + (1,) * (len(shape) - 2))


# -- matrix products -----------------------------------------------------------------------------

@lowers("Gemm")
def lower_gemm(ctx: LoweringContext, node: Node, opset: int) -> None:
    a, b = node.inputs[0], node.inputs[1]
    trans_a, trans_b = bool(node.attr("transA", 0)), bool(node.attr("transB", 0))
    sa, sb = ctx.shape(a), ctx.shape(b)
    if len(sa) != 2 or len(sb) != 2:
        raise UnsupportedOpError("Gemm", node.name, f"inputs must be 2D, got {list(sa)} and {list(sb)}")
    m, k = (sa[1], sa[0]) if trans_a else sa
    k2, n = (sb[1], sb[0]) if trans_b else sb
    if k != k2:
        raise UnsupportedOpError("Gemm", node.name, f"inner dimensions differ: {k} vs {k2}")
    inputs = [a, b]
    bias_strides = (0, 1)
    beta = float(node.attr("beta", 1.0))
    if len(node.inputs) > 2 and node.inputs[2] and beta != 0.0:
        inputs.append(node.inputs[2])
        c_shape = tuple(ctx.shape(node.inputs[2]))
        if len(c_shape) > 2 or any(c not in (1, o) for c, o in zip(c_shape[::-1], (n, m))):
            raise ModelError(f"node {node.name!r} (Gemm): C of shape {list(c_shape)} does not broadcast to the "
                             f"output [{m}, {n}]")
        bias_strides = tuple(broadcast_strides((m, n), c_shape))
    op = A.MatMul(tuple(inputs), (node.outputs[0],), node.name, batch=1, m=m, n=n, k=k,
                  trans_a=trans_a, trans_b=trans_b, alpha=float(node.attr("alpha", 1.0)), beta=beta,
                  has_bias=len(inputs) == 3, bias_strides=bias_strides, activation=fused_activation(node))
    ctx.emit(op, (m, n))


def _batched_operand(ctx: LoweringContext, node: Node, name: str, batch_shape: tuple[int, ...], mat: tuple[int, int]):
    """(tensor, batch stride) for a MatMul operand; broadcasts that are not plain sharing are materialised."""
    shape = ctx.shape(name)
    own = int(np.prod(shape[:-2], dtype=np.int64)) if len(shape) > 2 else 1
    batch = int(np.prod(batch_shape, dtype=np.int64))
    if own == 1:
        return name, 0
    if tuple(shape[:-2]) == tuple(batch_shape[len(batch_shape) - len(shape) + 2:]) and own == batch:
        return name, mat[0] * mat[1]
    expanded = ctx.temp(node, "expanded")
    target = tuple(batch_shape) + tuple(shape[-2:])
    reorder(ctx, node, [name], lambda xs, f: [np.broadcast_to(xs[0], target)], [expanded])
    return expanded, mat[0] * mat[1]


@lowers("MatMul")
def lower_matmul(ctx: LoweringContext, node: Node, opset: int) -> None:
    a, b = node.inputs[0], node.inputs[1]
    sa, sb = list(ctx.shape(a)), list(ctx.shape(b))
    squeeze_m, squeeze_n = len(sa) == 1, len(sb) == 1
    if squeeze_m:
        a2 = ctx.temp(node, "row")
        ctx.alias(a2, a, [1] + sa)
        a, sa = a2, [1] + sa
    if squeeze_n:
        b2 = ctx.temp(node, "col")
        ctx.alias(b2, b, sb + [1])
        b, sb = b2, sb + [1]
    m, k = sa[-2:]
    k2, n = sb[-2:]
    if k != k2:
        raise UnsupportedOpError("MatMul", node.name, f"inner dimensions differ: {sa} x {sb}")
    batch_shape = tuple(np.broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2])))
    batch = int(np.prod(batch_shape, dtype=np.int64))
    a, a_stride = _batched_operand(ctx, node, a, batch_shape, (m, k))
    b, b_stride = _batched_operand(ctx, node, b, batch_shape, (k, n))
    inputs = [a, b]
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None  # fused by optimize
    if bias is not None:
        inputs.append(bias)
    out_shape = list(batch_shape) + [m, n]
    final = node.outputs[0]
    target = final if not (squeeze_m or squeeze_n) else ctx.temp(node, "out")
    op = A.MatMul(tuple(inputs), (target,), node.name, batch=batch, m=m, n=n, k=k, a_batch_stride=a_stride,
                  b_batch_stride=b_stride, has_bias=bias is not None,
                  bias_strides=(0, 1), activation=fused_activation(node))
    ctx.emit(op, out_shape)
    if target != final:
        squeezed = list(batch_shape) + ([] if squeeze_m else [m]) + ([] if squeeze_n else [n])
        ctx.alias(final, target, squeezed)


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


# -- reductions ----------------------------------------------------------------------------------

REDUCE_ONNX = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min"}


def _empty_reduction(op: str, dtype: np.dtype):
    """ONNX's value of a reduction over nothing: the identity of ``op`` in ``dtype`` (the lowest
    value of an integer or bool type for max, not -inf)."""
    if op == "sum":
        return 0
    if op == "mean":
        return np.nan
    low, high = ((False, True) if dtype == np.bool_ else (np.iinfo(dtype).min, np.iinfo(dtype).max)
                 if dtype.kind in "iu" else (-np.inf, np.inf))
    return low if op == "max" else high


@lowers(*REDUCE_ONNX)
def lower_reduce(ctx: LoweringContext, node: Node, opset: int) -> None:
    shape = list(ctx.shape(node.inputs[0]))
    axes_from_input = opset >= 18 or (node.op_type == "ReduceSum" and opset >= 13)
    if axes_from_input:
        axes = list(np.asarray(ctx.const(node.inputs[1], node, "axes")).reshape(-1)) if len(node.inputs) > 1 and node.inputs[1] else []
    else:
        axes = list(node.attr("axes", []))
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            ctx.alias(node.outputs[0], node.inputs[0], shape)
            return
        axes = list(range(len(shape)))
    axes = sorted({norm_axis(int(a), len(shape), node) for a in axes})
    if any(shape[a] == 0 for a in axes):  # an empty reduction: ONNX's identity values, known now
        kept = [1 if i in axes else d for i, d in enumerate(shape)]
        final = kept if node.attr("keepdims", 1) else [d for i, d in enumerate(shape) if i not in axes]
        ctx.set_const(node.outputs[0], np.full(final, _empty_reduction(REDUCE_ONNX[node.op_type],
                                                                        ctx.dtype(node.inputs[0])), dtype=ctx.dtype(node.inputs[0])))
        return
    runs: list[list[int]] = []
    for a in axes:
        if runs and runs[-1][-1] == a - 1:
            runs[-1].append(a)
        else:
            runs.append([a])
    current, cur_shape = node.inputs[0], list(shape)
    op = REDUCE_ONNX[node.op_type]
    for i, run in enumerate(reversed(runs)):  # innermost first so earlier axis numbers stay valid
        lo, hi = run[0], run[-1] + 1
        out_shape = cur_shape[:lo] + [1] * (hi - lo) + cur_shape[hi:]
        target = ctx.temp(node, f"reduced{i}")
        ctx.emit(A.Reduce((current,), (target,), node.name, op=op,
                          outer=int(np.prod(cur_shape[:lo], dtype=np.int64)),
                          size=int(np.prod(cur_shape[lo:hi], dtype=np.int64)),
                          inner=int(np.prod(cur_shape[hi:], dtype=np.int64))), out_shape)
        current, cur_shape = target, out_shape
    final = cur_shape if node.attr("keepdims", 1) else [d for i, d in enumerate(cur_shape) if i not in axes]
    ctx.alias(node.outputs[0], current, final)


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


RESIZE_COORDS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric",
                 "tf_crop_and_resize")


def _resize_geometry(ctx: LoweringContext, node: Node, shape: tuple[int, ...]):
    """(output sizes, scale factors, roi as (start, end) per axis) of a Resize, with ``axes`` and
    ``keep_aspect_ratio_policy`` applied as the ONNX reference does."""
    rank = len(shape)
    axes = node.attr("axes")
    axes = list(range(rank)) if axes is None else [norm_axis(int(a), rank, node) for a in axes]
    if len(set(axes)) != len(axes):
        raise ModelError(f"node {node.name!r} (Resize): axes {axes} repeat an axis")

    def given(i: int, what: str) -> np.ndarray | None:
        if len(node.inputs) <= i or not node.inputs[i]:
            return None
        value = np.asarray(ctx.const(node.inputs[i], node, what), dtype=np.float64).reshape(-1)
        return value if value.size else None
    roi, scales, sizes = given(1, "roi"), given(2, "scales"), given(3, "sizes")
    for what, values, length in (("scales", scales, len(axes)), ("sizes", sizes, len(axes)),
                                 ("roi", roi, 2 * len(axes))):
        if values is not None and values.size != length:
            raise ModelError(f"node {node.name!r} (Resize): {values.size} {what} for {len(axes)} resized axes")
    factors, out = [1.0] * rank, list(shape)
    if sizes is not None:
        for a, size in zip(axes, sizes):
            out[a] = int(size)
            factors[a] = size / shape[a] if shape[a] else 1.0
        policy = node.attr("keep_aspect_ratio_policy", "stretch")
        if policy in ("not_larger", "not_smaller"):
            scale = (min if policy == "not_larger" else max)(factors[a] for a in axes)
            for a in axes:
                factors[a], out[a] = scale, int(scale * shape[a] + 0.5)
        elif policy != "stretch":
            raise ModelError(f"node {node.name!r} (Resize): keep_aspect_ratio_policy {policy!r} is not one of "
                             "stretch, not_larger, not_smaller")
    elif scales is not None:
        if not all(np.isfinite(scales)):
            raise ModelError(f"node {node.name!r} (Resize): scales {list(scales)} must be finite")
        for a, factor in zip(axes, scales):
            factors[a], out[a] = float(factor), int(np.floor(shape[a] * factor))
    else:
        raise UnsupportedOpError("Resize", node.name, "neither scales nor sizes is given")
    rois = [(0.0, 1.0)] * rank
    if roi is not None:
        for i, a in enumerate(axes):
            rois[a] = (float(roi[i]), float(roi[len(axes) + i]))
    return out, factors, rois


@lowers("Resize")
def lower_resize(ctx: LoweringContext, node: Node, opset: int) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    if len(shape) != 4:
        raise UnsupportedOpError("Resize", node.name, f"only 4D NCHW inputs are supported, got {list(shape)}")
    mode = node.attr("mode", "nearest")
    coord = node.attr("coordinate_transformation_mode", "half_pixel")
    if mode not in ("nearest", "linear", "cubic"):
        raise UnsupportedOpError("Resize", node.name, f"mode {mode!r} is not supported (nearest, linear, cubic)")
    if coord not in RESIZE_COORDS:
        raise UnsupportedOpError("Resize", node.name, f"coordinate_transformation_mode {coord!r} is not supported")
    if node.attr("exclude_outside", 0) and mode != "cubic":
        raise ModelError(f"node {node.name!r} (Resize): exclude_outside applies to mode 'cubic' only, "
                         f"not {mode!r} (ONNX Runtime refuses it too)")
    out, factors, rois = _resize_geometry(ctx, node, shape)
    if out[:2] != list(shape[:2]):
        raise UnsupportedOpError("Resize", node.name, "resizing the batch or channel axis is not supported")
    if min(out) < 0 or not all(np.isfinite(factors)) or min(factors) <= 0:
        raise ModelError(f"node {node.name!r} (Resize): output sizes {out} (scales {factors}) must be positive")
    if min(shape) < 1 or min(out) < 1:
        raise UnsupportedOpError("Resize", node.name, f"resizing an empty tensor ({list(shape)} to {out}) is not supported")
    nearest_mode = node.attr("nearest_mode", "round_prefer_floor")
    antialias = bool(node.attr("antialias", 0)) and mode != "nearest"
    # the Resize kernels sample 2 taps at the coordinates of sampling.resize_axis; the rest are matrix
    # products (half_pixel_symmetric too: the ONNX reference picks its taps from the coordinate in a way
    # that rounds differently from the kernels' tables at exact integers, and axis_weights follows it)
    if mode == "cubic" or antialias or node.attr("exclude_outside", 0) or coord in ("tf_crop_and_resize",
                                                                                    "half_pixel_symmetric"):
        _resize_by_matmul(ctx, node, shape, out, factors, rois, mode, coord, nearest_mode, antialias)
        return
    ctx.emit(A.Resize((x,), (node.outputs[0],), node.name, planes=shape[0] * shape[1], in_hw=tuple(shape[2:]),
                      out_hw=(out[2], out[3]), scales=(factors[2], factors[3]), mode=mode, coord=coord,
                      nearest_mode=nearest_mode), out)


def _resize_by_matmul(ctx: LoweringContext, node: Node, shape, out, factors, rois, mode: str, coord: str,
                      nearest_mode: str, antialias: bool) -> None:
    """Resize as separable matrix products: ``X @ Ww^T`` along the width, then ``Wh @ .`` along the
    height, with the ``[out, in]`` weight matrices of :func:`axis_weights` as constants.

    Exact for every mode and tap count (cubic, antialias, exclude_outside, tf_crop_and_resize),
    on every backend's MatMul. Outputs whose crop coordinate falls outside the input get zero
    rows, and the extrapolation value is added there afterwards.
    """
    from ...numerics.sampling import axis_weights
    n, c, h, w = shape
    oh, ow = out[2], out[3]
    options = dict(nearest_mode=nearest_mode, cubic_coeff_a=float(node.attr("cubic_coeff_a", -0.75)),
                   exclude_outside=bool(node.attr("exclude_outside", 0)), antialias=antialias)
    wh, outside_h = axis_weights(h, oh, factors[2], mode, coord, roi=rois[2], **options)
    ww, outside_w = axis_weights(w, ow, factors[3], mode, coord, roi=rois[3], **options)

    def weights(matrix: np.ndarray, hint: str) -> str:
        name = ctx.temp(node, hint)
        ctx.set_const(name, np.ascontiguousarray(matrix, dtype=np.float32))
        return name
    current, cur_w = node.inputs[0], w
    if not (ow == w and np.array_equal(ww, np.eye(w))):
        rows = ctx.temp(node, "rows")
        ctx.alias(rows, current, (n * c * h, w))
        along_w = ctx.temp(node, "resized_w")
        ctx.emit(A.MatMul((rows, weights(ww.T, "width_weights")), (along_w,), node.name, m=n * c * h, n=ow, k=w),
                 (n * c * h, ow))
        current, cur_w = along_w, ow
    if not (oh == h and np.array_equal(wh, np.eye(h))):
        planes = ctx.temp(node, "planes")
        ctx.alias(planes, current, (n * c, h, cur_w))
        along_h = ctx.temp(node, "resized_h")
        ctx.emit(A.MatMul((weights(wh, "height_weights"), planes), (along_h,), node.name, batch=n * c, m=oh,
                          n=cur_w, k=h, a_batch_stride=0, b_batch_stride=h * cur_w), (n * c, oh, cur_w))
        current = along_h
    extrapolated = outside_h[:, None] | outside_w[None, :]
    value = float(node.attr("extrapolation_value", 0.0))
    if value != 0.0 and extrapolated.any():
        resized = ctx.temp(node, "resized")
        ctx.alias(resized, current, out)
        emit_binary(ctx, node, "add", resized, weights(np.where(extrapolated, value, 0.0), "extrapolation"),
                    node.outputs[0])
    else:
        ctx.alias(node.outputs[0], current, out)


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
