"""Compiled GELU, erf, sigmoid, SiLU, hard-swish, hard sigmoid and square root for the cpu backend: one vectorised
pass instead of NumPy's several (twenty for GELU).

The NumPy versions (``cpu_math.erf_into``, ``gelu_into``) take a pass over memory per step: a
transformer's FFN activation cost a fifth of the whole encoder's run that way (measured:
bench/RESULTS.md). As one compiled loop it is a single pass, and LLVM vectorises it as long as the
loop calls no library function. Numba's ``exp`` is a call to the C library per element, which
keeps the loop scalar. So ``exp`` is written out here:

- range reduction to 2^n * e^r with |r| <= ln2 / 2;
- a degree-7 Taylor polynomial for e^r (relative error below 1e-8 there);
- the power of two made from its exponent bits (``_float_of_bits``, an LLVM bitcast).

The erf is the same Abramowitz & Stegun 7.1.26 formula as the NumPy kernels and the GPU
kernels, so every backend agrees to float32 rounding.
"""
from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np

from . import jit as cpu_jit
from .elementwise import ERF_A, ERF_P

numba = cpu_jit.numba
if numba is not None:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic
else:  # never called without Numba
    def intrinsic(fn):
        return fn

_LOG2E = np.float32(1.4426950408889634)
_LN2 = np.float32(0.6931471805599453)
_A1, _A2, _A3, _A4, _A5 = (np.float32(a) for a in ERF_A)
_P = np.float32(ERF_P)
_ZERO, _ONE, _HALF, _SIXTH = np.float32(0.0), np.float32(1.0), np.float32(0.5), np.float32(1.0 / 6.0)
_RSQRT2 = np.float32(0.7071067811865476)
#: e^-q underflows float32 past q = 103; from 87 on the result is below the smallest normal,
#: where erf and GELU are exact anyway
_EXP_LIMIT = np.float32(87.0)
#: past this y, e^y's power of two is 2^128, float32's infinity
_EXP_OVERFLOW = np.float32(89.0)
#: 1 / k! for the Taylor series of e^r, highest first (degree 7: |r|^8 / 8! < 1e-8 for |r| <= ln2/2)
_TAYLOR = tuple(np.float32(1.0 / f) for f in (5040.0, 720.0, 120.0, 24.0, 6.0, 2.0, 1.0, 1.0))
#: the same to degree 6 (|r|^7 / 7! < 1.3e-7) for SiLU, whose division rounds as much
_TAYLOR6 = _TAYLOR[1:]
#: 1.5 * 2^23: adding it rounds a float32 of magnitude below 2^22 to an integer, held in its low mantissa bits
_ROUND_MAGIC = np.float32(12582912.0)
_ROUND_MAGIC_BITS = np.int32(0x4B400000)


def _vector_kernel(fn: Callable) -> Callable:
    """``fn`` compiled as ``cpu_jit``'s kernels are, with NumPy's error model: Numba's default
    tests every float division for zero (to raise ZeroDivisionError), and that branch alone kept
    the loop scalar."""
    return cpu_jit.compiled(fn, error_model="numpy")


@intrinsic
def _float_of_bits(typingctx, bits):
    """The float32 whose IEEE bits are the int32 ``bits`` (a bitcast, which vectorises)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@intrinsic
def _bits_of_float(typingctx, value):
    """The IEEE bits of the float32 ``value`` as an int32 (a bitcast, which vectorises)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


@cpu_jit.inlined
def exp_clamped(y):
    """e^y for float32 y, degree 6, rounding by ``_ROUND_MAGIC`` (an add, a subtract and the bits)
    instead of floor and a conversion: from y = -87 down e^-87 (normal, where the exact result
    underflows), from about 88.4 up infinity (2^128), as float32 overflows."""
    y = min(max(y, -_EXP_LIMIT), _EXP_OVERFLOW) * _LOG2E
    t = y + _ROUND_MAGIC
    r = (y - (t - _ROUND_MAGIC)) * _LN2
    c6, c5, c4, c3, c2, c1, c0 = _TAYLOR6
    p = (((((c6 * r + c5) * r + c4) * r + c3) * r + c2) * r + c1) * r + c0
    return p * _float_of_bits((_bits_of_float(t) - _ROUND_MAGIC_BITS + np.int32(127)) << np.int32(23))


@cpu_jit.inlined
def exp_neg(q):
    """e^-q for float32 q >= 0; 0 from _EXP_LIMIT on (a masked softmax score, e^-inf, is 0)."""
    y = -min(q, _EXP_LIMIT) * _LOG2E
    n = np.floor(y + _HALF)
    r = (y - n) * _LN2
    c7, c6, c5, c4, c3, c2, c1, c0 = _TAYLOR
    p = ((((((c7 * r + c6) * r + c5) * r + c4) * r + c3) * r + c2) * r + c1) * r + c0
    e = p * _float_of_bits((np.int32(n) + np.int32(127)) << np.int32(23))
    return e if q < _EXP_LIMIT else _ZERO


@cpu_jit.inlined
def erf_value(z):
    """erf(z) by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), as cpu_math and the GPU kernels."""
    az = abs(z)
    t = _ONE / (_ONE + _P * az)
    poly = ((((_A5 * t + _A4) * t + _A3) * t + _A2) * t + _A1) * t
    e = _ONE - poly * exp_neg(az * az)
    return e if z >= 0 else -e


# In place, over one flat float32 array: a loop from x into out, called with out = x, ran scalar,
# since LLVM's run-time check found the two overlapping.

@cpu_jit.inlined
def gelu_value(v):
    """0.5 v (1 + erf(v / sqrt 2)) (a caller's loop vectorises only with NumPy's error model:
    ``_vector_kernel``)."""
    return _HALF * v * (_ONE + erf_value(v * _RSQRT2))


@_vector_kernel
def gelu_in_place(a):
    """a = 0.5 a (1 + erf(a / sqrt 2))."""
    for i in range(a.shape[0]):
        a[i] = gelu_value(a[i])


@_vector_kernel
def erf_in_place(a):
    """a = erf(a)."""
    for i in range(a.shape[0]):
        a[i] = erf_value(a[i])


# Mobile networks' activations (MobileNet-v3's hard-swish and squeeze-excitation's hard sigmoid,
# YOLO's SiLU, from Sigmoid and Mul: ``fuse_silu``): NumPy takes a pass over memory and a temporary per step.
# Each has an in-place kernel (an epilogue) and one from x into out (the Unary op); the
# parameters (hard_sigmoid's alpha and beta) follow the arrays in both.

@cpu_jit.inlined
def sigmoid_value(v):
    """1 / (1 + e^-v), from e^-|v| so that no step overflows and small results keep their digits."""
    e = exp_neg(abs(v))
    s = _ONE / (_ONE + e)
    return s if v >= _ZERO else (e * s if v < _ZERO else v)  # NaN passes through


@cpu_jit.inlined
def silu_value(v):
    """v / (1 + e^-v): one exponential and one division, no branch on the sign, faster than
    v * sigmoid(v) (bench/RESULTS.md); below about -88.4 -0.0, -inf NaN, as NumPy's same formula."""
    return v / (_ONE + exp_clamped(-v))


@cpu_jit.inlined
def hard_swish_value(v):
    """v clip(v / 6 + 1/2, 0, 1)."""
    return v * min(max(v * _SIXTH + _HALF, _ZERO), _ONE)


@_vector_kernel
def sigmoid_in_place(a, alpha, beta):
    for i in range(a.shape[0]):
        a[i] = sigmoid_value(a[i])


@_vector_kernel
def sigmoid_into(x, out, alpha, beta):
    for i in range(x.shape[0]):
        out[i] = sigmoid_value(x[i])


@_vector_kernel
def silu_in_place(a, alpha, beta):
    for i in range(a.shape[0]):
        a[i] = silu_value(a[i])


@_vector_kernel
def silu_into(x, out, alpha, beta):
    for i in range(x.shape[0]):
        out[i] = silu_value(x[i])


@_vector_kernel
def hard_swish_in_place(a, alpha, beta):
    for i in range(a.shape[0]):
        a[i] = hard_swish_value(a[i])


@_vector_kernel
def hard_swish_into(x, out, alpha, beta):
    for i in range(x.shape[0]):
        out[i] = hard_swish_value(x[i])


@_vector_kernel
def hard_sigmoid_in_place(a, alpha, beta):
    """a = clip(alpha a + beta, 0, 1)."""
    for i in range(a.shape[0]):
        a[i] = min(max(alpha * a[i] + beta, _ZERO), _ONE)


@_vector_kernel
def hard_sigmoid_into(x, out, alpha, beta):
    for i in range(x.shape[0]):
        out[i] = min(max(alpha * x[i] + beta, _ZERO), _ONE)


@_vector_kernel
def sqrt_in_place(a):
    """a = sqrt(a) in one vector loop (a negative entry: NaN, as in NumPy)."""
    for i in range(a.shape[0]):
        a[i] = math.sqrt(a[i])


@_vector_kernel
def sqrt_into(x, out):
    for i in range(x.shape[0]):
        out[i] = math.sqrt(x[i])


#: activations with a compiled loop here (the others stay NumPy calls): a in place, then its parameters
KERNELS: dict[str, Callable] = {"gelu": gelu_in_place, "erf": erf_in_place, "sigmoid": sigmoid_in_place,
                                "hard_swish": hard_swish_in_place, "hard_sigmoid": hard_sigmoid_in_place,
                                "silu": silu_in_place, "sqrt": sqrt_in_place}
#: the same from x into out, for the Unary op
INTO: dict[str, Callable] = {"sigmoid": sigmoid_into, "hard_swish": hard_swish_into, "hard_sigmoid": hard_sigmoid_into,
                             "silu": silu_into, "sqrt": sqrt_into}
#: how many parameters each kernel takes after its arrays (none for GELU and erf)
_PARAMETERS = {"sigmoid": 2, "hard_swish": 2, "hard_sigmoid": 2, "silu": 2}


def _parameters(name: str, params: tuple) -> tuple:
    """The kernel's parameters after its arrays: ``params`` as float32, padded with zeros."""
    count = _PARAMETERS.get(name, 0)
    return tuple(np.float32(v) for v in (tuple(params) + (0.0,) * count)[:count])


def activation_in_place(name: str, fallback: Callable[[np.ndarray], None],
                        params: tuple = ()) -> Callable[[np.ndarray], None]:
    """``fn(array)`` applying activation ``name`` (with ``params``) in place: the compiled loop on
    a C-contiguous float32 array (one flat run), else ``fallback`` (the NumPy kernel; also where
    there is no compiled loop for ``name`` or Numba is missing)."""
    kernel = KERNELS.get(name)
    if kernel is None or numba is None:
        return fallback
    extra = _parameters(name, params)
    flat_kernel = cpu_jit.bind(kernel, np.empty(1, np.float32), *extra)  # compiled (or loaded) now, not in a run

    def apply(array: np.ndarray) -> None:
        if array.dtype != np.float32 or not array.flags.c_contiguous:
            fallback(array)
            return
        flat_kernel(array.reshape(-1), *extra)
    return apply


def unary_into(name: str, params: tuple, x: np.ndarray, out: np.ndarray) -> Callable[[], None] | None:
    """The work of a Unary op ``name`` from the flat float32 ``x`` into ``out`` as one compiled
    pass, or None where there is no such loop (or Numba, or the arrays are not flat float32)."""
    kernel = INTO.get(name)
    if (kernel is None or numba is None or x.dtype != np.float32 or out.dtype != np.float32 or x.ndim != 1
            or out.shape != x.shape or not (x.flags.c_contiguous and out.flags.c_contiguous)):
        return None
    extra = _parameters(name, params)
    compiled = cpu_jit.bind(kernel, x, out, *extra)
    if np.may_share_memory(x, out):
        if x.ctypes.data != out.ctypes.data:  # overlapping, not the same: NumPy's kernel buffers that
            return None
        in_place = cpu_jit.bind(KERNELS[name], out, *extra)  # LLVM's overlap check keeps the other loop scalar
        return functools.partial(in_place, out, *extra)
    return functools.partial(compiled, x, out, *extra)


__all__ = ["INTO", "KERNELS", "activation_in_place", "erf_in_place", "erf_value", "exp_neg", "gelu_in_place", "gelu_value",
           "hard_swish_value", "sigmoid_value", "silu_value", "unary_into"]
