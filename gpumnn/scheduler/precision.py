"""The session's ``precision``: the one place that rewrites a float program for lower precision,
and that decides where a statically quantized model computes in int8 (``lowers_static_int8``).

``int8`` is MNN's dynamic quantization (seed 004), with no calibration data: every MatMul with a
constant weight becomes a ``QuantizedMatMul`` whose weight is quantized here, once per prepared
shape set, per output column and symmetric in int8, and whose input rows are quantized at run
time (uint8, asymmetric: a row after GELU or ReLU is mostly on one side of 0, so its zero point
keeps a bit that a symmetric int8 row would spend on the empty side). The product sums in int32
and the result is dequantized to float32, so the ops around it are untouched.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import atomic as A

#: the values of ``Session``'s ``precision`` option
PRECISIONS: tuple[str, ...] = ("fp32", "int8")
#: the widest value of int8 weights (symmetric: -128 is never used)
INT8_MAX = 127


def lowers_static_int8(backend) -> bool:
    """Whether a statically quantized model's convolutions and products (QDQ, QLinearConv) are
    lowered to int8 ``QuantizedConv2D`` ops for ``backend``, the session's scheme backend: where it
    builds them. Elsewhere (the GPU APIs) they run in float as before, on that backend, never
    moved to the cpu for it. Independent of ``precision``: the model itself is quantized."""
    return A.QuantizedConv2D in getattr(backend, "kernel_table", {})


def check_precision(precision: str) -> str:
    """``precision`` if it is one gpumnn runs, else ValueError listing those it does."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {', '.join(map(repr, PRECISIONS))}")
    return precision


def quantize_columns(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``weight`` [K, N] as int8 (symmetric per column, rounding half to even) and its
    float32 scale per column: ``weight ~ int8 * scale``."""
    largest = np.abs(weight).max(axis=0)
    scale = (largest / np.float32(INT8_MAX)).astype(np.float32)
    scale[scale == 0] = np.float32(1)
    quantized = np.clip(np.rint(weight / scale), -INT8_MAX, INT8_MAX).astype(np.int8)
    return quantized, scale


def _quantizable(op: A.AtomicOp, program: A.AtomicProgram) -> bool:
    """Whether ``op`` is a float MatMul of rows by a constant weight that ``QuantizedMatMul`` computes."""
    if not isinstance(op, A.MatMul) or op.dtype != A.FLOAT32 or op.scheme != "gemm":
        return False
    if op.inputs[1] not in program.constants or op.inputs[0] in program.constants:
        return False
    if op.trans_a or op.b_batch_stride != 0 or op.k > A.QUANTIZED_MAX_K:
        return False
    if op.batch > 1 and op.a_batch_stride != op.m * op.k:
        return False  # rows of the batch not side by side
    return not op.has_bias or (op.beta == 1.0 and op.bias_strides == (0, 1))


def apply_precision(program: A.AtomicProgram, precision: str) -> A.AtomicProgram:
    """``program`` rewritten for ``precision`` (itself for fp32): see the module docstring."""
    if check_precision(precision) == "fp32":
        return program
    constants = dict(program.constants)
    quantized: dict[tuple[str, bool, float], tuple[str, str]] = {}
    ops: list[A.AtomicOp] = []
    for op in program.ops:
        if not _quantizable(op, program):
            ops.append(op)
            continue
        key = (op.inputs[1], op.trans_b, op.alpha)
        if key not in quantized:
            weight = np.asarray(program.constants[op.inputs[1]], np.float32)
            weight = weight.reshape(-1)[:op.k * op.n].reshape((op.n, op.k) if op.trans_b else (op.k, op.n))
            values, scale = quantize_columns(weight.T if op.trans_b else weight)
            name = f"{op.inputs[1]}.int8{'.t' if op.trans_b else ''}{'' if op.alpha == 1.0 else f'.x{op.alpha!r}'}"
            constants[name] = np.ascontiguousarray(values)
            constants[f"{name}.scale"] = (scale * np.float32(op.alpha)).astype(np.float32)
            quantized[key] = (name, f"{name}.scale")
        weight_name, scale_name = quantized[key]
        inputs = (op.inputs[0], weight_name, scale_name) + ((op.inputs[2],) if op.has_bias else ())
        ops.append(A.QuantizedMatMul(inputs, op.outputs, op.source, m=op.batch * op.m, n=op.n, k=op.k,
                                     has_bias=op.has_bias, activation=op.activation))
    if not quantized:
        return program
    return dataclasses.replace(program, ops=ops, constants=constants)
