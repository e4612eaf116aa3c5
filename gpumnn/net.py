"""Net: a loaded, optimised model from which sessions are created."""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import onnx

from .errors import GpumnnError, InternalError, UnsupportedOpError
from .geometry import lower, supported_ops
from .geometry.registry import lowering_for
from .ir import Graph, ValueInfo, all_nodes
from .frontend.importer import import_onnx
from .frontend.optimize import optimize as optimize_graph
from .input_shapes import resolve_input_shapes
from .runtime.session import DEFAULT_SHAPE_CACHE, Session


class Net:
    """An ONNX model turned into gpumnn's IR, with converter-style optimisations applied."""

    def __init__(self, graph: Graph, optimizations: dict[str, int] | None = None, source: str = "<model>"):
        self.graph = graph
        self.optimizations = optimizations or {}
        self.source = source

    @property
    def inputs(self) -> list[ValueInfo]:
        return list(self.graph.inputs)

    @property
    def outputs(self) -> list[ValueInfo]:
        return list(self.graph.outputs)

    def session(self, backend: str = "cpu", input_shapes: Mapping[str, Sequence[int]] | None = None,
                record: bool = True, threads: int | None = None, fallback: bool = True,
                max_concurrent_runs: int | None = None, shape_cache: int = DEFAULT_SHAPE_CACHE,
                precision: str = "fp32", **backend_options: Any) -> Session:
        """Pre-inference for one backend (see :class:`Session`): at creation for ``input_shapes``
        (which may leave out static dims), or, for a model with symbolic dims and no shapes given,
        at the first run; runs with other shapes prepare for them, keeping the ``shape_cache``
        most recently used shape sets (0: the first shape set only; others raise InputError).

        ``fallback=True`` runs on the CPU, with a warning, when the backend cannot start;
        ``fallback=False`` raises BackendUnavailableError instead. ``max_concurrent_runs`` caps
        how many threads' runs proceed at once (each needs a run state of its own; the backends
        set the upper bound, see the README's Threads section).

        ``precision="int8"`` runs matrix products with constant weights on int8 (weights quantized
        once per column, activations per row at run time, ``gpumnn.scheduler.precision``);
        ``precision="int4"`` likewise with 4-bit weights, a scale per block of 32 steps of K;
        ``precision="fp16"`` holds weights and activations in float16 where a GPU backend has the
        kernels (arithmetic in float32; the cpu runs it in float32, as ``report()`` says); the
        default ``"fp32"`` runs the model as it is; any other value is a ValueError.
        """
        return Session(self.graph, backend=backend, input_shapes=input_shapes, record=record, threads=threads,
                       fallback=fallback, max_concurrent_runs=max_concurrent_runs, shape_cache=shape_cache,
                       precision=precision, **backend_options)

    def infer_shapes(self, input_shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, tuple[int, ...]]:
        """Concrete shape of every run-time tensor for the given input shapes."""
        program = lower(self.graph, resolve_input_shapes(self.graph, input_shapes))
        return dict(program.shapes)

    def __repr__(self) -> str:
        return f"<Net {self.source} nodes={len(self.graph.nodes)} inputs={[v.describe() for v in self.inputs]}>"


def load(model: str | os.PathLike | bytes | onnx.ModelProto, optimize: bool = True) -> Net:
    """Load an ONNX model (path, bytes or ModelProto); raises ModelError / UnsupportedOpError
    (InternalError for a bug of gpumnn's)."""
    try:
        graph = import_onnx(model)
    except GpumnnError:
        raise
    except Exception as exc:  # the reader's and checker's refusals are ModelErrors already: anything else is a bug
        name = str(model) if isinstance(model, (str, os.PathLike)) else "the model"
        raise InternalError(f"reading {name}", exc) from exc
    for node in all_nodes(graph):  # subgraphs' nodes too: a branch that cannot run is refused at load
        if lowering_for(node) is None:
            raise UnsupportedOpError(node.op_type, node.name, "gpumnn has no implementation of this op",
                                     supported_ops(node.domain))
    stats = optimize_graph(graph) if optimize else {}
    source = str(model) if isinstance(model, (str, os.PathLike)) else f"<{graph.name}>"
    return Net(graph, stats, source)
