"""Lowering of the com.microsoft quantized ops ONNX Runtime's quantizers write: the QOperator ops
beside QLinearConv / QLinearMatMul (QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, the
QLinear pools, QLinearConcat, QLinearSoftmax, QGemm), the dynamic ones (DynamicQuantizeMatMul,
MatMulIntegerToFloat, DynamicQuantizeLSTM) and the weight-only MatMulNBits and GatherBlockQuantized.

The QOperator ops dequantize their inputs, run the float op and quantize its result (ORT's unfused
kernels compute the same to within one step). Constant weights fold at load.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from ... import atomic as A
from ...errors import ModelError, UnsupportedOpError
from ...ir import Node
from ..context import LoweringContext
from ..emit import QUICK_GELU, as_dtype, emit_unary, unary_spec
from ..registry import lowers
from .quantize import (_shift_operand, binary, const_input, dequantize, dynamic_uint8_centred,
                       lower_dynamic_quantize_linear, quant_type, quantize, sub_node)
from .recurrent import Recurrence, lower_recurrence, strided_slice

MS = "com.microsoft"


def _opt(node: Node, index: int) -> str | None:
    return node.inputs[index] if len(node.inputs) > index and node.inputs[index] else None


def _dq(ctx: LoweringContext, node: Node, q: str, scale: str, zp: str | None) -> str:
    out = ctx.temp(node, "dequantized")
    dequantize(ctx, node, q, scale, zp, out)
    return out


def _q(ctx: LoweringContext, node: Node, x: str, scale: str, zp: str | None, like: str, out: str) -> None:
    """Quantize to the zero point's type (the quantized input's type where it is absent)."""
    held, qrange = quant_type(node, ctx.dtype(zp if zp is not None else like), "output")
    quantize(ctx, node, x, scale, zp, out, held, qrange)


@lowers("QLinearAdd", "QLinearMul", domain=MS)
def lower_qlinear_binary(ctx: LoweringContext, node: Node, opset: int) -> None:
    a, b = const_input(ctx, node, 0), const_input(ctx, node, 3)
    fa = _dq(ctx, node, a, node.inputs[1], const_input(ctx, node, 2))
    fb = _dq(ctx, node, b, node.inputs[4], const_input(ctx, node, 5))
    result = binary(ctx, node, "add" if node.op_type == "QLinearAdd" else "mul", fa, fb)
    _q(ctx, node, result, node.inputs[6], const_input(ctx, node, 7), a, node.outputs[0])


def _unary_form(ctx: LoweringContext, node: Node, op_type: str, opset: int, **attrs) -> None:
    """Ops of inputs (X, X_scale, X_zero_point, Y_scale, Y_zero_point) around one float op."""
    x = const_input(ctx, node, 0)
    fx = _dq(ctx, node, x, node.inputs[1], const_input(ctx, node, 2))
    result = ctx.temp(node, op_type)
    sub_node(ctx, node, op_type, [fx], [result], opset, **attrs)
    _q(ctx, node, result, node.inputs[3], const_input(ctx, node, 4), x, node.outputs[0])


@lowers("QLinearSigmoid", domain=MS)
def lower_qlinear_sigmoid(ctx: LoweringContext, node: Node, opset: int) -> None:
    _unary_form(ctx, node, "Sigmoid", opset)


@lowers(QUICK_GELU[1], domain=QUICK_GELU[0])
def lower_quick_gelu(ctx: LoweringContext, node: Node, opset: int) -> None:
    """QuickGelu at alpha 1, SiLU: the atomic ``silu``."""
    spec = unary_spec(node, lambda n: None)
    if spec is None:
        raise UnsupportedOpError(node.op_type, node.name, "only alpha 1 (SiLU) is supported")
    emit_unary(ctx, node, spec[0], spec[1], node.inputs[0], node.outputs[0])


@lowers("QLinearLeakyRelu", domain=MS)
def lower_qlinear_leaky_relu(ctx: LoweringContext, node: Node, opset: int) -> None:
    _unary_form(ctx, node, "LeakyRelu", opset, alpha=float(node.attr("alpha", 0.01)))


def _channels_first(node: Node) -> None:
    if node.attr("channels_last", 0):
        raise UnsupportedOpError(node.op_type, node.name, "channels_last=1 is not supported (NCHW only)")


@lowers("QLinearGlobalAveragePool", domain=MS)
def lower_qlinear_global_average_pool(ctx: LoweringContext, node: Node, opset: int) -> None:
    _channels_first(node)
    _unary_form(ctx, node, "GlobalAveragePool", opset)


@lowers("QLinearAveragePool", domain=MS)
def lower_qlinear_average_pool(ctx: LoweringContext, node: Node, opset: int) -> None:
    _channels_first(node)
    attrs = {k: v for k, v in node.attrs.items() if k in ("auto_pad", "ceil_mode", "count_include_pad",
                                                          "kernel_shape", "pads", "strides")}
    _unary_form(ctx, node, "AveragePool", opset, **attrs)


@lowers("QLinearSoftmax", domain=MS)
def lower_qlinear_softmax(ctx: LoweringContext, node: Node, opset: int) -> None:
    """Softmax with the semantics of the opset its ``opset`` attribute names (13: one axis;
    earlier: the input flattened to 2D at ``axis``)."""
    semantics = int(node.attr("opset", 13))
    _unary_form(ctx, node, "Softmax", max(11, min(semantics, 13)), axis=int(node.attr("axis", -1)))


@lowers("QLinearConcat", domain=MS)
def lower_qlinear_concat(ctx: LoweringContext, node: Node, opset: int) -> None:
    """Inputs: Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) for each tensor."""
    if (len(node.inputs) - 2) % 3 or len(node.inputs) < 5:
        raise ModelError(f"node {node.name!r} (QLinearConcat): {len(node.inputs)} inputs are not 2 + 3 per tensor")
    parts, first = [], None
    for i in range(2, len(node.inputs), 3):
        x = const_input(ctx, node, i)
        first = first or x
        parts.append(_dq(ctx, node, x, node.inputs[i + 1], const_input(ctx, node, i + 2)))
    joined = ctx.temp(node, "concatenated")
    sub_node(ctx, node, "Concat", parts, [joined], opset, axis=int(node.attr("axis", 0)))
    _q(ctx, node, joined, node.inputs[0], const_input(ctx, node, 1), first, node.outputs[0])


@lowers("QGemm", domain=MS)
def lower_qgemm(ctx: LoweringContext, node: Node, opset: int) -> None:
    """alpha * A'B' + C (C an int32 bias of scale a_scale * b_scale), quantized by y_scale when given
    (float output otherwise). Per-column b scales apply along B's output axis."""
    a_q, b_q = const_input(ctx, node, 0), const_input(ctx, node, 3)
    trans_a, trans_b = int(node.attr("transA", 0)), int(node.attr("transB", 0))
    fa = _dq(ctx, node, a_q, node.inputs[1], const_input(ctx, node, 2))
    fb = ctx.temp(node, "dequantized")
    dequantize(ctx, node, b_q, node.inputs[4], const_input(ctx, node, 5), fb, axis=0 if trans_b else 1)
    inputs = [fa, fb]
    c = _opt(node, 6)
    if c is not None:
        b_scale = node.inputs[4]
        scale = binary(ctx, node, "mul", as_dtype(ctx, node, node.inputs[1], np.float32),
                       as_dtype(ctx, node, b_scale, np.float32))
        fc = binary(ctx, node, "mul", as_dtype(ctx, node, c, np.float32), scale)
        inputs.append(fc)
    y_scale = _opt(node, 7)
    target = node.outputs[0] if y_scale is None else ctx.temp(node, "gemm")
    sub_node(ctx, node, "Gemm", inputs, [target], opset, alpha=float(node.attr("alpha", 1.0)), transA=trans_a,
             transB=trans_b)
    if y_scale is not None:
        _q(ctx, node, target, y_scale, const_input(ctx, node, 8), a_q, node.outputs[0])


def _integer_matmul_to_float(ctx: LoweringContext, node: Node, a_q: str, a_zp: str | None, a_scale: str,
                             b_q: str, b_zp: str | None, b_scale: str, bias: str | None, opset: int) -> None:
    """(A - a_zp) @ (B - b_zp) * a_scale * b_scale (+ bias): b's scale and zero point per column or scalar."""
    a = _shift_operand(ctx, node, a_q, a_zp, row=False)
    b = _shift_operand(ctx, node, b_q, b_zp, row=False)
    product = ctx.temp(node, "product")
    sub_node(ctx, node, "MatMul", [a, b], [product], opset)
    scale = binary(ctx, node, "mul", as_dtype(ctx, node, a_scale, np.float32), as_dtype(ctx, node, b_scale, np.float32))
    if bias is None:
        sub_node(ctx, node, "Mul", [product, scale], [node.outputs[0]], opset)
        return
    scaled = binary(ctx, node, "mul", product, scale)
    sub_node(ctx, node, "Add", [scaled, bias], [node.outputs[0]], opset)


@lowers("MatMulIntegerToFloat", domain=MS)
def lower_matmul_integer_to_float(ctx: LoweringContext, node: Node, opset: int) -> None:
    _integer_matmul_to_float(ctx, node, const_input(ctx, node, 0), const_input(ctx, node, 4), node.inputs[2],
                             const_input(ctx, node, 1), const_input(ctx, node, 5), node.inputs[3], _opt(node, 6),
                             opset)


@lowers("DynamicQuantizeMatMul", domain=MS)
def lower_dynamic_quantize_matmul(ctx: LoweringContext, node: Node, opset: int) -> None:
    """A quantized to uint8 at run time as DynamicQuantizeLinear does, times the quantized B."""
    a_q, a_scale, a_zp = ctx.temp(node, "a_q"), ctx.temp(node, "a_scale"), ctx.temp(node, "a_zero_point")
    lower_dynamic_quantize_linear(ctx, Node("DynamicQuantizeLinear", node.name, [node.inputs[0]],
                                            [a_q, a_scale, a_zp]), opset)
    _integer_matmul_to_float(ctx, node, a_q, a_zp, a_scale, const_input(ctx, node, 1), const_input(ctx, node, 3),
                             node.inputs[2], _opt(node, 4), opset)


def _unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The ``count`` unsigned ``bits``-bit values of each row of ``packed`` (low bits first)."""
    packed = packed.astype(np.uint8)
    per_byte = 8 // bits
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    values = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return values.reshape(*packed.shape[:-1], -1)[..., :count]


@lowers("MatMulNBits", domain=MS)
def lower_matmul_nbits(ctx: LoweringContext, node: Node, opset: int) -> None:
    """A [.., K] @ W, W [K, N] dequantized at load from B [N, blocks, blob] of ``bits``-bit values
    (low bits first), one scale (and zero point, by default 2**(bits-1)) per block of a column."""
    k, n = int(node.attr("K")), int(node.attr("N"))
    bits, block = int(node.attr("bits", 4)), int(node.attr("block_size", 0))
    if bits not in (2, 4, 8) or block < 16 or block & (block - 1):
        raise UnsupportedOpError(node.op_type, node.name, f"bits={bits}, block_size={block}")
    if _opt(node, 4) is not None:
        raise UnsupportedOpError(node.op_type, node.name, "g_idx (act-order) is not supported")
    blocks = -(-k // block)
    packed = ctx.const(node.inputs[1], node, "the packed weight")
    scales = ctx.const(node.inputs[2], node, "the scales").astype(np.float32).reshape(n, blocks)
    q = _unpack(packed.reshape(n, blocks, -1), bits, block).astype(np.float32)
    zp_name = _opt(node, 3)
    if zp_name is None:
        zp = np.full((n, blocks), 2 ** (bits - 1), np.float32)
    else:
        zps = ctx.const(zp_name, node, "the zero points")
        if zps.dtype.kind == "f":
            zp = zps.astype(np.float32).reshape(n, blocks)
        else:
            zp = _unpack(zps.reshape(n, -1), bits, blocks).astype(np.float32)
    weight = ((q - zp[..., None]) * scales[..., None]).reshape(n, blocks * block)[:, :k]
    w_name = ctx.temp(node, "weight")
    ctx.set_const(w_name, np.ascontiguousarray(weight.T))
    bias = _opt(node, 5)
    if bias is None:
        sub_node(ctx, node, "MatMul", [node.inputs[0], w_name], [node.outputs[0]], opset)
        return
    product = ctx.temp(node, "product")
    sub_node(ctx, node, "MatMul", [node.inputs[0], w_name], [product], opset)
    sub_node(ctx, node, "Add", [product, bias], [node.outputs[0]], opset)


@lowers("GatherBlockQuantized", domain=MS)
def lower_gather_block_quantized(ctx: LoweringContext, node: Node, opset: int) -> None:
    """Gather of a blocked-quantized table dequantized at load (4-bit values packed two a byte,
    low nibble first, as uint8; or int4/uint4 tensors; or 8-bit)."""
    bits = int(node.attr("bits", 4))
    block = int(node.attr("block_size", 128))
    data = ctx.const(node.inputs[0], node, "the quantized table")
    scales = ctx.const(node.inputs[2], node, "the scales").astype(np.float32)
    qaxis = int(node.attr("quantize_axis", -1)) % max(scales.ndim, 1)
    if data.dtype == np.uint8 and bits == 4:  # packed: two values a byte along the last axis
        q = _unpack(data, 4, data.shape[-1] * 2).astype(np.float32)
        default_zp = 8.0
    else:
        q = data.astype(np.float32)
        # ONNX Runtime's default: 0 for int4/uint4 tensors, the middle of the range for 8-bit data
        default_zp = 0.0 if data.dtype.name in ("int4", "uint4", "int8") else 2.0 ** (bits - 1)
    zp_name = _opt(node, 3)
    if zp_name is None:
        zp = np.full(scales.shape, default_zp, np.float32)
    else:
        zps = ctx.const(zp_name, node, "the zero points")
        if zps.dtype == np.uint8 and bits == 4:
            zp = _unpack(zps, 4, scales.shape[-1]).astype(np.float32).reshape(scales.shape)
        else:
            zp = zps.astype(np.float32)
    length = q.shape[qaxis]
    expand = lambda a: np.repeat(a, block, axis=qaxis).take(np.arange(length), axis=qaxis)  # noqa: E731
    table = ctx.temp(node, "table")
    ctx.set_const(table, ((q - expand(zp)) * expand(scales)).astype(np.float32))
    sub_node(ctx, node, "Gather", [table, node.inputs[1]], [node.outputs[0]], opset,
             axis=int(node.attr("gather_axis", 0)))



# -- DynamicQuantizeLSTM --------------------------------------------------------------------------
# ONNX Runtime computes each of the LSTM's two products in integers: the whole X (every step) and,
# at each step, each direction's H_{t-1} are quantized to uint8 over their own range (as
# DynamicQuantizeLinear does), multiplied by the int8/uint8 weights, and the int32 product is scaled
# by the activation's scale times the weight's (per direction, or per gate column). The rounding of
# the activations moves the outputs by about one step of H's quantization (2/255) from the float
# product with dequantized weights, so the lowering quantizes the activations as ONNX Runtime does.
# Differences that remain: with sequence_lens shorter than the sequence, X's range covers every step
# and H's range covers the kept states of finished entries (ONNX Runtime's covers the steps up to the
# longest length, and zeros for finished entries); and ONNX Runtime splits the batch among threads
# (each part quantized over its own range) where intra_op_num_threads > 1 and the batch is 2 or more.

@dataclass
class DynamicQuantizedRecurrence(Recurrence):
    """An LSTM whose W and R are the integer weights less their zero points (``[D, 4H, K]`` float
    constants) and whose products quantize X and H_{t-1} to uint8 at run time."""

    input_scales: np.ndarray | None = None  # [D * 4H]: W's scale of each projection column
    recurrent_scales: np.ndarray | None = None  # [D, 1, 4H]: R's scale of each gate column

    def project(self, x: str, w: str, b: str | None, keep_recurrent_bias: np.ndarray | None) -> None:
        ctx, node = self.ctx, self.node
        rows, inputs = self.seq * self.batch, ctx.shape(x)[2]
        centred, x_scale = dynamic_uint8_centred(ctx, node, x, 1)
        x2d, w2d = ctx.temp(node, "inputs"), ctx.temp(node, "input_weights")
        ctx.alias(x2d, centred, (rows, inputs))
        ctx.alias(w2d, w, (self.width, inputs))
        accumulated = ctx.temp(node, "accumulated")
        ctx.emit(A.MatMul((x2d, w2d), (accumulated,), node.name, m=rows, n=self.width, k=inputs, trans_b=True),
                 (rows, self.width))
        multiplier = self.binary("mul", x_scale, self.const(self.input_scales, "input_scales"))
        scaled = self.binary("mul", accumulated, multiplier)
        if b is None:
            self.projection = scaled
            return
        self.projection = self.binary("add", scaled, self.projection_bias(b, keep_recurrent_bias))

    def product(self, a: str, weight: str, n: int, weight_stride: int) -> str:
        d, b, h = self.directions, self.batch, self.hidden
        hidden = strided_slice(self.ctx, self.node, a, 0, (d, b, h), (b * h, h, 1), "hidden")
        centred, h_scale = dynamic_uint8_centred(self.ctx, self.node, hidden, d)
        accumulated = super().product(centred, weight, n, weight_stride)
        per_direction = self.ctx.temp(self.node, "hidden_scales")
        self.ctx.alias(per_direction, h_scale, (d, 1, 1))
        multiplier = self.binary("mul", per_direction, self.const(self.recurrent_scales, "recurrent_scales"))
        return self.binary("mul", accumulated, multiplier)


def _lstm_weight(ctx: LoweringContext, node: Node, index: int, scale_index: int, directions: int, gates: int,
                 what: str) -> tuple[str, np.ndarray]:
    """(W or R less its zero points as a float constant ``[D, 4H, K]``, its scales ``[D, 4H]``) from the
    quantized ``[D, K, 4H]`` at input ``index``, its scale at ``scale_index`` and zero point after it
    (each per direction or per column)."""
    q = ctx.const(node.inputs[index], node, what)
    if q.dtype not in (np.int8, np.uint8):
        raise UnsupportedOpError(node.op_type, node.name, f"{what} of type {q.dtype.name}: int8 or uint8 expected")
    if q.ndim != 3 or q.shape[0] != directions or q.shape[2] != gates:
        raise ModelError(f"node {node.name!r} ({node.op_type}): {what} of shape {list(q.shape)}, expected "
                         f"[{directions}, K, {gates}]")
    params = []
    for name, part in ((_opt(node, scale_index), "scale"), (_opt(node, scale_index + 1), "zero point")):
        if name is None:
            raise ModelError(f"node {node.name!r} ({node.op_type}): {what}'s {part} (input {scale_index}) is missing")
        value = ctx.const(name, node, f"{what}'s {part}")
        if value.size not in (directions, directions * gates):
            raise ModelError(f"node {node.name!r} ({node.op_type}): {what}'s {part} of shape {list(value.shape)}, "
                             f"expected [{directions}] or [{directions}, {gates}]")
        params.append(np.broadcast_to(value.reshape(directions, -1).astype(np.float32), (directions, gates)))
        scale_index += 1
    scale, zero_point = params
    name = ctx.temp(node, what)
    ctx.set_const(name, np.ascontiguousarray((q.astype(np.float32) - zero_point[:, None, :]).transpose(0, 2, 1)))
    return name, np.ascontiguousarray(scale)


@lowers("DynamicQuantizeLSTM", domain=MS)
def lower_dynamic_quantize_lstm(ctx: LoweringContext, node: Node, opset: int) -> None:
    """ONNX's LSTM (inputs 0-7, attributes but ``layout``) with W ``[D, input, 4H]`` and R ``[D, H, 4H]``
    quantized; inputs 8-11 are W's scale and zero point, then R's."""
    directions = 2 if node.attr("direction", "forward") == "bidirectional" else 1
    hidden = int(node.attr("hidden_size", 0))
    if hidden <= 0:
        raise ModelError(f"node {node.name!r} ({node.op_type}): hidden_size must be given and positive")
    gates = 4 * hidden
    w, w_scales = _lstm_weight(ctx, node, 1, 8, directions, gates, "W")
    r, r_scales = _lstm_weight(ctx, node, 2, 10, directions, gates, "R")
    inputs = [node.inputs[0], w, r] + [node.inputs[i] if len(node.inputs) > i else "" for i in range(3, 8)]
    lstm = Node("LSTM", node.name, inputs, node.outputs, dict(node.attrs))
    lower_recurrence(ctx, lstm, opset, partial(DynamicQuantizedRecurrence, input_scales=w_scales.reshape(-1),
                                               recurrent_scales=r_scales.reshape(directions, 1, gates)))
