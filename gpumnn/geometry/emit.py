"""What the lowerings share: reorder ops given as NumPy functions (folded on constants, Rasters
otherwise), the ONNX -> atomic op name tables, a node's fused activation, broadcast strides, and
the emission of casts, Unary and Binary ops."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from .. import atomic as A
from ..backends.limits import check_host_bytes
from ..errors import ModelError, UnsupportedOpError
from ..ir import Node
from .context import LoweringContext, PendingRaster
from ..numerics.strides import contiguous_strides, merge_dims
from .regions import IndexMap


ArrayFn = Callable[[list[np.ndarray], float], list[np.ndarray]]


def norm_axis(axis: int, rank: int, node: Node) -> int:
    if not -rank <= axis < max(rank, 1):
        raise UnsupportedOpError(node.op_type, node.name, f"axis {axis} is out of range for rank {rank}")
    return axis % max(rank, 1)


def _check_memory(node: Node, values, out_shapes: Sequence[Sequence[int]]) -> None:
    """ResourceError before a reorder materialises more than the host can hold: folded constants
    (their dtype's size per element) or Raster index maps (int32 source id + int64 index per
    element of every input and output, twice for the outputs' fusion and region temporaries)."""
    out_elements = sum(math.prod(s) for s in out_shapes)
    shapes = [list(s) for s in out_shapes] or [list(v.shape) for v in values]
    what = f"node {node.name!r} ({node.op_type}) with {'output' if out_shapes else 'input'} shape(s) {shapes}"
    if all(v.is_const for v in values):
        itemsize = max((v.const.dtype.itemsize for v in values), default=4)
        check_host_bytes(itemsize * out_elements, f"folding {what} into a constant")
    else:
        in_elements = sum(v.size for v in values)
        check_host_bytes(12 * in_elements + 24 * out_elements, f"lowering {what} to a Raster (index maps)")


def reorder(ctx: LoweringContext, node: Node, sources: Sequence[str], fn: ArrayFn,
            outputs: Sequence[str], fill: float | None = None,
            out_shapes: Sequence[Sequence[int]] | None = None,
            kept: Sequence[tuple[int, int]] = ()) -> None:
    """Lower a reorder op given by ``fn`` (NumPy semantics) into constants or Rasters.

    ``out_shapes`` is required of ops whose ``fn`` allocates outputs larger than its inputs
    (Tile, Pad, Gather), so that memory is checked before ``fn`` runs; the outputs of the
    others are views until they are copied here, and are checked before that.

    ``kept`` names the axes the op copies through unchanged, as (input axis, output axis) pairs
    that hold for every input and output (Concat: every axis but the concatenated one). Where
    the inputs agree on such an axis's size and stride, ``fn`` is applied to index maps one
    element long along it, and the output maps hold the axis as affine (see ``regions.py``):
    the same Raster at a cost independent of that axis's length."""
    values = [ctx.value(s, node) for s in sources]
    _check_memory(node, values, out_shapes or [])
    if all(v.is_const for v in values):
        results = fn([v.const for v in values], 0.0 if fill is None else fill)
        _check_memory(node, values, [np.shape(r) for r in results])
        for name, array in zip(outputs, results):
            ctx.set_const(name, np.asarray(array, order="C"))
        return
    held = _held_axes([v.shape for v in values], kept)
    src_maps = fn([np.full(_shrunk(v.shape, held), k, dtype=np.int32) for k, v in enumerate(values)], -1)
    idx_maps = fn([_element_indices(v.shape, held) for v in values], 0)
    full_shapes = [_grown(np.shape(m), held) for m in idx_maps]
    _check_memory(node, values, full_shapes)
    for name, src, idx, shape in zip(outputs, src_maps, idx_maps, full_shapes):
        steps = tuple(held[axis][1] if axis in held else None for axis in range(len(shape)))
        index_map = IndexMap(np.asarray(src, dtype=np.int32, order="C"), np.asarray(idx, dtype=np.int64, order="C"),
                             steps, shape)
        ctx.emit_raster(PendingRaster(list(sources), index_map, name, fill, node.name))


def _held_axes(shapes: Sequence[Sequence[int]], kept: Sequence[tuple[int, int]]) -> dict[int, tuple[int, int, int]]:
    """Output axis -> (input axis, step, length) for each kept axis longer than 1 on which every
    input has the same length and the same stride (its step in the output map)."""
    held: dict[int, tuple[int, int, int]] = {}
    if any(math.prod(s) == 0 for s in shapes):  # nothing to copy: no axis worth holding
        return held
    for in_axis, out_axis in kept:
        lengths = {int(s[in_axis]) for s in shapes}
        strides = {contiguous_strides(s)[in_axis] for s in shapes}
        if len(lengths) == 1 and len(strides) == 1 and min(lengths) > 1:
            held[out_axis] = (in_axis, strides.pop(), lengths.pop())
    return held


def _shrunk(shape: Sequence[int], held: dict[int, tuple[int, int, int]]) -> tuple[int, ...]:
    ins = {in_axis for in_axis, _, _ in held.values()}
    return tuple(1 if axis in ins else int(d) for axis, d in enumerate(shape))


def _grown(shape: Sequence[int], held: dict[int, tuple[int, int, int]]) -> tuple[int, ...]:
    return tuple(held[axis][2] if axis in held else int(d) for axis, d in enumerate(shape))


def _element_indices(shape: Sequence[int], held: dict[int, tuple[int, int, int]]) -> np.ndarray:
    """The flat element index of every element of a tensor of ``shape``, held axes at 0."""
    shrunk = _shrunk(shape, held)
    if shrunk == tuple(shape):
        return np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    idx = np.zeros(shrunk, dtype=np.int64)
    for axis, (length, stride) in enumerate(zip(shrunk, contiguous_strides(shape))):
        if length > 1:
            view = [1] * len(shrunk)
            view[axis] = length
            idx = idx + (np.arange(length, dtype=np.int64) * stride).reshape(view)
    return idx


ConstLookup = Callable[[str], "np.ndarray | None"]

UNARY_ONNX: dict[str, str] = {
    "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Exp": "exp", "Log": "log",
    "Sqrt": "sqrt", "Neg": "neg", "Abs": "abs", "Reciprocal": "reciprocal", "Floor": "floor",
    "Ceil": "ceil", "Round": "round", "Softplus": "softplus", "Sign": "sign", "HardSwish": "hard_swish",
    "LeakyRelu": "leaky_relu", "HardSigmoid": "hard_sigmoid", "Elu": "elu", "Gelu": "gelu", "Clip": "clip",
    "Selu": "selu", "Celu": "celu", "Mish": "mish", "ThresholdedRelu": "thresholded_relu",
}
#: ONNX Runtime's x * sigmoid(alpha x) (com.microsoft), which at alpha 1 is SiLU: what its optimiser
#: and gpumnn's (``fuse_silu``) make of Sigmoid and Mul
QUICK_GELU = ("com.microsoft", "QuickGelu")

BINARY_ONNX: dict[str, str] = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow",
                               "Max": "max", "Min": "min", "Sum": "add", "PRelu": "prelu"}


def unary_spec(node: Node, lookup: ConstLookup) -> tuple[str, tuple[float, ...]] | None:
    """The atomic unary (name, params) an ONNX activation node computes, or None if it cannot
    be expressed (e.g. Clip with data-dependent bounds). Shared by lowering and fusion."""
    op = node.op_type
    if (node.domain, op) == QUICK_GELU:
        return ("silu", ()) if _scalar(node, "alpha", node.attr("alpha", 1.702)) == 1.0 else None
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
