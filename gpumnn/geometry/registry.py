"""The table of ONNX op types gpumnn can lower, filled by ``@lowers`` in the lowering modules
(the ``gpumnn.geometry`` package imports them all), and the lowering of nodes through it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..errors import GpumnnError, InternalError, ResourceError, UnsupportedOpError
from ..ir import Graph, Node

if TYPE_CHECKING:
    from .context import LoweringContext

Lowering = Callable[..., None]  # (ctx: LoweringContext, node: Node, opset: int) -> None

LOWERINGS: dict[str, Lowering] = {}
#: the lowerings of ops of other domains (ONNX Runtime's com.microsoft), by domain and op type
DOMAIN_LOWERINGS: dict[str, dict[str, Lowering]] = {}
DEFAULT_DOMAINS = ("", "ai.onnx")


def lowers(*op_types: str, domain: str = "") -> Callable[[Lowering], Lowering]:
    """Register a function as the lowering of one or more ONNX op types (of ``domain``)."""
    def register(fn: Lowering) -> Lowering:
        table = LOWERINGS if domain in DEFAULT_DOMAINS else DOMAIN_LOWERINGS.setdefault(domain, {})
        for op_type in op_types:
            table[op_type] = fn
        return fn
    return register


def supported_ops(domain: str = "") -> tuple[str, ...]:
    """The op types of ``domain`` (the default domain unless named) gpumnn lowers."""
    return tuple(sorted(LOWERINGS if domain in DEFAULT_DOMAINS else DOMAIN_LOWERINGS.get(domain, {})))


def lowering_for(node: Node) -> Lowering | None:
    if node.domain in DEFAULT_DOMAINS:
        return LOWERINGS.get(node.op_type)
    return DOMAIN_LOWERINGS.get(node.domain, {}).get(node.op_type)


def lower_into(ctx: LoweringContext, graph: Graph, nodes=None) -> None:
    """Lower ``nodes`` (default: all of the graph's) into ``ctx``, naming the node on failure.
    Only a whole graph's lowering lets a lowering absorb the nodes after its own (``ctx.graph_reads``)."""
    from .context import GraphReads

    previous = ctx.graph_reads
    ctx.graph_reads = GraphReads.of(graph) if nodes is None else None
    try:
        _lower_nodes(ctx, graph, graph.nodes if nodes is None else nodes)
    finally:
        ctx.graph_reads = previous


def _lower_nodes(ctx: LoweringContext, graph: Graph, nodes) -> None:
    for node in nodes:
        if id(node) in ctx.absorbed:
            continue
        fn = lowering_for(node)
        if fn is None:
            raise UnsupportedOpError(node.op_type, node.name, "no lowering for this op type", supported_ops())
        try:
            fn(ctx, node, graph.opset)
        except GpumnnError:
            raise
        except MemoryError as exc:  # an allocation no guard foresaw (see scheduler.resources)
            raise ResourceError(f"node {node.name!r} ({node.op_type}) ran out of host memory while being "
                                f"lowered: {exc}") from exc
        except ValueError as exc:
            if not _numpy_too_big(exc):
                raise _lowering_error(ctx, node, exc) from exc
            raise ResourceError(f"node {node.name!r} ({node.op_type}) needs an array larger than NumPy can "
                                f"allocate: {exc}") from exc
        except Exception as exc:  # a bug: a malformed model is refused on purpose, with a ModelError
            raise _lowering_error(ctx, node, exc) from exc


def _lowering_error(ctx: LoweringContext, node, exc: Exception) -> InternalError:
    """The error for an exception a lowering did not raise on purpose: gpumnn's bug, not the model's."""
    shapes = {n: list(ctx.values[n].shape) for n in node.inputs if n in ctx.values}
    return InternalError(f"lowering node {node.name!r} ({node.op_type}) with input shapes {shapes}", exc)


def _numpy_too_big(exc: ValueError) -> bool:
    """NumPy's ValueErrors for sizes beyond what it can index (np.empty, np.arange, reshape)."""
    text = str(exc)
    return "array is too big" in text or "Maximum allowed size exceeded" in text
