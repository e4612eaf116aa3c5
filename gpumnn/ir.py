"""gpumnn's own graph: a small, ONNX-free picture of a model.

The importer turns ONNX protobufs into these plain Python objects once, so that optimisation
passes, shape inference and lowering never touch protobuf APIs and can be tested on hand-made
graphs.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Dim = int | str | None


@dataclass
class ValueInfo:
    """A graph input or output: a name, a (possibly symbolic) shape and a NumPy dtype."""

    name: str
    shape: tuple[Dim, ...] | None
    dtype: np.dtype
    #: the model's type where ``dtype`` holds a narrower one (int4 and uint4 in int8 and uint8), and its range
    declared: str | None = None
    value_range: tuple[int, int] | None = None

    def describe(self) -> str:
        dims = "?" if self.shape is None else "x".join(str(d) if d not in (None, "") else "?" for d in self.shape)
        return f"{self.name}: {self.declared or np.dtype(self.dtype).name}[{dims}]"


@dataclass
class Node:
    """One operator: ONNX op type, a unique name, tensor names in and out, attributes.

    Attributes are plain Python values (int, float, str, list, np.ndarray), and a :class:`Graph`
    for a control-flow op's subgraph (If's branches, Loop's and Scan's body). Optimisation passes
    may add gpumnn-private attributes whose names start with ``gpumnn_`` (e.g. a fused
    activation), which the lowering reads.
    """

    op_type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)


@dataclass
class Graph:
    """A topologically ordered list of nodes plus constants and the graph's inputs/outputs."""

    nodes: list[Node]
    inputs: list[ValueInfo]
    outputs: list[ValueInfo]
    initializers: dict[str, np.ndarray]
    opset: int = 17
    name: str = "graph"

    def copy(self) -> "Graph":
        """A copy whose node list and dicts can be rewritten; constant arrays are shared."""
        return Graph(
            nodes=[Node(n.op_type, n.name, list(n.inputs), list(n.outputs), dict(n.attrs), n.domain) for n in self.nodes],
            inputs=[copy.copy(v) for v in self.inputs],
            outputs=[copy.copy(v) for v in self.outputs],
            initializers=dict(self.initializers),
            opset=self.opset,
            name=self.name,
        )

    def consumers(self) -> dict[str, list[Node]]:
        """Map each tensor name to the nodes that read it (through their subgraphs too)."""
        users: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node_reads(node):
                if name:
                    users.setdefault(name, []).append(node)
        return users

    def producers(self) -> dict[str, Node]:
        return {out: node for node in self.nodes for out in node.outputs if out}

    @property
    def output_names(self) -> list[str]:
        return [v.name for v in self.outputs]

    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.inputs]

    def defined_names(self) -> set[str]:
        """The names this graph binds itself: its inputs, constants and node outputs."""
        names = set(self.input_names) | set(self.initializers)
        names.update(o for node in self.nodes for o in node.outputs if o)
        return names

    def outer_reads(self) -> set[str]:
        """The names this graph (a control-flow op's body) reads from enclosing scopes.

        ONNX subgraphs may read any tensor of an enclosing graph by name, without it being an
        input of the node that holds them; passes that rename, fold or drop outer tensors must
        see these reads (:func:`node_reads`)."""
        reads = {n for node in self.nodes for n in node_reads(node)} | set(self.output_names)
        return reads - self.defined_names() - {""}


def subgraphs(node: Node) -> list[Graph]:
    """The graph attributes of a node (If's branches, Loop's and Scan's body), in attribute order."""
    return [value for value in node.attrs.values() if isinstance(value, Graph)]


def node_reads(node: Node) -> list[str]:
    """Every tensor ``node`` reads: its inputs, then what its subgraphs read from outside them."""
    outer = sorted(set().union(*(g.outer_reads() for g in subgraphs(node))) - set(node.inputs))
    return [n for n in node.inputs if n] + outer


def inputs_behind(graph: Graph, tensor: str) -> set[str]:
    """The graph inputs ``tensor`` is computed from (itself, if it is one)."""
    producers = graph.producers()
    seen, todo = set(), [tensor]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in producers:
            todo.extend(node_reads(producers[name]))  # a subgraph's outer reads too
    return seen & set(graph.input_names)


def all_nodes(graph: Graph):
    """The nodes of ``graph`` and, recursively, of its nodes' subgraphs."""
    for node in graph.nodes:
        yield node
        for sub in subgraphs(node):
            yield from all_nodes(sub)
