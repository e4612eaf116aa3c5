"""The cpu backend's static int8 sum: ``QuantizedAdd`` (a QDQ model's residual Add between its
DequantizeLinear and QuantizeLinear nodes, ONNX Runtime's QLinearAdd), on the 8-bit values.

The arithmetic is the contract's in float32, operation by operation: the NumPy kernel computes it
in passes over a float32 scratch, the compiled one in one loop with no fused multiply-add (Numba
without ``fastmath``), so both give the float path's bits.
"""
from __future__ import annotations

import numpy as np

from ... import atomic as A
from ..base import KernelWork
from . import jit as cpu_jit
from .reference import _on_pool, _spans, typed

#: elements from which the compiled sum is cut into spans, one per thread of the backend's pool
PARALLEL_MIN_ELEMENTS = 1 << 15


def quantized_add_reference(op: A.QuantizedAdd, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The contract's QuantizedAdd in NumPy: a, b of ``op.dtype`` -> out of ``op.out_dtype`` (a new array)."""
    total = np.empty(a.shape, np.float32)
    _float_sum_into(op, a, b, total, np.empty(a.shape, np.float32))
    return total.astype(op.out_dtype)


def _float_sum_into(op: A.QuantizedAdd, a: np.ndarray, b: np.ndarray, total: np.ndarray, other: np.ndarray) -> None:
    """``total`` = the requantized sum as integer-valued float32 (``other``: scratch of its shape)."""
    np.subtract(a, np.float32(op.a_zero_point), out=total, dtype=np.float32)  # 8-bit integers: exact in float32
    np.multiply(total, np.float32(op.a_scale), out=total)
    np.subtract(b, np.float32(op.b_zero_point), out=other, dtype=np.float32)
    np.multiply(other, np.float32(op.b_scale), out=other)
    np.add(total, other, out=total)
    np.divide(total, np.float32(op.y_scale), out=total)
    np.rint(total, out=total)
    np.add(total, np.float32(op.y_zero_point), out=total)
    np.clip(total, np.float32(op.lo), np.float32(op.hi), out=total)


def _quantized_sum(a, b, out, a_zero, a_scale, b_zero, b_scale, y_scale, y_zero, lo, hi):
    """The contract's sum over every element of the 1-D arrays: the scales and bounds are float32,
    the zero points integers (``y_zero`` a float32 of one)."""
    for i in range(out.size):
        fa = np.float32(np.int32(a[i]) - a_zero) * a_scale
        fb = np.float32(np.int32(b[i]) - b_zero) * b_scale
        q = np.rint((fa + fb) / y_scale) + y_zero
        out[i] = np.int32(min(max(q, lo), hi))


_compiled_sum = cpu_jit.compiled(_quantized_sum, fastmath=False, error_model="numpy") if cpu_jit.available() else None


def _flat(handle) -> np.ndarray:
    return typed(handle)[handle.offset:handle.offset + handle.size]


def make_quantized_add(op: A.QuantizedAdd, ins, outs, pool, engine) -> KernelWork:
    """The cpu execution of ``op``: the compiled loop (spans on the backend's threads for large
    tensors) where Numba runs, else the NumPy passes."""
    a, b, out = _flat(ins[0]), _flat(ins[1]), _flat(outs[0])
    if not engine.jit:
        total, other = np.empty(op.count, np.float32), np.empty(op.count, np.float32)

        def reference() -> None:
            _float_sum_into(op, a, b, total, other)
            np.copyto(out, total, casting="unsafe")
        return KernelWork((reference,), "int8 NumPy")
    arguments = (np.int32(op.a_zero_point), np.float32(op.a_scale), np.int32(op.b_zero_point),
                 np.float32(op.b_scale), np.float32(op.y_scale), np.float32(op.y_zero_point), np.float32(op.lo),
                 np.float32(op.hi))
    kernel = cpu_jit.bind(_compiled_sum, a, b, out, *arguments)
    parts = pool.threads if op.count >= PARALLEL_MIN_ELEMENTS else 1
    spans = [(a[s:e], b[s:e], out[s:e]) for s, e in _spans(op.count, parts, 64)]

    def chunk(k: int, slot: int) -> None:
        kernel(*spans[k], *arguments)
    return KernelWork((_on_pool(pool, len(spans), chunk),), "int8 compiled")
