"""The session's ``precision``: the one place that knows the precisions and what each changes.

``fp32`` (the default) changes nothing: float32 arithmetic everywhere, no TF32 in any kernel.

``tf32`` changes the kernels, not the program: on cuda the convolution and GEMM tiles multiply on
tensor cores (``mma.sync`` m16n8k8, operands rounded to TF32's 10-bit mantissa, float32 sums;
the backend option ``tf32=True``: :func:`backend_options`). Depthwise convolutions, matrix-vector
products and every other op stay float32. Only cuda has such kernels: a session on any other
backend refuses ``tf32`` (ValueError) rather than run float32 under its name; ops that
placement moves from cuda to the cpu run there in float32. Expect a relative L2 error of about
1e-3 against float32 on a network, checked below ``TOLERANCES``.

``int8`` is MNN's dynamic quantization (seed 004), with no calibration data: every MatMul with a
constant weight becomes a ``QuantizedMatMul`` whose weight is quantized here, once per prepared
shape set, per output column and symmetric in int8, and whose input rows are quantized at run
time (uint8, asymmetric: a row after GELU or ReLU is mostly on one side of 0, so its zero point
keeps a bit that a symmetric int8 row would spend on the empty side). The product sums in int32
and the result is dequantized to float32, so the ops around it are untouched.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from .. import atomic as A

#: the values of ``Session``'s ``precision`` option
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "int8")
#: the precisions that choose kernels instead of rewriting the program: per backend that has such
#: kernels, the backend options that select them
KERNEL_PRECISIONS: dict[str, dict[str, dict[str, Any]]] = {"tf32": {"cuda": {"tf32": True}}}
#: the relative L2 error against float32 (ONNX Runtime's) within which a kernel precision keeps a
#: zoo network's output: TF32 rounds each operand to 2^-11 relative, about 1e-3 on a network; the
#: cuda tests check this bound where a GPU runs them
TOLERANCES: dict[str, float] = {"tf32": 1e-2}
#: the widest value of int8 weights (symmetric: -128 is never used)
INT8_MAX = 127


def check_precision(precision: str) -> str:
    """``precision`` if it is one gpumnn runs, else ValueError listing those it does."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {', '.join(map(repr, PRECISIONS))}")
    return precision


def backend_options(precision: str, backend: str | Sequence[str]) -> dict[str, Any]:
    """The backend options a session on ``backend`` (as requested: a name, a list, "auto") passes
    its backend for ``precision``: none for a precision that rewrites the program; for a kernel
    precision, its options where the one backend named has those kernels, else ValueError naming
    the backends that have them."""
    kernels = KERNEL_PRECISIONS.get(check_precision(precision))
    if kernels is None:
        return {}
    if isinstance(backend, str) and backend in kernels:
        return dict(kernels[backend])
    having = " or ".join(repr(b) for b in kernels)
    raise ValueError(f"precision={precision!r} runs on backend={having} only (its kernels have it), not "
                     f"backend={backend!r}; precision='fp32' runs there")


def precision_run(precision: str, backends: Sequence[str]) -> str:
    """The precision a session on ``backends`` (those that started) computes in: ``precision``, or
    "fp32" where it is a kernel precision none of them has (its backend fell back to the cpu)."""
    kernels = KERNEL_PRECISIONS.get(precision)
    return "fp32" if kernels is not None and not set(backends) & set(kernels) else precision


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
    rows_share_bias = op.bias_strides[0] == 0 or op.batch * op.m == 1  # a single row's stride is never used
    return not op.has_bias or (op.beta == 1.0 and op.bias_strides[1] == 1 and rows_share_bias)


def apply_precision(program: A.AtomicProgram, precision: str) -> A.AtomicProgram:
    """``program`` rewritten for ``precision`` (itself for fp32): see the module docstring."""
    if check_precision(precision) == "fp32" or precision in KERNEL_PRECISIONS:
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
