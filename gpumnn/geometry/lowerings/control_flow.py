"""Lowering of control flow: If, Loop and Scan, by inlining their subgraphs at session creation.

gpumnn prepares a session at fixed input shapes, and everything shape- or constant-valued folds
while it lowers (``context.py``). Control flow is resolved the same way, before any run:

* **If** whose condition folds (a constant, or computed from shapes and constants: the common
  case in exported models) becomes the chosen branch's nodes, inline. A run-time condition lowers
  both branches and picks between their outputs with the atomic Select (see :func:`lower_if`).
* **Loop** with a trip count and condition known at session creation, and **Scan** (its
  sequence length comes from the input shapes), are unrolled: the body is lowered once per
  iteration, loop-carried values threaded from one copy to the next and per-iteration outputs
  stacked. A trip count that depends on input data is refused with an UnsupportedOpError.

A subgraph is lowered by :func:`lower_body` under names of its own (``<node>/<branch>/...``,
``<node>/iter<i>/...``), so that copies cannot clash with each other or the outer graph; names it
does not bind itself are outer tensors, read by name as ONNX allows.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ...errors import DataDependentError, ModelError, UnsupportedOpError
from ...ir import Graph, Node, ValueInfo
from ..context import LoweringContext, Value
from .logic import emit_select
from ..registry import lower_into, lowers
from ..emit import norm_axis, reorder

#: iterations beyond which a loop with a known but huge trip count is refused instead of unrolled
MAX_UNROLLED_ITERATIONS = 4096


def _rebound(graph: Graph, scope: Mapping[str, str], prefix: str) -> Graph:
    """``graph`` with every name in ``scope`` renamed (in nested subgraphs too, where they do not
    bind the name themselves) and its node names prefixed with ``prefix``."""
    rename = lambda name: scope.get(name, name) if name else name  # noqa: E731

    def attr(value):
        if not isinstance(value, Graph):
            return value
        own = value.defined_names()
        return _rebound(value, {k: v for k, v in scope.items() if k not in own}, "")

    nodes = [Node(n.op_type, prefix + n.name, [rename(i) for i in n.inputs], [rename(o) for o in n.outputs],
                  {k: attr(v) for k, v in n.attrs.items()}, n.domain) for n in graph.nodes]
    infos = lambda values: [ValueInfo(rename(v.name), v.shape, v.dtype) for v in values]  # noqa: E731
    return Graph(nodes, infos(graph.inputs), infos(graph.outputs),
                 {rename(k): v for k, v in graph.initializers.items()}, graph.opset, graph.name)


def lower_body(ctx: LoweringContext, node: Node, body: Graph, prefix: str, bound: Sequence[str]) -> list[str]:
    """Lower subgraph ``body`` into ``ctx``, its formal inputs bound to the tensors ``bound``;
    returns the names its outputs have in ``ctx``."""
    if len(bound) != len(body.inputs):
        raise ModelError(f"node {node.name!r} ({node.op_type}): its subgraph takes {len(body.inputs)} inputs, "
                         f"the node gives it {len(bound)}")
    scope = {name: prefix + name for name in body.defined_names()}
    scope.update(zip(body.input_names, bound))
    copy = _rebound(body, scope, prefix)
    for name, array in copy.initializers.items():
        ctx.set_const(name, array)
    try:
        lower_into(ctx, copy)
    except DataDependentError as exc:
        if not exc.tensor.startswith(prefix):
            raise
        # the tensor is the subgraph's own, unknown outside: name the node's output, which is
        # computed from what the subgraph reads (gpumnn.onnx_backend binds the inputs behind it)
        raise DataDependentError(exc.op_type, exc.node_name, node.outputs[0],
                                 f"{exc.reason} (inside the subgraph of {node.op_type} node {node.name!r})") from exc
    return copy.output_names


def _output_signature(ctx: LoweringContext, node: Node, body: Graph, bound: Sequence[str],
                      extra: Mapping[str, Value] | None = None) -> list[tuple[tuple[int, ...], np.dtype]]:
    """Shapes and dtypes of one iteration's outputs, found by lowering the body into a throwaway
    context that also knows ``extra`` (for a loop that runs zero times: its stacked outputs are
    empty, of the shape one iteration would stack)."""
    probe = LoweringContext()
    probe.values = {**ctx.values, **(extra or {})}
    outs = lower_body(probe, node, body, f"{node.name}/probe/", bound)
    return [(probe.shape(n), probe.dtype(n)) for n in outs]


def _bind_outputs(ctx: LoweringContext, outputs: Sequence[str], sources: Sequence[str]) -> None:
    """The node's outputs become views of the tensors its subgraph computed."""
    for out, source in zip(outputs, sources):
        if out:
            ctx.alias(out, source, ctx.shape(source))


def _condition(ctx: LoweringContext, node: Node, name: str, what: str) -> bool | None:
    """The value of a one-element boolean tensor if it is known now, else None."""
    value = ctx.value(name, node)
    if value.size != 1:
        raise ModelError(f"node {node.name!r} ({node.op_type}): {what} {name!r} has shape {list(value.shape)}; "
                         "a condition holds one element")
    return None if value.const is None else bool(np.asarray(value.const).reshape(-1)[0])


@lowers("If")
def lower_if(ctx: LoweringContext, node: Node, opset: int) -> None:
    """If: the chosen branch inline when the condition is known now; else both branches and a Select.

    Why Select for a run-time condition: gpumnn records each run's work at session creation, as
    a fixed list of atomic ops, so a branch cannot be skipped per run without a host round trip
    in the middle of the recorded work. ONNX branches are side-effect free, so computing both
    and selecting the outputs by the condition is exact; the cost is the work of both branches.
    It needs outputs of equal shapes and dtypes (what one atomic op can select between): other
    branches are refused by name, with both branches' shapes.
    """
    branches = {key: node.attr(key) for key in ("then_branch", "else_branch")}
    for key, branch in branches.items():
        if not isinstance(branch, Graph) or len(branch.outputs) != len(node.outputs):
            raise ModelError(f"node {node.name!r} (If): {key} must be a graph with {len(node.outputs)} outputs")
    cond = _condition(ctx, node, node.inputs[0], "condition")
    if cond is not None:
        key = "then_branch" if cond else "else_branch"
        _bind_outputs(ctx, node.outputs, lower_body(ctx, node, branches[key], f"{node.name}/{key}/", []))
        return
    then_outs, else_outs = (lower_body(ctx, node, b, f"{node.name}/{k}/", []) for k, b in branches.items())
    signature = lambda names: ", ".join(f"{ctx.dtype(n).name}{list(ctx.shape(n))}" for n in names)  # noqa: E731
    if signature(then_outs) != signature(else_outs):
        raise UnsupportedOpError("If", node.name, "a condition known only at run time needs branches whose outputs "
                                 "have equal shapes and dtypes (gpumnn computes both and selects), but then_branch "
                                 f"gives {signature(then_outs)} and else_branch {signature(else_outs)}")
    scalar = ctx.temp(node, "condition")
    ctx.alias(scalar, node.inputs[0], ())
    for out, then_out, else_out in zip(node.outputs, then_outs, else_outs):
        if out:
            emit_select(ctx, node, scalar, then_out, else_out, out)


def _stack(ctx: LoweringContext, node: Node, parts: Sequence[str], axis: int, out: str,
           empty: tuple[tuple[int, ...], np.dtype] | None) -> None:
    """``out``: the per-iteration tensors ``parts`` stacked along a new ``axis``, or, after zero
    iterations, an empty tensor of one iteration's shape and dtype ``empty``."""
    if not parts:
        shape, dtype = empty
        ctx.set_const(out, np.zeros(shape[:axis] + (0,) + shape[axis:], dtype=dtype))
        return
    reorder(ctx, node, list(parts), lambda xs, f: [np.stack(xs, axis=axis)], [out])


@lowers("Loop")
def lower_loop(ctx: LoweringContext, node: Node, opset: int) -> None:
    """Loop, unrolled: the trip count M and the condition must be known at session creation
    (a constant, or computed from shapes and constants; the body's condition output is checked
    after every iteration, as it folds). Scan outputs are stacked along a new first axis."""
    body = node.attr("body")
    max_trip, cond_input = (list(node.inputs) + ["", ""])[:2]
    carried = list(node.inputs[2:])
    n_scan = len(body.outputs) - 1 - len(carried)
    trip = None
    if max_trip:
        if not ctx.value(max_trip, node).is_const:
            raise DataDependentError("Loop", node.name, max_trip, f"Loop trip count not known at session creation: "
                                     f"M ({max_trip!r}) depends on input data, and gpumnn unrolls loops")
        trip = int(np.asarray(ctx.value(max_trip).const).reshape(-1)[0])
    running = True
    if cond_input:
        running = _condition(ctx, node, cond_input, "condition")
        if running is None:
            raise DataDependentError("Loop", node.name, cond_input, "Loop trip count not known at session creation: "
                                     f"its condition ({cond_input!r}) depends on input data")
    elif trip is None:
        raise UnsupportedOpError("Loop", node.name, "neither a trip count nor a condition: the loop never ends")
    true = f"{node.name}/true"
    ctx.set_const(true, np.array(True))
    scans: list[list[str]] = [[] for _ in range(n_scan)]
    iteration = 0
    while running and (trip is None or iteration < trip):
        if iteration >= MAX_UNROLLED_ITERATIONS:
            raise UnsupportedOpError("Loop", node.name, f"more than {MAX_UNROLLED_ITERATIONS} iterations: gpumnn "
                                     "unrolls loops at session creation")
        counter = f"{node.name}/iter{iteration}/iteration_num"
        ctx.set_const(counter, np.array(iteration, dtype=np.int64))
        outs = lower_body(ctx, node, body, f"{node.name}/iter{iteration}/", [counter, true] + carried)
        carried = outs[1:1 + len(carried)]
        for parts, out in zip(scans, outs[1 + len(carried):]):
            parts.append(out)
        if cond_input:  # with no condition input, the body's condition output is ignored (ONNX)
            running = _condition(ctx, node, outs[0], "the body's condition output")
            if running is None:
                raise UnsupportedOpError("Loop", node.name, "Loop trip count not known at session creation: the "
                                         f"condition computed by its body in iteration {iteration} depends on input data")
        iteration += 1
    _bind_outputs(ctx, node.outputs, carried)
    empty = [None] * n_scan
    if iteration == 0 and n_scan:
        counter = f"{node.name}/probe/iteration_num"
        ctx.set_const(counter, np.array(0, dtype=np.int64))
        empty = _output_signature(ctx, node, body, [counter, true] + carried)[1 + len(carried):]
    for parts, out, signature in zip(scans, node.outputs[len(carried):], empty):
        if out:
            _stack(ctx, node, parts, 0, out, signature)


def _axes(node: Node, key: str, count: int, ranks: Sequence[int]) -> list[int]:
    values = list(node.attr(key) or [0] * count)
    if len(values) != count:
        raise ModelError(f"node {node.name!r} (Scan): {key} lists {len(values)} axes for {count} tensors")
    return [norm_axis(int(a), rank, node) for a, rank in zip(values, ranks)]


@lowers("Scan")
def lower_scan(ctx: LoweringContext, node: Node, opset: int) -> None:
    """Scan (opset 9 on; opset 8 models are converted at load), unrolled over the scan axis,
    whose length the input shapes give: each iteration's body reads slice t of every scan input
    (counted from the end for a reverse direction) and the states the previous one computed."""
    body = node.attr("body")
    n_scan_in = int(node.attr("num_scan_inputs"))
    n_state = len(node.inputs) - n_scan_in
    states, scan_inputs = list(node.inputs[:n_state]), list(node.inputs[n_state:])
    n_scan_out = len(body.outputs) - n_state
    in_axes = _axes(node, "scan_input_axes", n_scan_in, [len(ctx.shape(x)) for x in scan_inputs])
    in_reverse = list(node.attr("scan_input_directions") or [0] * n_scan_in)
    out_reverse = list(node.attr("scan_output_directions") or [0] * n_scan_out)
    lengths = {ctx.shape(x)[axis] for x, axis in zip(scan_inputs, in_axes)}
    if len(lengths) != 1:
        raise ModelError(f"node {node.name!r} (Scan): the scan inputs have sequence lengths {sorted(lengths)} "
                         "along their scan axes; they must agree")
    length = lengths.pop()
    scans: list[list[str]] = [[] for _ in range(n_scan_out)]
    for step in range(length):
        slices = []
        for k, (x, axis) in enumerate(zip(scan_inputs, in_axes)):
            index = length - 1 - step if in_reverse[k] else step
            name = f"{node.name}/iter{step}/scan_input{k}"
            reorder(ctx, node, [x], lambda xs, f, i=index, a=axis: [np.take(xs[0], i, axis=a)], [name])
            slices.append(name)
        outs = lower_body(ctx, node, body, f"{node.name}/iter{step}/", states + slices)
        states = outs[:n_state]
        for parts, out in zip(scans, outs[n_state:]):
            parts.append(out)
    _bind_outputs(ctx, node.outputs, states)
    empty = [None] * n_scan_out
    if length == 0 and n_scan_out:
        slices = {f"{node.name}/probe/scan_input{k}": Value(ctx.shape(x)[:a] + ctx.shape(x)[a + 1:], ctx.dtype(x))
                  for k, (x, a) in enumerate(zip(scan_inputs, in_axes))}
        empty = _output_signature(ctx, node, body, states + list(slices), slices)[n_state:]
    ranks = [len(ctx.shape(parts[0]) if parts else signature[0]) + 1 for parts, signature in zip(scans, empty)]
    out_axes = _axes(node, "scan_output_axes", n_scan_out, ranks)
    for k, (parts, out) in enumerate(zip(scans, node.outputs[n_state:])):
        if out:
            _stack(ctx, node, parts[::-1] if out_reverse[k] else parts, out_axes[k], out, empty[k])
