"""Lowering of data-reorder and shape ops: views (aliases), Rasters and folded constants.

Each reorder op is given as a NumPy function on arrays. Applied to constant data it folds the
op; applied to arrays of element indices it yields the index map from which the Raster's
regions are cut (see ``regions.py``). One definition serves both, so they cannot disagree.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ...errors import ModelError, UnsupportedOpError
from ...backends.limits import check_host_bytes
from ...ir import Node
from ..context import LoweringContext
from ..emit import norm_axis, reorder
from ..registry import lowers

def _all_but(rank: int, moved: Sequence[int]) -> list[tuple[int, int]]:
    """Every axis but ``moved`` kept in place (for ``reorder``'s ``kept``)."""
    return [(a, a) for a in range(rank) if a not in moved]


def _ints(array: np.ndarray) -> list[int]:
    return [int(v) for v in np.asarray(array).reshape(-1)]


# -- pure views ----------------------------------------------------------------------------------

@lowers("Identity", "Dropout")
def lower_identity(ctx: LoweringContext, node: Node, opset: int) -> None:
    if node.op_type == "Dropout" and len(node.inputs) > 2 and node.inputs[2]:
        if bool(np.asarray(ctx.const(node.inputs[2], node, "training_mode")).reshape(-1)[0]):
            raise UnsupportedOpError("Dropout", node.name, "training mode (random masks) is not supported")
    ctx.alias(node.outputs[0], node.inputs[0], ctx.shape(node.inputs[0]))
    if len(node.outputs) > 1 and node.outputs[1]:  # Dropout's mask: all ones at inference
        ctx.set_const(node.outputs[1], np.ones(ctx.shape(node.inputs[0]), dtype=bool))


@lowers("Reshape")
def lower_reshape(ctx: LoweringContext, node: Node, opset: int) -> None:
    in_shape = ctx.shape(node.inputs[0])
    target = _ints(ctx.const(node.inputs[1], node, "the target shape"))
    allow_zero = bool(node.attr("allowzero", 0))
    if not allow_zero and any(d == 0 and i >= len(in_shape) for i, d in enumerate(target)):
        raise ModelError(f"node {node.name!r} (Reshape): target shape {target} copies (0) a dimension beyond the "
                         f"input's rank {len(in_shape)}")
    if any(d < -1 for d in target):
        raise ModelError(f"node {node.name!r} (Reshape): target shape {target} has a negative dimension other than -1")
    shape = [in_shape[i] if (d == 0 and not allow_zero) else d for i, d in enumerate(target)]
    size = int(np.prod(in_shape, dtype=np.int64))
    if shape.count(-1) > 1:
        raise UnsupportedOpError("Reshape", node.name, f"target shape {target} has more than one -1")
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
        shape[shape.index(-1)] = size // known if known else 0
    if int(np.prod(shape, dtype=np.int64)) != size:
        raise UnsupportedOpError("Reshape", node.name, f"cannot reshape {list(in_shape)} to {target}")
    ctx.alias(node.outputs[0], node.inputs[0], shape)


@lowers("Flatten")
def lower_flatten(ctx: LoweringContext, node: Node, opset: int) -> None:
    shape = ctx.shape(node.inputs[0])
    axis = node.attr("axis", 1)
    if not -len(shape) <= axis <= len(shape):  # Flatten's axis may also be the rank itself
        raise ModelError(f"node {node.name!r} (Flatten): axis {axis} is out of range for rank {len(shape)}")
    axis = axis + len(shape) if axis < 0 else axis
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    ctx.alias(node.outputs[0], node.inputs[0], (outer, int(np.prod(shape[axis:], dtype=np.int64))))


def _axes_input(ctx: LoweringContext, node: Node, opset: int, since: int) -> list[int] | None:
    if opset >= since:
        if len(node.inputs) > 1 and node.inputs[1]:
            return _ints(ctx.const(node.inputs[1], node, "axes"))
        return None
    axes = node.attr("axes")
    return None if axes is None else list(axes)


@lowers("Squeeze")
def lower_squeeze(ctx: LoweringContext, node: Node, opset: int) -> None:
    shape = ctx.shape(node.inputs[0])
    axes = _axes_input(ctx, node, opset, 13)
    if axes is None:
        keep = [d for d in shape if d != 1]
    else:
        drop = {norm_axis(a, len(shape), node) for a in axes}
        for a in drop:
            if shape[a] != 1:
                raise UnsupportedOpError("Squeeze", node.name, f"axis {a} has size {shape[a]}, not 1")
        keep = [d for i, d in enumerate(shape) if i not in drop]
    ctx.alias(node.outputs[0], node.inputs[0], keep)


@lowers("Unsqueeze")
def lower_unsqueeze(ctx: LoweringContext, node: Node, opset: int) -> None:
    shape = list(ctx.shape(node.inputs[0]))
    axes = _axes_input(ctx, node, opset, 13) or []
    rank = len(shape) + len(axes)
    for a in sorted(norm_axis(a, rank, node) for a in axes):
        shape.insert(a, 1)
    ctx.alias(node.outputs[0], node.inputs[0], shape)


# -- Rasters -------------------------------------------------------------------------------------

@lowers("Transpose")
def lower_transpose(ctx: LoweringContext, node: Node, opset: int) -> None:
    rank = len(ctx.shape(node.inputs[0]))
    perm = node.attr("perm") or list(reversed(range(rank)))
    if sorted(perm) != list(range(rank)):
        raise ModelError(f"node {node.name!r} (Transpose): perm {perm} is not a permutation of the input's "
                         f"{rank} axes")
    reorder(ctx, node, node.inputs[:1], lambda xs, f: [np.transpose(xs[0], perm)], node.outputs,
            kept=[(p, out) for out, p in enumerate(perm)])


@lowers("Concat")
def lower_concat(ctx: LoweringContext, node: Node, opset: int) -> None:
    named = [n for n in node.inputs if n]
    sources = [n for n in named if ctx.value(n, node).size > 0] or named  # all empty: the empty result's shape
    axis = norm_axis(node.attr("axis", 0), len(ctx.shape(sources[0])), node)
    shapes = [ctx.shape(n) for n in sources]
    if any(len(s) != len(shapes[0]) or any(a != b for i, (a, b) in enumerate(zip(s, shapes[0])) if i != axis)
           for s in shapes):
        raise ModelError(f"node {node.name!r} (Concat): input shapes {[list(s) for s in shapes]} differ outside "
                         f"the concatenation axis {axis}")
    reorder(ctx, node, sources, lambda xs, f: [np.concatenate(xs, axis=axis)], node.outputs,
            kept=_all_but(len(shapes[0]), [axis]))


@lowers("Split")
def lower_split(ctx: LoweringContext, node: Node, opset: int) -> None:
    shape = ctx.shape(node.inputs[0])
    axis = norm_axis(node.attr("axis", 0), len(shape), node)
    outputs = [o for o in node.outputs]
    if len(node.inputs) > 1 and node.inputs[1]:
        sizes = _ints(ctx.const(node.inputs[1], node, "split sizes"))
    elif node.attr("split") is not None:
        sizes = list(node.attr("split"))
    else:
        parts = node.attr("num_outputs", len(outputs))
        chunk = -(-shape[axis] // parts)
        sizes = [min(chunk, shape[axis] - i * chunk) for i in range(parts)]
    bounds = np.cumsum([0] + sizes)
    if bounds[-1] != shape[axis]:
        raise UnsupportedOpError("Split", node.name, f"split sizes {sizes} do not add up to {shape[axis]}")
    reorder(ctx, node, node.inputs[:1],
            lambda xs, f: [np.take(xs[0], np.arange(bounds[i], bounds[i + 1]), axis=axis) for i in range(len(sizes))],
            outputs, kept=_all_but(len(shape), [axis]))


@lowers("Slice")
def lower_slice(ctx: LoweringContext, node: Node, opset: int) -> None:
    shape = ctx.shape(node.inputs[0])
    given = [ctx.const(n, node, what) for n, what in zip(node.inputs[1:5], ("starts", "ends", "axes", "steps")) if n]
    if len(node.inputs) < 3 or any(np.ndim(v) != 1 or len(v) != len(given[0]) for v in given):
        raise ModelError(f"node {node.name!r} (Slice): starts, ends, axes and steps must be 1-D and of one length, "
                         f"got shapes {[list(np.shape(v)) for v in given]}")
    starts = _ints(ctx.const(node.inputs[1], node, "starts"))
    ends = _ints(ctx.const(node.inputs[2], node, "ends"))
    axes = _ints(ctx.const(node.inputs[3], node, "axes")) if len(node.inputs) > 3 and node.inputs[3] else list(range(len(starts)))
    steps = _ints(ctx.const(node.inputs[4], node, "steps")) if len(node.inputs) > 4 and node.inputs[4] else [1] * len(starts)
    index = [slice(None)] * len(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        if step == 0:
            raise UnsupportedOpError("Slice", node.name, "a step of 0 is not allowed")
        index[norm_axis(axis, len(shape), node)] = slice(start, end, step)
    key = tuple(index)
    reorder(ctx, node, node.inputs[:1], lambda xs, f: [xs[0][key]], node.outputs,
            kept=_all_but(len(shape), [a for a, k in enumerate(key) if k != slice(None)]))


@lowers("Expand")
def lower_expand(ctx: LoweringContext, node: Node, opset: int) -> None:
    target = tuple(_ints(ctx.const(node.inputs[1], node, "the target shape")))
    try:
        out_shape = np.broadcast_shapes(ctx.shape(node.inputs[0]), target)
    except ValueError:
        raise ModelError(f"node {node.name!r} (Expand): shape {list(ctx.shape(node.inputs[0]))} does not broadcast "
                         f"to {list(target)}") from None
    reorder(ctx, node, node.inputs[:1], lambda xs, f: [np.broadcast_to(xs[0], out_shape)], node.outputs,
            out_shapes=[out_shape])


@lowers("Tile")
def lower_tile(ctx: LoweringContext, node: Node, opset: int) -> None:
    """Tile as a broadcast over interleaved (repeat, size) axes, then a free view of the result.

    The broadcast's index map is linear (stride 0 on the repeat axes), so it compresses into a
    few regions however large the repeat counts; ``np.tile``'s map on the output shape is
    periodic and would be cut into one region per period.
    """
    shape = ctx.shape(node.inputs[0])
    repeats = _ints(ctx.const(node.inputs[1], node, "repeats"))
    if len(repeats) != len(shape) or any(r < 0 for r in repeats):
        raise ModelError(f"node {node.name!r} (Tile): repeats {repeats} must be {len(shape)} non-negative counts")
    spread = [v for d in shape for v in (1, d)]
    interleaved = [v for r, d in zip(repeats, shape) for v in (r, d)]
    tiled = ctx.temp(node, "tiled")
    reorder(ctx, node, node.inputs[:1], lambda xs, f: [np.broadcast_to(xs[0].reshape(spread), interleaved)], [tiled],
            out_shapes=[interleaved])
    ctx.alias(node.outputs[0], tiled, [r * d for r, d in zip(repeats, shape)])


@lowers("Pad")
def lower_pad(ctx: LoweringContext, node: Node, opset: int) -> None:
    shape = ctx.shape(node.inputs[0])
    rank = len(shape)
    pads = _ints(ctx.const(node.inputs[1], node, "pads")) if len(node.inputs) > 1 and node.inputs[1] else list(node.attr("pads", []))
    value = 0.0
    if len(node.inputs) > 2 and node.inputs[2]:
        value = float(np.asarray(ctx.const(node.inputs[2], node, "constant_value")).reshape(-1)[0])
    else:
        value = float(node.attr("value", 0.0))
    axes = _ints(ctx.const(node.inputs[3], node, "axes")) if len(node.inputs) > 3 and node.inputs[3] else list(range(rank))
    axes = [norm_axis(a, rank, node) for a in axes]
    if len(pads) != 2 * len(axes):
        raise ModelError(f"node {node.name!r} (Pad): {len(pads)} pads for {len(axes)} axes (2 per axis expected)")
    begin, end = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        begin[a], end[a] = pads[i], pads[i + len(axes)]
    if any(d + b + e < 0 for d, b, e in zip(shape, begin, end)):
        raise ModelError(f"node {node.name!r} (Pad): pads {pads} crop more than the input's shape {list(shape)}")
    mode = node.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        raise UnsupportedOpError("Pad", node.name, f"mode {mode!r} is not supported (constant, reflect, edge)")
    crop = tuple(slice(max(0, -b), d - max(0, -e)) for b, e, d in zip(begin, end, shape))
    widths = [(max(0, b), max(0, e)) for b, e in zip(begin, end)]
    out_shape = [max(0, d + b + e) for b, e, d in zip(begin, end, shape)]

    def pad(xs: list[np.ndarray], fill: float) -> list[np.ndarray]:
        x = xs[0][crop]
        if mode == "constant":
            return [np.pad(x, widths, mode="constant", constant_values=fill)]
        return [np.pad(x, widths, mode=mode)]
    reorder(ctx, node, node.inputs[:1], pad, node.outputs, fill=value if mode == "constant" else None,
            out_shapes=[out_shape], kept=_all_but(rank, [a for a in range(rank) if begin[a] or end[a]]))


def _block_geometry(ctx: LoweringContext, node: Node) -> tuple[int, int, int, int]:
    """NCHW of a DepthToSpace/SpaceToDepth input whose blocksize divides what it must."""
    shape = ctx.shape(node.inputs[0])
    b = node.attr("blocksize")
    if len(shape) != 4 or not isinstance(b, int) or b < 1:
        raise ModelError(f"node {node.name!r} ({node.op_type}): needs a 4D input and a positive blocksize, got "
                         f"shape {list(shape)} and blocksize {b!r}")
    n, c, h, w = shape
    if (node.op_type == "DepthToSpace" and c % (b * b)) or (node.op_type == "SpaceToDepth" and (h % b or w % b)):
        raise ModelError(f"node {node.name!r} ({node.op_type}): blocksize {b} does not divide the input {list(shape)}")
    return n, c, h, w


@lowers("DepthToSpace")
def lower_depth_to_space(ctx: LoweringContext, node: Node, opset: int) -> None:
    n, c, h, w = _block_geometry(ctx, node)
    b = int(node.attr("blocksize"))
    if node.attr("mode", "DCR") == "DCR":
        fn = lambda xs, f: [xs[0].reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2).reshape(n, c // (b * b), h * b, w * b)]
    else:
        fn = lambda xs, f: [xs[0].reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(n, c // (b * b), h * b, w * b)]
    reorder(ctx, node, node.inputs[:1], fn, node.outputs)


@lowers("SpaceToDepth")
def lower_space_to_depth(ctx: LoweringContext, node: Node, opset: int) -> None:
    n, c, h, w = _block_geometry(ctx, node)
    b = int(node.attr("blocksize"))
    order = (0, 3, 5, 1, 2, 4) if node.attr("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)  # CRD: opset 28
    fn = lambda xs, f: [xs[0].reshape(n, c, h // b, b, w // b, b).transpose(order).reshape(n, c * b * b, h // b, w // b)]
    reorder(ctx, node, node.inputs[:1], fn, node.outputs)


@lowers("Shape")
def lower_shape(ctx: LoweringContext, node: Node, opset: int) -> None:
    shape = ctx.shape(node.inputs[0])
    start, end = node.attr("start", 0), node.attr("end", None)
    ctx.set_const(node.outputs[0], np.array(shape[start:end], dtype=np.int64))


@lowers("Size")
def lower_size(ctx: LoweringContext, node: Node, opset: int) -> None:
    ctx.set_const(node.outputs[0], np.array(ctx.value(node.inputs[0], node).size, dtype=np.int64))


@lowers("ConstantOfShape")
def lower_constant_of_shape(ctx: LoweringContext, node: Node, opset: int) -> None:
    shape = _ints(ctx.const(node.inputs[0], node, "the shape"))
    fill = node.attr("value")
    fill = np.zeros(1, dtype=np.float32) if fill is None else np.asarray(fill).reshape(-1)
    check_host_bytes(fill.dtype.itemsize * math.prod(shape), f"node {node.name!r} (ConstantOfShape) of shape {shape}")
    ctx.set_const(node.outputs[0], np.full(shape, fill[0], dtype=fill.dtype))


@lowers("Range")
def lower_range(ctx: LoweringContext, node: Node, opset: int) -> None:
    bounds = [np.asarray(ctx.const(n, node, "Range bounds")) for n in node.inputs[:3]]
    if any(b.size != 1 for b in bounds):
        raise ModelError(f"node {node.name!r} (Range): start, limit and delta must be single numbers, got shapes "
                         f"{[list(b.shape) for b in bounds]}")
    start, limit, delta = (b.reshape(-1)[0] for b in bounds)
    if float(delta) != 0:
        count = max(0, math.ceil((float(limit) - float(start)) / float(delta)))
        check_host_bytes(8 * count, f"node {node.name!r} (Range) of {count} elements")
    ctx.set_const(node.outputs[0], np.arange(start, limit, delta).astype(np.result_type(*bounds)))
