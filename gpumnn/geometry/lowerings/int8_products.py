"""Static int8 products and sums: a QDQ model's convolutions and matrix products, QLinearConv and
QLinearMatMul, as one ``QuantizedConv2D`` each, and its residual sums and QLinearAdd as one
``QuantizedAdd`` each (ONNX Runtime's QDQ selectors, QNNPACK's operators).

The patterns ``quantize_static`` writes::

    DequantizeLinear(x_q) -> Conv / Gemm / MatMul (weight: DequantizeLinear of int8 constants,
    symmetric per tensor or per output channel; bias optional) -> [Relu | Clip] -> QuantizeLinear

    DequantizeLinear(a_q), DequantizeLinear(b_q) -> Add (equal shapes) -> [Relu | Clip] -> QuantizeLinear

    DequantizeLinear(x_q) -> MaxPool / GlobalMaxPool -> QuantizeLinear (x_q's scale, zero point, type)

    DequantizeLinear(x_q) -> GlobalAveragePool -> [Relu | Clip] -> QuantizeLinear (and QLinearGlobalAveragePool)

    DequantizeLinear(x_q) -> Flatten / Reshape -> QuantizeLinear (x_q's scale, zero point, type)

become one op reading the 8-bit tensors and writing the QuantizeLinear's output (the max pooling a max
Pool2D on the 8-bit values: exact, as both nodes are nondecreasing and a QuantizeLinear of a
DequantizeLinear's value by the same parameters gives the integer back, which makes a Flatten or
Reshape between them a view of x_q; the average one a
QuantizedGlobalAveragePool, int32 sums requantized, where ``LoweringContext.int8_average_pool``
asks for it), where the lowering is asked for it (``LoweringContext.int8_ops``: the session's scheme backend builds the ops, decided
in ``gpumnn.scheduler.precision``). Anything else, and every node where it is not asked, is lowered
in float as before. An activation's DequantizeLinear stays where other nodes read its float values;
its ops that nothing reads any more are dropped at the end of lowering.

Where the backend keeps 8-bit activations channels-last (``LoweringContext.int8_channels_last``,
decided in ``gpumnn.scheduler.precision.int8_channels_last``), a depthwise convolution reads and
writes NHWC tensors and a 1x1 convolution at stride 1 is the product of their rows
(``_channels_last_kind``); the residual sums of two such tensors add them as they lie. A convolution
over a few NCHW input channels (an image's first) whose output only such convolutions read writes it
channels-last itself (``out_channels_last``); where an NCHW op reads it too, it writes NCHW. Each writes
its NHWC tensor and a transposing Raster to the NCHW one the model names, which is dropped where
nothing reads it (a global average pooling reads the NHWC tensor: its output is the same either way), and an NCHW input is transposed once (``channels_last_twins``): the conversions
are left only at the boundaries to NCHW and float ops.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import atomic as A
from ...errors import ModelError, UnsupportedOpError
from ...ir import Node
from ..context import LoweringContext
from ..emit import fused_activation, reorder
from ..registry import DEFAULT_DOMAINS, lowers
from .conv import conv2d_geometry, lower_conv, lower_global_pool, lower_pool
from .elementwise import lower_binary
from .matmul import lower_gemm, lower_matmul
from .microsoft import MS, lower_qlinear_binary, lower_qlinear_global_average_pool
from .quantize import RANGES, lower_qlinear_conv, lower_qlinear_matmul, scalar_constant
from .reorder import lower_flatten, lower_reshape

_INT32 = np.iinfo(np.int32)
#: the most NCHW input channels of a convolution that writes channels-last 8-bit activations for
#: channels-last readers (an image's first convolution: grey, RGB or RGBA in)
STEM_CHANNELS = 4


@dataclass(frozen=True)
class _Quantization:
    """An 8-bit tensor's quantization: the tensor (or constant), its scale and zero point."""

    tensor: str
    scale: np.float32
    zero_point: int
    dtype: np.dtype


def _input(node: Node, index: int) -> str | None:
    return node.inputs[index] if len(node.inputs) > index and node.inputs[index] else None


def _is_op(node: Node | None, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in DEFAULT_DOMAINS


def _quantization(ctx: LoweringContext, q: str, scale: str | None, zero_point: str | None) -> _Quantization | None:
    """A run-time int8/uint8 tensor's one float32 scale (positive) and one zero point, else None."""
    value = ctx.values.get(q)
    if value is None or value.is_const or value.dtype not in (np.int8, np.uint8):
        return None
    s = scalar_constant(ctx, scale)
    zp = np.zeros((), value.dtype) if zero_point is None else scalar_constant(ctx, zero_point)
    if s is None or s.dtype != np.float32 or not np.isfinite(s) or s <= 0 or zp is None or zp.dtype != value.dtype:
        return None
    return _Quantization(q, np.float32(s), int(zp), value.dtype)


def _dequantized_activation(ctx: LoweringContext, name: str) -> _Quantization | None:
    """The quantization of the 8-bit tensor that a per-tensor DequantizeLinear turns into ``name``."""
    dq = ctx.graph_reads.producers.get(name)
    if not _is_op(dq, "DequantizeLinear") or dq.attr("block_size", 0) or dq.attr("output_dtype", 0):
        return None
    return _quantization(ctx, dq.inputs[0], dq.inputs[1], _input(dq, 2))


def _symmetric_int8(ctx: LoweringContext, q: str | None, scale: str | None, zero_point: str | None,
                    channels: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(int8 weight, float32 scale per output channel [channels]) of a constant symmetric int8
    weight with one scale or one per channel, else None."""
    value = ctx.values.get(q) if q else None
    scales = ctx.values.get(scale) if scale else None
    if value is None or not value.is_const or value.dtype != np.int8 or scales is None or not scales.is_const:
        return None
    if zero_point is not None:
        zp = ctx.values.get(zero_point)
        if zp is None or not zp.is_const or np.any(zp.const):
            return None
    s = scales.const
    if s.dtype != np.float32 or s.size not in (1, channels) or not np.all(np.isfinite(s)) or np.any(s <= 0):
        return None
    return value.const, np.ascontiguousarray(np.broadcast_to(s.reshape(-1), (channels,)), np.float32)


def _dequantized_weight(ctx: LoweringContext, name: str, channels: int, axis: int):
    """(int8 weight, scale per output channel) of a DequantizeLinear of int8 constants along
    ``axis`` (the output channels' axis of the weight), else None."""
    dq = ctx.graph_reads.producers.get(name)
    if not _is_op(dq, "DequantizeLinear") or dq.attr("block_size", 0) or dq.attr("output_dtype", 0):
        return None
    found = _symmetric_int8(ctx, dq.inputs[0], dq.inputs[1], _input(dq, 2), channels)
    if found is None:
        return None
    rank = len(found[0].shape)
    if ctx.values[dq.inputs[1]].const.size > 1 and int(dq.attr("axis", 1)) % max(rank, 1) != axis:
        return None
    return found


def _quantized_bound(value: float, out: _Quantization, lo: int, hi: int) -> int:
    """QuantizeLinear of one float bound, as the lowering computes it (float32, half to even)."""
    return int(np.clip(np.rint(np.float32(value) / out.scale) + out.zero_point, lo, hi))


@dataclass(frozen=True)
class _Requantization:
    """Where a product's result goes: the QuantizeLinear (and the nodes before it) that the op
    absorbs, the output's quantization and its clamp."""

    nodes: tuple[Node, ...]
    output: str
    quantization: _Quantization
    lo: int
    hi: int


def _requantizing_reader(ctx: LoweringContext, node: Node) -> _Requantization | None:
    """The QuantizeLinear (per tensor, to int8 or uint8) that alone reads ``node``'s output, through
    at most one Relu or Clip (or ``node``'s fused one), else None."""
    reads = ctx.graph_reads
    activation = fused_activation(node)
    nodes: list[Node] = []
    reader = reads.only_reader(node.outputs[0])
    if activation is None and (_is_op(reader, "Relu") or _is_op(reader, "Clip")):
        if reader.op_type == "Relu":
            activation = ("relu", ())
        else:
            bounds = [scalar_constant(ctx, _input(reader, i)) for i in (1, 2)]
            if any(b is None and _input(reader, i) for b, i in zip(bounds, (1, 2))):
                return None
            activation = ("clip", (-np.inf if bounds[0] is None else float(bounds[0]),
                                   np.inf if bounds[1] is None else float(bounds[1])))
        nodes.append(reader)
        reader = reads.only_reader(reader.outputs[0])
    if not _is_op(reader, "QuantizeLinear") or reader.attr("block_size", 0):
        return None
    zero_point = _input(reader, 2)
    declared = reader.attr("output_dtype", 0)
    if declared not in (0, 2, 3):  # unset, uint8, int8 (TensorProto codes)
        return None
    dtype = np.dtype(np.int8 if declared == 3 else np.uint8) if declared else (
        ctx.dtype(zero_point) if zero_point else np.dtype(np.uint8))
    if dtype not in (np.int8, np.uint8) or reader.attr("precision", 0) not in (0, 1):
        return None
    scale = scalar_constant(ctx, reader.inputs[1])
    zp = np.zeros((), dtype) if zero_point is None else scalar_constant(ctx, zero_point)
    if scale is None or scale.dtype != np.float32 or not np.isfinite(scale) or scale <= 0 or zp is None:
        return None
    out = _Quantization(reader.outputs[0], np.float32(scale), int(zp), dtype)
    lo, hi = RANGES[dtype.name]
    if activation is not None:
        if activation[0] == "relu":
            lo = max(lo, out.zero_point)
        elif activation[0] == "clip":  # QuantizeLinear is nondecreasing: it commutes with the clamp
            a, b = activation[1]
            lo, hi = max(lo, _quantized_bound(a, out, lo, hi)), min(hi, _quantized_bound(b, out, lo, hi))
        else:
            return None
    if lo > hi:
        return None
    return _Requantization(tuple(nodes) + (reader,), reader.outputs[0], out, lo, hi)


def _integer_bias(ctx: LoweringContext, bias: str | None, product_scale: np.ndarray) -> np.ndarray | None:
    """The bias in units of x_scale * w_scale as int32 [OC] (zeros without one), else None: a
    bias that ``quantize_static`` quantized that way is its integers again."""
    if bias is None:
        return np.zeros(product_scale.shape, np.int32)
    value = ctx.values.get(bias)
    if value is None or not value.is_const or value.const.size not in (1, product_scale.size):
        return None
    integers = np.rint(value.const.astype(np.float64).reshape(-1) / product_scale.astype(np.float64))
    if not np.all(np.isfinite(integers)) or integers.min(initial=0) < _INT32.min or integers.max(initial=0) > _INT32.max:
        return None
    return np.ascontiguousarray(np.broadcast_to(integers, product_scale.shape), np.int32)


def _emit(ctx: LoweringContext, node: Node, x: _Quantization, weight: np.ndarray, w_scale: np.ndarray,
          bias: np.ndarray, out: _Requantization, geometry: dict, out_shape: tuple[int, ...]) -> None:
    """One QuantizedConv2D of ``x`` by the int8 ``weight`` [OC, C/groups, KH, KW] into ``out``; on
    channels-last activations (``_channels_last_kind``) a depthwise one reads and writes them and a
    1x1 one is the product of their rows."""
    multiplier = (x.scale * w_scale / out.quantization.scale).astype(np.float32)
    names = []
    for hint, array in (("weight_int8", weight), ("bias_int32", bias), ("multiplier", multiplier)):
        names.append(ctx.temp(node, hint))
        ctx.set_const(names[-1], np.ascontiguousarray(array))
    kind = _channels_last_kind(ctx, geometry, out.output)
    source, target, target_shape, extra = x.tensor, out.output, out_shape, {}
    if kind:
        n, oc, (oh, ow) = geometry["batch"], geometry["out_channels"], geometry["out_hw"]
        target, target_shape = ctx.temp(node, "nhwc"), (n, oh, ow, oc)
        if kind != "stem":
            source = _channels_last_input(ctx, node, x.tensor)
        if kind == "product":
            geometry = _product_geometry(n * oh * ow, geometry["in_channels"], oc)
        else:
            extra = {"channels_last": True} if kind == "depthwise" else {"out_channels_last": True}
    op = A.QuantizedConv2D((source, *names), (target,), node.name, **geometry, x_zero_point=x.zero_point,
                           y_zero_point=out.quantization.zero_point, out_dtype=out.quantization.dtype.name,
                           lo=out.lo, hi=out.hi, **extra)
    ctx.emit(op, target_shape, out.quantization.dtype)
    if kind:
        _channels_first_output(ctx, node, target, out.output)
    ctx.absorb(*out.nodes)
    ctx.int8_fused = True


def _channels_last_kind(ctx: LoweringContext, geometry: dict, output: str | None = None) -> str:
    """How a convolution runs where the backend keeps 8-bit activations channels-last
    (``LoweringContext.int8_channels_last``): "depthwise" (a ``channels_last`` QuantizedConv2D),
    "product" (a 1x1 at stride 1 without padding: the rows' product), "stem" (an undilated window over
    at most STEM_CHANNELS NCHW input channels whose quantized ``output`` only convolutions of the first
    two kinds read: an ``out_channels_last`` QuantizedConv2D, NCHW in, NHWC out), or "" (NCHW, as
    elsewhere)."""
    if not ctx.int8_channels_last or geometry["in_hw"] == (1, 1) and geometry["kernel"] == (1, 1):
        return ""  # a product's rows already
    c, oc, groups = geometry["in_channels"], geometry["out_channels"], geometry["groups"]
    if groups > 1 and groups == c == oc:
        return "depthwise"
    if (groups == 1 and geometry["kernel"] == (1, 1) and geometry["strides"] == (1, 1)
            and geometry["pads"] == (0, 0) and geometry["out_hw"] == geometry["in_hw"]):
        return "product"
    if (output is not None and groups == 1 and c <= STEM_CHANNELS and geometry["kernel"] != (1, 1)
            and geometry["dilations"] == (1, 1)
            and _read_channels_last(ctx, output, (geometry["batch"], oc) + tuple(geometry["out_hw"]))):
        return "stem"
    return ""


def _read_channels_last(ctx: LoweringContext, output: str, shape: tuple[int, ...]) -> bool:
    """Whether every node reading the 8-bit ``output`` (of NCHW ``shape``) is a per-tensor
    DequantizeLinear that only Conv nodes read which run on channels-last activations
    (``_channels_last_kind`` "depthwise" or "product"), and no graph output is among them."""
    reads = ctx.graph_reads
    dequantizers = reads.readers.get(output, [])
    if not dequantizers or output in reads.outputs:
        return False
    for dq in dequantizers:
        if not _is_op(dq, "DequantizeLinear") or dq.inputs[0] != output or dq.attr("block_size", 0):
            return False
        convs = reads.readers.get(dq.outputs[0], [])
        if not convs or dq.outputs[0] in reads.outputs:
            return False
        for conv in convs:
            w_shape = _weight_shape(ctx, _input(conv, 1))
            if not _is_op(conv, "Conv") or conv.inputs[0] != dq.outputs[0] or w_shape is None or len(w_shape) != 4:
                return False
            try:
                geometry = conv2d_geometry(conv, shape, w_shape)
            except (ModelError, UnsupportedOpError):
                return False
            if _channels_last_kind(ctx, geometry) not in ("depthwise", "product"):
                return False
    return True


def _weight_shape(ctx: LoweringContext, name: str | None) -> tuple[int, ...] | None:
    """The shape of a convolution's weight: a tensor lowered already, or the constant a
    DequantizeLinear not yet lowered reads."""
    if name is None:
        return None
    if name in ctx.values:
        return tuple(ctx.shape(name))
    dq = ctx.graph_reads.producers.get(name)
    if _is_op(dq, "DequantizeLinear") and dq.inputs[0] in ctx.values:
        return tuple(ctx.shape(dq.inputs[0]))
    return None


def _channels_last_input(ctx: LoweringContext, node: Node, tensor: str) -> str:
    """The channels-last [N, H, W, C] tensor holding the NCHW ``tensor``'s values: the one an int8
    op wrote, else a transposing Raster (made once per tensor)."""
    twin = ctx.channels_last_twins.get(tensor)
    if twin is None:
        twin = ctx.temp(node, "nhwc")
        reorder(ctx, node, [tensor], lambda arrays, fill: [arrays[0].transpose(0, 2, 3, 1)], [twin])
        ctx.channels_last_twins[tensor] = twin
    return twin


def _channels_first_output(ctx: LoweringContext, node: Node, twin: str, output: str) -> None:
    """``output`` (NCHW) from the channels-last ``twin`` an int8 op wrote, for the ops that read it
    as NCHW: a transposing Raster, dropped at the end of lowering where nothing reads it."""
    reorder(ctx, node, [twin], lambda arrays, fill: [arrays[0].transpose(0, 3, 1, 2)], [output])
    ctx.channels_last_twins[output] = twin


def _int8_conv(ctx: LoweringContext, node: Node) -> bool:
    """A QDQ Conv as QuantizedConv2D (see the module docstring); False where it is not one."""
    x = _dequantized_activation(ctx, node.inputs[0])
    w_shape = ctx.shape(node.inputs[1])
    if x is None or len(w_shape) != 4 or len(ctx.shape(x.tensor)) != 4:
        return False
    weight = _dequantized_weight(ctx, node.inputs[1], w_shape[0], axis=0)
    out = _requantizing_reader(ctx, node)
    if weight is None or out is None:
        return False
    bias = _integer_bias(ctx, _input(node, 2), x.scale * weight[1])
    if bias is None:
        return False
    geometry = conv2d_geometry(node, ctx.shape(x.tensor), w_shape)
    _emit(ctx, node, x, weight[0], weight[1], bias, out, geometry,
          (geometry["batch"], w_shape[0]) + geometry["out_hw"])
    return True


def _product_geometry(m: int, k: int, n: int) -> dict:
    """A product of m rows [m, k] by [k, n] as a 1x1 convolution of m images of k channels."""
    return dict(batch=m, in_channels=k, in_hw=(1, 1), out_channels=n, out_hw=(1, 1), kernel=(1, 1))


def _int8_product(ctx: LoweringContext, node: Node, trans_b: bool, bias: str | None) -> bool:
    """A QDQ Gemm or MatMul of rows by a constant 2D weight as QuantizedConv2D; False elsewhere."""
    x = _dequantized_activation(ctx, node.inputs[0])
    b_shape = ctx.shape(node.inputs[1])
    if x is None or len(b_shape) != 2 or len(ctx.shape(x.tensor)) < 2:
        return False
    x_shape = ctx.shape(x.tensor)
    k, n = b_shape[::-1] if trans_b else b_shape
    if x_shape[-1] != k:
        return False
    weight = _dequantized_weight(ctx, node.inputs[1], n, axis=0 if trans_b else 1)
    out = _requantizing_reader(ctx, node)
    if weight is None or out is None:
        return False
    integer_bias = _integer_bias(ctx, bias, x.scale * weight[1])
    if integer_bias is None:
        return False
    rows = weight[0] if trans_b else weight[0].T
    m = int(np.prod(x_shape[:-1], dtype=np.int64))
    _emit(ctx, node, x, rows.reshape(n, k, 1, 1), weight[1], integer_bias, out, _product_geometry(m, k, n),
          tuple(x_shape[:-1]) + (n,))
    return True


@lowers("Conv")
def lower_conv_int8_or_float(ctx: LoweringContext, node: Node, opset: int) -> None:
    if not (ctx.int8_ops and ctx.graph_reads is not None and _int8_conv(ctx, node)):
        lower_conv(ctx, node, opset)


@lowers("Gemm")
def lower_gemm_int8_or_float(ctx: LoweringContext, node: Node, opset: int) -> None:
    plain = (not node.attr("transA", 0) and float(node.attr("alpha", 1.0)) == 1.0
             and float(node.attr("beta", 1.0)) == 1.0)
    bias = _input(node, 2)
    if bias is not None and len(ctx.shape(bias)) == 2 and ctx.shape(bias)[0] != 1:
        plain = False  # a bias per row
    if not (plain and ctx.int8_ops and ctx.graph_reads is not None
            and _int8_product(ctx, node, bool(node.attr("transB", 0)), bias)):
        lower_gemm(ctx, node, opset)


@lowers("MatMul")
def lower_matmul_int8_or_float(ctx: LoweringContext, node: Node, opset: int) -> None:
    if not (ctx.int8_ops and ctx.graph_reads is not None and len(node.inputs) == 2
            and _int8_product(ctx, node, False, None)):
        lower_matmul(ctx, node, opset)


def _int8_qlinear_conv(ctx: LoweringContext, node: Node) -> bool:
    """QLinearConv with per-tensor x and y and a symmetric int8 weight as QuantizedConv2D."""
    x = _quantization(ctx, node.inputs[0], node.inputs[1], _input(node, 2))
    w_shape = ctx.shape(node.inputs[3])
    if x is None or len(w_shape) != 4 or len(ctx.shape(x.tensor)) != 4:
        return False
    weight = _symmetric_int8(ctx, node.inputs[3], node.inputs[4], _input(node, 5), w_shape[0])
    y_zp = _input(node, 7)
    dtype = ctx.dtype(y_zp) if y_zp else np.dtype(np.uint8)
    scale = scalar_constant(ctx, node.inputs[6])
    zp = np.zeros((), dtype) if y_zp is None else scalar_constant(ctx, y_zp)
    bias = _input(node, 8)
    bias_value = ctx.values.get(bias) if bias else None
    if weight is None or scale is None or scale.dtype != np.float32 or scale <= 0 or zp is None \
            or dtype not in (np.int8, np.uint8) or bias and not (bias_value.is_const and bias_value.dtype == np.int32):
        return False
    out = _Quantization(node.outputs[0], np.float32(scale), int(zp), dtype)
    integer_bias = np.zeros(w_shape[0], np.int32) if bias is None else bias_value.const.reshape(-1).astype(np.int32)
    geometry = conv2d_geometry(node, ctx.shape(x.tensor), w_shape)
    lo, hi = RANGES[dtype.name]
    _emit(ctx, node, x, weight[0], weight[1], integer_bias, _Requantization((), node.outputs[0], out, lo, hi),
          geometry, (geometry["batch"], w_shape[0]) + geometry["out_hw"])
    return True


@lowers("QLinearConv")
def lower_qlinear_conv_int8_or_float(ctx: LoweringContext, node: Node, opset: int) -> None:
    if not (ctx.int8_ops and _int8_qlinear_conv(ctx, node)):
        lower_qlinear_conv(ctx, node, opset)


def _int8_qlinear_matmul(ctx: LoweringContext, node: Node) -> bool:
    """QLinearMatMul of per-tensor 8-bit rows by a constant symmetric int8 [K, N] as QuantizedConv2D."""
    x = _quantization(ctx, node.inputs[0], node.inputs[1], _input(node, 2))
    b_shape = ctx.shape(node.inputs[3])
    if x is None or len(b_shape) != 2 or len(ctx.shape(x.tensor)) < 2 or ctx.shape(x.tensor)[-1] != b_shape[0]:
        return False
    k, n = b_shape
    weight = _symmetric_int8(ctx, node.inputs[3], node.inputs[4], _input(node, 5), n)
    y_zp = _input(node, 7)
    dtype = ctx.dtype(y_zp) if y_zp else np.dtype(np.uint8)
    scale = scalar_constant(ctx, node.inputs[6])
    zp = np.zeros((), dtype) if y_zp is None else scalar_constant(ctx, y_zp)
    if weight is None or scale is None or scale.dtype != np.float32 or scale <= 0 or zp is None \
            or dtype not in (np.int8, np.uint8):
        return False
    out = _Quantization(node.outputs[0], np.float32(scale), int(zp), dtype)
    x_shape = ctx.shape(x.tensor)
    m = int(np.prod(x_shape[:-1], dtype=np.int64))
    lo, hi = RANGES[dtype.name]
    _emit(ctx, node, x, weight[0].T.reshape(n, k, 1, 1), weight[1], np.zeros(n, np.int32),
          _Requantization((), node.outputs[0], out, lo, hi), _product_geometry(m, k, n), tuple(x_shape[:-1]) + (n,))
    return True


@lowers("QLinearMatMul")
def lower_qlinear_matmul_int8_or_float(ctx: LoweringContext, node: Node, opset: int) -> None:
    if not (ctx.int8_ops and _int8_qlinear_matmul(ctx, node)):
        lower_qlinear_matmul(ctx, node, opset)


def _emit_add(ctx: LoweringContext, node: Node, a: _Quantization, b: _Quantization, out: _Requantization) -> bool:
    """One QuantizedAdd of ``a`` and ``b`` into ``out`` (on their channels-last twins where int8 ops
    wrote both so); False (nothing emitted) where the operands are not one 8-bit type of one shape."""
    shape = ctx.shape(a.tensor)
    if a.dtype != b.dtype or ctx.shape(b.tensor) != shape:
        return False
    q = out.quantization
    twins = ctx.channels_last_twins
    channels_last = a.tensor in twins and b.tensor in twins
    sources = (twins[a.tensor], twins[b.tensor]) if channels_last else (a.tensor, b.tensor)
    target = ctx.temp(node, "nhwc") if channels_last else out.output
    op = A.QuantizedAdd(sources, (target,), node.name, count=ctx.value(a.tensor).size,
                        a_scale=float(a.scale), a_zero_point=a.zero_point, b_scale=float(b.scale),
                        b_zero_point=b.zero_point, y_scale=float(q.scale), y_zero_point=q.zero_point,
                        out_dtype=q.dtype.name, lo=out.lo, hi=out.hi)
    ctx.emit(op, ctx.shape(sources[0]), q.dtype)
    if channels_last:
        _channels_first_output(ctx, node, target, out.output)
    ctx.absorb(*out.nodes)
    ctx.int8_fused = True
    return True


def _int8_add(ctx: LoweringContext, node: Node) -> bool:
    """A QDQ Add of two dequantized 8-bit tensors of one shape as QuantizedAdd; False elsewhere."""
    inputs = [n for n in node.inputs if n]
    if len(inputs) != 2:
        return False
    a, b = (_dequantized_activation(ctx, name) for name in inputs)
    if a is None or b is None:
        return False
    out = _requantizing_reader(ctx, node)
    return out is not None and _emit_add(ctx, node, a, b, out)


@lowers("Add")
def lower_add_int8_or_float(ctx: LoweringContext, node: Node, opset: int) -> None:
    if not (ctx.int8_ops and ctx.graph_reads is not None and _int8_add(ctx, node)):
        lower_binary(ctx, node, opset)


def _int8_qlinear_add(ctx: LoweringContext, node: Node) -> bool:
    """QLinearAdd of two per-tensor 8-bit tensors of one shape as QuantizedAdd; False elsewhere."""
    if len(node.inputs) < 7:
        return False
    a = _quantization(ctx, node.inputs[0], node.inputs[1], _input(node, 2))
    b = _quantization(ctx, node.inputs[3], node.inputs[4], _input(node, 5))
    y_zp = _input(node, 7)
    dtype = ctx.dtype(y_zp) if y_zp else a.dtype if a is not None else None
    scale = scalar_constant(ctx, node.inputs[6])
    zp = np.zeros((), dtype) if y_zp is None else scalar_constant(ctx, y_zp)
    if a is None or b is None or scale is None or scale.dtype != np.float32 or not np.isfinite(scale) \
            or scale <= 0 or zp is None or dtype not in (np.int8, np.uint8):
        return False
    out = _Quantization(node.outputs[0], np.float32(scale), int(zp), np.dtype(dtype))
    lo, hi = RANGES[out.dtype.name]
    return _emit_add(ctx, node, a, b, _Requantization((), node.outputs[0], out, lo, hi))


@lowers("QLinearAdd", domain=MS)
def lower_qlinear_add_int8_or_float(ctx: LoweringContext, node: Node, opset: int) -> None:
    if not (ctx.int8_ops and _int8_qlinear_add(ctx, node)):
        lower_qlinear_binary(ctx, node, opset)


def _on_8bit_values(ctx: LoweringContext, node: Node, opset: int, lower) -> bool:
    """``node``, an op that only selects or moves values (MaxPool, GlobalMaxPool, Flatten, Reshape),
    between a DequantizeLinear and a QuantizeLinear of the same scale, zero point and type, lowered by
    ``lower`` on the 8-bit tensor itself (see the module docstring): a max pooling of the 8-bit values,
    a view of them; False (nothing emitted) elsewhere, or where ``ctx`` does not ask for int8 ops."""
    if not ctx.int8_ops or ctx.graph_reads is None:
        return False
    x = _dequantized_activation(ctx, node.inputs[0])
    if x is None or len(node.outputs) > 1 and node.outputs[1]:  # MaxPool's Indices output
        return False
    out = _requantizing_reader(ctx, node)
    if out is None or len(out.nodes) != 1:  # a Relu or Clip between: a clamp the op has not
        return False
    q = out.quantization
    if (q.scale, q.zero_point, q.dtype) != (x.scale, x.zero_point, x.dtype) or (out.lo, out.hi) != RANGES[q.dtype.name]:
        return False
    moved = Node(node.op_type, node.name, [x.tensor] + list(node.inputs[1:]), [out.output], node.attrs, node.domain)
    lower(ctx, moved, opset)
    ctx.absorb(*out.nodes)
    ctx.int8_fused = True
    return True


@lowers("MaxPool")
def lower_max_pool_int8_or_float(ctx: LoweringContext, node: Node, opset: int) -> None:
    if not _on_8bit_values(ctx, node, opset, lower_pool):
        lower_pool(ctx, node, opset)


@lowers("GlobalMaxPool")
def lower_global_max_pool_int8_or_float(ctx: LoweringContext, node: Node, opset: int) -> None:
    if not _on_8bit_values(ctx, node, opset, lower_global_pool):
        lower_global_pool(ctx, node, opset)


@lowers("Flatten")
def lower_flatten_int8_or_float(ctx: LoweringContext, node: Node, opset: int) -> None:
    if not _on_8bit_values(ctx, node, opset, lower_flatten):
        lower_flatten(ctx, node, opset)


@lowers("Reshape")
def lower_reshape_int8_or_float(ctx: LoweringContext, node: Node, opset: int) -> None:
    if not _on_8bit_values(ctx, node, opset, lower_reshape):
        lower_reshape(ctx, node, opset)


def _emit_global_average_pool(ctx: LoweringContext, node: Node, x: _Quantization, out: _Requantization) -> bool:
    """One QuantizedGlobalAveragePool of the 8-bit NCHW ``x`` into ``out`` (reading its channels-last twin
    where an int8 op wrote one); False (nothing emitted) where ``x`` is not 4-D or its sums could pass int32."""
    shape = ctx.shape(x.tensor)
    if len(shape) != 4:
        return False
    n, c, h, w = shape
    pixels = h * w
    if pixels == 0 or pixels > _INT32.max // 256:  # the sums of values and of zero points stay int32
        return False
    q = out.quantization
    twins = ctx.channels_last_twins
    channels_last = x.tensor in twins
    multiplier = np.float32(np.float64(x.scale) / (np.float64(q.scale) * pixels))
    op = A.QuantizedGlobalAveragePool((twins[x.tensor] if channels_last else x.tensor,), (out.output,), node.name,
                                      batch=n, channels=c, pixels=pixels, channels_last=channels_last,
                                      x_zero_point=x.zero_point, multiplier=float(multiplier),
                                      y_zero_point=q.zero_point, out_dtype=q.dtype.name, lo=out.lo, hi=out.hi)
    ctx.emit(op, (n, c, 1, 1), q.dtype)
    ctx.absorb(*out.nodes)
    ctx.int8_fused = True
    return True


def _int8_global_average_pool(ctx: LoweringContext, node: Node) -> bool:
    """A GlobalAveragePool of a dequantized 8-bit NCHW tensor that a QuantizeLinear (through at most a
    Relu or Clip) alone reads, as one QuantizedGlobalAveragePool; False (nothing emitted) elsewhere."""
    x = _dequantized_activation(ctx, node.inputs[0])
    out = _requantizing_reader(ctx, node) if x is not None else None
    return out is not None and _emit_global_average_pool(ctx, node, x, out)


@lowers("GlobalAveragePool")
def lower_global_average_pool_int8_or_float(ctx: LoweringContext, node: Node, opset: int) -> None:
    if not (ctx.int8_average_pool and ctx.graph_reads is not None and _int8_global_average_pool(ctx, node)):
        lower_global_pool(ctx, node, opset)


def _int8_qlinear_global_average_pool(ctx: LoweringContext, node: Node) -> bool:
    """QLinearGlobalAveragePool (NCHW) of a per-tensor 8-bit tensor as QuantizedGlobalAveragePool; False elsewhere."""
    if len(node.inputs) < 5 or node.attr("channels_last", 0):
        return False
    x = _quantization(ctx, node.inputs[0], node.inputs[1], _input(node, 2))
    if x is None:
        return False
    y_zp = _input(node, 4)
    scale = scalar_constant(ctx, node.inputs[3])
    zp = np.zeros((), x.dtype) if y_zp is None else scalar_constant(ctx, y_zp)
    if scale is None or scale.dtype != np.float32 or not np.isfinite(scale) or scale <= 0 or zp is None \
            or zp.dtype != x.dtype:
        return False
    out = _Quantization(node.outputs[0], np.float32(scale), int(zp), x.dtype)
    lo, hi = RANGES[x.dtype.name]
    return _emit_global_average_pool(ctx, node, x, _Requantization((), node.outputs[0], out, lo, hi))


@lowers("QLinearGlobalAveragePool", domain=MS)
def lower_qlinear_global_average_pool_int8_or_float(ctx: LoweringContext, node: Node, opset: int) -> None:
    if not (ctx.int8_average_pool and _int8_qlinear_global_average_pool(ctx, node)):
        lower_qlinear_global_average_pool(ctx, node, opset)
