"""Round trips through narrow storage removed at the end of lowering.

``LoweringContext.emit`` converts every narrow (float16, int8, uint8) tensor to its compute dtype
before a computing op reads it, and computes a narrow result into a float32/int32 temp that it then
converts. A narrow tensor that only such conversions read, and that is no graph input or output,
need not exist: the pair ``wide -> narrow -> wide`` becomes one op on the wide values.

* float16: float32 -> float16 -> float32 is ``round_f16``; nothing at all (an alias) when the
  float32 values are float16 values already (``_Float16Values`` follows which are).
* int8/uint8: the pair wraps around to 8 bits, which is the identity only where lowering recorded
  that the conversion's input is in the type's range and integral (``LoweringContext.exact_conversions``,
  as QuantizeLinear's clip makes it); elsewhere the narrow tensor stays.

A narrow tensor that an element-moving op (Raster, Gather, Select, Scatter) reads stays narrow.

Then two rewrites keep the remaining ``round_f16`` ops from costing memory (each exact):
``round_f16`` and a ``relu`` behind it move after a max Pool2D that alone reads them (both are
nondecreasing, so they commute with a max), and a ``round_f16`` that alone reads the result of an
op with a free activation epilogue becomes that epilogue.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Callable, Iterable

import numpy as np

from .. import atomic as A

#: the ops whose ``activation`` epilogue may take a ``round_f16``
_EPILOGUE_OPS = (A.Conv2D, A.ConvTranspose2D, A.MatMul, A.Binary)


def remove_round_trips(ops: list[A.AtomicOp], ctx, inputs: Iterable[str], outputs: Iterable[str]) -> list[A.AtomicOp]:
    """``ops`` without the narrow round trips described above; aliases and values are added to
    ``ctx`` (a ``LoweringContext``) for what replaces them."""
    ops = _drop_conversion_pairs(ops, ctx, set(inputs), set(outputs))
    ops = _move_after_max_pools(ops, ctx, set(outputs))
    return _fuse_rounding_epilogues(ops, ctx, set(outputs))


def _root(ctx, name: str) -> str:
    while name in ctx.aliases:
        name = ctx.aliases[name]
    return name


def _is_conversion(op: A.AtomicOp) -> bool:
    return isinstance(op, A.Unary) and op.op == "identity"


def _drop_conversion_pairs(ops: list[A.AtomicOp], ctx, inputs: set[str], outputs: set[str]) -> list[A.AtomicOp]:
    readers: dict[str, list[int]] = defaultdict(list)
    for i, op in enumerate(ops):
        for name in dict.fromkeys(op.inputs):
            readers[_root(ctx, name)].append(i)
    kept = {_root(ctx, n) for n in outputs} | {_root(ctx, n) for n in inputs}
    float16_values = _Float16Values(ctx)
    dropped: set[int] = set()
    result: list[A.AtomicOp] = []
    for i, op in enumerate(ops):
        if i in dropped:
            continue
        narrow = op.outputs[0]
        if not (_is_conversion(op) and op.output_dtype() in A.NARROW_DTYPES and op.dtype in A.COMPUTE_DTYPES
                and narrow not in kept):
            result.append(op)
            float16_values.note(op)
            continue
        back = [ops[j] for j in readers[narrow]]
        source = op.inputs[0]
        if op.output_dtype() == A.FLOAT16:
            usable = op.dtype == A.FLOAT32 and all(_is_conversion(r) and r.output_dtype() == A.FLOAT32 for r in back)
            exact = float16_values.holds(source)
        else:
            exact = usable = narrow in ctx.exact_conversions and all(
                _is_conversion(r) and r.output_dtype() in A.COMPUTE_DTYPES for r in back)
        if not back or not usable:
            result.append(op)
            float16_values.note(op)
            continue
        made: dict[str, str] = {}  # compute dtype -> the tensor that now holds the values in it
        for j, reader in zip(readers[narrow], back):
            dropped.add(j)
            wide, dtype = reader.outputs[0], reader.output_dtype()
            if dtype in made:
                ctx.aliases[wide] = made[dtype]
                continue
            made[dtype] = wide
            if exact and dtype == op.dtype and not (wide in outputs and _root(ctx, source) in inputs):
                ctx.aliases[wide] = source
                continue
            replacement = A.Unary((source,), (wide,), reader.source, dtype=op.dtype, count=reader.count,
                                  op="identity" if exact else "round_f16", out_dtype=dtype)
            result.append(replacement)
            float16_values.note(replacement)
    return result


class _Float16Values:
    """Which float32 tensors hold float16 values only (so rounding them to float16 changes
    nothing): conversions from float16, ``round_f16`` results, and what ops that pick, reorder or
    take the max, min, sign or absolute value of such values make of them."""

    _PRESERVING_UNARY = frozenset({"identity", "relu", "neg", "abs"})

    def __init__(self, ctx) -> None:
        self._ctx = ctx
        self._known: set[str] = set()
        self._constants: dict[str, bool] = {}

    def holds(self, name: str) -> bool:
        root = _root(self._ctx, name)
        if root in self._known:
            return True
        value = self._ctx.values.get(root)
        if value is None or value.const is None:
            return False
        if root not in self._constants:
            array = np.asarray(value.const)
            self._constants[root] = array.dtype == np.float16 or (
                array.dtype == np.float32 and bool(np.all(array.astype(np.float16).astype(np.float32) == array)))
        return self._constants[root]

    def note(self, op: A.AtomicOp) -> None:
        if op.output_dtype() != A.FLOAT32 or not self._makes_float16_values(op):
            return
        self._known.add(_root(self._ctx, op.outputs[0]))

    def _makes_float16_values(self, op: A.AtomicOp) -> bool:
        holds: Callable[[Iterable[str]], bool] = lambda names: all(self.holds(n) for n in names)
        if isinstance(op, A.Unary):
            if op.op == "round_f16" or op.op == "identity" and op.dtype == A.FLOAT16:
                return True
            return op.dtype == A.FLOAT32 and op.op in self._PRESERVING_UNARY and holds(op.inputs)
        if isinstance(op, A.Raster):
            fill_ok = op.fill is None or float(np.float16(op.fill)) == float(op.fill)
            return op.dtype == A.FLOAT32 and fill_ok and holds(op.inputs)
        if isinstance(op, A.Pool2D):
            return op.op == "max" and holds(op.inputs)
        if isinstance(op, A.Reduce):
            return op.op in ("max", "min") and holds(op.inputs)
        if isinstance(op, A.Binary):
            return op.op in ("max", "min") and op.activation is None and holds(op.inputs)
        if isinstance(op, A.Gather):
            return holds(op.inputs[:1])
        if isinstance(op, A.Select):
            return holds(op.inputs[1:3])
        return False


def _reader_counts(ops: list[A.AtomicOp], ctx, outputs: set[str]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for op in ops:
        for name in op.inputs:
            counts[_root(ctx, name)] += 1
    for name in outputs:
        counts[_root(ctx, name)] += 2  # a graph output is read by the caller
    return counts


def _producers(ops: list[A.AtomicOp]) -> dict[str, int]:
    return {name: i for i, op in enumerate(ops) for name in op.outputs}


def _move_after_max_pools(ops: list[A.AtomicOp], ctx, outputs: set[str]) -> list[A.AtomicOp]:
    """``pool(round_f16(x))`` as ``round_f16(pool(x))``, and so for a ``relu`` of a ``round_f16``
    result: the elementwise op then runs on the pool's smaller output."""
    changed = True
    while changed:
        changed = False
        counts, producers = _reader_counts(ops, ctx, outputs), _producers(ops)
        for i, unary in enumerate(ops):
            if not (isinstance(unary, A.Unary) and unary.dtype == A.FLOAT32 and unary.output_dtype() == A.FLOAT32):
                continue
            if unary.op == "relu":
                feeder = producers.get(_root(ctx, unary.inputs[0]))
                if feeder is None or not (isinstance(ops[feeder], A.Unary) and ops[feeder].op == "round_f16"):
                    continue
            elif unary.op != "round_f16":
                continue
            result = unary.outputs[0]
            if counts[result] != 1 or result in ctx.aliases:
                continue
            reader = next(j for j in range(i + 1, len(ops)) if any(_root(ctx, n) == result for n in ops[j].inputs))
            pool = ops[reader]
            if not (isinstance(pool, A.Pool2D) and pool.op == "max" and pool.dtype == A.FLOAT32
                    and _root(ctx, pool.inputs[0]) == result):
                continue
            pooled = pool.outputs[0]
            before = ctx.unique_name(f"{pooled}/before_{unary.op}")
            ctx.set_runtime(before, ctx.values[pooled].shape, np.float32)
            moved = dataclasses.replace(unary, inputs=(before,), outputs=(pooled,),
                                        count=int(np.prod(ctx.values[pooled].shape)))
            ops = ops[:i] + ops[i + 1:reader] + [dataclasses.replace(pool, inputs=unary.inputs, outputs=(before,)),
                                                  moved] + ops[reader + 1:]
            changed = True
            break
    return ops


def _fuse_rounding_epilogues(ops: list[A.AtomicOp], ctx, outputs: set[str]) -> list[A.AtomicOp]:
    """An op without an activation whose float32 result only a ``round_f16`` reads rounds in its
    epilogue instead."""
    counts, producers = _reader_counts(ops, ctx, outputs), _producers(ops)
    fused: dict[int, A.AtomicOp] = {}
    dropped: set[int] = set()
    for i, op in enumerate(ops):
        if not (isinstance(op, A.Unary) and op.op == "round_f16" and op.dtype == A.FLOAT32):
            continue
        feeder = producers.get(op.inputs[0])
        if feeder is None or feeder in fused or counts[op.inputs[0]] != 1 or op.inputs[0] in ctx.aliases:
            continue
        producer = ops[feeder]
        if not (isinstance(producer, _EPILOGUE_OPS) and producer.activation is None and len(producer.outputs) == 1
                and producer.dtype == A.FLOAT32 and producer.output_dtype() == A.FLOAT32):
            continue
        fused[feeder] = dataclasses.replace(producer, outputs=op.outputs, activation=("round_f16", ()))
        dropped.add(i)
    return [fused.get(i, op) for i, op in enumerate(ops) if i not in dropped]
