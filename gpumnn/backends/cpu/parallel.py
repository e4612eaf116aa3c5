"""Native parallel regions for the cpu backend: a whole op on all threads without the GIL.

Why: the backend's Python threads (``cpu_workers``) hand an op's chunks over through the GIL and
a wake-up per op, and each wake-up of a sleeping thread, and each wait for the GIL held by the
other thread, costs tens of microseconds (a futex wake of an idle vCPU): an op of a few hundred
microseconds, MobileNet's 1x1 convolutions among them, gained nothing from a second thread
(measured: bench/RESULTS.md). A Numba ``parallel`` function runs the op's blocks on its threading
layer's threads (GNU OpenMP's by default, below), with the GIL released throughout: an empty region
costs a tenth of a hand-over, and each block's GEMM calls BLAS (NumPy's
own OpenBLAS where it has one, else SciPy's ``cython_blas``; one thread inside each block) with
the bias and a clamp applied to the block while it is in cache. The blocks: GEMM row and column
spans, im2col row (and channel) blocks, im2col on constant weights as pixel-panel or weight-panel
spans through ``cpu_tiles``' register tile instead of BLAS, Winograd on the same tile, depthwise and
pooling channel spans.

Only Numba's ``omp`` and ``tbb`` threading layers qualify: ``workqueue``, the fallback when
neither loads, costs as much per region as a hand-over and is not safe to enter from two threads
at once. GNU OpenMP is preferred where the user names no layer (``LAYER_PRIORITY``): its team's
threads spin between regions, so a region costs less than on TBB, whose workers sleep between
regions and whose caller runs the blocks no other thread has taken. OpenMP's region waits at its
barrier for every thread of its team, so a run stalls where another process displaced one; the
recording's run-by-run choice (``cpu_sharing``) then runs the ops on one thread
(bench/RESULTS.md, s16). TBB serves where libgomp is missing (``gpumnn[cpu]`` installs it), or by
``NUMBA_THREADING_LAYER=tbb``. Where the regions are not available (``available()`` says why) the
backend keeps ``cpu_workers``. GNU OpenMP cannot start its threads again in a process forked
after they ran, so there a forked child runs its regions on one thread (``_after_fork_in_child``).

Numba caches the compiled regions on disk; ``cpu_jit`` stamps that cache with every module of
the package, so editing a kernel, the tile or an activation the regions inline recompiles them.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
import types as types_module
from typing import Callable

import numpy as np

from . import activations as cpu_activations, jit as cpu_jit, tiles as cpu_tiles
from .tiles import MR, NR, POINTWISE_ROWS, SQUARE

numba = cpu_jit.numba
if numba is not None:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic
else:  # never called without Numba
    def intrinsic(fn):
        return fn
_N, _T = ord("N"), ord("T")


def _numpy_sgemm() -> tuple[int, type] | None:
    """(address, integer type) of the Fortran sgemm in the OpenBLAS NumPy itself loaded
    (threadpoolctl finds it, its symbol prefix and suffix), or None where NumPy uses another
    BLAS. Preferred to SciPy's: NumPy's wheels bundle a newer OpenBLAS than SciPy's (0.3.31 against
    0.3.30 here), whose products with few rows or a short inner dimension, Winograd's transforms
    among them, run faster (measured: bench/RESULTS.md)."""
    from threadpoolctl import ThreadpoolController
    for lib in ThreadpoolController().select(internal_api="openblas").lib_controllers:
        if "numpy" not in os.path.basename(os.path.dirname(lib.filepath)):
            continue
        prefix, suffix = getattr(lib, "_symbol_prefix", ""), getattr(lib, "_symbol_suffix", "")
        try:
            dll = ctypes.CDLL(lib.filepath)
            sgemm = getattr(dll, f"{prefix}sgemm_{suffix}")
            config = getattr(dll, f"{prefix}openblas_get_config{suffix}")
        except (OSError, AttributeError):
            continue
        config.restype = ctypes.c_char_p
        wide = b"USE64BITINT" in (config() or b"")
        return ctypes.cast(sgemm, ctypes.c_void_p).value, np.int64 if wide else np.int32
    return None


def _scipy_sgemm() -> tuple[int, type]:
    """(address, integer type) of SciPy's Fortran sgemm (what Numba's own np.dot calls)."""
    from numba.extending import get_cython_function_address
    return get_cython_function_address("scipy.linalg.cython_blas", "sgemm"), np.int32


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
    #: The sgemm the regions call, passed to them as an argument (a ctypes function baked into a
    #: kernel would keep Numba from caching it on disk: an address differs per process, and parallel
    #: kernels take seconds to compile), and the integer type of its Fortran arguments.
    SGEMM, BLAS_INT = _numpy_sgemm() or _scipy_sgemm()
except Exception as exc:  # noqa: BLE001 -- neither BLAS is reachable: no regions
    SGEMM, BLAS_INT = 0, np.int32
    _MISSING = f"neither NumPy's OpenBLAS nor SciPy's BLAS is reachable ({exc}); install gpumnn[cpu]"
else:
    _MISSING = None


def compiled_region(fn: Callable, **options) -> Callable:
    """``fn`` as a Numba parallel function (its ``prange`` loops on the layer's threads);
    ``options`` add to or override this module's (``fastmath``, ``error_model``)."""
    if numba is None or not SGEMM:
        return fn
    options = dict(dict(parallel=True, nogil=True, fastmath=cpu_jit.FAST, boundscheck=False), **options)
    try:
        return numba.njit(cache=cpu_jit.CACHE, **options)(fn)
    except RuntimeError:  # no writable place for Numba's cache: compile per process
        return numba.njit(**options)(fn)


def _region(fn: Callable) -> Callable:
    """``fn`` as a parallel function with this module's options (``compiled_region``)."""
    return compiled_region(fn)


@_region
def _probe(x):
    for i in numba.prange(x.shape[0]):
        x[i] = numba.get_thread_id()


_probe_lock = threading.Lock()


def _preload_tbb() -> None:
    """Loads the TBB library of the ``tbb`` wheel, if installed, so that Numba's TBB layer finds
    it: pip puts it in the environment's ``lib/``, which is not on the loader's path, and Numba's
    layer then fails to import (the fallback where GNU OpenMP is missing)."""
    for folder in (os.path.join(sys.prefix, "lib"), os.path.join(sys.base_prefix, "lib")):
        path = os.path.join(folder, "libtbb.so.12")
        if os.path.exists(path):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:  # not loadable here: Numba tries its other layers
                pass
            return


#: True in a process forked after GNU OpenMP's threads ran: its regions run on one thread.
_forked_after_openmp = False


def _after_fork_in_child() -> None:
    """In a child forked after GNU OpenMP's threads ran, regions run on one thread: a team of two
    would wait forever for threads the child does not have, and Numba's launcher ends the process
    at its first region. Calling the launcher again records the child as the process that started
    it (its check compares that with the parent's pid) and makes one thread the default."""
    global _forked_after_openmp
    _forked_after_openmp = True
    from numba.np.ufunc import omppool
    ctypes.CFUNCTYPE(None, ctypes.c_int)(omppool.launch_threads)(1)
    _numba_thread_calls()[1](1)


#: Numba's threading layers in the order the regions take them where the user names none
#: (``NUMBA_THREADING_LAYER``, ``NUMBA_THREADING_LAYER_PRIORITY``): GNU OpenMP's threads spin
#: between regions, so a region costs less than on TBB (bench/RESULTS.md, s14 and s16); TBB
#: where libgomp is missing.
LAYER_PRIORITY = ["omp", "tbb", "workqueue"]


def _prefer_layers() -> None:
    """Starts Numba's threading layer in ``LAYER_PRIORITY``'s order unless the user chose one or
    an order, or the layer has started already (this changes nothing then)."""
    chosen = any(os.environ.get(name) for name in ("NUMBA_THREADING_LAYER", "NUMBA_THREADING_LAYER_PRIORITY"))
    if not chosen and str(numba.config.THREADING_LAYER).lower() == "default":
        numba.config.THREADING_LAYER_PRIORITY = list(LAYER_PRIORITY)
    numba.get_num_threads()  # starts the layer now, before a compilation could reload Numba's config


@functools.lru_cache(maxsize=1)
def _layer() -> tuple[str | None, str | None]:
    """(the threading layer Numba started, why regions are off or None)."""
    if _MISSING is not None:
        return None, _MISSING
    if sys.platform.startswith("linux"):
        _preload_tbb()
    with _probe_lock:
        try:
            _prefer_layers()
            _probe(np.zeros(2, np.int64))
            layer = numba.threading_layer()
        except Exception as exc:  # noqa: BLE001 -- no layer loads: the Python threads stay
            return None, f"Numba could not start a threading layer ({exc})"
    if layer == "omp" and hasattr(os, "register_at_fork"):
        from numba.np.ufunc import omppool
        if getattr(omppool, "openmp_vendor", "") == "GNU" and hasattr(omppool, "launch_threads"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
    if layer not in ("omp", "tbb"):
        return layer, (f"Numba's threading layer is {layer!r}: neither 'omp' nor 'tbb' loaded (workqueue "
                       "regions are slow and not thread-safe); install gpumnn[cpu] (tbb) or libgomp1")
    return layer, None


def available() -> tuple[bool, str | None]:
    """(whether native regions run here, why not)."""
    layer, why = _layer()
    return why is None, why


def threads_for(threads: int) -> int:
    """The region threads a backend of ``threads`` threads gets (at most Numba's pool size; one in
    a process forked after GNU OpenMP's threads ran)."""
    if _forked_after_openmp:
        return 1
    return max(1, min(threads, numba.config.NUMBA_NUM_THREADS))


def _numba_thread_calls() -> tuple[Callable[[], int], Callable[[int], None]]:
    """(get, set) of the calling thread's Numba thread count: the threading layer's C calls, which
    ``numba.get_num_threads`` and ``set_num_threads`` make after their start-up and range checks (a
    one-thread run sets and restores the count on every submit, and the checks cost more than the
    calls), or those public calls where this Numba has no such C calls."""
    numba.get_num_threads()  # starts the layer, which binds the C calls
    from numba.np.ufunc import parallel as numba_parallel
    getter = getattr(numba_parallel, "_get_num_threads", None)
    setter = getattr(numba_parallel, "_set_num_threads", None)
    if callable(getter) and callable(setter):
        return getter, setter
    return numba.get_num_threads, numba.set_num_threads


class RegionThreads:
    """Context: regions the calling thread enters inside use ``threads`` threads; the thread's own
    Numba setting (kept per thread) is restored after, so a run leaves the caller's Numba as it
    was. One instance serves every thread of a backend: what each entry changed is kept per
    thread. A class rather than a generator context, as it is entered on every run."""

    def __init__(self, threads: int):
        self.threads = threads
        self._entries = threading.local()  # .previous: a stack of counts to restore, None where unchanged
        self._thread_count, self._set_thread_count = _numba_thread_calls()

    def __enter__(self):
        try:
            stack = self._entries.previous
        except AttributeError:
            stack = self._entries.previous = []
        previous = self._thread_count()
        if previous <= 0:  # the C getter's "not set here": Numba's own call says what it means
            previous = numba.get_num_threads()
        threads = 1 if _forked_after_openmp else self.threads  # a backend made before the fork
        if previous == threads:  # the usual case: no set and no restore
            stack.append(None)
        else:
            self._set_thread_count(threads)  # in 1..NUMBA_NUM_THREADS: ``threads_for``
            stack.append(previous)
        return self

    def __exit__(self, *exc):
        previous = self._entries.previous.pop()
        if previous is not None:
            self._set_thread_count(previous)


# -- GEMM blocks through BLAS ------------------------------------------------------------------
# ``calls`` [blocks, 13] int64, one row per block (``gemm_calls``): the Fortran sgemm arguments of
# the row-major product C[rows, cols] = A[rows, k] B[k, cols] computed as C^T = B^T A^T (op of the
# first operand, op of the second, cols, rows, k, ld of B, ld of A, ldc), the element offsets of B,
# A and C in their flat buffers, and the bias row and column of the block's first element. Fortran
# takes its arguments by reference: ``fortran_arguments`` lays the first eight out as the integers
# BLAS reads, and ``scalars`` holds (alpha, 0), both made at session creation so that a region
# allocates nothing (BLAS only reads them, so every thread may point at the same ones).

_COLUMNS = 13


def _gemm_region(fn: Callable) -> Callable:
    """``fn`` as a parallel region with NumPy's float error model, so that GELU's division
    vectorises in the epilogue (``cpu_activations._vector_kernel`` says why)."""
    return compiled_region(fn, error_model="numpy")


#: The activations ``activation_spans`` and ``gemm_blocks`` apply, by the ``kind`` they take: those
#: a region's clamp does not cover, with a compiled loop in ``cpu_activations``
ACTIVATION_KINDS = ("sigmoid", "silu", "hard_swish", "gelu")
#: Its index of hard-swish, which ``cpu_tiles``' pointwise tiles apply in registers
HARD_SWISH = ACTIVATION_KINDS.index("hard_swish")


def _activate(kind, span):
    """ACTIVATION_KINDS[kind] in place on ``span``."""
    if kind == 0:
        for i in range(span.shape[0]):
            span[i] = cpu_activations.sigmoid_value(span[i])
    elif kind == 1:
        for i in range(span.shape[0]):
            span[i] = cpu_activations.silu_value(span[i])
    elif kind == 2:
        for i in range(span.shape[0]):
            span[i] = cpu_activations.hard_swish_value(span[i])
    else:
        for i in range(span.shape[0]):
            span[i] = cpu_activations.gelu_value(span[i])


if numba is not None:  # Numba is an optional extra: without it the regions are never compiled
    _activate = numba.njit(inline="always")(_activate)


@cpu_jit.inlined
def finish_span(kind, span, value, lo, hi):
    """span = ACTIVATION_KINDS[kind] (none where < 0) of clamp(span + value) to [lo, hi], in one
    loop per kind: a clamp loop and an activation loop after it took two passes."""
    if kind == 0:
        for i in range(span.shape[0]):
            span[i] = cpu_activations.sigmoid_value(min(max(span[i] + value, lo), hi))
    elif kind == 1:
        for i in range(span.shape[0]):
            span[i] = cpu_activations.silu_value(min(max(span[i] + value, lo), hi))
    elif kind == 2:
        for i in range(span.shape[0]):
            span[i] = cpu_activations.hard_swish_value(min(max(span[i] + value, lo), hi))
    elif kind == 3:
        for i in range(span.shape[0]):
            span[i] = cpu_activations.gelu_value(min(max(span[i] + value, lo), hi))
    else:
        for i in range(span.shape[0]):
            span[i] = min(max(span[i] + value, lo), hi)


@_gemm_region
def activation_spans(kind, a, bounds):
    """ACTIVATION_KINDS[kind] in place on the spans [bounds[j], bounds[j + 1]) of the flat ``a``:
    the activation after a convolution's region shared by the region's threads, not on one."""
    for j in numba.prange(bounds.shape[0] - 1):
        _activate(kind, a[bounds[j]:bounds[j + 1]])


@_gemm_region
def gemm_blocks(sgemm, a, b, c, calls, fortran, scalars, bias, bias_offset, bias_period, bias_rows, bias_cols, beta,
                lo, hi, activation, epilogue):
    """Every block of ``calls`` on the region's threads: the BLAS product (``sgemm``: ``SGEMM``,
    scaled by alpha, ``scalars[0]``),
    then, where ``epilogue``, clamp(C + beta * bias) to [lo, hi] over the block while it is in
    cache, and ACTIVATION_KINDS[activation] after where ``activation`` >= 0. The bias element of C's row r and column j is
    bias[bias_offset + (r % bias_period) * bias_rows + j * bias_cols] (bias_cols 0 or 1: a value
    per row or a row of values)."""
    for i in numba.prange(calls.shape[0]):
        p = calls[i]
        at, w, scalar_at = fortran.ctypes.data + fortran.strides[0] * i, fortran.itemsize, scalars.ctypes.data
        _call_sgemm(sgemm, at, at + w, at + 2 * w, at + 3 * w, at + 4 * w, scalar_at, b.ctypes.data + 4 * p[8],
                    at + 5 * w, a.ctypes.data + 4 * p[9], at + 6 * w, scalar_at + 4, c.ctypes.data + 4 * p[10], at + 7 * w)
        if epilogue:
            cols, rows, ldc = p[2], p[3], p[7]
            for r in range(rows):
                start = p[10] + r * ldc
                row = c[start:start + cols]
                if bias_period == 0:
                    for j in range(cols):
                        row[j] = min(max(row[j], lo), hi)
                elif bias_cols == 0:
                    value = bias[bias_offset + ((p[11] + r) % bias_period) * bias_rows] * beta
                    for j in range(cols):
                        row[j] = min(max(row[j] + value, lo), hi)
                else:
                    first = bias_offset + ((p[11] + r) % bias_period) * bias_rows + p[12]
                    values = bias[first:first + cols]
                    for j in range(cols):
                        row[j] = min(max(row[j] + beta * values[j], lo), hi)
                if activation >= 0:
                    _activate(activation, row)


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
    contiguous integers (``BLAS_INT``) BLAS reads by reference."""
    return np.ascontiguousarray(rows[:, :8], dtype=BLAS_INT)


# -- im2col row blocks ----------------------------------------------------------------------------

@cpu_jit.inlined
def copy_windows(flat, col, channels, height, width, geometry, r0, r1, ow):
    """im2col of output rows [r0, r1) of one image (``flat``: x [C, H, W] flattened) into ``col``
    [C*KH*KW, (r1 - r0) * OW], zeros where a window reaches past the input's edge.
    geometry: (kh, kw, sh, sw, dh, dw, pt, pl)."""
    kh, kw, sh, sw, dh, dw, pt, pl = geometry
    pixels = (r1 - r0) * ow
    # flat indices, not slices: a block copies C*KH*KW*rows runs of OW elements, and a slice per
    # run cost more than the run itself at OW = 7
    for ci in range(channels):
        for ky in range(kh):
            for kx in range(kw):
                base = ((ci * kh + ky) * kw + kx) * pixels
                shift = kx * dw - pl  # input column of output column 0
                first = max(0, (sw - 1 - shift) // sw)  # first output column inside the input
                stop = min(ow, max(0, (width - 1 - shift) // sw + 1))  # past the last inside
                for oy in range(r0, r1):
                    at = base + (oy - r0) * ow
                    iy = oy * sh + ky * dh - pt
                    if iy < 0 or iy >= height or first >= stop:
                        for j in range(ow):
                            col[at + j] = 0.0
                        continue
                    for j in range(first):
                        col[at + j] = 0.0
                    for j in range(stop, ow):
                        col[at + j] = 0.0
                    src, dst = flat[(ci * height + iy) * width + first * sw + shift:], col[at + first:]
                    # strides 1 and 2 in loops of their own: a run-time stride in the index keeps
                    # the copy scalar, a constant one lets it use vector loads and shuffles
                    if sw == 1:
                        for j in range(stop - first):
                            dst[j] = src[j]
                    elif sw == 2:
                        copy_stride_2(src, stop - first, dst)
                    else:
                        for j in range(stop - first):
                            dst[j] = src[j * sw]


@cpu_jit.inlined
def copy_stride_2(src, count, dst):
    """dst[0:count] = src[0:2 * count:2] (flat views): whole vectors (``cpu_tiles.copy_even_lanes``)
    while their reads lie inside ``src``, then one float at a time. Views, not offsets into the
    arrays: an index Numba cannot prove non-negative keeps a wraparound test in the loop."""
    j = 0
    while j + cpu_tiles.EVEN_LANES <= count and 2 * (j + cpu_tiles.EVEN_LANES) <= src.shape[0]:
        cpu_tiles.copy_even_lanes(dst.ctypes.data + 4 * j, src.ctypes.data + 8 * j)
        j += cpu_tiles.EVEN_LANES
    for t in range(j, count):
        dst[t] = src[2 * t]


@cpu_jit.inlined
def copy_window_rows(flat, col, channels, height, width, geometry, r0, r1, ow):
    """im2col of output rows [r0, r1) of one image (``flat``: x [C, H, W] flattened) into ``col``
    [(r1 - r0) * OW, C*KH*KW], a pixel's windows a row, zeros where a window reaches past the
    input's edge: each window row a run of the input (dilation 1 along columns, ``engines.window_rows``).
    geometry: (kh, kw, sh, sw, dh, dw, pt, pl)."""
    kh, kw, sh, sw, dh, dw, pt, pl = geometry
    k = channels * kh * kw
    for oy in range(r0, r1):
        for ox in range(ow):
            row = col[((oy - r0) * ow + ox) * k:((oy - r0) * ow + ox + 1) * k]
            ix = ox * sw - pl  # input column of the window's first tap
            first, stop = max(0, -ix), min(kw, max(0, width - ix))
            for ci in range(channels):
                for ky in range(kh):
                    dst = row[(ci * kh + ky) * kw:(ci * kh + ky + 1) * kw]
                    iy = oy * sh + ky * dh - pt
                    if iy < 0 or iy >= height or first >= stop:
                        for j in range(kw):
                            dst[j] = 0.0
                        continue
                    for j in range(first):
                        dst[j] = 0.0
                    for j in range(stop, kw):
                        dst[j] = 0.0
                    src = flat[(ci * height + iy) * width + ix + first:]
                    for j in range(stop - first):
                        dst[first + j] = src[j]


@_gemm_region
def im2col_blocks(sgemm, x, w, out, bias, blocks, fortran, scalars, cols, geometry, window_rows, lo, hi, epilogue,
                  activation):
    """A convolution of one image, x [C, H, W] with w [O, C*KH*KW] into out [O, OH, OW], as blocks
    (output rows [r0, r1), output channels [o0, o1)) = blocks[i]: each copies its rows' windows
    (zeros past the input's edge) into its thread's ``cols`` [C*KH*KW*rows*OW], multiplies w's
    rows o0.. by them through BLAS (``sgemm``, with block i's integers at fortran[i] and (1, 0) in
    ``scalars``: ``im2col_arguments``) and, where ``epilogue``, applies clamp(out + bias[o]) to
    [lo, hi] while the block is in cache, then ACTIVATION_KINDS[activation] where ``activation`` >= 0. Blocks that share rows copy them each: where an image
    has fewer pixels than channels, channel spans keep every product wide, and the copy is small
    beside the product. geometry: (kh, kw, sh, sw, dh, dw, pt, pl); ``window_rows``: the columns
    laid a pixel a row (``copy_window_rows``; ``fortran`` then has BLAS read them transposed)."""
    channels, height, width = x.shape
    k = w.shape[1]
    oh, ow = out.shape[1], out.shape[2]
    flat = x.reshape(channels * height * width)
    for i in numba.prange(blocks.shape[0]):
        col = cols[numba.get_thread_id()]
        r0, r1, o0, o1 = blocks[i, 0], blocks[i, 1], blocks[i, 2], blocks[i, 3]
        pixels = (r1 - r0) * ow
        if window_rows:
            copy_window_rows(flat, col, channels, height, width, geometry, r0, r1, ow)
        else:
            copy_windows(flat, col, channels, height, width, geometry, r0, r1, ow)
        at, size, scalar_at = fortran.ctypes.data + fortran.strides[0] * i, fortran.itemsize, scalars.ctypes.data
        _call_sgemm(sgemm, at, at + size, at + 2 * size, at + 3 * size, at + 4 * size, scalar_at, col.ctypes.data,
                    at + 5 * size, w.ctypes.data + 4 * o0 * k, at + 6 * size, scalar_at + 4,
                    out.ctypes.data + 4 * (o0 * oh * ow + r0 * ow), at + 7 * size)
        if epilogue or activation >= 0:
            for oc in range(o0, o1):
                finish_span(activation, out[oc, r0:r1].reshape(pixels), bias[oc] if epilogue else np.float32(0.0), lo, hi)


def im2col_arguments(blocks: np.ndarray, k: int, ow: int, pixels: int, window_rows: bool = False) -> np.ndarray:
    """``im2col_blocks``' Fortran integers per block (rows [r0, r1), channels [o0, o1)): (weights
    times columns) cols^T w^T, the block's pixels wide, into an output ``pixels`` wide; with
    ``window_rows`` the columns lie a pixel a row, read transposed."""
    widths = (blocks[:, 1] - blocks[:, 0]) * ow
    channels = blocks[:, 3] - blocks[:, 2]
    full = np.full_like
    trans_a, lda = (full(widths, _T), full(widths, k)) if window_rows else (full(widths, _N), widths)
    return fortran_arguments(np.stack([trans_a, full(widths, _N), widths, channels, full(widths, k), lda,
                                       full(widths, k), full(widths, pixels)], axis=1))


# -- im2col into packed panels, products by the register tile ------------------------------------

@cpu_jit.inlined
def pack_windows(xp, pack, bases, taps, plane, channels, q0, q1):
    """im2col straight into ``cpu_tiles``' pixel panels: pack[q - q0] [C*T, MR] for the panels
    q0..q1 of MR output pixels, element (c*T + t, r) = xp[bases[q*MR + r] + c*plane + taps[t]]
    (``xp``: the input with its padding, flat; ``bases``: each pixel's window origin in a plane,
    0 past the last pixel; ``taps``: each of the T window taps' offset from it)."""
    depth = channels * taps.shape[0]
    for q in range(q0, q1):
        panel = pack[(q - q0) * depth * MR:]
        lanes = bases[q * MR:(q + 1) * MR]
        # lanes rise, so a span of MR - 1 (2 (MR - 1)) puts every pixel 1 (2) after the one before:
        # the rows copied as vectors, with no per-pixel index
        span = lanes[MR - 1] - lanes[0]
        if span == MR - 1 or span == 2 * (MR - 1):
            to, start = panel.ctypes.data, xp.ctypes.data + 4 * lanes[0]
            for ci in range(channels):
                for t in range(taps.shape[0]):
                    if span == MR - 1:
                        cpu_tiles.copy_row(to, start + 4 * (ci * plane + taps[t]))
                    else:
                        cpu_tiles.copy_row_s2(to, start + 4 * (ci * plane + taps[t]))
                    to += 4 * MR
            continue
        k = 0
        for ci in range(channels):
            for t in range(taps.shape[0]):
                at, offset = k * MR, ci * plane + taps[t]
                for r in range(MR):
                    panel[at + r] = xp[lanes[r] + offset]
                k += 1


@cpu_jit.inlined
def tile_products(panels, pack, source, bases, offsets, panel_rows, dummy, result, bias, q0, q1, v0, v1, pixels,
                  pixels_outer, lo, hi):
    """result [O, pixels] (flat) for pixel panels [q0, q1) (``pack_windows``' panels of MR, from pack's
    start, by weight panels of NR; or, where ``offsets`` is not empty, panels of R = ``panel_rows`` pixels read
    where they lie in ``source``: ``cpu_tiles.tile_in_place_stored`` at pixel q * R + r's origin
    ``bases[q * R + r]`` plus ``offsets[k]`` for depth step k, by weight panels of
    ``cpu_tiles.IN_PLACE_COLUMNS``) and weight panels [v0, v1): the register tile per pair, each
    storing clamp(sum + bias[o]) to [lo, hi] itself (``bias`` zero-padded to whole panels; the
    tile's values past the last pixel or channel go to ``dummy``, a few floats of the thread's
    scratch); ``pixels_outer``: the order of the pairs."""
    depth, width = panels.shape[1], panels.shape[2]
    o = result.shape[0] // pixels
    across = v1 - v0
    for j in range((q1 - q0) * across):
        # pixel panels outer where the weights are the smaller operand (they stay in cache while
        # each pixel panel is used across them), weight panels outer where they are the larger
        if pixels_outer:
            q, v = q0 + j // across, v0 + j % across
        else:
            v, q = v0 + j // (q1 - q0), q0 + j % (q1 - q0)
        first = q * panel_rows
        at = result.ctypes.data + 4 * (v * width * pixels + first)
        rows, channels_here = min(panel_rows, pixels - first), min(width, o - v * width)
        bias_at = bias.ctypes.data + 4 * v * width
        if offsets.shape[0]:
            cpu_tiles.tile_in_place_stored(source.ctypes.data, bases.ctypes.data + 8 * first, offsets.ctypes.data,
                                           panels[v].ctypes.data, width, depth, at, pixels, rows, channels_here,
                                           bias_at, dummy, lo, hi)
        else:
            cpu_tiles.tile_product_stored(pack.ctypes.data + 4 * (q - q0) * depth * MR, MR, panels[v].ctypes.data, NR,
                                          depth, at, pixels, rows, channels_here, bias_at, dummy, lo, hi)


@cpu_jit.inlined
def activate_block(activation, result, pixels, channels, q0, q1, v0, v1, panel_rows, width):
    """ACTIVATION_KINDS[activation] in place on the outputs of pixel panels [q0, q1) (of
    ``panel_rows`` pixels) and weight panels [v0, v1) (of ``width`` channels) of result [channels,
    pixels] (flat): a block's, while it is in cache."""
    p0, p1 = q0 * panel_rows, min(q1 * panel_rows, pixels)
    for ch in range(v0 * width, min(v1 * width, channels)):
        _activate(activation, result[ch * pixels + p0:ch * pixels + p1])


@_gemm_region
def packed_conv(x, xp, inner, bases, taps, offsets, panel_rows, panels, out, bias, pack_bounds, blocks, packs, accs,
                shared, pixels_outer, lo, hi, activation):
    """A convolution of one image, x [C, H, W] with weights packed at creation ``panels`` [O / W,
    C*T, W] (``cpu_tiles.pack_panels``; W: NR for packed pixel panels, ``cpu_tiles.IN_PLACE_COLUMNS``
    in place) into out [O, OH, OW], clamp(. + bias) to [lo, hi] (``bias``
    zero-padded to whole panels) in the tiles' stores, in up to three parallel steps: x
    copied into the inside ``inner`` = (top, left, rows, columns) of ``xp``, its zero-bordered
    copy (none where there is no padding: ``xp`` is empty, x is read as it lies); the windows
    packed into pixel panels (``pack_windows``); the products (``tile_products``) of blocks (pixel panels [q0, q1), weight
    panels [v0, v1)) = blocks[i]. Where ``shared``, the panels are packed once, spans
    [pack_bounds[j], pack_bounds[j + 1]) in parallel into packs[0], and every block reads them
    (an image with fewer pixels than channels: its blocks are weight spans); else each block
    packs its own into its thread's ``packs`` row and multiplies them while in cache, then
    ACTIVATION_KINDS[activation] on its outputs where ``activation`` >= 0. Where ``offsets`` (each
    depth step's offset from a window's origin) is not empty, nothing is packed: the tiles read the
    windows where they lie (``tile_products``). ``panel_rows``: pixels per pixel panel (the caller
    decides: ``cpu_tiles.IN_PLACE_ROWS`` in place, MR packed). No BLAS: its packing of the weights on
    every call was the cost (``cpu_tiles`` says why)."""
    channels, height, width = x.shape
    o, oh, ow = out.shape
    top, left, rows, cols = inner
    plane = rows * cols
    result = out.reshape(o * oh * ow)
    if xp.shape[0]:
        grid = xp.reshape(channels, rows, cols)
        for ci in numba.prange(channels):
            grid[ci, top:top + height, left:left + width] = x[ci]
        source = xp
    else:
        source = x.reshape(x.size)
    if shared and not offsets.shape[0]:
        pack = packs[0]
        depth = panels.shape[1]
        for j in numba.prange(pack_bounds.shape[0] - 1):
            q0 = pack_bounds[j]
            pack_windows(source, pack[q0 * depth * MR:], bases, taps, plane, channels, q0, pack_bounds[j + 1])
        for i in numba.prange(blocks.shape[0]):
            q0, q1, v0, v1 = blocks[i, 0], blocks[i, 1], blocks[i, 2], blocks[i, 3]
            tile_products(panels, pack[q0 * depth * MR:], source, bases, offsets, panel_rows,
                          accs[numba.get_thread_id()].ctypes.data, result, bias, q0, q1, v0, v1, oh * ow, pixels_outer,
                          lo, hi)
            if activation >= 0:
                activate_block(activation, result, oh * ow, o, q0, q1, v0, v1, panel_rows, panels.shape[2])
    else:
        for i in numba.prange(blocks.shape[0]):
            thread = numba.get_thread_id()
            q0, q1, v0, v1 = blocks[i, 0], blocks[i, 1], blocks[i, 2], blocks[i, 3]
            if not offsets.shape[0]:
                pack_windows(source, packs[thread], bases, taps, plane, channels, q0, q1)
            tile_products(panels, packs[thread], source, bases, offsets, panel_rows, accs[thread].ctypes.data, result,
                          bias, q0, q1, v0, v1, oh * ow, pixels_outer, lo, hi)
            if activation >= 0:
                activate_block(activation, result, oh * ow, o, q0, q1, v0, v1, panel_rows, panels.shape[2])



@cpu_jit.inlined
def pixel_rows(rows, x_at, pixels, w_at, depth, out_at, valid, bias_at, lo, hi, swish, dummy):
    """``cpu_tiles.pixel_rows_<rows>``: ``rows`` pixels of x (read in place, ``pixels`` apart
    from channel to channel) by a panel of NR output channels, stored into NCHW."""
    if rows == MR:
        cpu_tiles.pixel_rows_6(x_at, pixels, w_at, NR, depth, out_at, 1, pixels, valid, bias_at, lo, hi, swish, dummy)
    elif rows == 5:
        cpu_tiles.pixel_rows_5(x_at, pixels, w_at, NR, depth, out_at, 1, pixels, valid, bias_at, lo, hi, swish, dummy)
    elif rows == 4:
        cpu_tiles.pixel_rows_4(x_at, pixels, w_at, NR, depth, out_at, 1, pixels, valid, bias_at, lo, hi, swish, dummy)
    elif rows == 3:
        cpu_tiles.pixel_rows_3(x_at, pixels, w_at, NR, depth, out_at, 1, pixels, valid, bias_at, lo, hi, swish, dummy)
    elif rows == 2:
        cpu_tiles.pixel_rows_2(x_at, pixels, w_at, NR, depth, out_at, 1, pixels, valid, bias_at, lo, hi, swish, dummy)
    else:
        cpu_tiles.pixel_rows_1(x_at, pixels, w_at, NR, depth, out_at, 1, pixels, valid, bias_at, lo, hi, swish, dummy)


#: Input floats (channels x pixels) of one chunk of ``pointwise_block``'s pixels: every weight
#: panel runs over a chunk while it is in L2
POINTWISE_CHUNK_FLOATS = 1 << 15


@cpu_jit.inlined
def channel_rows(rows, wide, w_at, x_at, pixels, depth, out_at, valid, bias_at, lo, hi, swish, dummy):
    """One pointwise tile with pixels in the vector registers: ``rows`` output channels (a panel of
    POINTWISE_ROWS[0] channels or of POINTWISE_ROWS[1]) by NR pixels where ``wide``, else by NARROW."""
    if rows == POINTWISE_ROWS[0]:
        if wide:
            cpu_tiles.channel_rows_tile(w_at, rows, x_at, pixels, depth, out_at, pixels, 1, valid, bias_at, lo, hi,
                                        swish, dummy)
        else:
            cpu_tiles.channel_rows_narrow(w_at, rows, x_at, pixels, depth, out_at, pixels, 1, valid, bias_at, lo, hi,
                                          swish, dummy)
    elif wide:
        cpu_tiles.channel_rows_short_tile(w_at, rows, x_at, pixels, depth, out_at, pixels, 1, valid, bias_at, lo, hi,
                                          swish, dummy)
    else:
        cpu_tiles.channel_rows_short_narrow(w_at, rows, x_at, pixels, depth, out_at, pixels, 1, valid, bias_at, lo,
                                            hi, swish, dummy)


@cpu_jit.inlined
def pointwise_block(x, panels, out, bias, c0, c1, p0, p1, dummy, channels_in_rows, lo, hi, activation):
    """Channels [c0, c1) and pixels [p0, p1) of ``pointwise_tiles``' product (its block); pixels in
    the vector registers in chunks of POINTWISE_CHUNK_FLOATS, the activation after each."""
    depth, pixels = x.shape
    o = out.shape[0]
    swish = 1 if activation == HARD_SWISH else 0  # in the tile's registers
    if channels_in_rows:
        chunk = max(NR, POINTWISE_CHUNK_FLOATS // max(depth, 1) // NR * NR)
        q0 = p0
        while q0 < p1:
            q1 = p1 if p1 - (q0 + chunk) < NR else q0 + chunk  # NR pixels or more in every chunk
            rows = panels.shape[2]
            for ch in range(c0, c1, rows):
                w_at, bias_at = panels[ch // rows].ctypes.data, bias.ctypes.data + 4 * ch
                row_at = out.ctypes.data + 4 * ch * pixels
                first = q0
                while first < q1:
                    left = q1 - first
                    wide = left >= NR or left > cpu_tiles.NARROW
                    at = (first if left >= NR else q1 - NR) if wide else q1 - cpu_tiles.NARROW
                    channel_rows(rows, wide, w_at, x.ctypes.data + 4 * at, pixels, depth, row_at + 4 * at, o - ch,
                                 bias_at, lo, hi, swish, dummy)
                    first = at + NR if wide else q1
            if activation >= 0 and not swish:
                for ch in range(c0, min(c1, o)):
                    _activate(activation, out[ch, q0:q1])
            q0 = q1
    else:
        width = panels.shape[2]
        for ch in range(c0, c1, width):
            w_at, bias_at = panels[ch // width].ctypes.data, bias.ctypes.data + 4 * ch
            if width == NR:
                for first in range(p0, p1, MR):
                    pixel_rows(min(MR, p1 - first), x.ctypes.data + 4 * first, pixels, w_at, depth,
                               out.ctypes.data + 4 * (ch * pixels + first), o - ch, bias_at, lo, hi, swish, dummy)
            else:
                for first in range(p0, p1):
                    cpu_tiles.pixel_row_wide(x.ctypes.data + 4 * first, pixels, w_at, width, depth,
                                             out.ctypes.data + 4 * (ch * pixels + first), 1, pixels, o - ch, bias_at,
                                             lo, hi, swish, dummy)
        if activation >= 0 and not swish:
            for ch in range(c0, min(c1, o)):
                _activate(activation, out[ch, p0:p1])


@_gemm_region
def row_tiles(a, bases, panels, out, bias, blocks, accs, lo, hi, activation):
    """out [M, N] = a [M, K] (C-contiguous) times the weights packed at creation ``panels`` [N / NR,
    K, NR], clamp(. + bias) to [lo, hi] (``bias`` zero-padded to whole panels), then
    ACTIVATION_KINDS[activation] (none where < 0) on each block's outputs: MR rows of a at a time
    read where they lie (``cpu_tiles.rows_in_place`` from ``bases``, each row's offset in a, the
    last row repeated past M) against each weight panel, which stays in cache while every row panel
    passes. blocks[i] = (first weight panel, panel stop). BLAS packs both operands on every call,
    the weights being the larger one at a few dozen rows (an LSTM's input projection)."""
    m, k = a.shape
    n = out.shape[1]
    for i in numba.prange(blocks.shape[0]):
        acc = accs[numba.get_thread_id()]
        for v in range(blocks[i, 0], blocks[i, 1]):
            columns = min(NR, n - v * NR)
            lanes = bias[v * NR:v * NR + columns]
            for q in range(0, m, MR):
                cpu_tiles.rows_in_place(a.ctypes.data, bases.ctypes.data + 8 * q, 1, panels[v].ctypes.data, NR, k,
                                        acc.ctypes.data)
                for r in range(min(MR, m - q)):
                    row, sums = out[q + r, v * NR:v * NR + columns], acc[r * NR:]
                    for c in range(columns):
                        row[c] = min(max(sums[c] + lanes[c], lo), hi)
        if activation >= 0:
            for r in range(m):
                _activate(activation, out[r, blocks[i, 0] * NR:min(blocks[i, 1] * NR, n)])


@_gemm_region
def pointwise_tiles(x, panels, out, bias, blocks, dummies, channels_in_rows, lo, hi, activation):
    """A 1x1 convolution of one image, x [C, P] times the weights packed at creation ``panels``
    [O / width, C, width] into out [O, P] (NCHW), on ``cpu_tiles``' pointwise tiles: the input read
    where it lies (no packing of it), the bias (``bias``, zero-padded to whole panels) and the
    clamp to [lo, hi] applied in registers, then ACTIVATION_KINDS[activation] (none where < 0):
    hard-swish in registers too, the others on each block's outputs while in cache. blocks[i] =
    (first channel, channel stop, first pixel, pixel stop), channels in whole panels.
    ``channels_in_rows``: panels of ``cpu_tiles.pointwise_rows`` channels broadcast against NR pixels
    in the vector registers (a chunk's pixels at least NR: its last tile is moved back to end at the
    chunk's end, redoing a few pixels, or is one vector wide); else pixels broadcast (MR at a time,
    fewer at the end) against panels of NR channels, or one at a time against panels of WIDE, each
    value stored on its own. ``dummies``: a row per thread where the tiles store what lies past the
    last channel."""
    for i in numba.prange(blocks.shape[0]):
        pointwise_block(x, panels, out, bias, blocks[i, 0], blocks[i, 1], blocks[i, 2], blocks[i, 3],
                        dummies[numba.get_thread_id()].ctypes.data, channels_in_rows, lo, hi, activation)

@cpu_jit.inlined
def tapped_row(row_at, offsets_at, depth, w_at, out_at, ow, pixels, valid, bias_at, lo, hi, swish, dummy):
    """One output row of ``tapped_conv`` for one panel of MR output channels: NR pixels a tile, the
    last tile moved back to end at the row's end (redoing a few pixels), one vector wide where the
    row is narrower than NR."""
    first = 0
    while first < ow:
        left = ow - first
        if left >= NR or (left > cpu_tiles.NARROW and ow >= NR):
            at = first if left >= NR else ow - NR
            cpu_tiles.tapped_tile(w_at, MR, row_at + 4 * at, offsets_at, depth, out_at + 4 * at, pixels, 1, valid,
                                  bias_at, lo, hi, swish, dummy)
            first = at + NR
        else:
            at = first if left >= cpu_tiles.NARROW else ow - cpu_tiles.NARROW
            cpu_tiles.tapped_narrow(w_at, MR, row_at + 4 * at, offsets_at, depth, out_at + 4 * at, pixels, 1, valid,
                                    bias_at, lo, hi, swish, dummy)
            first = at + cpu_tiles.NARROW


@_gemm_region
def tapped_conv(x, xp, inner, offsets, panels, out, bias, blocks, dummies, stride_h, lo, hi, activation):
    """A convolution of one image, x [C, H, W] with weights packed at creation ``panels``
    [O / MR, C*KH*KW, MR] into out [O, OH, OW], with no im2col copy: x copied into the inside of
    ``xp``, its zero-bordered copy (none where there is no padding and stride 1 along columns:
    ``xp`` is empty, x read as it lies), then ``cpu_tiles.tapped_tile`` on each (output row, panel
    of MR channels), whose steps read NR neighbouring output pixels' inputs at each (channel, tap)
    offset of ``offsets`` from the row's window origin (output row oy starts at input row oy *
    ``stride_h``). ``inner`` = (top, left, rows, columns, column stride): at a column stride s > 1
    each padded row is stored as s phases side by side (padded column p at (p % s) * (columns / s)
    + p // s), so that neighbouring output pixels' inputs lie side by side in each phase
    (``tapped_conv_offsets``). The bias (zero-padded to whole panels) and the clamp to [lo, hi] in
    registers, ACTIVATION_KINDS[activation] (none where < 0) after each row, hard-swish in
    registers. blocks[i] = (first output row, row stop, first channel, channel stop), channels in
    whole panels; ``dummies``: a row per thread for the tiles' stores past the last channel. For
    short inner dimensions, where an im2col copy and BLAS's product cost more than the
    multiply-adds."""
    channels, height, width = x.shape
    o, oh, ow = out.shape
    top, left, rows, cols, stride_w = inner
    if xp.shape[0]:
        grid = xp.reshape(channels, rows, cols)
        if stride_w == 1:
            for ci in numba.prange(channels):
                grid[ci, top:top + height, left:left + width] = x[ci]
        else:
            phase_width = cols // stride_w
            flat = x.reshape(x.size)
            for ci in numba.prange(channels):
                for phase in range(stride_w):
                    first = (phase - left) % stride_w  # the first input column of this phase
                    if first >= width:
                        continue
                    count = (width - first + stride_w - 1) // stride_w
                    at = phase * phase_width + (left + first) // stride_w
                    if stride_w == 2:  # vectors and shuffles, where a slice's gather was scalar
                        for y in range(height):
                            copy_stride_2(flat[(ci * height + y) * width + first:], count,
                                          xp[(ci * rows + top + y) * cols + at:])
                    else:
                        grid[ci, top:top + height, at:at + count] = x[ci, :, first::stride_w]
        source = xp
    else:
        source = x.reshape(x.size)
    swish = 1 if activation == HARD_SWISH else 0
    pixels = oh * ow
    for i in numba.prange(blocks.shape[0]):
        dummy = dummies[numba.get_thread_id()].ctypes.data
        r0, r1, c0, c1 = blocks[i, 0], blocks[i, 1], blocks[i, 2], blocks[i, 3]
        for oy in range(r0, r1):
            row_at = source.ctypes.data + 4 * oy * stride_h * cols
            for ch in range(c0, c1, MR):
                tapped_row(row_at, offsets.ctypes.data, offsets.shape[0], panels[ch // MR].ctypes.data,
                           out.ctypes.data + 4 * (ch * pixels + oy * ow), ow, pixels, o - ch,
                           bias.ctypes.data + 4 * ch, lo, hi, swish, dummy)
            if activation >= 0 and not swish:
                for ch in range(c0, min(c1, o)):
                    _activate(activation, out[ch, oy])


def tapped_row_width(padded_width: int, stride_w: int) -> int:
    """The floats ``tapped_conv`` stores a zero-bordered row of ``padded_width`` columns in: at a
    column stride s, s phases of ceil(padded_width / s) columns each."""
    return -(-padded_width // stride_w) * stride_w


def tapped_conv_offsets(channels: int, kernel: tuple[int, int], dilations: tuple[int, int], plane: int,
                        row_width: int, stride_w: int = 1) -> np.ndarray:
    """``tapped_conv``'s step offsets: for each input channel and window tap (the weights' C*KH*KW
    order), its offset in floats from an output pixel's window origin in the zero-bordered input
    (planes of ``plane`` floats, rows ``row_width`` wide, each row ``stride_w`` phases of
    ``row_width / stride_w`` columns: tap column t lies in phase t % stride_w, t // stride_w on)."""
    (kh, kw), (dh, dw) = kernel, dilations
    columns = np.arange(kw) * dw
    column_offsets = (columns % stride_w) * (row_width // stride_w) + columns // stride_w
    taps = (np.arange(kh)[:, None] * dh * row_width + column_offsets[None, :]).reshape(-1)
    return (np.arange(channels)[:, None] * plane + taps[None, :]).reshape(-1).astype(np.int64)


def packed_conv_tables(kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int],
                       out_hw: tuple[int, int], padded_width: int, rows: int = MR) -> tuple[np.ndarray, np.ndarray]:
    """``pack_windows``' bases (each output pixel's window origin in a padded plane
    ``padded_width`` wide, in panels of ``rows`` pixels, 0 past the last pixel) and taps (each window
    tap's offset from it)."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = kernel, strides, dilations, out_hw
    origins = ((np.arange(oh)[:, None] * sh) * padded_width + np.arange(ow)[None, :] * sw).reshape(-1)
    bases = np.zeros(-(-origins.size // rows) * rows, np.int64)
    bases[:origins.size] = origins
    taps = ((np.arange(kh)[:, None] * dh) * padded_width + np.arange(kw)[None, :] * dw).reshape(-1).astype(np.int64)
    return bases, taps


# -- Winograd on the register tile ---------------------------------------------------------------
# Tiles go in panels of MR (the broadcast operand of ``cpu_tiles.tile_product``), output channels
# in panels of NR (the weights, transformed and packed at creation). Every transform is a product
# of at most 8 x 8 matrices, done one tile at a time by ``cpu_tiles.square_product`` (B_h^T d B_w)
# or ``row_product`` (a 1D tile's, a 1x7 or 7x1 kernel's: d B), or on a panel by ``tile_product``
# (A_h^T m A_w); Numba's own loops left them scalar. A matrix of an axis whose alpha is 1 is [[1]]:
# its step is skipped, not multiplied by one.

@cpu_jit.inlined
def winograd_input_panel(xp, v, bases, b_rows, b_cols, scratch, c, p, panels, channels, plane, cols):
    """Channel c of tile panel p transformed (B_h^T d B_w) into v [panels, alpha_h * alpha_w, C,
    MR]: each tile's alpha_h x alpha_w inputs read from the zero-bordered plane ``xp`` at
    ``bases[p * MR + r]`` (rows ``cols`` apart; reads run SQUARE floats wide); b_rows, b_cols:
    B_h [alpha_h, SQUARE] and B_w [alpha_w, SQUARE] zero-padded (a 1D tile's B: [alpha, ROW]);
    ``scratch``: SQUARE^2 * (MR + 1) floats, t, then the panel's MR results e_r."""
    ah, aw = b_rows.shape[0], b_cols.shape[0]
    block = SQUARE * SQUARE
    xa, sa = xp.ctypes.data, scratch.ctypes.data
    position = channels * MR
    dst = v[(p * ah * aw * channels + c) * MR:]
    if ah == 1 or aw == 1:  # a 1D tile: e[u] = sum over y of d[y] B[y][u], d along the long axis
        b, a, step = (b_cols, aw, 1) if ah == 1 else (b_rows, ah, cols)
        # the panel's MR tiles as the rows of one register tile: MR sums in flight at each step,
        # where a row at a time waited on each multiply-add's latency
        cpu_tiles.rows_in_place(xa + 4 * c * plane, bases.ctypes.data + 8 * p * MR, step, b.ctypes.data,
                                cpu_tiles.ROW, a, sa)
        for u in range(a):
            for r in range(MR):
                dst[u * position + r] = scratch[r * cpu_tiles.ROW + u]
        return
    for r in range(MR):
        origin = xa + 4 * (c * plane + bases[p * MR + r])
        # t[x][u] = sum over y of d[y][x] B_h[y][u]; then e_r[w][u] = sum over x of B_w[x][w] t[x][u]
        cpu_tiles.square_product(origin, cols, b_rows.ctypes.data, SQUARE, ah, sa)
        cpu_tiles.square_product(b_cols.ctypes.data, SQUARE, sa, SQUARE, aw, sa + 4 * block * (r + 1))
    e = scratch[block:block * (MR + 1)]
    for u in range(ah):
        for w in range(aw):
            at, src = (u * aw + w) * position, e[w * SQUARE + u:]
            for r in range(MR):  # the panel's MR tiles side by side, as the product reads them
                dst[at + r] = src[r * block]


@cpu_jit.inlined
def winograd_axis_transform(a, src, count, outer_step, row_step, stride, depth, dst):
    """One axis of the output transform A_h^T m A_w for a tile panel's MR tiles: for o < count and
    each tile r, the MR x NR block dst[o][r] (at (o * MR + r) * MR * NR floats from ``dst``) = the
    sum over d < depth of a[d][0:MR] (outer product) the NR floats at ``src`` + (o * outer_step +
    r * row_step + d * stride) floats (``src``, ``dst``: addresses)."""
    for o in range(count):
        for r in range(MR):
            cpu_tiles.tile_product(a.ctypes.data, MR, src + 4 * (o * outer_step + r * row_step), stride, depth,
                                   dst + 4 * (o * MR + r) * MR * NR)


@cpu_jit.inlined
def finish_lanes(activation, values, at, bias, count, lo, hi):
    """values[at:at + count] = ACTIVATION_KINDS[activation] (none where < 0) of clamp(values +
    bias[0:count]) to [lo, hi]: a channel panel's sums of one output pixel, in one loop per kind
    (a loop of its own for the activation after the clamp's ran at a third of the speed)."""
    span = values[at:at + count]
    if activation == 0:
        for c in range(count):
            span[c] = cpu_activations.sigmoid_value(min(max(span[c] + bias[c], lo), hi))
    elif activation == 1:
        for c in range(count):
            span[c] = cpu_activations.silu_value(min(max(span[c] + bias[c], lo), hi))
    elif activation == 2:
        for c in range(count):
            span[c] = cpu_activations.hard_swish_value(min(max(span[c] + bias[c], lo), hi))
    elif activation == 3:
        for c in range(count):
            span[c] = cpu_activations.gelu_value(min(max(span[c] + bias[c], lo), hi))
    else:
        for c in range(count):
            span[c] = min(max(span[c] + bias[c], lo), hi)


@cpu_jit.inlined
def winograd_output_panel(m, s, y, a_rows, a_cols, tile, out, bias, p, q, tiles, tiles_w, lo, hi, activation):
    """Tile panel p, channel panel q of the products m [alpha_h * alpha_w, MR, NR] (position
    u * alpha_w + w) transformed (A_h^T m A_w), clamp(. + bias[o]) to [lo, hi] and
    ACTIVATION_KINDS[activation] (none where < 0) applied to the tiles in scratch, NR channels a
    vector (``finish_lanes``), and put in place, clipped at the output's edges; a_rows, a_cols:
    A_h [alpha_h, MR] and A_w [alpha_w, MR] zero-padded; ``tile`` = (nh, nw); s [alpha_w, MR, MR,
    NR] and y [nh, MR, MR, NR] scratch."""
    ah, aw = a_rows.shape[0], a_cols.shape[0]
    nh, nw = tile
    width = MR * NR
    ma, sa = m.ctypes.data, s.ctypes.data
    # s[w][r][i][c] = sum over u of A_h[u][i] m[u][w][r][c], at w * s_w + r * s_r + i * NR + c
    s_w, s_r = MR * width, width
    if ah == 1:
        sa, s_w, s_r = ma, width, NR
    else:
        winograd_axis_transform(a_rows, ma, aw, width, NR, aw * width, ah, sa)
    # y[i][r][j][c] = sum over w of A_w[w][j] s[w][r][i][c], at i * y_i + r * y_r + j * NR + c
    y_i, y_r = MR * width, width
    if aw == 1:  # s is the output tiles
        y_i, y_r = NR, s_r
    else:
        winograd_axis_transform(a_cols, sa, nh, NR, s_r, s_w, aw, y.ctypes.data)
    source = s if aw == 1 else y  # where A_w is [[1]], s is the output tiles
    o, oh, ow = out.shape
    tiles_here, channels_here = min(MR, tiles - p * MR), min(NR, o - q * NR)
    lanes = bias[q * NR:q * NR + channels_here]
    for r in range(tiles_here):
        for i in range(nh):
            for j in range(nw):
                finish_lanes(activation, source, i * y_i + r * y_r + j * NR, lanes, channels_here, lo, hi)
    for r in range(tiles_here):  # each tile's rows, its channels' pixels stored as one loop per pixel
        ty, tx = (p * MR + r) // tiles_w, (p * MR + r) % tiles_w
        columns = min(nw, ow - tx * nw)
        for i in range(min(nh, oh - ty * nh)):
            rows = out[q * NR:q * NR + channels_here, ty * nh + i, tx * nw:tx * nw + columns]
            for j in range(columns):
                src = source[i * y_i + r * y_r + j * NR:]
                for c in range(channels_here):
                    rows[c, j] = src[c]


@_gemm_region
def winograd_packed(x, xp, inner, bases, b_rows, b_cols, a_rows, a_cols, u, v, scratch, out, bias, geometry, lo, hi,
                    activation):
    """Winograd F(nh x nw, kh x kw) of one image, x [C, H, W] into out [O, OH, OW], in three
    parallel steps: x copied into the inside ``inner`` = (top, left, rows, columns) of ``xp``, its
    zero-bordered copy; every (tile panel, channel) transformed into v (``winograd_input_panel``);
    every (tile panel, channel panel) pair's alpha_h * alpha_w products by the register tile
    against the weights transformed and packed at creation u [O / NR, alpha_h * alpha_w, C, NR]
    (a pair reads one run of v and one of u),
    then transformed back with the bias, a clamp and ACTIVATION_KINDS[activation] (none where <
    0) and put in place (``winograd_output_panel``). geometry: (nh, nw, tiles,
    tiles per row, panels, weights_outer: the pairs walk channel panels outer, where u is larger
    than v, so each thread reads its part of the weights once)."""
    channels, height, width = x.shape
    top, left, rows, cols = inner
    nh, nw, tiles, tiles_w, panels, weights_outer = geometry
    plane = rows * cols
    grid = xp[:channels * plane].reshape(channels, rows, cols)
    for ci in numba.prange(channels):
        grid[ci, top:top + height, left:left + width] = x[ci]
    for i in numba.prange(panels * channels):
        winograd_input_panel(xp, v, bases, b_rows, b_cols, scratch[numba.get_thread_id()], i % channels,
                             i // channels, panels, channels, plane, cols)
    positions = b_rows.shape[0] * b_cols.shape[0]
    aw = b_cols.shape[0]
    count = u.shape[0]
    size = MR * NR
    for i in numba.prange(panels * count):
        sc = scratch[numba.get_thread_id()]
        m, s, y = sc[:positions * size], sc[positions * size:(positions + aw * MR) * size], sc[(positions + aw * MR) * size:]
        p, q = (i % panels, i // panels) if weights_outer else (i // count, i % count)
        for f in range(positions):
            cpu_tiles.tile_product(v.ctypes.data + 4 * (p * positions + f) * channels * MR, MR,
                                   u.ctypes.data + 4 * (q * positions + f) * channels * NR, NR, channels,
                                   m.ctypes.data + 4 * f * size)
        winograd_output_panel(m, s, y, a_rows, a_cols, (nh, nw), out, bias, p, q, tiles, tiles_w, lo, hi, activation)


def winograd_scratch_floats(alpha_h: int, alpha_w: int, nh: int) -> int:
    """Floats of ``winograd_packed``'s scratch row per thread."""
    return max(SQUARE * SQUARE * (MR + 1), (alpha_h * alpha_w + alpha_w * MR + nh * MR) * MR * NR)


# -- channel spans of the compiled depthwise and pooling loops ---------------------------------

#: ``cpu_jit``'s depthwise kernels on a zero-bordered plane, by the ``kind`` ``depthwise_spans``
#: takes. A kernel passed as an argument would be typed by its identity, which differs per
#: process, so Numba's disk cache would never hit and every process would spend ~1.3 s per
#: kernel compiling the region.
PLANE_KINDS = (cpu_jit.depthwise_rows, cpu_jit.depthwise3x3_s1_flat, cpu_jit.depthwise_any,
               cpu_jit.depthwise_channels_last, cpu_jit.depthwise_masked, cpu_jit.depthwise_bands)


@_region
def depthwise_spans(kind, x, w, bias, out, bounds, planes, accs, geometry, pt, pl, lo, hi, swish):
    """``cpu_jit``'s depthwise kernel PLANE_KINDS[kind] on the channel spans [bounds[i],
    bounds[i + 1]) of one image, each on its thread's scratch."""
    for i in numba.prange(bounds.shape[0] - 1):
        t = numba.get_thread_id()
        c0, c1 = bounds[i], bounds[i + 1]
        args = (x[c0:c1], w[c0:c1], bias[c0:c1], out[c0:c1], planes[t], accs[t], geometry, pt, pl, lo, hi)
        if kind == 0:
            cpu_jit.depthwise_rows(*args)
        elif kind == 1:
            cpu_jit.depthwise3x3_s1_flat(*args)
        elif kind == 2:
            cpu_jit.depthwise_any(*args)
        elif kind == 3:
            cpu_jit.depthwise_channels_last(*args)
        elif kind == 4:
            cpu_jit.depthwise_masked(*args, swish)
        else:
            cpu_jit.depthwise_bands(*args, swish)


def depthwise_region(kernel: Callable, args: tuple) -> tuple[Callable, tuple]:
    """The region running ``kernel`` on channel spans, and its arguments: ``args`` after the
    kernel's kind."""
    return depthwise_spans, (PLANE_KINDS.index(kernel), *args)


@_region
def masked_conv_rows(x, w, bias, out, bounds, geometry, pt, pl, lo, hi, swish):
    """``cpu_jit.conv_masked`` on the output row spans [bounds[i], bounds[i + 1]) of one image."""
    for i in numba.prange(bounds.shape[0] - 1):
        cpu_jit.conv_masked(x, w, bias, out, geometry, pt, pl, lo, hi, swish, bounds[i], bounds[i + 1])


@_region
def pool_spans(x, out, scale, bounds, rows, is_max, sh, sw, pt, pl):
    """``cpu_jit.pool3x3`` (a max where ``is_max``, else a mean) on the channel spans of one
    image, each on its thread's scratch row."""
    for i in numba.prange(bounds.shape[0] - 1):
        t = numba.get_thread_id()
        c0, c1 = bounds[i], bounds[i + 1]
        cpu_jit.pool3x3(x[c0:c1], out[c0:c1], scale, rows[t], is_max, sh, sw, pt, pl)


@_region
def pool_same_spans(x, out, scale, bounds, planes, is_max):
    """``cpu_jit.pool3x3_same`` (stride 1, the input's size) on the channel spans of one image,
    as flat planes [C, H W], each on its thread's scratch plane."""
    for i in numba.prange(bounds.shape[0] - 1):
        t = numba.get_thread_id()
        c0, c1 = bounds[i], bounds[i + 1]
        cpu_jit.pool3x3_same(x[c0:c1], out[c0:c1], scale, planes[t], is_max)


@_region
def row_sum_spans(a, values, index, out, bounds, width, lo, hi, product):
    """out[r * width + i] = clamp(a[r * width + i] + values[index[r]]) to [lo, hi] (times where
    ``product``) for the rows r in the spans [bounds[j], bounds[j + 1]): a value per row added along
    it (a per-channel bias over NCHW planes) or multiplying it (squeeze-excitation's scales)."""
    for j in numba.prange(bounds.shape[0] - 1):
        for r in range(bounds[j], bounds[j + 1]):
            value = values[index[r]]
            x, z = a[r * width:(r + 1) * width], out[r * width:(r + 1) * width]
            if product:
                for i in range(width):
                    z[i] = min(max(x[i] * value, lo), hi)
            else:
                for i in range(width):
                    z[i] = min(max(x[i] + value, lo), hi)


@_region
def sum_spans(a, b, out, bounds, lo, hi):
    """out[i] = clamp(a[i] + b[i]) to [lo, hi] over the spans [bounds[j], bounds[j + 1])."""
    for j in numba.prange(bounds.shape[0] - 1):
        s0, s1 = bounds[j], bounds[j + 1]
        x, y, z = a[s0:s1], b[s0:s1], out[s0:s1]
        for i in range(s1 - s0):
            z[i] = min(max(x[i] + y[i], lo), hi)


_ALONE: dict = {}


def alone(region: Callable) -> Callable:
    """``region`` compiled as a plain loop on the calling thread (its ``prange`` a ``range``,
    ``get_thread_id`` 0), for a call of one span: entering a region costs more than the smallest
    ops take. Compiled under a name of its own, so that Numba's disk cache keeps the two apart.
    The threading layer is started first: ``get_thread_id`` reads it, outside a region too."""
    if numba is None or not hasattr(region, "py_func"):
        return region
    _layer()
    twin = _ALONE.get(region)
    if twin is None:
        fn = region.py_func
        copy = types_module.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_alone", fn.__defaults__,
                                         fn.__closure__)
        copy.__qualname__ = fn.__qualname__ + "_alone"
        copy.__doc__ = fn.__doc__
        options = {key: value for key, value in region.targetoptions.items() if key not in ("parallel", "nopython")}
        try:
            twin = numba.njit(cache=cpu_jit.CACHE, **options)(copy)
        except RuntimeError:  # no writable place for Numba's cache: compile per process
            twin = numba.njit(**options)(copy)
        _ALONE[region] = twin
    return twin


def available_layer() -> str | None:
    """The threading layer the regions run on (None before ``available()`` found one)."""
    return _layer()[0]
