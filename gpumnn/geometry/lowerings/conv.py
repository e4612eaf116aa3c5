"""Lowering of convolutions and pooling: Conv, ConvTranspose, MaxPool / AveragePool and the global
pools (1D as 2D on a free view), with the window checks they share."""
from __future__ import annotations

import math

from ... import atomic as A
from ...errors import ModelError, UnsupportedOpError
from ...ir import Node
from ..context import LoweringContext
from ..registry import lowers
from ..emit import fused_activation


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


def conv2d_geometry(node: Node, x_shape, w_shape, is1d: bool = False) -> dict:
    """The ``ConvGeometry`` fields of a Conv node on a 4D input ``x_shape`` with weights of the 4D
    ``w_shape`` (a 1D convolution seen as 2D with ``is1d``), checked; ModelError or
    UnsupportedOpError where they do not fit."""
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
                         f"{list(w_shape[-1:] if is1d else w_shape)}")
    strides = _pair(node.attr("strides"), 1, is1d, node, "strides")
    dilations = _pair(node.attr("dilations"), 1, is1d, node, "dilations")
    pads4 = _pads4(node, is1d)
    _check_window(node, (h, w), kernel, strides, dilations, pads4)
    pads, out_hw = _conv_geometry(node, (h, w), kernel, strides, dilations, pads4)
    _check_window(node, (h, w), kernel, strides, dilations, pads4, out_hw)
    return dict(batch=n, in_channels=c, in_hw=(h, w), out_channels=w_shape[0], out_hw=out_hw, kernel=kernel,
                strides=strides, pads=pads, dilations=dilations, groups=groups)


def lower_conv(ctx: LoweringContext, node: Node, opset: int) -> None:
    """Conv as a float Conv2D (registered by ``int8_products``, which first tries the int8 op)."""
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
    geometry = conv2d_geometry(node, x_shape, w_shape, is1d)
    n, out_hw = geometry["batch"], geometry["out_hw"]
    inputs = [x, w_name] + ([node.inputs[2]] if len(node.inputs) > 2 and node.inputs[2] else [])
    _check_bias(ctx, node, inputs, w_shape[0])
    out = node.outputs[0] if not is1d else ctx.temp(node, "out2d")
    op = A.Conv2D(tuple(inputs), (out,), node.name, **geometry, has_bias=len(inputs) == 3,
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
