"""The NumPy backend: the CPU fallback and the reference semantics of every atomic op.

Executions bind NumPy views of the session's pool at creation (MNN's onCreate), pack weights
and allocate their scratch (im2col columns, padded copies) once, so that a recorded run is a
list of calls into NumPy/BLAS with ``out=`` targets and no allocation of tensors.

The kernels are dtype-generic where that is cheap (Raster, Binary, Unary on integers), because
constant folding of shape arithmetic (int64) reuses this backend.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
import time
from typing import Any, Callable

import numpy as np

from ... import atomic as A
from ..base import KERNEL_SCHEMES, Backend, BackendInfo, Execution, KernelWork, TensorHandle, constant_words, host_out, kernels_option
from ...errors import BackendOptionError, BackendUnavailableError
from ..limits import MemoryLimits, host_limits
from . import activations as cpu_activations, compiled as cpu_compiled, engines, jit as cpu_jit, parallel as cpu_parallel, reference as cpu_reference
from . import int8 as cpu_int8, int8_conv as cpu_int8_conv, int8_elementwise as cpu_int8_elementwise, rows as cpu_rows, tiles as cpu_tiles
from . import sharing as cpu_sharing
from .arena import RunStateArenas, ScratchArena
from .constants import PackedConstants, is_constant, made_once
from .elementwise import binary_function, unary_function
from .engines import Engine
from .compiled import _bounds, _region_items, _row_broadcast
from .excitation import excitation_runs
from .recurrent import cell_step, compiled_lstm_step, direction_groups, lstm_runs
from .reference import (_PaddedInput, _conv_epilogue, _conv_pads, _epilogue, _even_spans, _gemm_chunk, _on_pool, _spans,
                        _window_view, flat, strided, typed, view)
from .workers import Workers, workers
from ...numerics.sampling import resize_axis
from ...numerics.strides import contiguous_strides, merge_dims, one_run
from ..speed import host_cpu_flops


@functools.lru_cache(maxsize=1)
def _numpy_blas() -> str:
    """ "NumPy 2.4.6; BLAS scipy-openblas 0.3.31..." from NumPy's build configuration."""
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"NumPy {np.__version__}; BLAS {blas.get('name', '?')} {blas.get('version', '?')}"
    except Exception:  # noqa: BLE001 -- NumPy < 1.26 has no dicts mode: the version alone
        return f"NumPy {np.__version__}"


def _thread_count_calls(lib: Any) -> tuple[Callable[[], Any], Callable[[int], Any]]:
    """(get, set) of one threadpoolctl library controller's thread count: OpenBLAS's own C
    functions where its threads are its own pool (the usual wheel), the controller's methods
    otherwise. The C functions skip threadpoolctl's Python wrapper on every run; the limiter's
    lock plays the part of its one-controlling-thread rule."""
    if type(lib).__name__ == "OpenBLASController" and getattr(lib, "threading_layer", None) != "openmp":
        get = lib._get_symbol("openblas_get_num_threads")
        put = lib._get_symbol("openblas_set_num_threads")
        if get is not None and put is not None:
            return get, put
    return lib.get_num_threads, lib.set_num_threads


class _ThreadLimiter:
    """Limits BLAS/OpenMP threads while runs are in flight (threadpoolctl), restoring after: to
    one, as the backend's own threads share the work (``cpu_workers`` says why).

    The limit is process state, not per thread, so it is shared by every run in the process:
    the first run to enter sets it, the last to leave restores the libraries' defaults. A
    per-run set/restore would let one thread's restore lift another's limit mid-run. A library
    already at the limit (a user's ``OPENBLAS_NUM_THREADS=1``) is left alone.
    """

    _lock = threading.Lock()
    _inside = 0
    _saved: list = []  # (set call, the library's thread count before the first run entered)
    _controller: Any = None
    _calls: list = []  # (get call, set call) per library the controller found
    _probed = False

    def __init__(self, threads: int):
        self.threads = threads

    @classmethod
    def _get_controller(cls) -> Any:
        if not cls._probed:
            cls._probed = True
            try:
                from threadpoolctl import ThreadpoolController
                cls._controller = ThreadpoolController()
            except Exception:  # threadpoolctl missing or no BLAS found: run with library defaults
                cls._controller = None
            cls._calls = ([_thread_count_calls(lib) for lib in cls._controller.lib_controllers]
                          if cls._controller is not None else [])
        return cls._controller

    def __enter__(self):
        cls = type(self)
        with cls._lock:
            cls._inside += 1
            if cls._inside == 1:
                cls._get_controller()
                saved = []
                for get, put in cls._calls:
                    count = get()
                    if count is not None and count != self.threads:  # None: a library that cannot say
                        put(self.threads)
                        saved.append((put, count))
                cls._saved = saved
        return self

    def __exit__(self, *exc):
        cls = type(self)
        with cls._lock:
            cls._inside -= 1
            if cls._inside == 0:
                for put, threads in cls._saved:
                    put(threads)
                cls._saved = []


# --------------------------------------------------------------------------------------------
# One maker per atomic op: binds views and scratch, returns a KernelWork of the callables that do the work.
# A maker with several kernels asks the backend's ``engines.Engine`` once which one, and builds it.
# --------------------------------------------------------------------------------------------

def _raster_loop(op: A.Raster, ins, out: TensorHandle) -> Callable[[], None] | None:
    """The regions of ``op`` as one compiled loop (``cpu_jit.raster_regions``) on the words of the
    one buffer every source lies in and of the output's, or None where the sources lie in several
    buffers or one overlaps the output."""
    sources = {id(h.buffer) for h in ins}
    words = all(A.ITEMSIZE[h.dtype] == 4 and h.buffer.itemsize == 4 and h.buffer.flags.c_contiguous
                for h in (*ins, out))
    overlap = any(h.buffer is out.buffer and h.offset < out.offset + out.size and out.offset < h.offset + h.size
                  for h in ins)
    if len(sources) != 1 or not words or overlap or any(len(r.size) != A.RANK for r in op.regions):
        return None
    src, dst = ins[0].buffer.reshape(-1).view(np.int32), out.buffer.reshape(-1).view(np.int32)
    table = np.array([(ins[r.src].offset + r.src_offset, out.offset + r.dst_offset, *r.size, *r.src_strides,
                       *r.dst_strides) for r in op.regions], np.int64).reshape(len(op.regions), 2 + 3 * A.RANK)
    compiled = cpu_jit.bind(cpu_jit.raster_regions, src, dst, table)
    return functools.partial(compiled, src, dst, table)


def _make_raster(op: A.Raster, ins, outs, pool: Workers, engine: Engine):
    out = outs[0]
    loop = None
    if engine.raster(len(op.regions), sum(r.count for r in op.regions)).kernel == "regions_loop":
        loop = _raster_loop(op, ins, out)
    copies = [(strided(ins[r.src], r.src_offset, r.size, r.src_strides),
               strided(out, r.dst_offset, r.size, r.dst_strides)) for r in op.regions]
    out_flat = flat(out)
    fill = op.fill

    def run():
        if fill is not None:
            out_flat.fill(fill)
        for src, dst in copies:
            np.copyto(dst, src)

    def run_loop():
        if fill is not None:
            out_flat.fill(fill)
        loop()
    return KernelWork((run if loop is None else run_loop,))


def _make_unary(op: A.Unary, ins, outs, pool: Workers, engine: Engine):
    x, o = flat(ins[0]), flat(outs[0])
    compiled = cpu_activations.unary_into(op.op, op.params, x, o) if engine.jit else None  # one pass, where it has one
    if compiled is not None:
        return KernelWork((compiled,))
    fn = unary_function(op.op, op.params, o.dtype)
    return KernelWork((lambda: fn(x, o),))


def _make_binary(op: A.Binary, ins, outs, pool: Workers, engine: Engine):
    o = view(outs[0]).reshape(op.out_shape)
    a = strided(ins[0], 0, op.out_shape, op.a_strides)
    b = strided(ins[1], 0, op.out_shape, op.b_strides)
    dims = merge_dims(op.out_shape, contiguous_strides(op.out_shape), op.a_strides, op.b_strides)
    size = o.size
    kernel, parts = engine.elementwise(size, op.op in ("add", "mul") and o.dtype == a.dtype == b.dtype == np.float32
                                       and cpu_jit.clamp_of(op.activation) is not None)
    if kernel == "sum_region":  # where the operands' layout allows: dense, or a value per row (a product: per row only)
        if one_run(dims) and op.op == "add":
            return cpu_compiled._sum_region(strided(ins[0], 0, (size,), (1,)), strided(ins[1], 0, (size,), (1,)), o.reshape(size),
                               op.activation, parts)
        for dense, row_values, side in ((ins[0], ins[1], 2), (ins[1], ins[0], 1)):
            if _row_broadcast(dims, side):
                return cpu_compiled._row_sum_region(strided(dense, 0, (size,), (1,)), row_values, dims, side, o.reshape(size),
                                                    op.activation, parts, product=op.op == "mul")
    fn = binary_function(op.op, a.dtype)
    act = _epilogue(op.activation)
    if act and engine.jit:  # a compiled pass where there is one (``cpu_activations.KERNELS``), else NumPy's
        act = cpu_activations.activation_in_place(op.activation[0], act, op.activation[1])

    def run():
        fn(a, b, o)
        if act:
            act(o)
    return KernelWork((run,))


def _rows_reduced(mean: bool, x: np.ndarray, out: np.ndarray, parts: int, name: str) -> KernelWork:
    """out[r] = the mean (else the largest value) of row r of x [rows, size] (``cpu_rows``), the rows
    in ``parts`` spans on the region's threads: global pooling, and a Reduce along a tensor's last axes."""
    bounds = _bounds(_even_spans(x.shape[0], parts))
    run = _region_items(cpu_rows.mean_rows if mean else cpu_rows.max_rows, [(x, out, bounds)], None, out,
                        one_span=len(bounds) == 2)
    return KernelWork((run,), name, keep=(bounds,))


def _make_reduce(op: A.Reduce, ins, outs, pool: Workers, engine: Engine):
    x = view(ins[0]).reshape(op.outer, op.size, op.inner)
    o = view(outs[0]).reshape(op.outer, op.inner)
    if op.op in ("mean", "max") and op.inner == 1 and x.dtype == o.dtype == np.float32:
        kernel, parts = engine.rows(op.outer, op.size, True)  # a mean over the spatial axes: global pooling's rows
        if kernel == "rows_region":
            return _rows_reduced(op.op == "mean", x.reshape(op.outer, op.size), o.reshape(op.outer), parts, "rows")
    if op.op in ("argmax", "argmin"):
        found = np.empty((op.outer, op.inner), dtype=np.intp)  # NumPy's arg-reductions write intp only
        arg = np.argmax if op.op == "argmax" else np.argmin

        def run_arg():
            arg(x, axis=1, out=found)
            np.copyto(o, found, casting="unsafe")
        return KernelWork((run_arg,))
    if op.op == "mean" and o.dtype.kind != "f":
        return KernelWork((lambda: np.copyto(o, np.mean(x, axis=1), casting="unsafe"),))  # integer mean truncates
    reducer = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[op.op]
    return KernelWork((lambda: reducer(x, axis=1, out=o),))


def _make_matmul(op: A.MatMul, ins, outs, pool: Workers, engine: Engine, constants: PackedConstants | None = None):
    a_shape = (op.batch, op.k, op.m) if op.trans_a else (op.batch, op.m, op.k)
    b_shape = (op.batch, op.n, op.k) if op.trans_b else (op.batch, op.k, op.n)
    a = strided(ins[0], 0, a_shape, (op.a_batch_stride, a_shape[2], 1))
    b = strided(ins[1], 0, b_shape, (op.b_batch_stride, b_shape[2], 1))
    if op.trans_a:
        a = a.transpose(0, 2, 1)
    if op.trans_b:
        b = b.transpose(0, 2, 1)
    rows_per_bias = op.m  # output rows the bias's rows repeat over
    if op.b_batch_stride == 0 and op.batch > 1 and op.a_batch_stride == op.m * op.k and not op.trans_a:
        # shared weights: one [batch*M, K] x [K, N] GEMM instead of a loop over the batch
        a = a.reshape(1, op.batch * op.m, op.k)
        b = b[:1]
    o = view(outs[0]).reshape(a.shape[0], a.shape[1], op.n)
    bias = strided(ins[2], 0, (op.m, op.n), op.bias_strides) if op.has_bias else None
    act = _epilogue(op.activation)
    alpha, beta = op.alpha, op.beta
    vector = (a.shape[:2] == (1, 1) and a.strides[2] == 4 and alpha == 1.0 and beta == 1.0  # a vector, constant weights
              and CpuBackend.is_constant(ins[1]) and (bias is None or bias.shape[0] == 1))
    macs = a.shape[0] * a.shape[1] * op.n * op.k
    float32 = o.dtype == a.dtype == b.dtype == np.float32
    row_bias = bias is None or (op.bias_strides == (0, 1) and beta == 1.0)  # none, or one row added to every row
    plain = (float32 and alpha == 1.0 and row_bias and a.flags.c_contiguous
             and (b.flags.c_contiguous or CpuBackend.is_constant(ins[1])))
    constant_rows = (a.shape[1] if a.shape[0] == 1 and b.shape[0] == 1 and CpuBackend.is_constant(ins[1])
                     and o.flags.c_contiguous else 0)
    kernel, parts = engine.matmul(macs, float32, vector, plain, constant_rows)
    if kernel == "row_tiles_region":  # the weights packed once into the tile's panels, in whatever layout
        panels = functools.partial(made_once, constants, ins[1], ("row panels", b.shape, b.strides),
                                   lambda: cpu_tiles.pack_panels(np.ascontiguousarray(b[0].T), cpu_tiles.NR))
        return cpu_compiled._row_tiles_region(a[0], panels, o[0], None if bias is None else bias[0],
                                              not op.has_bias or CpuBackend.is_constant(ins[2]), op.activation,
                                              engine.regions, parts)
    b_base = typed(ins[1])  # the buffer b's views lie in (a GEMM region's blocks are offsets into it)
    if (not vector and b.dtype == np.float32 and b.shape[0] == 1 and not b.flags.c_contiguous
            and CpuBackend.is_constant(ins[1]) and engine.relaid_weights(a.shape[0] * a.shape[1])):
        b = made_once(constants, ins[1], ("rows", b.shape, b.strides), lambda: np.ascontiguousarray(b))
        b_base = b.reshape(-1)
    if kernel == "small_product":  # constant weights stored transposed are laid [K, N] once
        packed = b if b.flags.c_contiguous else functools.partial(
            made_once, constants, ins[1], ("rows", b.shape, b.strides), lambda: np.ascontiguousarray(b))
        return cpu_compiled._small_product(a, packed, None if bias is None else bias[0], o, op.activation)
    if kernel == "vector_region":
        return cpu_compiled._vector_product_region(op, a[0, 0], b[0], o[0, 0], bias,
                                                   not op.has_bias or CpuBackend.is_constant(ins[2]), parts,
                                                   functools.partial(made_once, constants, ins[1]))
    # blocks of the output: whole batches, else column or row spans (rows in whole repeats of the bias)
    if kernel == "gemm_region":
        blocks = _gemm_blocks(a.shape[0], a.shape[1], op.n, parts)
        bias_spec = None
        if op.has_bias:
            bias_spec = (typed(ins[2]), ins[2].offset, op.m, *op.bias_strides)
        region = cpu_compiled._gemm_region(
            (typed(ins[0]), b_base, typed(outs[0])),
            [(a[bi, m0:m1], b[0 if b.shape[0] == 1 else bi, :, n0:n1], o[bi, m0:m1, n0:n1], m0, n0)
             for bi, m0, m1, n0, n1 in _expand_batch(blocks, a.shape[0])],
            op.activation, o, alpha=alpha, bias=bias_spec, beta=beta, regions=engine.regions)
        if region is not None:
            return KernelWork((region,))
        kernel, parts = engine.without_regions().matmul(macs, True, vector)
    blocks = _gemm_blocks(a.shape[0], a.shape[1], op.n, parts, align_m=rows_per_bias if a.shape[1] != op.m else 1)
    tasks = []
    for bi, m0, m1, n0, n1 in blocks:
        ob = o[bi, m0:m1, n0:n1]
        if bias is None:
            epi = None
        else:
            bias_rows = bias[:, n0:n1] if a.shape[1] != op.m else bias[m0:m1, n0:n1]
            target = ob.reshape(-1, bias_rows.shape[0], n1 - n0)
            # the bias may be a run-time tensor: scaled on every run, into this block's scratch
            scaled = np.empty(bias_rows.shape, dtype=bias.dtype) if beta != 1.0 else None
            epi = (target, bias_rows, scaled)
        tasks.append((a[bi, m0:m1], b[bi, :, n0:n1], ob, epi))

    def chunk(k: int, slot: int) -> None:
        ab, bb, ob, epi = tasks[k]
        np.matmul(ab, bb, out=ob)
        if alpha != 1.0:
            np.multiply(ob, alpha, out=ob)
        if epi is not None:
            target, bias_rows, scaled = epi
            if scaled is not None:
                np.multiply(bias_rows, beta, out=scaled)
                bias_rows = scaled
            np.add(target, bias_rows, out=target)
        if act:
            act(ob)
    return KernelWork((_on_pool(pool, len(tasks), chunk),))


def _make_quantized_matmul(op: A.QuantizedMatMul, ins, outs, pool: Workers, engine: Engine,
                           constants: PackedConstants | None = None):
    return cpu_int8.make_quantized_matmul(op, ins, outs, engine, functools.partial(made_once, constants))


def _make_quantized_conv2d(op: A.QuantizedConv2D, ins, outs, pool: Workers, engine: Engine,
                           constants: PackedConstants | None = None):
    return cpu_int8_conv.make_quantized_conv2d(op, ins, outs, engine, functools.partial(made_once, constants))


def _make_quantized_add(op: A.QuantizedAdd, ins, outs, pool: Workers, engine: Engine):
    return cpu_int8_elementwise.make_quantized_add(op, ins, outs, pool, engine)


def _make_quantized_global_average_pool(op: A.QuantizedGlobalAveragePool, ins, outs, pool: Workers, engine: Engine):
    return cpu_int8_elementwise.make_quantized_global_average_pool(op, ins, outs, engine)


def _make_quantize(op: A.Quantize, ins, outs, pool: Workers, engine: Engine):
    return cpu_int8_elementwise.make_quantize(op, ins, outs, pool, engine)


def _gemm_blocks(batch: int, m: int, n: int, threads: int, align_m: int = 1) -> list[tuple[int | slice, int, int, int, int]]:
    """(batch index, m0, m1, n0, n1) blocks of a batched [m, k] x [k, n] product for ``threads``
    (``Engine.gemm``): whole products while there are enough of them, else the longer side of each
    cut into spans (rows in multiples of ``align_m``); for one thread (a product too small to share),
    one block, the whole batch (index ``slice(None)``: one batched call): the transformer's attention
    products ran faster as one call than as a block per head handed to the threads."""
    if threads == 1:
        return [(slice(None), 0, m, 0, n)]
    parts = max(1, -(-threads * engines.CHUNKS_PER_THREAD // batch))
    if parts == 1:
        return [(bi, 0, m, 0, n) for bi in range(batch)]
    if n >= m or m // align_m < 2:
        return [(bi, 0, m, n0, n1) for bi in range(batch) for n0, n1 in _spans(n, parts, 16)]
    return [(bi, m0, m1, 0, n) for bi in range(batch) for m0, m1 in _spans(m, parts, align_m if align_m > 1 else 8)]


def _expand_batch(blocks: list[tuple[int | slice, int, int, int, int]], batch: int) -> list[tuple[int, int, int, int, int]]:
    """``_gemm_blocks``'s blocks with a whole-batch block written out as one block per product."""
    return [(bi, m0, m1, n0, n1) for index, m0, m1, n0, n1 in blocks
            for bi in (range(batch) if isinstance(index, slice) else (index,))]


def _make_conv2d(op: A.Conv2D, ins, outs, pool: Workers, engine: Engine, constants: PackedConstants | None = None,
                 arena: ScratchArena | None = None):
    if op.has_residual:
        return _with_residual(op, ins, outs, pool, engine, constants, arena)
    n, c, oc, g = op.batch, op.in_channels, op.out_channels, op.groups
    (h, w), (oh, ow), (kh, kw) = op.in_hw, op.out_hw, op.kernel
    x = view(ins[0]).reshape(n, c, h, w)
    weight = view(ins[1]).reshape(oc, c // g, kh, kw)  # views, not copies: W may be a run-time tensor
    out = view(outs[0]).reshape(n, oc, oh * ow)
    bias = view(ins[2]).reshape(oc, 1) if op.has_bias else None
    pads = _conv_pads(op)
    once = functools.partial(made_once, constants, ins[1])  # the weights in a kernel's layout, packed once
    # op.scheme (decided by gpumnn.scheduler.schemes, which checked the geometry fits) names the kernel family
    kernel, parts = engine.conv(op, CpuBackend.is_constant(ins[1]))
    jit, regions = engine.jit, engine.regions

    if kernel == "small_product":  # one pixel: x [N, C] @ W^T [C, OC], the weights laid so once
        rows, bias1, activation = cpu_compiled.one_pixel_operands(
            op, weight, bias, not op.has_bias or CpuBackend.is_constant(ins[2]), once)
        return cpu_compiled._small_product(x.reshape(1, n, c), rows[None], bias1, out.reshape(1, n, oc), activation)
    if kernel == "winograd_region":
        return cpu_compiled._winograd_region(op, x, weight.reshape(oc, c, kh, kw), out, bias, regions, once, arena)
    if kernel == "winograd":
        return cpu_reference._winograd(op, x, weight.reshape(oc, c, kh, kw), out, bias, pads, pool, parts, jit, once)
    if kernel == "masked_region" and weight.flags.c_contiguous and x.strides[-1] == 4:
        return cpu_compiled._masked_conv_region(op, x, weight, out, bias, regions, parts)
    if kernel == "masked_region":  # a layout it does not read in place
        kernel, parts = "im2col_region", regions if parts > 1 else 1
    if kernel in ("depthwise_region", "depthwise_compiled"):
        constant = CpuBackend.is_constant(ins[1]) and (not op.has_bias or CpuBackend.is_constant(ins[2]))
        return cpu_compiled._depthwise_compiled(op, x, weight, out, bias, pool, parts,
                                                regions if kernel == "depthwise_region" else 0, constant)
    if kernel == "depthwise":
        return cpu_reference._depthwise(op, x, weight, out, pads, _conv_epilogue(op, out, bias, jit), pool, parts)
    cg, ocg = c // g, oc // g
    k = cg * kh * kw
    w_packed = weight.reshape(g, ocg, k)
    if kernel == "pointwise_region" and x.dtype == np.float32 and x.flags.c_contiguous and out.flags.c_contiguous:
        return cpu_compiled._pointwise_region(op, x.reshape(n, c, h * w), w_packed[0], out, bias,
                                              not op.has_bias or CpuBackend.is_constant(ins[2]), regions, parts, once)
    if kernel == "pointwise_region":  # a layout the tiles do not take: BLAS's blocks
        kernel, parts = "gemm1x1_region", engine.gemm(ocg * h * w * cg, region=True)
    if kernel == "gemm1x1_region":  # 1x1 convolution is a GEMM on the input as it lies
        xs = x.reshape(n, g, cg, h * w)
        region = cpu_compiled._gemm_region(
            (typed(ins[1]), typed(ins[0]), typed(outs[0])),
            [(w_packed[gi, m0:m1], xs[b, gi, :, n0:n1], out[b, gi * ocg + m0:gi * ocg + m1, n0:n1], gi * ocg + m0, n0)
             for b in range(n) for gi in range(g) for _, m0, m1, n0, n1 in _gemm_blocks(1, ocg, h * w, parts)],
            op.activation, out, bias=(typed(ins[2]), ins[2].offset, oc, 1, 0) if op.has_bias else None,
            regions=engine.regions)
        if region is not None:
            return KernelWork((region,), "gemm1x1")
        kernel, parts = engine.without_regions().conv(op, False)
    finish = _conv_epilogue(op, out, bias, jit)
    if kernel == "gemm1x1":
        xs = x.reshape(n, g, cg, h * w)
        tasks = [(w_packed[gi, m0:m1], xs[b, gi, :, n0:n1], out[b, gi * ocg + m0:gi * ocg + m1, n0:n1],
                  (b, gi * ocg + m0, gi * ocg + m1, n0, n1))
                 for b in range(n) for gi in range(g) for _, m0, m1, n0, n1 in _gemm_blocks(1, ocg, h * w, parts)]
        return KernelWork((_on_pool(pool, len(tasks), _gemm_chunk(tasks, finish)),), "gemm1x1")
    if kernel == "direct_region" and x.dtype == np.float32 and x.flags.c_contiguous and out.flags.c_contiguous:
        return cpu_compiled._direct_region(op, x, weight, out, bias, not op.has_bias or CpuBackend.is_constant(ins[2]),
                                           regions, parts)
    if kernel == "direct_region":  # a layout the direct kernel does not take
        kernel, parts = "im2col_region", engine.shared(op.macs(), engines.REGION_MIN_MACS)  # as Engine.conv would
    if kernel == "tapped_region" and x.dtype == np.float32 and x.flags.c_contiguous and out.flags.c_contiguous:
        return cpu_compiled._tapped_conv_region(op, x, w_packed[0], out, bias,
                                                not op.has_bias or CpuBackend.is_constant(ins[2]), regions, parts, once)
    if kernel == "tapped_region":  # a layout the tiles do not take: im2col's copy and BLAS
        kernel = "im2col_region"
    if kernel == "packed_region":
        width = cpu_tiles.IN_PLACE_COLUMNS if engines.packed_in_place(op) else cpu_tiles.NR
        panels = once(("panels", width, w_packed.shape), lambda: cpu_tiles.pack_panels(w_packed[0], width))
        return cpu_compiled._packed_conv_region(op, x, panels, out, bias,
                                                not op.has_bias or CpuBackend.is_constant(ins[2]), regions, parts, arena)
    if kernel == "im2col_region":
        return cpu_compiled._im2col_region(op, x, w_packed[0], out, bias, regions, parts, arena)
    padded = _PaddedInput(x, pads, 0.0, (0, 0))
    windows = _window_view(padded.buf, op.kernel, op.strides, op.dilations, op.out_hw)  # [n, c, kh, kw, oh, ow]
    if kernel == "im2col_rows":
        # row blocks, each copying its own im2col columns into the thread's scratch and
        # multiplying them while they are in cache
        rows = max(1, min(engines.CHUNK_BYTES // (4 * k * ow), -(-oh // parts)))
        scratch = [np.empty(k * rows * ow, dtype=np.float32) for _ in range(pool.threads)]
        tasks = [(windows[b, gi * cg:(gi + 1) * cg, :, :, r0:r1], w_packed[gi],
                  out[b, gi * ocg:(gi + 1) * ocg, r0 * ow:r1 * ow], (b, gi * ocg, (gi + 1) * ocg, r0 * ow, r1 * ow))
                 for b in range(n) for gi in range(g) for r0, r1 in _spans(oh, -(-oh // rows))]

        def row_block(index: int, slot: int) -> None:
            src, wg, dst, block = tasks[index]
            cols = scratch[slot][:src.size]
            np.copyto(cols.reshape(src.shape), src)
            np.matmul(wg, cols.reshape(k, -1), out=dst)
            finish(*block)
        run_rows = _on_pool(pool, len(tasks), row_block)

        def run_row_blocks():
            padded.refresh()
            run_rows()
        return KernelWork((run_row_blocks,), "im2col")

    # fewer output pixels than channels: the columns once (channel spans in parallel), then row
    # spans of the weights against all of them
    cols = np.empty((c, kh, kw, oh, ow), dtype=np.float32)
    cols2 = cols.reshape(g, k, oh * ow)
    copy_runs = [_on_pool(pool, len(pairs), lambda i, slot, pairs=pairs: np.copyto(*pairs[i]))
                 for pairs in ([(cols[c0:c1], windows[b, c0:c1]) for c0, c1 in _spans(c, parts)] for b in range(n))]
    gemms = [[(w_packed[gi, m0:m1], cols2[gi], out[b, gi * ocg + m0:gi * ocg + m1], (b, gi * ocg + m0, gi * ocg + m1, 0, oh * ow))
              for gi in range(g)
              for _, m0, m1, _, _ in _gemm_blocks(1, ocg, oh * ow, engine.gemm(ocg * oh * ow * k, region=False))]
             for b in range(n)]
    gemm_runs = [_on_pool(pool, len(tasks), _gemm_chunk(tasks, finish)) for tasks in gemms]

    def run_im2col():
        padded.refresh()
        for copy, gemm in zip(copy_runs, gemm_runs):
            copy()
            gemm()
    return KernelWork((run_im2col,), "im2col")


def _with_residual(op: A.Conv2D, ins, outs, pool: Workers, engine: Engine, constants: PackedConstants | None,
                   arena: ScratchArena | None = None):
    """A convolution with a residual: every engine's kernel for the convolution with its bias,
    then the residual added and the activation applied in place over the output, in the same
    work (the contract's order: bias, residual, activation)."""
    inner = _make_conv2d(dataclasses.replace(op, inputs=op.inputs[:-1], has_residual=False, activation=None),
                         ins[:-1], outs, pool, engine, constants, arena)
    out, residual, act = view(outs[0]).reshape(-1), view(ins[-1]).reshape(-1), _epilogue(op.activation)

    def add_residual() -> None:
        np.add(out, residual, out=out)
        if act is not None:
            act(out)
    return dataclasses.replace(inner, work=tuple(inner.work) + (add_residual,))


def _make_conv_transpose2d(op: A.ConvTranspose2D, ins, outs, pool: Workers):
    n, c, oc, g = op.batch, op.in_channels, op.out_channels, op.groups
    (h, w), (oh, ow), (kh, kw) = op.in_hw, op.out_hw, op.kernel
    (sh, sw), (dh, dw), (top, left) = op.strides, op.dilations, op.pads
    cg, ocg = c // g, oc // g
    x = view(ins[0]).reshape(n, g, cg, h * w)
    weight = view(ins[1]).reshape(g, cg, ocg * kh * kw)
    w_t = weight.transpose(0, 2, 1)  # [g, ocg*kh*kw, cg]; a view (BLAS reads it transposed): W may be a run-time tensor
    out = view(outs[0]).reshape(n, oc, oh, ow)
    bias = view(ins[2]).reshape(1, oc, 1, 1) if op.has_bias else None
    full_h = max((h - 1) * sh + (kh - 1) * dh + 1, top + oh)
    full_w = max((w - 1) * sw + (kw - 1) * dw + 1, left + ow)
    full = np.zeros((n, oc, full_h, full_w), dtype=np.float32)
    cols = np.empty((g, ocg, kh, kw, h, w), dtype=np.float32)
    cols2 = cols.reshape(g, ocg * kh * kw, h * w)
    act = _epilogue(op.activation)

    def run():
        full.fill(0.0)
        for b in range(n):
            for gi in range(g):
                np.matmul(w_t[gi], x[b, gi], out=cols2[gi])
            target = full[b].reshape(g, ocg, full_h, full_w)
            for i in range(kh):
                for j in range(kw):
                    target[:, :, i * dh:i * dh + (h - 1) * sh + 1:sh, j * dw:j * dw + (w - 1) * sw + 1:sw] += cols[:, :, i, j]
        np.copyto(out, full[:, :, top:top + oh, left:left + ow])
        if bias is not None:
            np.add(out, bias, out=out)
        if act:
            act(out)
    return KernelWork((run,))


def _make_pool2d(op: A.Pool2D, ins, outs, pool: Workers, engine: Engine):
    n, c = op.batch, op.channels
    (h, w), (oh, ow), (kh, kw), (sh, sw) = op.in_hw, op.out_hw, op.kernel, op.strides
    x = view(ins[0]).reshape(n, c, h, w)
    out = view(outs[0]).reshape(n, c, oh, ow)
    kernel, parts = engine.pool(op, x.dtype == np.float32, x.dtype.itemsize == 1)
    if kernel == "max_bytes":
        return cpu_int8_elementwise.make_max_pool_bytes(op, ins, outs, pool, parts)
    if kernel in ("mean_rows_region", "max_rows_region", "global"):  # global pooling
        x3, o3 = x.reshape(n, c, h * w), out.reshape(n, c)
        if kernel in ("mean_rows_region", "max_rows_region"):
            return _rows_reduced(kernel == "mean_rows_region", x3.reshape(n * c, h * w), o3.reshape(n * c), parts,
                                 "global")
        reducer = np.max if op.op == "max" else np.mean
        return KernelWork((lambda: reducer(x3, axis=2, out=o3),), "global")
    top, left, bottom, right = op.pads
    inv_count = None
    if op.op != "max":
        starts_h = np.arange(oh) * sh - top
        starts_w = np.arange(ow) * sw - left
        if op.count_include_pad:
            lo_h, hi_h, lo_w, hi_w = -top, h + bottom, -left, w + right
        else:
            lo_h, hi_h, lo_w, hi_w = 0, h, 0, w
        count_h = np.minimum(starts_h + kh, hi_h) - np.maximum(starts_h, lo_h)
        count_w = np.minimum(starts_w + kw, hi_w) - np.maximum(starts_w, lo_w)
        inv_count = (1.0 / np.maximum(np.outer(count_h, count_w), 1)).astype(np.float32)
    if kernel == "pool_tiles":  # the windows tile the input: one compiled pass, no padded copy
        x3, o3 = x.reshape(n * c, h, w), out.reshape(n * c, oh, ow)
        args = (x3, o3, op.op == "max", np.int64(kh), np.int64(kw), np.float32(1.0 / (kh * kw)))
        compiled = cpu_jit.bind(cpu_jit.pool_tiles, *args)
        return KernelWork((functools.partial(compiled, *args),), "tiles")
    if kernel in ("pool3x3_region", "pool3x3"):
        return cpu_compiled._pool_compiled(op, x, out, inv_count, pool, parts, engine.regions)
    extent = ((oh - 1) * sh + kh, (ow - 1) * sw + kw)
    border = (np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf) if op.op == "max" else 0.0
    padded = _PaddedInput(x, op.pads, border, extent)
    reduce_windows = cpu_reference._separable_windows(padded.buf, op.kernel, op.strides, out, np.maximum if op.op == "max" else np.add)
    if op.op == "max":
        def run_max():
            padded.refresh()
            reduce_windows()
        return KernelWork((run_max,))

    def run_avg():
        padded.refresh()
        reduce_windows()
        np.multiply(out, inv_count, out=out)
    return KernelWork((run_avg,))


def _make_softmax(op: A.Softmax, ins, outs, pool: Workers, engine: Engine):
    x = view(ins[0]).reshape(op.outer, op.size, op.inner)
    o = view(outs[0]).reshape(op.outer, op.size, op.inner)
    kernel, parts = engine.rows(op.outer, op.size, op.inner == 1 and o.dtype == x.dtype == np.float32)
    if kernel == "rows_region":  # along the last axis: rows
        bounds = _bounds(_even_spans(op.outer, parts))
        args = (x.reshape(op.outer, op.size), o.reshape(op.outer, op.size), bounds, op.log)
        return KernelWork((_region_items(cpu_rows.softmax_rows, [args], None, o, one_span=len(bounds) == 2),),
                          keep=(bounds,))
    peak = np.empty((op.outer, 1, op.inner), dtype=np.float32)
    total = np.empty_like(peak)

    def run():
        np.max(x, axis=1, keepdims=True, out=peak)
        np.subtract(x, peak, out=o)
        if op.log:
            np.sum(np.exp(o), axis=1, keepdims=True, out=total)
            np.subtract(o, np.log(total), out=o)
        else:
            np.exp(o, out=o)
            np.sum(o, axis=1, keepdims=True, out=total)
            np.divide(o, total, out=o)
    return KernelWork((run,))


def _make_normalize(op: A.Normalize, ins, outs, pool: Workers, engine: Engine):
    x = view(ins[0]).reshape(op.outer, op.size)
    o = view(outs[0]).reshape(op.outer, op.size)
    scale = view(ins[1]).reshape(1, op.size) if op.has_affine else None
    shift = view(ins[2]).reshape(1, op.size) if op.has_affine else None
    kernel, parts = engine.rows(op.outer, op.size, o.dtype == x.dtype == np.float32)
    if kernel == "rows_region":
        bounds = _bounds(_even_spans(op.outer, parts))
        unit = np.ones(1, np.float32)  # stands for scale and shift without an affine step (never read)
        args = (x, o, unit if scale is None else scale[0], unit if shift is None else shift[0], np.float32(op.eps),
                op.has_affine, bounds)
        return KernelWork((_region_items(cpu_rows.normalize_rows, [args], None, o, one_span=len(bounds) == 2),),
                          keep=(bounds, unit))
    mean = np.empty((op.outer, 1), dtype=np.float32)
    var = np.empty_like(mean)

    def run():
        np.mean(x, axis=1, keepdims=True, out=mean)
        np.subtract(x, mean, out=o)
        np.mean(np.square(o), axis=1, keepdims=True, out=var)
        np.add(var, op.eps, out=var)
        np.sqrt(var, out=var)
        np.divide(o, var, out=o)
        if scale is not None:
            np.multiply(o, scale, out=o)
            np.add(o, shift, out=o)
    return KernelWork((run,))


def _make_resize(op: A.Resize, ins, outs, pool: Workers, engine: Engine):
    (h, w), (oh, ow) = op.in_hw, op.out_hw
    x = view(ins[0]).reshape(op.planes, h, w)
    out = view(outs[0]).reshape(op.planes, oh, ow)
    rows, cols = resize_axis(op, 0), resize_axis(op, 1)
    kernel, parts = engine.resize(op.planes * oh * ow)
    if kernel == "compiled":
        if op.mode == "nearest":
            kernel_fn, sampling = cpu_jit.resize_nearest, (rows.lo, cols.lo)
        else:
            kernel_fn, sampling = cpu_jit.resize_linear, (rows.lo, rows.hi, rows.frac, cols.lo, cols.hi, cols.frac)
        spans = _even_spans(op.planes, parts)
        calls = [(x[a:b], *sampling, out[a:b]) for a, b in spans]
        compiled = cpu_jit.bind(kernel_fn, *calls[0])
        return KernelWork((_on_pool(pool, len(calls), lambda k, slot: compiled(*calls[k])),))
    if op.mode == "nearest":
        picked = np.empty((op.planes, oh, w), dtype=np.float32)

        def run_nearest():
            np.take(x, rows.lo, axis=1, out=picked)
            np.take(picked, cols.lo, axis=2, out=out)
        return KernelWork((run_nearest,))
    fh, fw = rows.frac.reshape(1, oh, 1), cols.frac.reshape(1, 1, ow)

    def run_linear():
        top = x[:, rows.lo][:, :, cols.lo] * (1 - fw) + x[:, rows.lo][:, :, cols.hi] * fw
        bottom = x[:, rows.hi][:, :, cols.lo] * (1 - fw) + x[:, rows.hi][:, :, cols.hi] * fw
        np.copyto(out, top * (1 - fh) + bottom * fh)
    return KernelWork((run_linear,))


def _make_gather(op: A.Gather, ins, outs, pool: Workers, engine: Engine):
    data = view(ins[0]).reshape(op.outer, op.axis, op.inner)
    idx_f = flat(ins[1])
    out = view(outs[0]).reshape(op.outer, op.count, op.inner)
    if engine.jit and op.axis > 0 and idx_f.dtype.kind in "iu" and data.dtype == out.dtype:
        args = (data, idx_f, out)
        compiled = cpu_jit.bind(cpu_jit.gather_rows, *args)
        return KernelWork((functools.partial(compiled, *args),))

    def run():
        idx = idx_f.astype(np.int64)
        idx[idx < 0] += op.axis
        np.clip(idx, 0, op.axis - 1, out=idx)  # the contract: out-of-range indices clamp
        np.take(data, idx, axis=1, out=out)
    return KernelWork((run,))


def _make_select(op: A.Select, ins, outs, pool: Workers):
    o = view(outs[0]).reshape(op.out_shape)
    cond = strided(ins[0], 0, op.out_shape, op.c_strides)
    a = strided(ins[1], 0, op.out_shape, op.a_strides)
    b = strided(ins[2], 0, op.out_shape, op.b_strides)
    mask = np.empty(op.out_shape, dtype=bool)

    def run():
        np.not_equal(cond, 0, out=mask)
        np.copyto(o, b)
        np.copyto(o, a, where=mask)
    return KernelWork((run,))


def _make_cumsum(op: A.CumSum, ins, outs, pool: Workers):
    x = view(ins[0]).reshape(op.outer, op.size, op.inner)
    o = view(outs[0]).reshape(op.outer, op.size, op.inner)
    if op.reverse:  # the same running sum over reversed views
        x, o = x[:, ::-1], o[:, ::-1]
    if not op.exclusive:
        return KernelWork((lambda: np.cumsum(x, axis=1, out=o),))

    def run_exclusive():
        o[:, :1] = 0
        np.cumsum(x[:, :-1], axis=1, out=o[:, 1:])
    return KernelWork((run_exclusive,))


def _make_topk(op: A.TopK, ins, outs, pool: Workers):
    x = view(ins[0]).reshape(op.outer, op.size, op.inner)
    o = view(outs[0]).reshape(op.outer, op.k, op.inner)

    def run():
        keys = x.astype(np.float64) if x.dtype.kind != "f" else x
        order = np.argsort(-keys if op.largest else keys, axis=1, kind="stable")  # ties: lower index first
        np.copyto(o, order[:, :op.k], casting="unsafe")
    return KernelWork((run,))


def _make_scatter(op: A.Scatter, ins, outs, pool: Workers):
    data = view(ins[0]).reshape(op.rows, op.inner)
    index = flat(ins[1])
    updates = view(ins[2]).reshape(op.count, op.inner)
    out = view(outs[0]).reshape(op.rows, op.inner)
    combine = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}.get(op.reduction)

    def run():
        rows = index.astype(np.int64)
        rows[rows < 0] += op.rows
        np.clip(rows, 0, op.rows - 1, out=rows)  # the contract: out-of-range rows clamp
        np.copyto(out, data)
        if combine is None:
            out[rows] = updates
        else:
            combine.at(out, rows, updates)
    return KernelWork((run,))


def _make_recurrent_cell(op: A.RecurrentCell, ins, outs, pool: Workers, engine: Engine):
    """One LSTM/GRU/RNN step (``cpu_recurrent.cell_step``) on views of the pools: the projection's
    step slices are one strided view (the directions' offsets apart), so nothing is copied in.
    With ``jit``, the usual LSTM step is one compiled pass (``cpu_recurrent.compiled_lstm_step``)."""
    d, b, h, g = op.directions, op.batch, op.hidden, op.gate_blocks
    roles = dict(zip(op.input_roles(), ins))
    if engine.jit:
        compiled = compiled_lstm_step(op, flat(roles["gates"]), typed(roles["projection"])[roles["projection"].offset:],
                                      flat(roles["state"]), flat(outs[0]))
        if compiled is not None:
            return KernelWork((compiled,))
    gates = view(roles["gates"]).reshape(d, b, g, h)
    x0 = op.x_offsets[0]
    x = strided(roles["projection"], x0, (d, b, A.CELLS[op.cell][0], h),
                (op.x_offsets[-1] - x0, op.x_row_stride, h, 1))
    state = view(roles["state"]).reshape(op.state_blocks, d, b, h)
    shapes = {"candidate": (d, b, h), "recurrent_bias": (d, 1, h), "peephole": (d, 1, 3, h), "lengths": (b,)}
    extra = {role: view(roles[role]).reshape(shape) for role, shape in shapes.items() if role in roles}
    out = view(outs[0]).reshape(op.output_blocks, d, b, h)
    groups = direction_groups(op)
    return KernelWork((lambda: cell_step(op, groups, gates, x, state, extra, out),))


_ANY_INT = frozenset({A.INT32})
#: makers with a compiled or region kernel for some of their ops: they ask the backend's ``Engine`` which
_ENGINE_AWARE = frozenset({_make_raster, _make_unary, _make_reduce, _make_conv2d, _make_pool2d, _make_matmul, _make_quantized_matmul,
                           _make_quantized_conv2d, _make_quantized_add, _make_quantized_global_average_pool,
                           _make_quantize, _make_binary,
                           _make_softmax, _make_normalize, _make_recurrent_cell, _make_gather, _make_resize})
#: makers whose kernels take their scratch from the run state's arena (``cpu_arena``)
_TAKES_ARENA = frozenset({_make_conv2d})
#: makers that pack constant weights (shared between run states: ``cpu_constants``)
_PACKS_CONSTANTS = frozenset({_make_conv2d, _make_matmul, _make_quantized_matmul, _make_quantized_conv2d})
_MAKERS = {
    A.Raster: _make_raster, A.Unary: _make_unary, A.Binary: _make_binary, A.Reduce: _make_reduce,
    A.MatMul: _make_matmul, A.QuantizedMatMul: _make_quantized_matmul, A.QuantizedConv2D: _make_quantized_conv2d,
    A.QuantizedAdd: _make_quantized_add, A.QuantizedGlobalAveragePool: _make_quantized_global_average_pool,
    A.Quantize: _make_quantize,
    A.Conv2D: _make_conv2d, A.ConvTranspose2D: _make_conv_transpose2d,
    A.Pool2D: _make_pool2d, A.Softmax: _make_softmax, A.Normalize: _make_normalize,
    A.Resize: _make_resize, A.Gather: _make_gather, A.Select: _make_select, A.CumSum: _make_cumsum,
    A.TopK: _make_topk, A.Scatter: _make_scatter, A.RecurrentCell: _make_recurrent_cell,
}


class CpuBackend(Backend):
    """NumPy on the host CPU on ``threads`` threads (default: all cores): the backend's own
    (``cpu_workers``) share each large op's chunks, BLAS runs one thread inside each chunk."""

    name = "cpu"
    device_arrays_unsupported = ("its tensors are NumPy arrays in host memory; a CPU DLPack tensor is taken as a "
                                 "host array, a GPU tensor must be copied to the host first (tensor.cpu(), "
                                 "cupy.asnumpy) or run on the cuda backend")
    #: runs on distinct run states touch distinct buffers; they share read-only weights and the
    #: process-wide BLAS thread limit (``_ThreadLimiter``)
    max_concurrent_runs = 2
    alignment = 64
    kernel_table = _MAKERS
    int4_weights = True
    int8_channels_last = True
    schemes = {**KERNEL_SCHEMES, A.Conv2D: KERNEL_SCHEMES[A.Conv2D] | {"winograd"}}
    residual_schemes = {A.Conv2D: schemes[A.Conv2D]}
    #: NumPy computes every integer op; float-only kernels (convolution, pooling, ...) stay float32;
    #: the element-moving ops and the Unary conversion also take the narrow dtypes; a prequantized
    #: QuantizedMatMul reads uint8, QuantizedConv2D, QuantizedAdd and QuantizedGlobalAveragePool uint8
    #: and int8, Quantize writes them, and max pooling compares int8 and uint8 elements too
    dtypes = {**{op: _ANY_INT for op in (A.Raster, A.Unary, A.Binary, A.Reduce, A.MatMul, A.Gather, A.Select,
                                         A.CumSum, A.TopK, A.Scatter, A.Pool2D)},
              **{op: _ANY_INT | A.NARROW_DTYPES for op in (A.Raster, A.Unary, A.Gather, A.Select, A.Scatter)},
              A.QuantizedMatMul: frozenset({A.UINT8}), A.QuantizedConv2D: frozenset({A.UINT8, A.INT8}),
              A.QuantizedAdd: frozenset({A.UINT8, A.INT8}),
              A.QuantizedGlobalAveragePool: frozenset({A.UINT8, A.INT8}), A.Quantize: frozenset({A.UINT8, A.INT8}),
              A.Pool2D: _ANY_INT | {A.UINT8, A.INT8}}
    winograd_min_tiles, winograd_min_channels, winograd_min_saving = engines.WINOGRAD_PAYS["threads"]
    winograd_per_image = True  # both Winograd kernels go image by image: a batch has no more tiles per product

    @property
    def default_concurrent_runs(self) -> int:
        """Overlap only where one run leaves cores idle (``threads`` below the core count):
        on 2 cores with threads=2, two overlapping runs were slower than turns (bench/RESULTS.md)."""
        return max(1, min(self.max_concurrent_runs, (os.cpu_count() or 1) // self.threads))

    def __init__(self, threads: int | None = None, kernels: str | None = None, jit: bool | None = None,
                 regions: bool | None = None, **unknown: Any):
        """``threads``: threads per run (default: all cores). ``kernels``: the option every backend
        takes (``base.KERNEL_FAMILIES``), checked only: NumPy has one family. ``jit``: the compiled
        loops of ``cpu_jit`` for the memory-bound ops (None: where Numba is installed; False: NumPy
        only, the reference they are tested against; True: an error where Numba is missing).
        ``regions``: with the compiled loops, GEMMs, im2col, Winograd and depthwise convolutions and
        pooling as ``cpu_parallel``'s native regions instead of on ``cpu_workers``' Python threads,
        on one thread too, where each op runs its region's kernel on the calling thread rather than
        NumPy's (None: where available; False: never; True: an error where they are not available,
        saying why)."""
        super().__init__(**unknown)
        kernels_option(kernels, self.name)
        if jit not in (None, True, False):
            raise BackendOptionError(f"backend 'cpu': jit={jit!r} is not one of None, True, False")
        if jit and not cpu_jit.available():
            raise BackendUnavailableError(f"backend 'cpu': jit=True, but {cpu_jit.MISSING}")
        self.jit = cpu_jit.available() if jit is None else bool(jit)
        if regions not in (None, True, False):
            raise BackendOptionError(f"backend 'cpu': regions={regions!r} is not one of None, True, False")
        self.threads = threads or os.cpu_count() or 1
        self.regions = 0  # threads of cpu_parallel's native regions (0: none)
        self._packed = PackedConstants()  # constant weights packed once, for every run state
        self.arenas = RunStateArenas()  # scratch shared by the ops of one run state, one arena per state
        if regions is not False and self.jit:
            ok, why = cpu_parallel.available()
            if ok:
                self.regions = cpu_parallel.threads_for(self.threads)
            elif regions:
                raise BackendUnavailableError(f"backend 'cpu': regions=True, but {why}")
        elif regions and not self.jit:
            raise BackendOptionError("backend 'cpu': regions=True needs the compiled loops (jit); here jit=False")
        loops = f" and Numba {cpu_jit.numba.__version__}" if self.jit else ""
        if self.regions:
            loops += f" ({cpu_parallel.available_layer()} regions)"
        self.engine = Engine(self.jit, self.regions, self.threads)
        # the scheme step reads these: Winograd pays sooner on the register tile
        self.winograd_min_tiles, self.winograd_min_channels, self.winograd_min_saving = self.engine.winograd_pays()
        self.winograd_transform_tiles = self.engine.winograd_transform_tiles()
        self._info = BackendInfo("cpu", f"NumPy {np.__version__}{loops} on {self.threads} thread(s)",
                                 host_cpu_flops(self.threads), 0.0, float("inf"), is_gpu=False)
        self._pool = workers(self.threads)
        self._limiter = _ThreadLimiter(1)
        # a run's regions use self.regions threads (Numba keeps the count per calling thread)
        self._region_threads = (cpu_parallel.RegionThreads(self.regions) if self.regions
                                else contextlib.nullcontext())
        # a recording's one-thread way (``cpu_sharing``) runs its regions on one thread
        self._solo_threads = cpu_parallel.RegionThreads(1) if self.regions else contextlib.nullcontext()

    @property
    def driver(self) -> str:
        """NumPy's version and the BLAS it was built with (what runs its matrix products)."""
        return _numpy_blas()

    # -- memory ----------------------------------------------------------------------------
    def memory_limits(self) -> MemoryLimits:
        return host_limits(copies_constants=False)  # constant() keeps a view of the host array

    def _new_buffer(self, nbytes: int, kind: str, **how: Any) -> np.ndarray:
        return np.zeros(max(1, (nbytes + 3) // 4), dtype=np.float32)

    def constant(self, array: np.ndarray) -> TensorHandle:
        data, dtype = constant_words(array)
        data = data.view()  # read-only: what marks a constant (``is_constant``), and guards it
        data.flags.writeable = False
        return TensorHandle(data, 0, tuple(array.shape), dtype)

    @staticmethod
    def is_constant(handle: TensorHandle) -> bool:
        """True when ``handle`` lives in a buffer from ``constant`` (its contents never change),
        so kernels may pack it once at creation instead of on every run (``constants.is_constant``)."""
        return is_constant(handle)

    def write(self, handle: TensorHandle, array: np.ndarray) -> None:
        flat(handle)[...] = np.asarray(array).reshape(-1)

    def read(self, handle: TensorHandle) -> np.ndarray:
        return view(handle).copy()

    def read_into(self, handle: TensorHandle, out: np.ndarray) -> None:
        np.copyto(host_out(handle, out), flat(handle))

    def host_view(self, handle: TensorHandle) -> np.ndarray:
        return view(handle)  # the pool is host memory: other backends copy straight into it

    # -- pre-inference ---------------------------------------------------------------------
    def _create_execution(self, op: A.AtomicOp, inputs: list[TensorHandle],
                          outputs: list[TensorHandle], engine: Engine | None = None) -> Execution:
        """``engine``: what to plan the op's kernel for (default: this backend's; a recording's
        one-thread way passes ``solo_engine``)."""
        if outputs and all(o.size == 0 for o in outputs):  # nothing to compute (NumPy refuses empty reductions)
            return Execution(op, inputs, outputs, KernelWork((), "empty"))
        maker = _MAKERS[type(op)]
        packs = {"constants": self._packed} if maker in _PACKS_CONSTANTS else {}
        if maker in _TAKES_ARENA and outputs:
            packs["arena"] = self.arenas.of(outputs[0].buffer)  # the run state's: its tensors' pool
        if maker in _ENGINE_AWARE:
            engine = engine or self.engine
            return Execution(op, inputs, outputs, maker(op, inputs, outputs, self._pool, engine=engine, **packs))
        return Execution(op, inputs, outputs, maker(op, inputs, outputs, self._pool, **packs))

    @property
    def solo_engine(self) -> Engine:
        """The engine a one-thread session of this backend plans for: each op on the calling thread."""
        return Engine(self.jit, 1 if self.regions else 0, 1)

    def work_items(self, executions: list[Execution],
                   engine: Engine | None = None) -> list[tuple[list[Execution], tuple[Callable[[], None], ...]]]:
        """What a recording of ``executions`` calls, in order, each with the executions it computes:
        an execution's own work, or one call for several (a run of LSTM steps: ``cpu_recurrent.lstm_runs``;
        a squeeze-excitation block: ``cpu_excitation.excitation_runs``). ``bench/cpu_profile.py`` times
        these. ``engine``: the one the executions were planned for."""
        engine = engine or self.engine
        runs = lstm_runs(executions, engine, self._packed) + excitation_runs(executions, engine, self._packed)
        items, at = [], 0
        for start, stop, work in sorted(runs, key=lambda run: run[0]):
            items += [([exe], exe.work) for exe in executions[at:start]]
            items.append((executions[start:stop], (work,)))
            at = stop
        return items + [([exe], exe.work) for exe in executions[at:]]

    def _record(self, executions: list[Execution]) -> cpu_sharing.Recording:
        """The work items as planned and, where the regions run on several threads and there are
        several ops, the same ops planned for one thread: each run takes the faster way
        (``cpu_sharing``). A recording of one op (a calibration's) keeps the planned way only."""
        shared = [fn for _, work in self.work_items(executions) for fn in work]
        solo = None
        if self.regions > 1 and len(executions) > 1:
            engine = self.solo_engine
            alone = [self._create_execution(exe.op, exe.inputs, exe.outputs, engine) for exe in executions]
            solo = [fn for _, work in self.work_items(alone, engine) for fn in work]
        return cpu_sharing.Recording(shared, solo)

    # -- run -------------------------------------------------------------------------------
    def _submit(self, recording: cpu_sharing.Recording) -> None:
        shared = recording.next_shared()
        with self._limiter, (self._region_threads if shared else self._solo_threads), np.errstate(all="ignore"):
            recording.run(shared)

    def _timed_submit(self, recording: cpu_sharing.Recording) -> float:
        """The planned way's time (what calibration and ``gpumnn plan`` measure), never the choice's."""
        with self._limiter, self._region_threads, np.errstate(all="ignore"):
            start = time.perf_counter()
            for fn in recording.shared:
                fn()
            return time.perf_counter() - start

    def _run_eager(self, executions: list[Execution]) -> None:
        with self._limiter, self._region_threads, np.errstate(all="ignore"):
            for exe in executions:
                for fn in exe.work:
                    fn()
