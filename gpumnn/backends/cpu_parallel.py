"""Native parallel regions for the cpu backend: a whole op on all threads without the GIL.

Why: the backend's Python threads (``cpu_workers``) hand an op's chunks over through the GIL and
a wake-up per op, and on this project's 2-core KVM machine each wake-up of a sleeping thread, and
each wait for the GIL held by the other thread, measured 25-50 us (a futex wake of an idle
vCPU). An op of 100-300 us, MobileNet's 1x1 convolutions among them, then gained nothing from a
second thread (64x384x196 GEMM: 137 us on one thread, 199 us shared). A Numba ``parallel``
function runs the op's blocks on OpenMP's threads, which spin a while between regions, with the
GIL released throughout: an empty region costs 2 us, and each block's GEMM calls BLAS (SciPy's
``cython_blas``, one thread inside each block) with the bias and a clamp applied to the block
while it is in cache.

Only Numba's ``tbb`` and ``omp`` threading layers qualify: ``workqueue``, the fallback when
neither loads, measured 106 us per region and is not safe to enter from two threads at once.
TBB is preferred (Numba tries it first; ``gpumnn[cpu]`` installs it): its caller runs the blocks
no other thread has taken, where OpenMP's region waits at its barrier for every thread of its
team. On 2 cores shared with another engine's spinning threads (ONNX Runtime's spin ~50 ms after
a run) that barrier waited for a descheduled thread: MobileNet-v2 in alternation with ONNX
Runtime, 13.4 and 12.8 ms a run on TBB against 18.0 and 18.3 on OpenMP. Where the regions are
not available (``available()`` says why) the backend keeps ``cpu_workers``.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import threading
from typing import Callable

import numpy as np

from . import cpu_jit

numba = cpu_jit.numba
if numba is not None:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic
else:  # never called without Numba
    def intrinsic(fn):
        return fn
_N, _T = ord("N"), ord("T")


def _sgemm_address() -> int:
    """The address of SciPy's Fortran sgemm (what Numba's own np.dot calls). It is passed to the
    regions as an argument: a ctypes function baked into a kernel would keep Numba from caching
    the kernel on disk (an address differs per process), and parallel kernels take seconds to compile."""
    from numba.extending import get_cython_function_address
    return get_cython_function_address("scipy.linalg.cython_blas", "sgemm")


@intrinsic
def _call_sgemm(typingctx, function, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """Calls the C function at address ``function`` with the 13 addresses after it (the Fortran
    sgemm's arguments, all passed by reference)."""
    def codegen(context, builder, signature, args):
        byte_pointer = ir.IntType(8).as_pointer()
        function_type = ir.FunctionType(ir.VoidType(), [byte_pointer] * len(args[1:]))
        callee = builder.inttoptr(args[0], function_type.as_pointer())
        builder.call(callee, [builder.inttoptr(a, byte_pointer) for a in args[1:]])
        return context.get_dummy_value()
    return types.void(*[types.intp] * 14), codegen


try:
    if numba is None:
        raise ImportError(cpu_jit.MISSING)
    SGEMM = _sgemm_address()
except Exception as exc:  # noqa: BLE001 -- SciPy missing or without cython_blas: no regions
    SGEMM = 0
    _MISSING = f"SciPy's BLAS is not importable ({exc}); install gpumnn[cpu]"
else:
    _MISSING = None


def _region(fn: Callable) -> Callable:
    """``fn`` as a Numba parallel function (its ``prange`` loops on the layer's threads)."""
    if numba is None or not SGEMM:
        return fn
    options = dict(parallel=True, nogil=True, fastmath=cpu_jit.FAST, boundscheck=False)
    try:
        return numba.njit(cache=True, **options)(fn)
    except RuntimeError:  # no writable place for Numba's cache: compile per process
        return numba.njit(**options)(fn)


@_region
def _probe(x):
    for i in numba.prange(x.shape[0]):
        x[i] = numba.get_thread_id()


_probe_lock = threading.Lock()


def _preload_tbb() -> None:
    """Loads the TBB library of the ``tbb`` wheel, if installed, so that Numba's TBB layer finds
    it: pip puts it in the environment's ``lib/``, which is not on the loader's path, and Numba's
    layer then fails to import and silently falls back to OpenMP."""
    for folder in (os.path.join(sys.prefix, "lib"), os.path.join(sys.base_prefix, "lib")):
        path = os.path.join(folder, "libtbb.so.12")
        if os.path.exists(path):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:  # not loadable here: Numba tries its other layers
                pass
            return


@functools.lru_cache(maxsize=1)
def _layer() -> tuple[str | None, str | None]:
    """(the threading layer Numba started, why regions are off or None)."""
    if _MISSING is not None:
        return None, _MISSING
    if sys.platform.startswith("linux"):
        _preload_tbb()
    with _probe_lock:
        try:
            _probe(np.zeros(2, np.int64))
            layer = numba.threading_layer()
        except Exception as exc:  # noqa: BLE001 -- no layer loads: the Python threads stay
            return None, f"Numba could not start a threading layer ({exc})"
    if layer not in ("omp", "tbb"):
        return layer, (f"Numba's threading layer is {layer!r}: neither 'omp' nor 'tbb' loaded (workqueue "
                       "regions cost ~100 us and are not thread-safe); install gpumnn[cpu] (tbb) or libgomp1")
    return layer, None


def available() -> tuple[bool, str | None]:
    """(whether native regions run here, why not)."""
    layer, why = _layer()
    return why is None, why


def threads_for(threads: int) -> int:
    """The region threads a backend of ``threads`` threads gets (at most Numba's pool size)."""
    return max(1, min(threads, numba.config.NUMBA_NUM_THREADS))


@contextlib.contextmanager
def using_threads(threads: int):
    """Regions the calling thread enters inside use ``threads`` threads; the thread's own Numba
    setting (kept per thread) is restored after, so a run leaves the caller's Numba as it was."""
    previous = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        yield
    finally:
        numba.set_num_threads(previous)


# -- GEMM blocks through BLAS ------------------------------------------------------------------
# ``calls`` [blocks, 13] int64, one row per block (``gemm_calls``): the Fortran sgemm arguments of
# the row-major product C[rows, cols] = A[rows, k] B[k, cols] computed as C^T = B^T A^T (op of the
# first operand, op of the second, cols, rows, k, ld of B, ld of A, ldc), the element offsets of B,
# A and C in their flat buffers, and the bias row and column of the block's first element. Fortran
# takes its arguments by reference: ``fortran_arguments`` lays the first eight out as the int32s
# BLAS reads, and ``scalars`` holds (alpha, 0), both made at session creation so that a region
# allocates nothing (BLAS only reads them, so every thread may point at the same ones).

_COLUMNS = 13


@_region
def gemm_blocks(sgemm, a, b, c, calls, fortran, scalars, bias, bias_offset, bias_period, bias_rows, bias_cols, beta,
                lo, hi, epilogue):
    """Every block of ``calls`` on the region's threads: the BLAS product (``sgemm``: ``SGEMM``,
    scaled by alpha, ``scalars[0]``),
    then, where ``epilogue``, clamp(C + beta * bias) to [lo, hi] over the block while it is in
    cache. The bias element of C's row r and column j is bias[bias_offset + (r % bias_period) *
    bias_rows + j * bias_cols] (bias_cols 0 or 1: a value per row or a row of values)."""
    for i in numba.prange(calls.shape[0]):
        p = calls[i]
        at, scalar_at = fortran.ctypes.data + 32 * i, scalars.ctypes.data
        _call_sgemm(sgemm, at, at + 4, at + 8, at + 12, at + 16, scalar_at, b.ctypes.data + 4 * p[8], at + 20,
                    a.ctypes.data + 4 * p[9], at + 24, scalar_at + 4, c.ctypes.data + 4 * p[10], at + 28)
        if epilogue:
            cols, rows, ldc = p[2], p[3], p[7]
            for r in range(rows):
                start = p[10] + r * ldc
                row = c[start:start + cols]
                if bias_period == 0:
                    for j in range(cols):
                        row[j] = min(max(row[j], lo), hi)
                    continue
                first = bias_offset + ((p[11] + r) % bias_period) * bias_rows + p[12] * bias_cols
                if bias_cols == 0:
                    value = bias[first] * beta
                    for j in range(cols):
                        row[j] = min(max(row[j] + value, lo), hi)
                else:
                    values = bias[first:first + cols]
                    for j in range(cols):
                        row[j] = min(max(row[j] + beta * values[j], lo), hi)


def _operand(x: np.ndarray) -> tuple[int, int] | None:
    """(op, ld) of a row-major [R, C] view as the first operand of a column-major product of its
    transpose ('N' where rows are contiguous, 'T' where columns are), None where neither is (nor
    where rows overlap or run backwards: BLAS needs ld >= the contiguous extent)."""
    rows, cols = x.shape
    s0, s1 = (s // x.itemsize for s in x.strides)
    if (s1 == 1 or cols == 1) and (rows == 1 or s0 >= cols):
        return _N, max(s0 if rows > 1 else cols, 1)
    if (s0 == 1 or rows == 1) and (cols == 1 or s1 >= rows):
        return _T, max(s1 if cols > 1 else rows, 1)
    return None


def _offset(view: np.ndarray, base: np.ndarray) -> int:
    """Elements from ``base``'s first to ``view``'s first."""
    delta = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    assert 0 <= delta < base.nbytes or view.size == 0, "a GEMM block outside its buffer"
    return delta // base.itemsize


def gemm_calls(a: np.ndarray, b: np.ndarray, c: np.ndarray,
               blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray, int, int]]) -> np.ndarray | None:
    """The ``calls`` rows of ``gemm_blocks`` for blocks (A view [rows, k], B view [k, cols], C view
    [rows, cols], bias row, bias column) of the flat float32 buffers a, b, c; None where a block's
    layout is not one BLAS takes (the caller keeps its NumPy chunks)."""
    rows_out = []
    for ab, bb, cb, bias_row, bias_col in blocks:
        first, second, out = _operand(bb), _operand(ab), _operand(cb)
        if first is None or second is None or out is None or out[0] != _N or cb.size == 0:
            return None
        rows_out.append((first[0], second[0], cb.shape[1], cb.shape[0], ab.shape[1], first[1], second[1], out[1],
                         _offset(bb, b), _offset(ab, a), _offset(cb, c), bias_row, bias_col))
    return np.array(rows_out, dtype=np.int64).reshape(-1, _COLUMNS)


def fortran_arguments(rows: np.ndarray) -> np.ndarray:
    """The eight Fortran sgemm integers of each row of ``rows`` (``calls``, or im2col's) as the
    contiguous int32s BLAS reads by reference, 32 bytes per block."""
    return np.ascontiguousarray(rows[:, :8], dtype=np.int32)


# -- im2col row blocks ----------------------------------------------------------------------------

@_region
def im2col_blocks(sgemm, x, w, out, bias, bounds, fortran, scalars, cols, geometry, lo, hi, epilogue):
    """A convolution of one image, x [C, H, W] with w [O, C*KH*KW] into out [O, OH, OW], as blocks of
    output rows [bounds[i], bounds[i + 1]): each copies its windows (zeros past the input's edge)
    into its thread's ``cols`` [C*KH*KW*rows*OW], multiplies w by them through BLAS (``sgemm``,
    with block i's integers at fortran[i] and (1, 0) in ``scalars``: ``im2col_arguments``) and,
    where ``epilogue``, applies clamp(out + bias[o]) to [lo, hi] while the block is in cache.
    geometry: (kh, kw, sh, sw, dh, dw, pt, pl)."""
    channels, height, width = x.shape
    kh, kw, sh, sw, dh, dw, pt, pl = geometry
    o, k = w.shape
    oh, ow = out.shape[1], out.shape[2]
    for i in numba.prange(bounds.shape[0] - 1):
        col = cols[numba.get_thread_id()]
        r0, r1 = bounds[i], bounds[i + 1]
        pixels = (r1 - r0) * ow
        for ci in range(channels):
            for ky in range(kh):
                for kx in range(kw):
                    row = col[((ci * kh + ky) * kw + kx) * pixels:((ci * kh + ky) * kw + kx + 1) * pixels]
                    shift = kx * dw - pl  # input column of output column 0
                    first = max(0, (sw - 1 - shift) // sw)  # first output column inside the input
                    stop = min(ow, max(0, (width - 1 - shift) // sw + 1))  # past the last inside
                    for oy in range(r0, r1):
                        dst = row[(oy - r0) * ow:(oy - r0 + 1) * ow]
                        iy = oy * sh + ky * dh - pt
                        if iy < 0 or iy >= height or first >= stop:
                            dst[:] = 0.0
                            continue
                        dst[:first] = 0.0
                        dst[stop:] = 0.0
                        src = x[ci, iy, first * sw + shift:]
                        if sw == 1:  # a loop of its own: a run-time stride in the index keeps it scalar
                            for j in range(stop - first):
                                dst[first + j] = src[j]
                        else:
                            for j in range(stop - first):
                                dst[first + j] = src[j * sw]
        at, scalar_at = fortran.ctypes.data + 32 * i, scalars.ctypes.data
        _call_sgemm(sgemm, at, at + 4, at + 8, at + 12, at + 16, scalar_at, col.ctypes.data, at + 20,
                    w.ctypes.data, at + 24, scalar_at + 4, out.ctypes.data + 4 * r0 * ow, at + 28)
        if epilogue:
            for oc in range(o):
                value = bias[oc]
                dst = out[oc, r0:r1].reshape(pixels)
                for j in range(pixels):
                    dst[j] = min(max(dst[j] + value, lo), hi)


def im2col_arguments(bounds: np.ndarray, out_channels: int, k: int, ow: int, pixels: int) -> np.ndarray:
    """``im2col_blocks``' Fortran integers per block of output rows [bounds[i], bounds[i + 1]):
    (weights times columns) cols^T w^T, the block's pixels wide, into an output ``pixels`` wide."""
    widths = np.diff(bounds) * ow
    return fortran_arguments(np.stack([np.full_like(widths, _N), np.full_like(widths, _N), widths,
                                       np.full_like(widths, out_channels), np.full_like(widths, k), widths,
                                       np.full_like(widths, k), np.full_like(widths, pixels)], axis=1))


# -- channel spans of the compiled depthwise and pooling loops ---------------------------------

#: ``cpu_jit``'s depthwise kernels on a zero-bordered plane, by the ``kind`` ``depthwise_spans``
#: takes (stride 2 takes phase planes: ``depthwise_s2_spans``). A kernel passed as an argument
#: would be typed by its identity, which differs per process, so Numba's disk cache would never
#: hit and every process would spend ~1.3 s per kernel compiling the region.
PLANE_KINDS = (cpu_jit.depthwise3x3_s1, cpu_jit.depthwise3x3_s1_flat, cpu_jit.depthwise_any)


@_region
def depthwise_spans(kind, x, w, bias, out, bounds, planes, accs, geometry, pt, pl, lo, hi):
    """``cpu_jit``'s depthwise kernel PLANE_KINDS[kind] on the channel spans [bounds[i],
    bounds[i + 1]) of one image, each on its thread's scratch."""
    for i in numba.prange(bounds.shape[0] - 1):
        t = numba.get_thread_id()
        c0, c1 = bounds[i], bounds[i + 1]
        args = (x[c0:c1], w[c0:c1], bias[c0:c1], out[c0:c1], planes[t], accs[t], geometry, pt, pl, lo, hi)
        if kind == 0:
            cpu_jit.depthwise3x3_s1(*args)
        elif kind == 1:
            cpu_jit.depthwise3x3_s1_flat(*args)
        else:
            cpu_jit.depthwise_any(*args)


@_region
def depthwise_s2_spans(x, w, bias, out, bounds, phases, unused, geometry, pt, pl, lo, hi):
    """``cpu_jit.depthwise3x3_s2`` on the channel spans of one image, each on its thread's scratch."""
    for i in numba.prange(bounds.shape[0] - 1):
        t = numba.get_thread_id()
        c0, c1 = bounds[i], bounds[i + 1]
        cpu_jit.depthwise3x3_s2(x[c0:c1], w[c0:c1], bias[c0:c1], out[c0:c1], phases[t], unused[t], geometry,
                                pt, pl, lo, hi)


def depthwise_region(kernel: Callable, args: tuple) -> tuple[Callable, tuple]:
    """The region running ``kernel`` on channel spans, and its arguments: ``args`` as the kernel's
    region takes them after (kind where it takes one)."""
    if kernel is cpu_jit.depthwise3x3_s2:
        return depthwise_s2_spans, args
    return depthwise_spans, (PLANE_KINDS.index(kernel), *args)


@_region
def pool_spans(is_max, x, out, scale, bounds, phases, sh, sw, pt, pl):
    """``cpu_jit.pool3x3`` (a max where ``is_max``, else a mean) on the channel spans of one
    image, each on its thread's scratch."""
    for i in numba.prange(bounds.shape[0] - 1):
        t = numba.get_thread_id()
        c0, c1 = bounds[i], bounds[i + 1]
        if is_max:
            cpu_jit.pool3x3(x[c0:c1], out[c0:c1], scale, phases[t], cpu_jit.max_row, sh, sw, pt, pl)
        else:
            cpu_jit.pool3x3(x[c0:c1], out[c0:c1], scale, phases[t], cpu_jit.mean_row, sh, sw, pt, pl)


def available_layer() -> str | None:
    """The threading layer the regions run on (None before ``available()`` found one)."""
    return _layer()[0]
