"""Lowering of Gemm and MatMul (batched, broadcast over the batch dimensions) to MatMul atomic ops."""
from __future__ import annotations

import numpy as np

from ... import atomic as A
from ...errors import ModelError, UnsupportedOpError
from ...ir import Node
from ..context import LoweringContext
from ..emit import broadcast_strides, fused_activation, reorder


# -- matrix products -----------------------------------------------------------------------------

def lower_gemm(ctx: LoweringContext, node: Node, opset: int) -> None:
    """Gemm as a float MatMul (registered by ``int8_products``, which first tries the int8 op)."""
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


def lower_matmul(ctx: LoweringContext, node: Node, opset: int) -> None:
    """MatMul as a float MatMul (registered by ``int8_products``, which first tries the int8 op)."""
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
