"""Compiled row-wise ops for the cpu backend: softmax, log-softmax, layer normalisation and global
average and max pooling, each row in one pass through cache, rows shared between the regions' threads.

NumPy takes a pass over the whole tensor per step: softmax is a max, a subtract, an exp, a sum and
a divide (five passes, one thread, and NumPy's ``exp`` is not the fastest), layer normalisation
eight: a transformer encoder's softmax and layer normalisations took several times ONNX Runtime's
time that way (measured: bench/RESULTS.md, ``bench/cpu_profile.py transformer_encoder --ort``). Here a row is
read into L1 once and every step runs on it there; ``exp`` is ``cpu_activations.exp_neg``, which
LLVM vectorises, and the sums are vectorised by letting them reassociate (as NumPy's pairwise
sums also reorder).

Special values keep NumPy's answer without a test per element in the vector loops: a row holding
a NaN, or whose largest value is +-inf, is NaN throughout in NumPy's softmax (inf - inf, or a NaN
maximum), so such a row is filled with NaN; a -inf beside finite values (a masked attention score)
takes the vector path, where ``exp_neg`` gives e^-inf = 0.
"""
from __future__ import annotations

import numpy as np

from . import jit as cpu_jit, parallel as cpu_parallel
from .activations import exp_neg

numba = cpu_jit.numba

#: sums over a row may reassociate (vectorised partial sums), beside the FMA contraction
ROW_FAST = cpu_jit.FAST | {"reassoc"}
_ZERO, _ONE = np.float32(0.0), np.float32(1.0)
_INF = np.float32(np.inf)


def _row_region(fn):
    """``fn`` as a parallel region summing in any order, with NumPy's float error model (Numba's
    default tests every division for zero, and that branch keeps a loop scalar)."""
    return cpu_parallel.compiled_region(fn, fastmath=ROW_FAST, error_model="numpy")


@cpu_jit.inlined
def _row_sum(row):
    """The sum of a row, in any order (``ROW_FAST``: vectorised partial sums)."""
    total = _ZERO
    for i in range(row.shape[0]):
        total += row[i]
    return total


@cpu_jit.inlined
def _softmax_row(x, o, log):
    """o = softmax(x) (log: log-softmax) over one row."""
    n = x.shape[0]
    peak = x[0]
    nans = 0
    for i in range(n):
        v = x[i]
        peak = max(peak, v)
        nans += v != v
    if nans or not (-_INF < peak < _INF):  # NaN throughout, as NumPy's (see the module's docstring)
        for i in range(n):
            o[i] = np.float32(np.nan)
        return
    if log:
        total = _ZERO
        for i in range(n):
            total += exp_neg(peak - x[i])
        shift = np.float32(np.log(total))
        for i in range(n):
            o[i] = (x[i] - peak) - shift
        return
    for i in range(n):
        o[i] = exp_neg(peak - x[i])
    scale = _ONE / _row_sum(o)
    for i in range(n):
        o[i] *= scale


@_row_region
def softmax_rows(x, o, bounds, log):
    """``_softmax_row`` over the rows of x [rows, size] into o, the spans [bounds[j], bounds[j + 1])
    of rows on the region's threads."""
    for j in numba.prange(bounds.shape[0] - 1):
        for r in range(bounds[j], bounds[j + 1]):
            _softmax_row(x[r], o[r], log)


@_row_region
def normalize_rows(x, o, scale, shift, eps, affine, bounds):
    """o = (x - mean) / sqrt(var + eps) per row of x [rows, size] (then * scale + shift where
    ``affine``), the spans [bounds[j], bounds[j + 1]) of rows on the region's threads."""
    size = np.float32(x.shape[1])
    for j in numba.prange(bounds.shape[0] - 1):
        for r in range(bounds[j], bounds[j + 1]):
            row, out = x[r], o[r]
            mean = _row_sum(row) / size
            squares = _ZERO
            for i in range(row.shape[0]):
                d = row[i] - mean
                squares += d * d
            inv = _ONE / np.sqrt(squares / size + eps)
            if affine:
                for i in range(row.shape[0]):
                    out[i] = (row[i] - mean) * inv * scale[i] + shift[i]
            else:
                for i in range(row.shape[0]):
                    out[i] = (row[i] - mean) * inv


@_row_region
def mean_rows(x, o, bounds):
    """o[r] = the mean of row r of x [rows, size] (a global average pool's plane), the spans
    [bounds[j], bounds[j + 1]) of rows on the region's threads: several times faster than NumPy's
    ``mean``."""
    inv = _ONE / np.float32(x.shape[1])
    for j in numba.prange(bounds.shape[0] - 1):
        for r in range(bounds[j], bounds[j + 1]):
            o[r] = _row_sum(x[r]) * inv


#: a float32 NaN's bits without the sign are above these (an infinity's)
_INF_BITS = np.int32(0x7F800000)
_ABS_BITS = np.int32(0x7FFFFFFF)


@cpu_jit.inlined
def _has_nan(bits):
    """Whether a row seen as its int32 bits holds a NaN: integer compares, which fast-math flags
    leave alone."""
    found = 0
    for i in range(bits.shape[0]):
        found |= (bits[i] & _ABS_BITS) > _INF_BITS
    return found != 0


@cpu_jit.inlined
def _row_max(row):
    """The largest value of a row without NaN (``max_rows``' no-NaN flag lets it vectorise)."""
    best = row[0]
    for i in range(1, row.shape[0]):
        v = row[i]
        best = v if v > best else best
    return best


def _max_rows(x, o, bounds):
    """o[r] = the largest value of row r of x [rows, size] (a global max pool's plane), NaN where
    the row holds one (NumPy's ``max``), the spans [bounds[j], bounds[j + 1]) of rows on the
    region's threads: the NaN found on the rows' bits first, so the maximum may vectorise."""
    bits = x.view(np.int32)
    for j in numba.prange(bounds.shape[0] - 1):
        for r in range(bounds[j], bounds[j + 1]):
            o[r] = np.float32(np.nan) if _has_nan(bits[r]) else _row_max(x[r])


#: compiled with no NaN assumed (``_max_rows`` tests for NaN on the bits before it compares)
max_rows = cpu_parallel.compiled_region(_max_rows, fastmath=ROW_FAST | {"nnan"}, error_model="numpy")


__all__ = ["ROW_FAST", "max_rows", "mean_rows", "normalize_rows", "softmax_rows"]
