"""Geometry lowering: an IR graph at concrete input shapes -> an :class:`AtomicProgram`.

Steps (MNN's geometry compute): every node is lowered in order (``lowerings/``, a module per op
family, through ``registry.py``; ``emit.py`` holds what they share), constants fold as they appear, then
neighbouring Rasters fuse by composing their index maps, identity Rasters become free aliases,
and the rest are compressed into strided regions. Last, round trips through narrow storage that
no op needs are removed (``round_trips.py``).
"""
from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

import numpy as np

from .. import atomic as A
from ..errors import ModelError
from ..ir import Graph
from . import lowerings  # noqa: F401  (importing fills the registry)
from .context import LoweringContext, PendingRaster, Value
from .regions import IndexMap, is_identity, needs_fill, regions_of
from .round_trips import remove_round_trips
from .registry import lower_into, supported_ops

__all__ = ["lower", "lower_into", "supported_ops", "LoweringContext", "Value"]


def lower(graph: Graph, input_shapes: Mapping[str, Sequence[int]],
          values: Mapping[str, np.ndarray] | None = None, int8_ops: bool = False,
          int8_channels_last: bool = False, int8_average_pool: bool = False,
          one_pass_quantize: bool = False) -> A.AtomicProgram:
    """Shape inference + lowering + Raster fusion for one set of concrete input shapes.

    ``values``: graph inputs known now (those that decide shapes); they become constants.
    ``int8_ops``: QDQ convolutions and products become QuantizedConv2D (``lowerings.int8_products``);
    ``int8_channels_last``: their 8-bit activations stay channels-last between them;
    ``int8_average_pool``: QDQ global average pooling becomes QuantizedGlobalAveragePool;
    ``one_pass_quantize``: a QuantizeLinear of float32 values per tensor to 8 bits becomes one Quantize."""
    if values:
        dtypes = {v.name: v.dtype for v in graph.inputs}
        graph = graph.copy()
        graph.inputs = [v for v in graph.inputs if v.name not in values]
        graph.initializers.update({n: np.asarray(a, dtype=dtypes[n], order="C") for n, a in values.items()})
    ctx = LoweringContext()
    ctx.int8_ops = int8_ops
    ctx.int8_channels_last = int8_channels_last
    ctx.int8_average_pool = int8_average_pool
    ctx.one_pass_quantize = one_pass_quantize
    for name, array in graph.initializers.items():
        ctx.set_const(name, array)
    for info in graph.inputs:
        try:
            A.storage_dtype(info.dtype)
        except TypeError:
            raise ModelError(f"graph input {info.describe()}: gpumnn runs float, integer and bool tensors only") from None
        ctx.set_runtime(info.name, input_shapes[info.name], info.dtype)
    lower_into(ctx, graph)
    return _finalize(ctx, graph)


def _compose(outer: PendingRaster, position: int, inner: PendingRaster) -> PendingRaster:
    """Fuse ``inner`` (which produces source ``position`` of ``outer``) into ``outer`` (on the
    maps in full: the fused map is indexed by element; it is reduced again afterwards)."""
    outer_map, inner_map = outer.index_map.full(), inner.index_map.full()
    sources = [s for i, s in enumerate(outer.sources) if i != position]
    remap_outer = np.array([i if i < position else i - 1 for i in range(len(outer.sources))] + [-1], dtype=np.int32)
    inner_ids = []
    for s in inner.sources:
        if s not in sources:
            sources.append(s)
        inner_ids.append(sources.index(s))
    remap_inner = np.array(inner_ids + [-1], dtype=np.int32)
    src = remap_outer[outer_map.src]  # -1 indexes the trailing -1
    idx = outer_map.idx.copy()
    mask = outer_map.src == position
    picked = idx[mask]
    src[mask] = remap_inner[inner_map.src.reshape(-1)[picked]]
    idx[mask] = inner_map.idx.reshape(-1)[picked]
    fill = outer.fill if outer.fill is not None else inner.fill
    return PendingRaster(sources, IndexMap(src, idx).reduced(), outer.output, fill, outer.source_node)


def _finalize(ctx: LoweringContext, graph: Graph) -> A.AtomicProgram:
    def storage(name: str) -> str:
        while name in ctx.aliases:
            name = ctx.aliases[name]
        return name

    uses: Counter[str] = Counter()
    for op in ctx.ops:
        for name in (op.sources if isinstance(op, PendingRaster) else op.inputs):
            uses[storage(name)] += 1
    for name in graph.output_names:
        uses[storage(name)] += 2  # an output is never fused away

    producers: dict[str, PendingRaster] = {}
    ops: list[A.AtomicOp | PendingRaster] = []
    for op in ctx.ops:
        if isinstance(op, PendingRaster):
            changed = True
            while changed:  # fold every single-use Raster feeding this one into it
                changed = False
                for position, name in enumerate(op.sources):
                    inner = producers.get(storage(name))
                    if inner is None or uses[storage(name)] != 1:
                        continue
                    if inner.fill is not None and op.fill is not None and inner.fill != op.fill:
                        continue
                    op = _compose(op, position, inner)
                    inner.output = ""  # dead
                    changed = True
                    break
            producers[op.output] = op
        ops.append(op)

    final_ops: list[A.AtomicOp] = []
    for op in ops:
        if not isinstance(op, PendingRaster):
            final_ops.append(op)
            continue
        if not op.output:
            continue
        if len(op.sources) == 1 and is_identity(op.index_map, ctx.values[op.sources[0]].size):
            ctx.aliases[op.output] = op.sources[0]
            continue
        regions = tuple(regions_of(op.index_map))
        fill_needed = needs_fill(op.index_map)
        final_ops.append(A.Raster(tuple(op.sources), (op.output,), op.source_node, out_shape=op.index_map.shape,
                                  regions=regions, fill=(op.fill if op.fill is not None else 0.0) if fill_needed else None,
                                  dtype=A.storage_dtype(ctx.values[op.output].dtype)))

    if ctx.int8_fused:  # the float values of an int8 op's input that nothing else reads
        final_ops = _drop_unread(final_ops, storage, graph.output_names)
    final_ops = remove_round_trips(final_ops, ctx, graph.input_names, graph.output_names)
    used = {n for op in final_ops for n in op.inputs + op.outputs} | set(graph.output_names) | set(graph.input_names)
    for name in list(used):  # keep whole alias chains, so storage_of() resolves every view
        while name in ctx.aliases:
            name = ctx.aliases[name]
            used.add(name)
    shapes = {n: v.shape for n, v in ctx.values.items() if n in used and not v.is_const}
    constants = {n: a for n, a in ctx.constants.items() if n in used}
    folded = {n: ctx.values[n].const for n in graph.output_names if ctx.values[n].is_const}
    for name in graph.output_names:
        if name not in ctx.values:
            raise ModelError(f"graph output {name!r} was never computed")
    aliases = {n: s for n, s in ctx.aliases.items() if n in used}
    dtypes = {n: ctx.values[n].dtype for n in shapes}
    dtypes.update({n: np.asarray(a).dtype for n, a in folded.items()})  # returned as folded when undeclared
    return A.AtomicProgram(final_ops, shapes, constants, graph.input_names, graph.output_names, aliases, folded,
                           dtypes=dtypes, exact_integer_sources=frozenset(ctx.exact_integer_sources))


def _drop_unread(ops: list[A.AtomicOp], storage, outputs) -> list[A.AtomicOp]:
    """``ops`` without those whose outputs no later op and no graph output reads (``storage``
    resolves a name to the tensor that holds it)."""
    needed = {storage(n) for n in outputs}
    kept = []
    for op in reversed(ops):
        if any(storage(n) in needed for n in op.outputs):
            kept.append(op)
            needed.update(storage(n) for n in op.inputs)
    return kept[::-1]
