"""The table of ONNX op types gpumnn can lower, filled by ``@lowers`` in the lowering modules."""
from __future__ import annotations

from typing import Callable

from ..ir import Node

Lowering = Callable[..., None]  # (ctx: LoweringContext, node: Node, opset: int) -> None

LOWERINGS: dict[str, Lowering] = {}


def lowers(*op_types: str) -> Callable[[Lowering], Lowering]:
    """Register a function as the lowering of one or more ONNX op types."""
    def register(fn: Lowering) -> Lowering:
        for op_type in op_types:
            LOWERINGS[op_type] = fn
        return fn
    return register


def supported_ops() -> tuple[str, ...]:
    from . import compute, control_flow, einsum, indexing, logic, recurrent, reorder  # noqa: F401  (importing fills the table)
    return tuple(sorted(LOWERINGS))


def lowering_for(node: Node) -> Lowering | None:
    supported_ops()
    return LOWERINGS.get(node.op_type)
