"""Concatenation without copies: producers write straight into their slice of the output.

A Raster whose regions each copy one whole tensor, in order, to a contiguous range of its
output (a Concat along the outermost non-trivial axis: SqueezeNet's fire modules, Inception's
branches at batch 1) is removed once each op's backend is known (after placement; for a device
profile's plan, all on its backend). Each input's storage becomes a view of the
output at its range's offset (``AtomicProgram.view_offsets``), so the pool layout places the
inputs inside the output and their producers' kernels write there. This is the one place that
decides it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from .. import atomic as A


def _walks_contiguously(size: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether a region's index space visits ``strides`` addresses in row-major, gap-free order."""
    expected = 1
    for extent, stride in zip(reversed(size), reversed(strides)):
        if extent == 1:
            continue
        if stride != expected:
            return False
        expected *= extent
    return True


def _slices(program: A.AtomicProgram, op: A.Raster) -> list[tuple[str, int]] | None:
    """``(input storage, byte offset in the output)`` per input where ``op`` only lays whole
    inputs side by side, each in a contiguous range, covering the output; else None."""
    out = op.outputs[0]
    if len(op.regions) < 2 or len(op.regions) != len(op.inputs) or len(set(op.inputs)) != len(op.inputs):
        return None
    itemsize = A.ITEMSIZE[op.dtype]
    ranges = []
    for region in op.regions:
        name = op.inputs[region.src]
        if name in program.constants or program.storage_dtype_of(name) != op.dtype:
            return None
        count = math.prod(program.shapes[name])
        if region.src_offset != 0 or region.count != count or program.offset_in_storage(name) != 0:
            return None
        if not (_walks_contiguously(region.size, region.src_strides)
                and _walks_contiguously(region.size, region.dst_strides)):
            return None
        storage = program.storage_of(name)
        if program.nbytes_of(storage) != count * itemsize or program.storage_dtype_of(storage) != op.dtype:
            return None
        ranges.append((region.dst_offset, count, storage))
    ranges.sort()
    end = 0
    for start, count, _ in ranges:
        if start != end:
            return None
        end += count
    if end != math.prod(program.shapes[out]):
        return None
    return [(storage, start * itemsize) for start, _, storage in ranges]


def write_concats_in_place(program: A.AtomicProgram, op_backends: Sequence[str],
                           alignments: Mapping[str, int]) -> tuple[A.AtomicProgram, list[int]]:
    """``program`` without the concatenating Rasters whose inputs can be views of their output,
    and the indices of the ops it keeps. An input qualifies where it is a tensor of its own (no
    graph input, constant or view of part of another) of the output's dtype, written and read
    only on the Raster's backend (``op_backends``: each op's), at an offset that keeps that
    backend's byte alignment (``alignments``)."""
    storage_inputs = {program.storage_of(name) for name in program.inputs}
    aliases, offsets = dict(program.aliases), dict(program.view_offsets)
    current = replace(program, aliases=aliases, view_offsets=offsets)  # updated as concats are placed
    removed: set[int] = set()
    for index, op in enumerate(program.ops):
        if not isinstance(op, A.Raster) or len(op.outputs) != 1:
            continue
        out = op.outputs[0]
        if out in aliases or out in storage_inputs:
            continue
        slices = _slices(current, op)
        backend = op_backends[index]
        if slices is None or any(offset % alignments[backend] for _, offset in slices):
            continue
        storages = {storage for storage, _ in slices}
        if storages & storage_inputs or len(storages) != len(slices) or out in storages:
            continue
        if not _all_on(current, op_backends, removed, index, storages, backend):
            continue
        for storage, offset in slices:
            aliases[storage], offsets[storage] = out, offset
        removed.add(index)
    kept = [i for i in range(len(program.ops)) if i not in removed]
    if not removed:
        return program, kept
    return replace(current, ops=[program.ops[i] for i in kept]), kept


def _all_on(program: A.AtomicProgram, op_backends: Sequence[str], removed: set[int], raster: int,
            storages: set[str], backend: str) -> bool:
    """Whether every op that writes or reads one of ``storages`` (the Raster ``raster`` apart)
    runs on ``backend``, and each of them is written by some op: a copy between backends moves
    a whole storage, so a view's writes and reads must stay where the storage lives."""
    written: set[str] = set()
    for i, (op, b) in enumerate(zip(program.ops, op_backends)):
        if i == raster or i in removed:
            continue
        outs = {program.storage_of(n) for n in op.outputs} & storages
        ins = {program.storage_of(n) for n in op.inputs if n not in program.constants} & storages
        if (outs or ins) and b != backend:
            return False
        written |= outs
    return written == storages
