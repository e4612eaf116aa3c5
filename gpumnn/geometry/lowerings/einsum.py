"""Lowering of Einsum to Rasters, Reduce sums and batched MatMuls.

The equation is parsed into one label per dimension (ellipsis dims get spare letters, aligned
from the right). Each operand first takes its diagonals (a label repeated within it: a Raster
whose strides add up, written as ``np.einsum`` on the index maps) and drops size-1 dims that
broadcast against a larger size elsewhere. Operands are then combined left to right, two at a
time: labels only one side has and nothing later needs are summed away (Reduce), the rest are
classified as batch (both sides, needed later), contracted (both sides, not needed), and kept
from A or from B, and each side is laid out ``[batch, M, K]`` / ``[batch, K, N]`` (a Raster only
when its order is neither that nor the transposed one, which the MatMul reads with
``trans_a``/``trans_b``) for one batched MatMul. A last Raster puts the labels in output order.

Products of integer operands are MatMuls of int32 tensors: GPU backends have float matrix
kernels only, so the session places those MatMuls on the cpu backend (NumPy), visibly.
"""
from __future__ import annotations

import math
import string
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ... import atomic as A
from ...errors import ModelError, UnsupportedOpError
from ...ir import Node
from ..context import LoweringContext
from ..registry import lowers
from ..emit import reorder


@dataclass(frozen=True)
class Operand:
    """A tensor during the lowering, with one label per dimension."""

    name: str
    labels: str


def parse_equation(equation: str, ranks: Sequence[int], node: Node) -> tuple[list[str], str]:
    """(labels of each operand, output labels): one letter per dimension, ellipsis dims spelled
    with letters the equation does not use; an implicit output is the ellipsis dims then the
    letters used once, in alphabetical order."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ModelError(f"node {node.name!r} (Einsum): equation {equation!r} has {len(terms)} operands, the node "
                         f"{len(ranks)} inputs")
    for part in terms + [rhs]:
        rest = part.replace("...", "", 1)
        if not all(c in string.ascii_letters for c in rest):
            raise ModelError(f"node {node.name!r} (Einsum): {part!r} in {equation!r} is not letters and one '...'")
    spare = [c for c in string.ascii_letters if c not in eq]
    ellipsis_ranks = []
    for term, rank in zip(terms, ranks):
        given = len(term) - 3 if "..." in term else len(term)
        if given > rank or ("..." not in term and given != rank):
            raise ModelError(f"node {node.name!r} (Einsum): {term!r} does not fit an input of rank {rank}")
        ellipsis_ranks.append(rank - given)
    widest = max(ellipsis_ranks, default=0)
    if widest > len(spare):
        raise UnsupportedOpError("Einsum", node.name, f"{widest} ellipsis dims and the equation's letters exceed 52 labels")
    ellipsis = "".join(spare[:widest])
    labels = [t.replace("...", ellipsis[widest - e:]) for t, e in zip(terms, ellipsis_ranks)]
    if arrow:
        output = rhs.replace("...", ellipsis)
    else:
        counts = Counter(c for t in terms for c in t.replace("...", ""))
        output = ellipsis + "".join(sorted(c for c, n in counts.items() if n == 1))
    if len(set(output)) != len(output) or not set(output) <= set("".join(labels)):
        raise ModelError(f"node {node.name!r} (Einsum): output {output!r} of {equation!r} repeats a label or names "
                         "one no input has")
    return labels, output


def label_sizes(labels: Sequence[str], shapes: Sequence[Sequence[int]], node: Node) -> dict[str, int]:
    """The size of each label; size 1 broadcasts against a larger one."""
    sizes: dict[str, int] = {}
    for term, shape in zip(labels, shapes):
        for label, dim in zip(term, shape):
            known = sizes.setdefault(label, dim)
            if dim != known and known == 1:
                sizes[label] = dim
            elif dim != known and dim != 1:
                raise ModelError(f"node {node.name!r} (Einsum): label {label!r} has sizes {known} and {dim}")
    return sizes


def _shape(labels: str, sizes: dict[str, int]) -> list[int]:
    return [sizes[c] for c in labels]


def _relabel(ctx: LoweringContext, node: Node, op: Operand, target: str) -> Operand:
    """``op`` with its dims in the order of ``target`` (each distinct label of ``op`` once): a
    transpose, and diagonals where ``op`` repeats a label."""
    if op.labels == target:
        return op
    out = ctx.temp(node, "einsum_layout")
    spec = f"{op.labels}->{target}"
    reorder(ctx, node, [op.name], lambda xs, f: [np.einsum(spec, xs[0])], [out])
    return Operand(out, target)


def _prepare(ctx: LoweringContext, node: Node, op: Operand, sizes: dict[str, int]) -> Operand:
    """Diagonals taken, and size-1 dims that broadcast against a larger size dropped (a view)."""
    op = _relabel(ctx, node, op, "".join(dict.fromkeys(op.labels)))
    shape = ctx.shape(op.name)
    kept = "".join(c for c, d in zip(op.labels, shape) if not (d == 1 and sizes[c] != 1))
    if kept == op.labels:
        return op
    view = ctx.temp(node, "einsum_view")
    ctx.alias(view, op.name, _shape(kept, sizes))
    return Operand(view, kept)


def _sum_out(ctx: LoweringContext, node: Node, op: Operand, keep: set[str], sizes: dict[str, int]) -> Operand:
    """``op`` summed over its labels not in ``keep``: one Reduce, after a Raster only when those
    labels are not already neighbours."""
    summed = [c for c in op.labels if c not in keep]
    if not summed:
        return op
    start = op.labels.index(summed[0])
    if op.labels[start:start + len(summed)] != "".join(summed):
        op = _relabel(ctx, node, op, "".join(c for c in op.labels if c in keep) + "".join(summed))
        start = len(op.labels) - len(summed)
    before, after = op.labels[:start], op.labels[start + len(summed):]
    out = ctx.temp(node, "einsum_sum")
    ctx.emit(A.Reduce((op.name,), (out,), node.name, op="sum", outer=math.prod(_shape(before, sizes)),
                      size=math.prod(_shape("".join(summed), sizes)), inner=math.prod(_shape(after, sizes))),
             _shape(before + after, sizes))
    return Operand(out, before + after)


def _matrix(ctx: LoweringContext, node: Node, op: Operand, lead: str, rows: str, cols: str) -> tuple[str, bool]:
    """(tensor laid out ``[lead, rows, cols]``, or ``[lead, cols, rows]`` with True: transposed)."""
    if op.labels == lead + cols + rows and rows and cols:
        return op.name, True
    return _relabel(ctx, node, op, lead + rows + cols).name, False


def _contract(ctx: LoweringContext, node: Node, a: Operand, b: Operand, needed: set[str],
              sizes: dict[str, int]) -> Operand:
    """The product of two operands over their shared labels not in ``needed``, as one MatMul;
    the result's labels are batch, then A's kept, then B's kept."""
    a = _sum_out(ctx, node, a, set(b.labels) | needed, sizes)
    b = _sum_out(ctx, node, b, set(a.labels) | needed, sizes)
    batch = "".join(c for c in a.labels if c in b.labels and c in needed)
    contracted = "".join(c for c in a.labels if c in b.labels and c not in needed)
    rows = "".join(c for c in a.labels if c not in b.labels)
    cols = "".join(c for c in b.labels if c not in a.labels)
    a_name, trans_a = _matrix(ctx, node, a, batch, rows, contracted)
    b_name, trans_b = _matrix(ctx, node, b, batch, contracted, cols)
    count, m, n, k = (math.prod(_shape(s, sizes)) for s in (batch, rows, cols, contracted))
    out = ctx.temp(node, "einsum_product")
    ctx.emit(A.MatMul((a_name, b_name), (out,), node.name, batch=count, m=m, n=n, k=k, a_batch_stride=m * k,
                      b_batch_stride=k * n, trans_a=trans_a, trans_b=trans_b), _shape(batch + rows + cols, sizes))
    return Operand(out, batch + rows + cols)


@lowers("Einsum")
def lower_einsum(ctx: LoweringContext, node: Node, opset: int) -> None:
    equation = node.attr("equation")
    if not isinstance(equation, str):
        raise ModelError(f"node {node.name!r} (Einsum): the equation attribute is missing")
    names = list(node.inputs)
    shapes = [ctx.shape(n) for n in names]
    labels, output = parse_equation(equation, [len(s) for s in shapes], node)
    sizes = label_sizes(labels, shapes, node)
    operands = [_prepare(ctx, node, Operand(n, t), sizes) for n, t in zip(names, labels)]
    current = operands[0]
    for i, other in enumerate(operands[1:], start=1):
        needed = set(output).union(*(op.labels for op in operands[i + 1:]))
        current = _contract(ctx, node, current, other, needed, sizes)
    current = _relabel(ctx, node, _sum_out(ctx, node, current, set(output), sizes), output)
    ctx.alias(node.outputs[0], current.name, _shape(output, sizes))
