"""Lowering of ReduceMean / ReduceSum / ReduceMax / ReduceMin (axes as attribute or input)."""
from __future__ import annotations

import numpy as np

from ... import atomic as A
from ...ir import Node
from ..context import LoweringContext
from ..registry import lowers
from ..emit import norm_axis


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
