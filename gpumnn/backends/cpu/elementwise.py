"""Elementwise math of the Unary and Binary atomic ops, written once for NumPy.

Each factory returns ``fn(x, out)`` / ``fn(a, b, out)`` that writes into ``out`` (which may be
``x`` itself), so that executions allocate nothing per run. The erf approximation is the same
one the GPU kernels use (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7), so every backend
agrees to far better than the 1e-4 tolerance.
"""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np

ERF_P = 0.3275911
ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)

UnaryFn = Callable[[np.ndarray, np.ndarray], None]
BinaryFn = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


_local = threading.local()


def _scratch(like: np.ndarray, count: int) -> list[np.ndarray]:
    """``count`` float32 arrays shaped like ``like``, kept per thread and reused: a fresh array
    per step was slower at a transformer's FFN width (new pages faulted in on every call), and the epilogue runs on several worker threads at once."""
    n = like.size
    held = getattr(_local, "arrays", None)
    if held is None or held[0].size < n or len(held) < count:
        held = _local.arrays = [np.empty(max(n, held[0].size if held else 0), np.float32)
                                for _ in range(max(count, len(held) if held else 0))]
    return [a[:n].reshape(like.shape) for a in held[:count]]


def erf_into(x: np.ndarray, out: np.ndarray) -> None:
    """erf of ``x`` into ``out`` (which may be ``x``): NumPy has none and SciPy is not a
    dependency. Every step in place, in this thread's scratch arrays."""
    t, e, poly = _scratch(x, 3)
    np.abs(x, out=t)
    np.square(t, out=e)
    np.negative(e, out=e)
    np.exp(e, out=e)  # exp(-x^2)
    t *= ERF_P
    t += 1.0
    np.reciprocal(t, out=t)
    a1, a2, a3, a4, a5 = ERF_A
    np.multiply(t, a5, out=poly)
    for a in (a4, a3, a2, a1):
        poly += a
        poly *= t
    poly *= e
    np.subtract(1.0, poly, out=poly)
    np.copysign(poly, x, out=out)


def gelu_into(x: np.ndarray, out: np.ndarray) -> None:
    """0.5 x (1 + erf(x / sqrt 2)) into ``out`` (which may be ``x``)."""
    y = _scratch(x, 4)[3]
    np.multiply(x, np.float32(0.7071067811865476), out=y)
    erf_into(y, y)
    y += 1.0
    y *= 0.5
    np.multiply(x, y, out=out)


def _store(expr: Callable[[np.ndarray], np.ndarray]) -> UnaryFn:
    def fn(x: np.ndarray, out: np.ndarray) -> None:
        np.copyto(out, expr(x), casting="unsafe")
    return fn


def convert(x: np.ndarray, out: np.ndarray) -> None:
    """``out = x`` converted to ``out``'s dtype as the Unary ``identity`` defines it: float to
    float rounds to nearest even (overflow to inf); a float to int8/uint8 truncates toward zero
    and wraps, through int64 (as ``astype`` from int64 does); integers to a narrower integer wrap."""
    if x.dtype.kind == "f" and out.dtype.kind in "iu" and out.dtype.itemsize < 4:
        info = np.iinfo(out.dtype)
        if x.size and info.min <= x.min() and x.max() <= info.max:  # (a NaN fails both comparisons)
            # every value truncates into the type's range, where NumPy's direct cast truncates as
            # the one through int64 does, and runs vectorised (the cast to int64 does not)
            np.copyto(out, x, casting="unsafe")
        else:
            np.copyto(out, x.astype(np.int64), casting="unsafe")
    else:
        np.copyto(out, x, casting="unsafe")


#: Unary ops that are one NumPy ufunc of the input
_UNARY_UFUNCS = {"log": np.log, "sqrt": np.sqrt, "floor": np.floor, "ceil": np.ceil, "round": np.rint, "trunc": np.trunc,
                 "square": np.square, "sign": np.sign}


def unary_function(name: str, params: tuple[float, ...], dtype: np.dtype) -> UnaryFn:
    """``fn(x, out)`` computing atomic Unary ``name`` with ``params`` (see gpumnn.atomic)."""
    p = tuple(params)
    ufunc = _UNARY_UFUNCS.get(name)
    if ufunc is not None:  # straight into ``out``: no temporary array and no second pass to copy it
        return lambda x, out: ufunc(x, out=out, casting="unsafe")
    if name == "identity":
        return convert
    if name == "relu":
        return lambda x, out: np.maximum(x, 0, out=out)
    if name == "clip":
        lo, hi = p[0], p[1]
        if np.dtype(dtype).kind in "iu":  # integer bounds (an infinite bound is the type's limit)
            info = np.iinfo(dtype)
            lo, hi = (dtype.type(int(min(max(v, info.min), info.max))) for v in (lo, hi))
        return lambda x, out: np.clip(x, lo, hi, out=out)
    if name == "neg":
        return lambda x, out: np.negative(x, out=out)
    if name == "abs":
        return lambda x, out: np.abs(x, out=out)
    if name == "exp":
        return lambda x, out: np.exp(x, out=out)
    if name == "tanh":
        return lambda x, out: np.tanh(x, out=out)
    if name == "erf":
        return erf_into
    if name == "gelu":
        return gelu_into
    if name == "sigmoid":
        def sigmoid(x: np.ndarray, out: np.ndarray) -> None:
            np.negative(x, out=out)
            np.exp(out, out=out)
            np.add(out, 1.0, out=out)
            np.reciprocal(out, out=out)
        return sigmoid
    table: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "leaky_relu": lambda x: np.where(x < 0, x * p[0], x) if p else x,
        "hard_sigmoid": lambda x: np.clip(x * p[0] + p[1], 0.0, 1.0),
        "hard_swish": lambda x: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0),
        "reciprocal": lambda x: 1.0 / x,
        "softplus": lambda x: np.logaddexp(0.0, x),
        "elu": lambda x: np.where(x < 0, p[0] * np.expm1(np.minimum(x, 0)), x) if p else x,
        "affine_pow": lambda x: np.power(p[0] + p[1] * x, p[2]),
        "selu": lambda x: p[1] * np.where(x <= 0, p[0] * np.expm1(np.minimum(x, 0)), x),
        "celu": lambda x: np.maximum(x, 0) + np.minimum(0, p[0] * np.expm1(np.minimum(x, 0) / p[0])),
        "mish": lambda x: x * np.tanh(np.logaddexp(0.0, x)),
        "thresholded_relu": lambda x: np.where(x > p[0], x, 0),
        "round_f16": lambda x: x.astype(np.float16).astype(x.dtype),
        "not": lambda x: x == 0,
        "nonzero": lambda x: x != 0,
        "silu": lambda x: x / (1.0 + np.exp(-x)),
    }
    if name not in table:
        raise KeyError(f"unknown unary op {name!r}")
    return _store(table[name])


def _int_div(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """ONNX integer Div truncates toward zero (C semantics), unlike NumPy's floor division."""
    wide_a, wide_b = a.astype(np.int64), b.astype(np.int64)  # abs(INT32_MIN) does not fit int32
    q = np.abs(wide_a) // np.abs(wide_b)
    np.copyto(out, np.where((wide_a < 0) ^ (wide_b < 0), -q, q), casting="unsafe")


def _int_pow(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """Integer Pow through float64 (NumPy refuses negative integer exponents; ONNX does not): a
    negative exponent truncates 1 / a**|b| toward zero (0 for a base of 0, as the contract says)."""
    with np.errstate(divide="ignore"):
        value = np.trunc(np.power(a.astype(np.float64), b))
    np.copyto(out, np.where((b < 0) & (a == 0), 0, value), casting="unsafe")


def binary_function(name: str, dtype: np.dtype) -> BinaryFn:
    """``fn(a, b, out)`` computing atomic Binary ``name`` on operands of ``dtype``; a and b may be
    broadcast views, ``out`` is of the op's output dtype."""
    integer = np.issubdtype(dtype, np.integer) or np.dtype(dtype) == np.bool_
    if name == "div" and integer:
        return _int_div
    if name == "pow" and integer:
        return _int_pow
    ufuncs = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
              "pow": np.power, "max": np.maximum, "min": np.minimum, "mod": np.mod, "fmod": np.fmod,
              "equal": np.equal, "less": np.less, "less_equal": np.less_equal, "greater": np.greater,
              "greater_equal": np.greater_equal, "and": np.logical_and, "or": np.logical_or,
              "xor": np.logical_xor}
    if name in ufuncs:
        ufunc = ufuncs[name]
        return lambda a, b, out: ufunc(a, b, out=out, casting="unsafe")
    if name == "prelu":
        return lambda a, b, out: np.copyto(out, np.where(a < 0, a * b, a), casting="unsafe")
    raise KeyError(f"unknown binary op {name!r}")
