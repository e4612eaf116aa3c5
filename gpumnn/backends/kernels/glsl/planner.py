"""API-neutral planning of the GLSL compute kernels, shared by the Vulkan and OpenGL backends.

The kernels in ``gpumnn/backends/kernels/glsl`` are one set of sources for both APIs; what to dispatch for
an atomic op -- which kernel variant (``#define``s: op ids, activation, tile and register-block
sizes), which element ranges of which buffers at which binding slots, the 32 int32/float32
parameters and the workgroup grid -- is the same decision on both. This module makes it:

* one *planner* per atomic op (``PLANNERS``) returns a :class:`~gpumnn.backends.base.KernelWork`
  of :class:`Builder` objects and the scheme; :func:`plan` turns it into one of the backend's
  dispatches;
* a :class:`Builder` collects one dispatch; ``Builder.build()`` hands it to the backend, which
  turns it into its API objects (a Vulkan pipeline + descriptor set + push constants, or a GL
  program + SSBO ranges + uniform bytes);
* :class:`Hazards` places memory barriers only in front of dispatches that touch a byte range
  written (or write a range read) since the last barrier.

What a backend provides to the planners (duck-typed, see :class:`PlannerTarget`):

``kernels``           "simd" (register blocking, vec4 loads, narrow workgroups: CPU devices) or
                      "tiled" (shared-memory tiles, wide workgroups: GPUs)
``simd_lanes``        SIMD width of a CPU device (workgroup size of the simd convolution)
``compute_units``     SMs / CUs / cores of the device (``backends.speed``'s defaults where the
                      driver does not say): the tiled GEMM's tile shape and split-K follow it
``cooperative_gemm``  the device's cooperative-matrix GEMM (``coopmat.CooperativeGemm``: Vulkan
                      devices that have one) or None: the tiled GEMM's tiles go on it where they fit
``max_group_count``   (x, y, z) workgroup-count limits
``plan_error``        exception class raised for work the device cannot run
``binding(buf, lo, hi)``  -> (binding, base byte): the aligned range bound for bytes [lo, hi)
                      of ``buf`` and the byte the range starts at
``native_narrow``     the narrow element sizes (1, 2 bytes) the device's buffers hold as
                      themselves (8-/16-bit storage); other narrow tensors are held packed in
                      words (``elements.glsl``)
``dispatch(builder, bindings)``  -> the backend's dispatch object
``scratch(nbytes)``   a new buffer (``kind`` "scratch") for one execution: a split-K GEMM's partial
                      sums; it is the execution's alone (in its ``keep``), and the backend frees it
                      with ``release`` when the execution's run state goes (``release_scratch``)
``packed``, ``tables``  dicts caching repacked weights and resize tables (per backend)
``constant(array)``, ``read(handle)``  as in :class:`~gpumnn.backends.base.Backend`

Buffers handed to the planners carry ``id`` (unique per backend) and ``kind`` ("pool",
"constant", "arena", ...).
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable, Mapping, NamedTuple, Protocol, Sequence

import numpy as np

from .... import atomic as A
from . import coopmat
from .compile import GLSL_DIR
from ....numerics.strides import contiguous_strides, merge_dims
from ...base import (KERNEL_SCHEMES, TILED_KERNEL_SCHEMES, KernelWork, family_residual_schemes, family_schemes,
                     PlannerTarget as BasePlannerTarget, TensorHandle)
from ....numerics.sampling import resize_axis
from ....numerics.winograd import conv_matrices, transformed_weights


def grid_limit(op: A.AtomicOp, max_group_count: Sequence[int]) -> str | None:
    """Why the planners' grid for ``op`` exceeds the device's workgroup-count limit, or None:
    convolutions and matrix products put batch x groups on the grid's z axis."""
    if isinstance(op, (A.Conv2D, A.MatMul)):
        z = op.batch * getattr(op, "groups", 1)
        if z > max_group_count[2]:
            return f"batch x groups = {z} exceeds the device's workgroup grid ({max_group_count[2]})"
    return None


def view_sizes(op: A.AtomicOp) -> list[int]:
    """Element counts of the tensors ``op`` binds (the largest must fit one storage-buffer binding)."""
    if isinstance(op, A.MatMul):
        return [op.batch * op.m * op.n, (op.batch - 1) * op.a_batch_stride + op.m * op.k,
                (op.batch - 1) * op.b_batch_stride + op.k * op.n]
    if isinstance(op, A.QuantizedMatMul):  # x (float32 or bytes), y, the packed weight's words
        return [op.m * op.k, op.m * op.n, (2 + -(-op.k // 4)) * op.n]
    if isinstance(op, (A.Conv2D, A.ConvTranspose2D)):
        (h, w), (oh, ow), (kh, kw) = op.in_hw, op.out_hw, op.kernel
        return [op.batch * op.in_channels * h * w, op.batch * op.out_channels * oh * ow,
                op.out_channels * op.in_channels * kh * kw // op.groups]
    if isinstance(op, A.Pool2D):
        (h, w), (oh, ow) = op.in_hw, op.out_hw
        return [op.batch * op.channels * h * w, op.batch * op.channels * oh * ow]
    if isinstance(op, (A.Softmax, A.Reduce)):
        return [op.outer * op.size * op.inner]
    if isinstance(op, A.Normalize):
        return [op.outer * op.size]
    if isinstance(op, A.Unary):
        return [op.count]
    if isinstance(op, (A.Binary, A.Raster, A.Select)):
        return [math.prod(op.out_shape)]
    if isinstance(op, A.CumSum):
        return [op.outer * op.size * op.inner]
    if isinstance(op, A.Scatter):
        return [op.rows * op.inner, op.count * op.inner]
    if isinstance(op, A.Gather):
        return [op.outer * op.count * op.inner, op.outer * op.axis * op.inner]
    if isinstance(op, A.Resize):
        (h, w), (oh, ow) = op.in_hw, op.out_hw
        return [op.planes * h * w, op.planes * oh * ow]
    return []


def binding_limit(op: A.AtomicOp, max_range: int, what: str) -> str | None:
    """Why a tensor ``op`` binds is larger than one storage-buffer binding may be (``max_range``
    bytes, the API limit ``what``), or None. Such an op is left to the CPU by placement."""
    largest = 4 * max(view_sizes(op), default=0)
    if largest > max_range:
        return f"a tensor of {largest} bytes exceeds {what} ({max_range} bytes)"
    return None


UNARY_IDS, BINARY_IDS, REDUCE_IDS = A.UNARY_IDS, A.BINARY_IDS, A.REDUCE_IDS
PARAMS = 32  # int32 parameters per dispatch (128 bytes: Vulkan push constants, GL uniform array)


class PlanError(RuntimeError):
    """A dispatch the device cannot run (parameter overflow, grid too large, ...)."""


class PlannerTarget(BasePlannerTarget, Protocol):
    """What the GLSL planners read from a backend (Vulkan, GL)."""

    simd_lanes: int
    compute_units: int
    max_group_count: tuple[int, int, int]
    plan_error: type[Exception]
    packed: dict
    tables: dict
    native_narrow: frozenset[int]
    int8_dot: str  # the integer dot-product instruction of the int8 implicit GEMM ("": plain int32)
    cooperative_gemm: "coopmat.CooperativeGemm | None"  # the tiled GEMM's cooperative-matrix build, None: plain

    def binding(self, buf: Any, lo: int, hi: int) -> tuple[Any, int]: ...
    def scratch(self, nbytes: int) -> Any: ...
    def release(self, buffer: Any) -> None: ...
    def dispatch(self, builder: "Builder", bindings: tuple) -> Any: ...
    def constant(self, array: np.ndarray) -> TensorHandle: ...
    def read(self, handle: TensorHandle) -> np.ndarray: ...


def _shader_ids(path: str, prefix: str) -> dict[str, int]:
    text = (GLSL_DIR / path).read_text()
    return {m.group(1).lower(): int(m.group(2)) for m in re.finditer(rf"#define {prefix}_(\w+) (\d+)", text)}


def check_shader_op_ids() -> None:
    """The GLSL op ids must follow gpumnn.atomic's orders (one source of truth each side)."""
    for path, prefix, ids, table in (("activation.glsl", "U", UNARY_IDS, "UNARY_OPS"),
                                     ("binary.comp", "B", BINARY_IDS, "BINARY_OPS"),
                                     ("reduce.comp", "R", REDUCE_IDS, "REDUCE_OPS"),
                                     ("recurrent.comp", "CACT", A.CELL_ACTIVATION_IDS, "CELL_ACTIVATIONS"),
                                     ("recurrent.comp", "CELL", {name: i for i, name in enumerate(A.CELLS)}, "CELLS"),
                                     ("convert.comp", "KIND", KIND_IDS, "STORAGE_DTYPES")):
        if _shader_ids(path, prefix) != ids:
            raise RuntimeError(f"gpumnn/backends/kernels/glsl/{path} op ids do not match atomic.{table}")



class Binding(NamedTuple):
    """A bound window of a buffer: ``range`` bytes from byte ``base``."""

    buf: Any
    base: int  # byte offset of the bound window
    range: int  # bytes bound


def window(buf: Any, lo: int, hi: int, align: int, max_range: int, error: type[Exception] = PlanError,
           what: str = "the device's maximum storage-buffer range") -> tuple[Binding, int]:
    """The window binding bytes [lo, hi) of ``buf`` (``buf.size`` bytes) and the byte it starts
    at. The window starts at ``lo`` aligned down to ``align`` bytes (the API's storage-buffer
    offset alignment) and ends at ``hi`` rounded up to a word (a packed narrow tensor's last
    word is whole): binding exactly what a dispatch touches lets validation see the true
    ranges, and lifts the per-binding size limit from the pool to a single tensor."""
    align = max(4, align)
    base = lo // align * align
    size = max(_word_end(hi) - base, 4)
    if size > max_range:
        raise error(f"a tensor view spans {size} bytes, more than {what} ({max_range} bytes)")
    return Binding(buf, base, min(size, buf.size - base)), base


def _word_end(nbytes: int) -> int:
    """``nbytes`` rounded up to a whole number of 32-bit words."""
    return -(-nbytes // 4) * 4


def _overlaps(ranges, others) -> bool:
    for b, lo, hi in ranges:
        for b2, lo2, hi2 in others:
            if b == b2 and lo < hi2 and lo2 < hi:
                return True
    return False


class Hazards:
    """Byte ranges written / read since the last barrier, to place barriers only where needed."""

    def __init__(self):
        self.written: list = []
        self.read: list = []

    MAX_PENDING = 64  # beyond this a barrier is cheaper than checking (keeps recording linear)

    def needs_barrier(self, d) -> bool:
        if not self.written and not self.read:
            return False
        if len(self.written) + len(self.read) > self.MAX_PENDING:
            return True
        return (_overlaps(d.reads, self.written) or _overlaps(d.writes, self.written)
                or _overlaps(d.writes, self.read))

    def add(self, d) -> None:
        self.written.extend(d.writes)
        self.read.extend(d.reads)

    def clear(self) -> None:
        self.written.clear()
        self.read.clear()



def _pad4(values: Sequence[int], fill: int) -> tuple[int, ...]:
    values = tuple(int(v) for v in values)
    if len(values) > 4:
        raise ValueError(f"strided description of rank {len(values)} > 4")
    return (fill,) * (4 - len(values)) + values


def _extent(offset: int, size: Sequence[int], strides: Sequence[int]) -> tuple[int, int]:
    """[lo, hi) element range touched by a strided view (strides may be zero or negative)."""
    lo = hi = offset
    for s, st in zip(size, strides):
        if s <= 0:
            return offset, offset
        if st < 0:
            lo += (s - 1) * st
        else:
            hi += (s - 1) * st
    return lo, hi + 1


def _collapse(shape: Sequence[int], *strides: Sequence[int]) -> tuple[int, tuple[int, ...], list[tuple[int, ...]]]:
    """Merge dimensions that are contiguous in every stride list and drop size-1 ones.

    Returns (ndim, shape, strides) right-aligned in RANK 4 dims, with ndim >= 1 the number of
    dimensions left: kernels compile only the index divisions those need.
    """
    merged = merge_dims(shape, *strides) or [(1,) + (0,) * len(strides)]
    pad = 4 - len(merged)
    shape4 = (1,) * pad + tuple(m[0] for m in merged)
    strides4 = [(0,) * pad + tuple(m[j + 1] for m in merged) for j in range(len(strides))]
    return len(merged), shape4, strides4


def _gemm_tiles(be: PlannerTarget, m: int, n: int, batch: int) -> tuple[int, int, int, int]:
    """(TM, TN, RM, RN) of a 256-invocation tile shaped to the problem: 64 x 64 where both sides
    are long, unless its tiles would be fewer than two per compute unit (then 32 x 32, four
    times as many, before K is split: ``k_splits``)."""
    if m >= 48 and n >= 48:
        if -(-m // 64) * -(-n // 64) * batch < 2 * be.compute_units:
            return 32, 32, 2, 2
        return 64, 64, 4, 4
    if m >= 48:
        return (64, 16, 4, 1) if n > 8 else (256, 4, 4, 1)
    if n >= 48:
        return (16, 64, 1, 4) if m > 8 else (4, 256, 1, 4)
    return 16, 16, 1, 1


def _tiled_gemm_defines(be: PlannerTarget, dtype: str, m: int, n: int, batch: int) -> dict[str, int]:
    """The tile of the tiled GEMM (matmul.comp, conv2d.comp's implicit GEMM and 1x1) of an ``m`` x
    ``n`` product over ``dtype`` tensors: on the device's cooperative matrices where the backend
    has them and the product fits (gemm_coopmat.glsl: ``coopmat.tile_defines``), else
    gemm_core.glsl's shared-memory tiles (``_gemm_tiles``)."""
    cooperative = coopmat.tile_defines(be.cooperative_gemm, dtype, m, n, batch, be.compute_units)
    if cooperative is not None:
        return cooperative
    tm, tn, rm, rn = _gemm_tiles(be, m, n, batch)
    return {"TM": tm, "TN": tn, "RM": rm, "RN": rn, "NT": (tm // rm) * (tn // rn)}


def _tiled_gemm_scheme(scheme: str, defines: Mapping[str, int]) -> str:
    """``scheme`` as the report names it: ``.../coopmat`` where the tiles are on cooperative matrices."""
    return f"{scheme}/{coopmat.LABEL}" if "COOPMAT" in defines else scheme


#: split-K of the tiled GEMM (matmul.comp and conv2d.comp -DKSPLIT, then split_sum.comp): each
#: slice of K at least MIN_K_SLICE deep (a multiple of gemm_core.glsl's TK), at most MAX_K_SPLITS
#: slices (each one more pass over the partial sums)
MIN_K_SLICE = 64
MAX_K_SPLITS = 32
GEMM_TK = 16
#: the most bytes of partial sums a split GEMM binds: GL's guaranteed storage-block size (Vulkan
#: guarantees more); a product with more outputs has tiles enough not to be split
MAX_PARTIAL_BYTES = 1 << 24


def k_splits(be: PlannerTarget, work_groups: int, k: int, z: int, outputs: int) -> tuple[int, int]:
    """(slices, slice depth) of the inner dimension for a tiled GEMM of ``work_groups`` tiles
    whose grid already has ``z`` layers and which writes ``outputs`` elements: a GEMM whose tiles
    are fewer than the device's compute units leaves most of them idle while each busy one walks
    all of K alone, so it is split into enough slices for about two workgroups per compute unit,
    none shallower than MIN_K_SLICE, as the OpenCL C family's ``k_splits`` does; the grid's z
    carries them (up to its limit), and the partial sums stay within MAX_PARTIAL_BYTES."""
    if work_groups >= be.compute_units:
        return 1, k
    wanted = -(-2 * be.compute_units // work_groups)
    splits = max(1, min(wanted, k // MIN_K_SLICE, MAX_K_SPLITS, be.max_group_count[2] // max(1, z),
                        MAX_PARTIAL_BYTES // (4 * max(1, outputs))))
    if splits == 1:
        return 1, k
    per_slice = -(-k // splits)
    depth = -(-per_slice // GEMM_TK) * GEMM_TK  # whole TK steps
    return -(-k // depth), depth


def _split_k_work(be: PlannerTarget, gemm: Builder, out_param: int, splits: int, total: int, scheme: str,
                  **split_sum: Any) -> KernelWork:
    """The KernelWork of a GEMM split into ``splits`` slices of K: ``gemm`` (all else bound and
    set) writing its partial sums into a float32 scratch of the execution's own (output slot 0,
    its element offset at parameter ``out_param``), then ``_split_sum_builder`` with
    ``split_sum``'s epilogue; the scheme says into how many slices (``.../split-K n``, as the
    OpenCL C family's). The scratch goes with the execution (``release_scratch``), or at
    once if binding it fails."""
    partial = TensorHandle(be.scratch(4 * splits * total), 0, (splits * total,))
    try:
        gemm.set(out_param, gemm.bind(0, partial, write=True))
        summed = _split_sum_builder(be, partial, splits, total, **split_sum)
    except BaseException:
        be.release(partial.buffer)
        raise
    return KernelWork([gemm, summed], f"{scheme}/split-K {splits}", (partial.buffer,))


def release_scratch(be: PlannerTarget, keep: Sequence[Any]) -> None:
    """Free the scratch buffers among an execution's ``keep`` (its run state is released, or an
    eager run re-planned it)."""
    for obj in keep:
        if getattr(obj, "kind", None) == "scratch":
            be.release(obj)


def _split_sum_builder(be: PlannerTarget, partial: TensorHandle, splits: int, total: int, *, m: int, n: int,
                       out: TensorHandle, bias: tuple | None = None, residual: TensorHandle | None = None,
                       alpha: float = 1.0, beta: float = 1.0, activation: A.Activation = None) -> Builder:
    """split_sum.comp: the ``splits`` slices of ``partial`` ([splits][total], laid out as ``out``
    of [batch][m][n]) summed into ``out`` with the GEMM's epilogue. ``bias``: (handle, lo, hi,
    stride along m, stride along n)."""
    defines = {}
    if bias is not None:
        defines["HAS_BIAS"] = 1
    if residual is not None:
        defines["HAS_RESIDUAL"] = 1
    b = Builder(be, "split_sum", defines, 4)
    o = b.bind(0, out, 0, total, write=True)
    p = b.bind(1, partial, 0, splits * total)
    bias_off = bias_sm = bias_sn = res_off = 0
    if bias is not None:
        handle, lo, hi, bias_sm, bias_sn = bias
        bias_off = b.bind(2, handle, lo, hi)
    if residual is not None:
        res_off = b.bind(3, residual, 0, total)
    b.set(0, total, splits, m, n, p, o, bias_off, bias_sm, bias_sn, res_off)
    b.setf(10, alpha, beta)
    b.activation(12, activation)
    b.grid1d(total, 256)
    return b


def _row_variant(rows: int, size: int) -> tuple[bool, int]:
    """(one workgroup per row?, workgroup size) for row reductions."""
    if size >= 128 or (size >= 32 and rows < 1024):
        return True, (128 if size >= 1024 else 64)
    return False, 64


class Builder:
    """Collects one dispatch: kernel variant, bindings (element offsets), parameters, grid."""

    def __init__(self, backend: PlannerTarget, kernel: str, defines: dict, nbind: int):
        self.backend = backend
        self.kernel = kernel
        self.defines = dict(defines)
        self.nbind = nbind
        self.bindings: list[Any] = [None] * nbind
        self.params = np.zeros(PARAMS, dtype=np.int32)
        self.reads: list = []
        self.writes: list = []
        self.groups = (0, 0, 0)

    def bind(self, slot: int, handle: TensorHandle, lo: int = 0, hi: int | None = None, write: bool = False) -> int:
        """Bind ``handle``'s buffer at ``slot``; returns the element offset of the handle's first
        element inside the bound range. ``[lo, hi)`` is the element range used, relative to it.
        The hazard ranges are whole words (a packed narrow tensor is written a word at a time); a
        packed output, whose binding the kernel reads and writes, counts as its whole window (the
        validation layer's synchronization checks take a binding's window as accessed)."""
        hi = handle.size if hi is None else hi
        size = handle.itemsize
        lo_byte, hi_byte = size * (handle.offset + lo), size * (handle.offset + hi)
        binding, base = self.backend.binding(handle.buffer, lo_byte, hi_byte)
        self.bindings[slot] = binding
        rng = (handle.buffer.id, lo_byte // 4 * 4, _word_end(hi_byte))
        if write and _packed(self.backend, handle.dtype):
            rng = (handle.buffer.id, binding.base, binding.base + binding.range)
        (self.writes if write else self.reads).append(rng)
        return handle.offset - base // size

    def set(self, index: int, *values: int) -> None:
        for i, v in enumerate(values):
            v = int(v)
            if not -2**31 <= v < 2**31:
                raise self.backend.plan_error(f"kernel parameter {v} does not fit in int32")
            self.params[index + i] = v

    def setf(self, index: int, *values: float) -> None:
        view = self.params.view(np.float32)
        for i, v in enumerate(values):
            view[index + i] = np.float32(v)

    def activation(self, index: int, activation: A.Activation) -> None:
        if activation is None:
            return
        name, params = activation
        self.defines["ACT"] = UNARY_IDS[name]
        self.setf(index, *(tuple(params) + (0.0, 0.0, 0.0))[:3])

    def grid1d(self, items: int, wg: int) -> None:
        """Enough workgroups of ``wg`` invocations for ``items`` (x capped, y carries the rest)."""
        self.defines.setdefault("WG", wg)
        self.rows(math.ceil(items / wg))

    def rows(self, groups: int) -> None:
        max_x, max_y, _ = self.backend.max_group_count
        gx = min(groups, max_x)
        gy = math.ceil(groups / gx) if gx else 0
        if gy > max_y:
            raise self.backend.plan_error(f"{groups} workgroups exceed the device's grid limit")
        self.groups = (gx, gy, 1)

    def build(self) -> Any:
        """The backend's dispatch object (None for an empty grid); unbound slots repeat the
        first binding (every slot of a layout must be valid)."""
        if 0 in self.groups:
            return None
        first = next(b for b in self.bindings if b is not None)
        bindings = tuple(b if b is not None else first for b in self.bindings)
        return self.backend.dispatch(self, bindings)


# --------------------------------------------------------------------------------------------
# Planners: one per atomic op; each returns a KernelWork of Builders and the scheme.
# --------------------------------------------------------------------------------------------

def _half_defines(op: A.AtomicOp) -> dict:
    """``HALF`` (and ``STORAGE16``, which it needs) where ``op``'s float tensors are float16 storage
    (common.glsl's BUFFER_*_F, LOADF, STOREF), else none."""
    return {"HALF": 1, "STORAGE16": 1} if op.dtype == A.FLOAT16 else {}


def _int_defines(in_dtype: str, out_dtype: str = A.FLOAT32) -> dict:
    """``IN_INT`` / ``OUT_INT`` where the input / output storage dtype is int32: kernels that
    compute read and write int32 views of their bindings with these (see unary.comp)."""
    return {name: 1 for name, dtype in (("IN_INT", in_dtype), ("OUT_INT", out_dtype)) if dtype == A.INT32}


def _word(bits: int) -> int:
    """A 32-bit word as the int32 parameter that carries it."""
    return bits - (1 << 32) if bits >= 1 << 31 else bits


def _packed(be: PlannerTarget, dtype: str) -> bool:
    """Whether tensors of ``dtype`` are held packed in words on ``be`` (elements.glsl)."""
    return A.ITEMSIZE[dtype] < 4 and A.ITEMSIZE[dtype] not in be.native_narrow


def _element_defines(be: PlannerTarget, in_dtype: str, out_dtype: str) -> dict:
    """elements.glsl's defines for bindings of ``in_dtype`` and ``out_dtype``: none for the 4-byte
    dtypes; IN_BYTES / OUT_BYTES for a narrow one, and STORAGE8 / STORAGE16 where the device holds
    its size natively."""
    defines = {}
    for key, dtype in (("IN_BYTES", in_dtype), ("OUT_BYTES", out_dtype)):
        size = A.ITEMSIZE[dtype]
        if size < 4:
            defines[key] = size
            if size in be.native_narrow:
                defines[f"STORAGE{8 * size}"] = 1
    return defines


def _elements_grid(be: PlannerTarget, b: Builder, dtype: str, count: int, out_offset: int) -> None:
    """The grid of an ELEMENTS_MAIN kernel (elements.glsl) writing ``count`` elements of ``dtype``
    from element ``out_offset`` of its bound window: an invocation per element, or per word
    where the output is packed."""
    if _packed(be, dtype) and count:
        shift = 2 if A.ITEMSIZE[dtype] == 1 else 1
        count = ((out_offset + count - 1) >> shift) - (out_offset >> shift) + 1
    b.grid1d(count, 128)


def _region_builder(be: PlannerTarget, r: A.Region, src: TensorHandle, out: TensorHandle, dtype: str) -> Builder:
    """One strided copy of elements of ``dtype`` (raster.comp); a packed output whose region is a
    contiguous run is written a word per invocation (-DDST_CONTIGUOUS)."""
    size = _pad4(r.size, 1)
    sst, dst = _pad4(r.src_strides, 0), _pad4(r.dst_strides, 0)
    slo, shi = _extent(r.src_offset, size, sst)
    dlo, dhi = _extent(r.dst_offset, size, dst)
    ndim, csize, (csst, cdst) = _collapse(size, sst, dst)
    defines = dict(_element_defines(be, dtype, dtype), NDIM=ndim)
    run = all(n == 1 or s == c for n, s, c in zip(csize, cdst, contiguous_strides(csize)))
    if _packed(be, dtype) and run:
        defines["DST_CONTIGUOUS"] = 1
    b = Builder(be, "raster", defines, 2)
    do = b.bind(0, out, dlo, dhi, write=True)
    so = b.bind(1, src, slo, shi)
    b.set(0, r.count, csize[1], csize[2], csize[3], so + r.src_offset, *csst, do + r.dst_offset, *cdst)
    if "DST_CONTIGUOUS" in defines:
        _elements_grid(be, b, dtype, r.count, do + r.dst_offset)
    else:
        b.grid1d(r.count, 128)
    return b


def _plan_raster(be: PlannerTarget, op: A.Raster, ins, outs):
    out = outs[0]
    builders = []
    if op.fill is not None and out.size:
        b = Builder(be, "raster", dict(_element_defines(be, op.dtype, op.dtype), FILL=1), 2)
        o = b.bind(0, out, write=True)
        b.set(0, out.size, o, _word(A.fill_bits(op.fill, op.dtype)))
        _elements_grid(be, b, op.dtype, out.size, o)
        builders.append(b)
    builders += [_region_builder(be, r, ins[r.src], out, op.dtype) for r in op.regions if r.count]
    return KernelWork(builders, "raster")


def _int_clip_bounds(params: Sequence[float]) -> tuple[int, int]:
    """Clip's float bounds as int32 bounds, as the reference takes them (truncated, an infinite
    or out-of-range bound the type's limit)."""
    lo, hi = -2**31, 2**31 - 1
    return tuple(int(min(max(v, lo), hi)) for v in params[:2])  # type: ignore[return-value]


def _plan_unary(be, op: A.Unary, ins, outs):
    if op.op == "identity" and {op.dtype, op.output_dtype()} & A.NARROW_DTYPES:  # a copy or a conversion
        return _plan_narrow_identity(be, op, ins[0], outs[0])
    defines = dict(_int_defines(op.dtype, op.output_dtype()), OP=UNARY_IDS[op.op], **_half_defines(op))
    b = Builder(be, "unary", defines, 2)
    o = b.bind(0, outs[0], 0, op.count, write=True)
    x = b.bind(1, ins[0], 0, op.count)
    b.set(0, op.count, x, o)
    if op.dtype == A.INT32:
        if op.op == "clip":
            b.set(3, *_int_clip_bounds(op.params))
    else:
        b.setf(3, *(tuple(op.params) + (0.0, 0.0, 0.0))[:3])
    b.grid1d(op.count, 128)
    return KernelWork([b])


def _plan_narrow_identity(be, op: A.Unary, x: TensorHandle, y: TensorHandle) -> KernelWork:
    """A copy of the elements (raster.comp) where the dtypes are the same, else a conversion
    (convert.comp)."""
    n = op.count
    if op.dtype == op.output_dtype():
        region = A.Region(0, 0, (0, 0, 0, 1), 0, (0, 0, 0, 1), (1, 1, 1, n))
        return KernelWork([_region_builder(be, region, x, y, op.dtype)] if n else [], "copy")
    defines = dict(_element_defines(be, op.dtype, op.output_dtype()), IN_KIND=KIND_IDS[op.dtype],
                   OUT_KIND=KIND_IDS[op.output_dtype()])
    b = Builder(be, "convert", defines, 2)
    o = b.bind(0, y, 0, n, write=True)
    i = b.bind(1, x, 0, n)
    b.set(0, n, i, o)
    _elements_grid(be, b, op.output_dtype(), n, o)
    return KernelWork([b], "convert")


def _elementwise_builder(be, kernel: str, defines: dict, shape: Sequence[int],
                         operand_strides: Sequence[Sequence[int]], ins, outs) -> Builder:
    """An elementwise dispatch over ``shape`` (RANK dims, output contiguous) reading each input
    through its strides (binary.comp, select.comp): dims contiguous in every view collapsed,
    then params total | shape[1..3] | per operand: offset, 4 strides | out offset."""
    shape, padded = _pad4(shape, 1), [_pad4(st, 0) for st in operand_strides]
    total = math.prod(shape)
    ndim, cshape, collapsed = _collapse(shape, *padded, contiguous_strides(shape))
    b = Builder(be, kernel, dict(defines, NDIM=ndim), len(padded) + 1)
    o = b.bind(0, outs[0], 0, total, write=True)
    params = [total, *cshape[1:]]
    for slot, (x, st, cst) in enumerate(zip(ins, padded, collapsed), 1):
        params += [b.bind(slot, x, *_extent(0, shape, st)), *cst]
    b.set(0, *params, o)
    if kernel == "select":
        _elements_grid(be, b, outs[0].dtype, total, o)
    else:
        b.grid1d(total, 128)
    return b


def _plan_binary(be, op: A.Binary, ins, outs):
    defines = dict(_int_defines(op.dtype), OP=BINARY_IDS[op.op], **_half_defines(op))
    b = _elementwise_builder(be, "binary", defines, op.out_shape, (op.a_strides, op.b_strides), ins, outs)
    b.activation(15, op.activation)
    return KernelWork([b])


def _row_builder(be, kernel: str, defines: dict, nbind: int, rows: int, size: int) -> Builder:
    per_row, wg = _row_variant(rows, size)
    if per_row:
        defines = dict(defines, WG_PER_ROW=1, WG=wg)
    b = Builder(be, kernel, defines, nbind)
    if per_row:
        b.rows(rows)
    else:
        b.grid1d(rows, wg)
    return b


def _reduce_builder(be, op_name: str, outer: int, size: int, inner: int, x: TensorHandle, out: TensorHandle,
                    dtype: str = A.FLOAT32):
    defines = dict(_int_defines(dtype), OP=REDUCE_IDS[op_name])
    b = _row_builder(be, "reduce", defines, 2, outer * inner, size)
    o = b.bind(0, out, 0, outer * inner, write=True)
    xo = b.bind(1, x, 0, outer * size * inner)
    b.set(0, outer, size, inner, xo, o)
    return b


def _plan_reduce(be, op: A.Reduce, ins, outs):
    return KernelWork([_reduce_builder(be, op.op, op.outer, op.size, op.inner, ins[0], outs[0], op.dtype)])


#: matrix-vector workgroups (gemv.comp): GEMV_WG invocations, KL lanes along K times NL columns;
#: NL columns side by side where B is contiguous along n, else up to GEMV_MAX_COLUMNS columns of
#: KL lanes side by side along k
GEMV_WG = 256
GEMV_ROW_MAJOR_COLUMNS = 32
GEMV_MAX_COLUMNS = 8
#: a product of a transposed weight with fewer column blocks than this takes fewer columns per
#: workgroup and more lanes along K (a few long columns: split K inside the workgroup)
GEMV_MIN_GROUPS = 64


def gemv_lanes(op: A.MatMul) -> tuple[int, int]:
    """(KL, NL) of gemv.comp's workgroup for ``op``."""
    if not op.trans_b:
        return GEMV_WG // GEMV_ROW_MAJOR_COLUMNS, GEMV_ROW_MAJOR_COLUMNS
    nl = GEMV_MAX_COLUMNS
    while nl > 1 and math.ceil(op.n / nl) * op.batch < GEMV_MIN_GROUPS and 2 * GEMV_WG // nl <= op.k:
        nl //= 2
    return GEMV_WG // nl, nl


def _plan_gemv(be, op: A.MatMul, ins, outs) -> KernelWork:
    """A MatMul with one row per batch entry (scheme ``gemv``) as gemv.comp: a workgroup per
    block of output columns, reducing over K in its lanes."""
    n, k, batch = op.n, op.k, op.batch
    kl, nl = gemv_lanes(op)
    b = Builder(be, "gemv", {"KL": kl, "NL": nl, "WG": kl * nl, "KFAST": int(op.trans_b)}, 4)
    y = b.bind(0, outs[0], 0, batch * n, write=True)
    x = b.bind(1, ins[0], 0, (batch - 1) * op.a_batch_stride + k)
    w = b.bind(2, ins[1], 0, (batch - 1) * op.b_batch_stride + k * n)
    bias = 0
    if op.has_bias:
        b.defines["HAS_BIAS"] = 1
        bias = b.bind(3, ins[2], *_extent(0, (1, n), tuple(op.bias_strides)))
    bsk, bsn = (1, k) if op.trans_b else (n, 1)
    b.set(0, n, k, x, w, bias, y, op.a_batch_stride, op.b_batch_stride, bsk, bsn, op.bias_strides[1])
    b.setf(11, op.alpha, op.beta)
    b.activation(13, op.activation)
    b.groups = (math.ceil(n / nl), 1, batch)
    _check_grid(be, b.groups)
    return KernelWork([b], "gemv")


def _plan_matmul(be, op: A.MatMul, ins, outs):
    if op.scheme == "gemv" and be.kernels == "tiled":
        return _plan_gemv(be, op, ins, outs)
    m, n, k, batch = op.m, op.n, op.k, op.batch
    a_bs, b_bs = op.a_batch_stride, op.b_batch_stride
    sam, sak = (1, m) if op.trans_a else (k, 1)
    sbk, sbn = (1, k) if op.trans_b else (n, 1)
    bias_sm, bias_sn = op.bias_strides
    if (batch > 1 and b_bs == 0 and not op.trans_a and a_bs == m * k
            and (not op.has_bias or bias_sm == 0)):  # shared weights: one [batch*M, K] GEMM
        m, batch = m * batch, 1
    splits, depth = 1, k
    if be.kernels == "simd":
        rm = min(16, 1 << (m - 1).bit_length())
        rn = min(16, 4 << max(0, (n - 1).bit_length() - 2)) if n > 4 else 4
        defines = {"REGBLOCK": 1, "RM": rm, "RN": rn, "WG": 16}
        groups = (math.ceil(math.ceil(n / rn) / 16), math.ceil(m / rm), batch)
    else:
        defines = _tiled_gemm_defines(be, op.dtype, m, n, batch)
        tm, tn = defines["TM"], defines["TN"]
        groups = (math.ceil(n / tn), math.ceil(m / tm), batch)
        if op.dtype == A.FLOAT32:  # the partial sums and split_sum.comp are float32 storage only
            splits, depth = k_splits(be, math.prod(groups), k, batch, op.batch * op.m * op.n)
    total = op.batch * op.m * op.n
    bias_range = _extent(0, (op.m, op.n), (bias_sm, bias_sn)) if op.has_bias else None
    if splits > 1:  # partial sums into a scratch; split_sum.comp applies alpha, bias and activation
        defines["KSPLIT"] = 1
        groups = (groups[0], groups[1], batch * splits)
    elif op.has_bias:
        defines["HAS_BIAS"] = 1
    b = Builder(be, "matmul", dict(defines, **_half_defines(op)), 4)
    c = b.bind(0, outs[0], 0, total, write=True) if splits == 1 else 0
    a = b.bind(1, ins[0], 0, (op.batch - 1) * a_bs + op.m * op.k)
    w = b.bind(2, ins[1], 0, (op.batch - 1) * b_bs + op.k * op.n)
    bias = 0
    if op.has_bias and splits == 1:
        bias = b.bind(3, ins[2], *bias_range)
    b.set(0, m, n, k, batch, a, w, bias, c, a_bs, b_bs, sam, sak, sbk, sbn)
    b.setf(14, op.alpha, op.beta)
    b.set(16, bias_sm, bias_sn)
    b.set(21, splits, depth)
    if (be.kernels == "simd" and sbn == 1 and n % 4 == 0 and w % 4 == 0 and sbk % 4 == 0
            and (batch == 1 or b_bs % 4 == 0)):
        b.defines["B_VEC4"] = 1
    b.groups = groups
    _check_grid(be, b.groups)
    scheme = "gemm_regblock" if be.kernels == "simd" else _tiled_gemm_scheme("gemm_tiled", defines)
    if splits == 1:
        b.activation(18, op.activation)
        return KernelWork([b], scheme)
    return _split_k_work(be, b, 7, splits, total, scheme, m=m, n=n, out=outs[0], alpha=op.alpha,
                         beta=op.beta, bias=(ins[2], *bias_range, bias_sm, bias_sn) if op.has_bias else None,
                         activation=op.activation)


def _check_grid(be, groups) -> None:
    for g, limit in zip(groups, be.max_group_count):
        if g > limit:
            raise be.plan_error(f"workgroup grid {groups} exceeds the device limit {be.max_group_count}")


def _conv2d_builder(be, op: A.Conv2D, defines: dict) -> "Builder":
    """conv2d.comp's builder: four bindings (output, input, weights, bias), a fifth where the
    convolution adds a residual."""
    defines = dict(defines, **_half_defines(op))
    return Builder(be, "conv2d", dict(defines, HAS_RESIDUAL=1) if op.has_residual else defines,
                   RESIDUAL_BINDINGS if op.has_residual else 4)


def _bind_residual(b: "Builder", op: A.Conv2D, ins, o_len: int) -> None:
    """Bind a Conv2D's residual (its last input, laid out as the output) at slot 4 and its element
    offset at parameter 25 (conv2d.comp's ADD_RESIDUAL)."""
    if op.has_residual:
        b.set(25, b.bind(4, ins[-1], 0, o_len))


def _plan_conv2d(be, op: A.Conv2D, ins, outs):
    n, c, oc, g = op.batch, op.in_channels, op.out_channels, op.groups
    (h, w), (oh, ow), (kh, kw) = op.in_hw, op.out_hw, op.kernel
    (sh, sw), (ph, pw), (dh, dw) = op.strides, op.pads, op.dilations
    x_len, w_len, o_len = n * c * h * w, oc * (c // g) * kh * kw, n * oc * oh * ow
    defines: dict = {"HAS_BIAS": 1} if op.has_bias else {}
    # op.scheme (decided by gpumnn.scheduler.schemes, which checked the geometry fits) names the kernel
    if op.scheme == "depthwise":
        max_rn = 16 if be.kernels == "simd" else 4
        rn = -(-ow // -(-ow // max_rn))  # <= max_rn pixels, evenly split rows
        row_groups = -(-ow // rn)
        b = _conv2d_builder(be, op, dict(defines, DEPTHWISE=1, RN=rn, KW=kw, SW=sw, DW=dw))
        o = b.bind(0, outs[0], 0, o_len, write=True)
        x = b.bind(1, ins[0], 0, x_len)
        wt = b.bind(2, ins[1], 0, w_len)
        bias = b.bind(3, ins[2], 0, oc) if op.has_bias else 0
        items = n * c * oh * row_groups
        b.set(0, items, c, h, w, oh, ow, kh, 0, sh, 0, ph, pw, dh, 0, x, wt, bias, o, row_groups)
        _bind_residual(b, op, ins, o_len)
        b.activation(22, op.activation)
        b.grid1d(items, 16 if be.kernels == "simd" else 64)
        return KernelWork([b], "depthwise")
    if op.scheme == "winograd":
        return _plan_winograd(be, op, ins, outs)
    if be.kernels == "simd" and _is_constant(ins[1]):
        return _plan_conv2d_direct_rb(be, op, ins, outs)
    cg, ocg = c // g, oc // g
    big_m, big_n, big_k = ocg, oh * ow, cg * kh * kw
    defines.update(_tiled_gemm_defines(be, op.dtype, big_m, big_n, n * g))
    tm, tn = defines["TM"], defines["TN"]
    groups = (math.ceil(big_n / tn), math.ceil(big_m / tm), n * g)
    # the partial sums and split_sum.comp are float32 storage only
    splits, depth = k_splits(be, math.prod(groups), big_k, n * g, o_len) if op.dtype == A.FLOAT32 else (1, big_k)
    pointwise = op.scheme == "gemm1x1"
    if pointwise:
        defines["POINTWISE"] = 1
    if splits > 1:  # partial sums laid out as the output; split_sum.comp adds bias, residual, activation
        defines = {key: v for key, v in defines.items() if key != "HAS_BIAS"}
        b = Builder(be, "conv2d", dict(defines, KSPLIT=1), 4)
        groups = (groups[0], groups[1], n * g * splits)
        o = 0
    else:
        b = _conv2d_builder(be, op, defines)
        o = b.bind(0, outs[0], 0, o_len, write=True)
    x = b.bind(1, ins[0], 0, x_len)
    wt = b.bind(2, ins[1], 0, w_len)
    bias = b.bind(3, ins[2], 0, oc) if op.has_bias and splits == 1 else 0
    b.set(0, big_m, big_n, big_k, g, x, wt, bias, o, c, h, w, ow, oc, cg, kh, kw, sh, sw, ph, pw, dh, dw)
    b.set(26, splits, depth, o_len)
    b.groups = groups
    _check_grid(be, b.groups)
    scheme = _tiled_gemm_scheme("gemm1x1" if pointwise else "implicit_gemm", defines)
    if splits == 1:
        _bind_residual(b, op, ins, o_len)
        b.activation(22, op.activation)
        return KernelWork([b], scheme)
    return _split_k_work(be, b, 7, splits, o_len, scheme, m=oc, n=big_n, out=outs[0],
                         bias=(ins[2], 0, oc, 1, 0) if op.has_bias else None,
                         residual=ins[-1] if op.has_residual else None, activation=op.activation)


#: shared memory a Winograd workgroup stages at most (the matrices, U and V slices), in floats:
#: half of the 32 KiB every GL 4.3 and Vulkan device gives a workgroup
WINOGRAD_SHARED_FLOATS = 4096


def _winograd_weights(be: PlannerTarget, op: A.Conv2D, weight: TensorHandle) -> TensorHandle:
    """The constant winograd.comp reads: B_h, B_w, A_h, A_w, then U = G_h W G_w^T [P][OC][C],
    made once per weight and tile on the host (the scheme step gives Winograd constant weights only)."""
    key = ("winograd", weight.buffer.id, weight.offset, weight.shape, op.winograd_tile, op.kernel)
    packed = be.packed.get(key)
    if packed is None:
        rows_m, cols_m = conv_matrices(op.winograd_tile, op.kernel)
        w = be.read(weight).reshape(op.out_channels, op.in_channels, *op.kernel)
        u = transformed_weights(rows_m, w, cols_m)
        parts = [m.ravel() for m in (rows_m.B, cols_m.B, rows_m.A, cols_m.A)] + [u.ravel()]
        packed = be.constant(np.concatenate(parts).astype(np.float32))
        be.packed[key] = packed
    return packed


def _plan_winograd(be: PlannerTarget, op: A.Conv2D, ins, outs) -> KernelWork:
    """Winograd F(n x n, k x k) as one kernel (winograd.comp): input transform, the products at
    every position and the output transform with the epilogue, per workgroup of TM output channels
    x TN tiles. Up to 16 positions an invocation holds 2 x 2 of them; more, one."""
    rows_m, cols_m = conv_matrices(op.winograd_tile, op.kernel)
    (nh, nw), (ah, aw) = (rows_m.n, cols_m.n), (rows_m.alpha, cols_m.alpha)
    n, c, oc = op.batch, op.in_channels, op.out_channels
    (h, w), (oh, ow), (kh, kw) = op.in_hw, op.out_hw, op.kernel
    th, tw = -(-oh // nh), -(-ow // nw)
    t, positions = n * th * tw, ah * aw
    tm = tn = 16
    rm = rn = 2 if positions <= 16 else 1
    mats = ah * ah + aw * aw + ah * nh + aw * nw
    tk = max(1, min(8, (WINOGRAD_SHARED_FLOATS - mats) // (positions * (tm + tn))))
    defines = {"AH": ah, "AW": aw, "NH": nh, "NW": nw, "TM": tm, "TN": tn, "RM": rm, "RN": rn, "TK": tk,
               "NT": (tm // rm) * (tn // rn)}
    if op.has_bias:
        defines["HAS_BIAS"] = 1
    if op.has_residual:
        defines["HAS_RESIDUAL"] = 1
    b = Builder(be, "winograd", defines, RESIDUAL_BINDINGS if op.has_residual else 4)
    o_len = n * oc * oh * ow
    o = b.bind(0, outs[0], 0, o_len, write=True)
    x = b.bind(1, ins[0], 0, n * c * h * w)
    u = b.bind(2, _winograd_weights(be, op, ins[1]))
    bias = b.bind(3, ins[2], 0, oc) if op.has_bias else 0
    b.set(0, oc, c, h, w, oh, ow, th, tw, t, op.pads[0], op.pads[1], x, u, bias, o)
    _bind_residual(b, op, ins, o_len)
    b.activation(22, op.activation)
    b.groups = (math.ceil(t / tn), math.ceil(oc / tm), 1)
    _check_grid(be, b.groups)
    return KernelWork([b], f"winograd F({nh}x{nw}, {kh}x{kw})")


def _quantized_conv_constant(be: PlannerTarget, op: A.QuantizedConv2D, ins, dot: bool) -> TensorHandle:
    """quantized_conv2d.comp's int32 constant: the bias, the multipliers' bits and the weights
    widened to int32, made once per weight (the op's weight, bias and multipliers are constants);
    for ``dot`` (-DINT8_DOT) the weights as words of four bytes instead and the bias less
    x_zero times each output channel's weight sum."""
    w, bias, mult = ins[1:4]
    if not all(_is_constant(h) for h in (w, bias, mult)):
        raise be.plan_error("QuantizedConv2D needs constant weights, bias and multipliers")
    key = ("quantized_conv2d", *((h.buffer.id, h.offset) for h in (w, bias, mult)), op.out_channels,
           (op.x_zero_point,) if dot else ())
    packed = be.packed.get(key)
    if packed is None:
        oc = op.out_channels
        weights = be.read(w).reshape(oc, -1).astype(np.int8)
        bias_values = be.read(bias).reshape(-1)[:oc].astype(np.int64)
        if dot:
            bias_values = bias_values - op.x_zero_point * weights.sum(axis=1, dtype=np.int64)
            words = np.zeros((oc, -(-weights.shape[1] // 4) * 4), np.int8)
            words[:, :weights.shape[1]] = weights
            weight_part = words.view("<i4").reshape(-1)
        else:
            weight_part = weights.reshape(-1).astype(np.int32)
        parts = (_wrapped_int32(bias_values), be.read(mult).reshape(-1)[:oc].astype(np.float32).view(np.int32),
                 weight_part)
        packed = be.packed[key] = be.constant(np.concatenate(parts))
    return packed


def _wrapped_int32(values: np.ndarray) -> np.ndarray:
    """``values`` modulo 2**32 as int32: the kernels' sums wrap the same way."""
    return ((values.astype(np.int64) + 2 ** 31) % 2 ** 32 - 2 ** 31).astype(np.int32)


def _plan_quantized_conv2d(be, op: A.QuantizedConv2D, ins, outs):
    """Static int8 convolution (quantized_conv2d.comp), bytes in and out, int32 sums and the float32
    requantizing epilogue: the GPU family's implicit GEMM on int32 tiles (on packed bytes and
    integer dot products where the backend chose them: ``be.int8_dot``), else (depthwise, and
    CPU devices) an invocation per output (per word of a packed one)."""
    (h, w), (oh, ow), (kh, kw) = op.in_hw, op.out_hw, op.kernel
    (sh, sw), (ph, pw), (dh, dw) = op.strides, op.pads, op.dilations
    total = op.batch * op.out_channels * oh * ow
    defines = _element_defines(be, op.dtype, op.out_dtype)
    if op.dtype == A.INT8:
        defines["X_SIGNED"] = 1
    tiled = be.kernels == "tiled" and op.scheme != "depthwise"
    dot = tiled and bool(be.int8_dot)
    if tiled:
        tm, tn, rm, rn = _gemm_tiles(be, op.out_channels // op.groups, oh * ow, op.batch * op.groups)
        defines.update(TILED=1, TM=tm, TN=tn, RM=rm, RN=rn, TK=16, NT=(tm // rm) * (tn // rn))
        if dot:
            defines["INT8_DOT"] = 1
    b = Builder(be, "quantized_conv2d", defines, 3)
    o = b.bind(0, outs[0], 0, total, write=True)
    x = b.bind(1, ins[0], 0, op.batch * op.in_channels * h * w)
    packed = b.bind(2, _quantized_conv_constant(be, op, ins, dot))
    b.set(0, total, op.in_channels, h, w, op.out_channels, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, op.groups,
          op.x_zero_point, op.y_zero_point, op.lo, op.hi, x, packed, o)
    if tiled:
        b.groups = (math.ceil(oh * ow / tn), math.ceil(op.out_channels // op.groups / tm), op.batch * op.groups)
        _check_grid(be, b.groups)
        return KernelWork([b], "int8 implicit GEMM" + ("/dot products" if dot else ""))
    _elements_grid(be, b, op.out_dtype, total, o)
    return KernelWork([b], "int8 direct")


def _plan_quantized_add(be, op: A.QuantizedAdd, ins, outs):
    """The static int8 sum (quantized_add.comp): bytes in and out, an invocation per element (per
    word of a packed output)."""
    n = op.count
    defines = _element_defines(be, op.dtype, op.out_dtype)
    if op.dtype == A.INT8:
        defines["X_SIGNED"] = 1
    b = Builder(be, "quantized_add", defines, 3)
    o = b.bind(0, outs[0], 0, n, write=True)
    a_off = b.bind(1, ins[0], 0, n)
    b_off = b.bind(2, ins[1], 0, n)
    b.set(0, n, a_off, b_off, o, op.a_zero_point)
    b.setf(5, op.a_scale)
    b.set(6, op.b_zero_point)
    b.setf(7, op.b_scale, op.y_scale)
    b.set(9, op.y_zero_point, op.lo, op.hi)
    _elements_grid(be, b, op.out_dtype, n, o)
    return KernelWork([b], "int8 elementwise")


def _quantized_matmul_constant(be: PlannerTarget, op: A.QuantizedMatMul, ins) -> TensorHandle:
    """quantized_matmul.comp's int32 constant: the weight's column sums, the column scales' bits and
    the int8 weight four steps of k a word, made once per weight (weight and scales are constants)."""
    w, w_scale = ins[1:3]
    if not all(_is_constant(h) for h in (w, w_scale)):
        raise be.plan_error("QuantizedMatMul needs a constant weight and column scales")
    key = ("quantized_matmul", *((h.buffer.id, h.offset) for h in (w, w_scale)), op.k, op.n)
    packed = be.packed.get(key)
    if packed is None:
        k, n = op.k, op.n
        weight = be.read(w).reshape(k, n).astype(np.int8)
        steps = np.zeros((-(-k // 4) * 4, n), np.int8)
        steps[:k] = weight
        words = np.ascontiguousarray(steps.reshape(-1, 4, n).transpose(0, 2, 1)).view(np.int32).reshape(-1)
        parts = (weight.sum(axis=0, dtype=np.int32), be.read(w_scale).reshape(-1)[:n].astype(np.float32).view(np.int32),
                 words)
        packed = be.packed[key] = be.constant(np.concatenate(parts))
    return packed


#: invocations per row of quantize_rows.comp
QUANTIZE_WG = 64
#: rows x columns of one invocation of quantized_matmul.comp on SIMD CPUs (fewer rows where M is less)
QUANTIZED_REGISTER_BLOCK = (4, 8)
#: how QuantizedMatMul computes here (quantize_rows.comp, quantized_matmul.comp), for ``gpumnn info``
INT8_PRODUCTS = ("rows quantized to uint8 on the device at run time, int32 sums: int32 tiles in shared memory "
                 "(GPU family), register blocks of 4 rows x 8 columns an invocation (CPU devices)")


def _plan_quantized_matmul(be, op: A.QuantizedMatMul, ins, outs):
    """The dynamically quantized product: each row of x quantized to uint8 into a scratch of the
    execution's own (quantize_rows.comp; not for a ``prequantized`` x, already uint8), then the int8
    product with int32 sums and the dequantizing epilogue (quantized_matmul.comp): int32 tiles in
    shared memory (GPU family) or an invocation per output (CPU devices). The weight's column sums
    are packed with it at planning time."""
    m, n, k = op.m, op.n, op.k
    defines = _element_defines(be, A.UINT8, A.FLOAT32)
    tiled = be.kernels == "tiled"
    if tiled:
        tm, tn, rm, rn = _gemm_tiles(be, m, n, 1)
        defines.update(TILED=1, TM=tm, TN=tn, RM=rm, RN=rn, TK=16, NT=(tm // rm) * (tn // rn))
    else:
        rm, rn = QUANTIZED_REGISTER_BLOCK
        rm = min(rm, m)
        defines.update(RM=rm, RN=rn)
    defines["PREQUANTIZED" if op.prequantized else "Q_WORDS"] = 1  # quantize_rows' scratch: whole words a row
    if op.has_bias:
        defines["HAS_BIAS"] = 1
    b = Builder(be, "quantized_matmul", defines, 6)
    work, keep, zero = [b], (), 0
    if op.prequantized:
        q_handle, lda = ins[0], k
        rows, rows_lo, rows_hi = ins[3], 0, 1
        zero = b.bind(5, ins[4], 0, 1)
    else:
        words = -(-k // 4)
        scratch = be.scratch(4 * m * words), be.scratch(8 * m)
        keep = scratch
        try:
            quantize = Builder(be, "quantize_rows", {"WG": QUANTIZE_WG}, 3)
            q_words = quantize.bind(0, TensorHandle(scratch[0], 0, (m * words,), A.INT32), write=True)
            rows_off = quantize.bind(1, TensorHandle(scratch[1], 0, (2 * m,)), write=True)
            x = quantize.bind(2, ins[0], 0, m * k)
            quantize.set(0, m, k, words, x, q_words, rows_off)
            quantize.rows(m)
        except BaseException:
            release_scratch(be, scratch)
            raise
        work.insert(0, quantize)
        q_handle, lda = TensorHandle(scratch[0], 0, (4 * m * words,), A.UINT8), 4 * words
        rows, rows_lo, rows_hi = TensorHandle(scratch[1], 0, (2 * m,)), 0, 2 * m
    try:
        y = b.bind(0, outs[0], 0, m * n, write=True)
        q = b.bind(1, q_handle, 0, (m - 1) * lda + k)
        packed = b.bind(2, _quantized_matmul_constant(be, op, ins))
        bias = b.bind(3, ins[op.bias_input()], 0, n) if op.has_bias else 0
        b.set(0, m, n, k, q, lda, packed, bias, b.bind(4, rows, rows_lo, rows_hi), zero, y)
        b.activation(10, op.activation)
        if tiled:
            b.groups = (math.ceil(n / tn), math.ceil(m / tm), 1)
            _check_grid(be, b.groups)
        else:
            b.grid1d(-(-m // rm) * -(-n // rn), 64)
    except BaseException:
        release_scratch(be, keep)
        raise
    return KernelWork(work, "int8 tiled GEMM" if tiled else "int8 register blocks", keep)


def _is_constant(handle: TensorHandle) -> bool:
    return getattr(handle.buffer, "kind", "") in ("constant", "arena")


def _packed_conv_weights(be: PlannerTarget, weight: TensorHandle, groups: int, m: int, k: int, rm: int) -> TensorHandle:
    """Weights [G, M, K] repacked to [G, ceil(M/RM), K, RM] (zero rows pad M), once per weight."""
    key = (weight.buffer.id, weight.offset, weight.shape, groups, rm)
    packed = be.packed.get(key)
    if packed is None:
        w = be.read(weight).reshape(groups, m, k)
        blocks = -(-m // rm)
        padded = np.zeros((groups, blocks * rm, k), dtype=np.float32)
        padded[:, :m] = w
        packed = be.constant(padded.reshape(groups, blocks, rm, k).transpose(0, 1, 3, 2).copy())
        be.packed[key] = packed
    return packed


def _rb_blocks(m: int, oh: int, ow: int, lanes: int, max_rn: int = 16) -> tuple[int, int]:
    """(RM output channels, RN pixels of a row) per invocation of DIRECT_RB.

    On lavapipe (Mesa 22.x) every storage-buffer load, uniform address or not, is a scalar loop
    over the SIMD lanes per component (tens of cycles per value loaded for one SIMD vector), an
    FMA one instruction: per input channel and tap an
    invocation loads RM + RN values for RM * RN FMAs, so bigger blocks win until the
    accumulators spill (RM * RN <= 256 floats measured best), and lanes left idle by too few
    pixel blocks (small late-stage maps, e.g. 7x7) or padding channels are wasted. Score each
    candidate by FMAs per load times the fraction of lanes and block elements doing real work.
    """
    best = None
    rms = (16, 32) if m >= 16 else (4 * -(-m // 4),)
    for rm in rms:
        for max_rn in (16, 8, 4)[(16 // max_rn).bit_length() - 1:]:
            if rm * max_rn > 256:
                continue
            rn = -(-ow // -(-ow // max_rn))  # <= max_rn pixels, evenly split rows
            items = oh * -(-ow // rn)
            used = (items / (-(-items // lanes) * lanes)) * (ow / (-(-ow // rn) * rn)) * (m / (-(-m // rm) * rm))
            score = used * rm * rn / (rm + rn)
            if best is None or score > best[0] + 1e-9:
                best = (score, rm, rn)
    return best[1], best[2]


def _plan_conv2d_direct_rb(be, op: A.Conv2D, ins, outs):
    """Register-blocked direct convolution (conv2d.comp DIRECT_RB) for SIMD CPU devices."""
    n, c, oc, g = op.batch, op.in_channels, op.out_channels, op.groups
    (h, w), (oh, ow), (kh, kw) = op.in_hw, op.out_hw, op.kernel
    (sh, sw), (ph, pw), (dh, dw) = op.strides, op.pads, op.dilations
    cg, m = c // g, oc // g
    pointwise = op.scheme == "gemm1x1"
    if pointwise:  # one row of H*W pixels: no row-boundary waste
        h, w, oh, ow = 1, h * w, 1, oh * ow
    lanes = be.simd_lanes
    # A backend may cap the pixel block (``rb_max_rn(op)``): without an unroll hint (OpenGL) a
    # long activation epilogue over 16 pixels stays a rolled loop and spills the accumulators.
    max_rn = be.rb_max_rn(op) if hasattr(be, "rb_max_rn") else 16
    rm, rn = _rb_blocks(m, oh, ow, lanes, max_rn)
    blocks = -(-m // rm)
    packed = _packed_conv_weights(be, ins[1], g, m, cg * kh * kw, rm)
    defines: dict = {"DIRECT_RB": 1, "RM": rm, "RN": rn, "KW": kw, "SW": sw, "DW": dw, "WG": lanes}
    if op.has_bias:
        defines["HAS_BIAS"] = 1
    b = _conv2d_builder(be, op, defines)
    o = b.bind(0, outs[0], 0, n * oc * oh * ow, write=True)
    x = b.bind(1, ins[0], 0, n * c * h * w)
    wp = b.bind(2, packed)
    bias = b.bind(3, ins[2], 0, oc) if op.has_bias else 0
    if wp % 4:
        raise be.plan_error("packed weights are not vec4-aligned")
    if pointwise and rn % 4 == 0 and x % 4 == 0 and w % 4 == 0 and (c * w) % 4 == 0:
        b.defines["X_VEC4"] = 1
    row_groups = -(-ow // rn)
    b.set(0, m, oh, ow, g, x, wp // 4, bias, o, c, h, w, oc, cg, kh, sh, ph, pw, dh, row_groups, blocks)
    _bind_residual(b, op, ins, n * oc * oh * ow)
    b.activation(22, op.activation)
    b.groups = (math.ceil(oh * row_groups / lanes), blocks, n * g)
    _check_grid(be, b.groups)
    return KernelWork([b], "direct_regblock")


def _plan_conv_transpose2d(be, op: A.ConvTranspose2D, ins, outs):
    n, c, oc, g = op.batch, op.in_channels, op.out_channels, op.groups
    (h, w), (oh, ow), (kh, kw) = op.in_hw, op.out_hw, op.kernel
    (sh, sw), (ph, pw), (dh, dw) = op.strides, op.pads, op.dilations
    total = n * oc * oh * ow
    b = Builder(be, "conv_transpose2d", {"HAS_BIAS": 1} if op.has_bias else {}, 4)
    o = b.bind(0, outs[0], 0, total, write=True)
    x = b.bind(1, ins[0], 0, n * c * h * w)
    wt = b.bind(2, ins[1], 0, c * (oc // g) * kh * kw)
    bias = b.bind(3, ins[2], 0, oc) if op.has_bias else 0
    b.set(0, total, c, h, w, oc, oh, ow, c // g, oc // g, kh, kw, sh, sw, ph, pw, dh, dw, x, wt, bias, o)
    b.activation(22, op.activation)
    b.grid1d(total, 128)
    return KernelWork([b], "direct")


def _plan_pool2d(be, op: A.Pool2D, ins, outs):
    n, c = op.batch, op.channels
    (h, w), (oh, ow), (kh, kw), (sh, sw) = op.in_hw, op.out_hw, op.kernel, op.strides
    is_max = op.op == "max"
    if op.dtype in (A.UINT8, A.INT8):  # max pooling of bytes (the contract defines no other)
        return _max_pool_bytes(be, op, ins, outs)
    # a global pool as a row reduction (reduce.comp, float32 only: a float16 one takes pool2d.comp)
    if (kh, kw) == (h, w) and (oh, ow) == (1, 1) and not any(op.pads) and op.dtype == A.FLOAT32:
        return KernelWork([_reduce_builder(be, "max" if is_max else "mean", n * c, h * w, 1, ins[0], outs[0])], "global")
    total = n * c * oh * ow
    defines = {"MAX": 1} if is_max else ({"COUNT_PAD": 1} if op.count_include_pad else {})
    b = Builder(be, "pool2d", dict(defines, **_half_defines(op)), 2)
    o = b.bind(0, outs[0], 0, total, write=True)
    x = b.bind(1, ins[0], 0, n * c * h * w)
    b.set(0, total, h, w, oh, ow, kh, kw, sh, sw, *op.pads, x, o)
    b.grid1d(total, 128)
    return KernelWork([b], "direct")


def _max_pool_bytes(be, op: A.Pool2D, ins, outs) -> KernelWork:
    """Max pooling of int8 or uint8 elements (max_pool_bytes.comp), an invocation per output element
    (per word of a packed output)."""
    n, c = op.batch, op.channels
    (h, w), (oh, ow) = op.in_hw, op.out_hw
    total = n * c * oh * ow
    defines = _element_defines(be, op.dtype, op.dtype)
    if op.dtype == A.INT8:
        defines["X_SIGNED"] = 1
    b = Builder(be, "max_pool_bytes", defines, 2)
    o = b.bind(0, outs[0], 0, total, write=True)
    x = b.bind(1, ins[0], 0, n * c * h * w)
    b.set(0, total, h, w, oh, ow, *op.kernel, *op.strides, op.pads[0], op.pads[1], x, o)
    _elements_grid(be, b, op.dtype, total, o)
    return KernelWork([b], "direct bytes")


def _plan_softmax(be, op: A.Softmax, ins, outs):
    rows, count = op.outer * op.inner, op.outer * op.size * op.inner
    b = _row_builder(be, "softmax", dict({"LOG": 1} if op.log else {}, **_half_defines(op)), 2, rows, op.size)
    o = b.bind(0, outs[0], 0, count, write=True)
    x = b.bind(1, ins[0], 0, count)
    b.set(0, op.outer, op.size, op.inner, x, o)
    return KernelWork([b])


def _plan_normalize(be, op: A.Normalize, ins, outs):
    count = op.outer * op.size
    b = _row_builder(be, "normalize", dict({"AFFINE": 1} if op.has_affine else {}, **_half_defines(op)), 4, op.outer,
                     op.size)
    o = b.bind(0, outs[0], 0, count, write=True)
    x = b.bind(1, ins[0], 0, count)
    scale = b.bind(2, ins[1], 0, op.size) if op.has_affine else 0
    shift = b.bind(3, ins[2], 0, op.size) if op.has_affine else 0
    b.set(0, op.outer, op.size, x, o)
    b.setf(4, op.eps)
    b.set(5, scale, shift)
    return KernelWork([b])


def _resize_table(be: PlannerTarget, op: A.Resize) -> TensorHandle:
    """Per-axis source indices and weights, computed in float64 exactly as the reference does."""
    key = (op.in_hw, op.out_hw, op.scales, op.mode, op.coord, op.nearest_mode)
    table = be.tables.get(key)
    if table is not None:
        return table
    parts = []
    for axis in range(2):
        sampling = resize_axis(op, axis)
        parts += [sampling.lo, sampling.hi, sampling.frac]
    table = be.constant(np.concatenate([np.asarray(p, dtype=np.float32) for p in parts]))
    be.tables[key] = table
    return table


def _plan_resize(be, op: A.Resize, ins, outs):
    (h, w), (oh, ow) = op.in_hw, op.out_hw
    total = op.planes * oh * ow
    table = _resize_table(be, op)
    b = Builder(be, "resize", {"NEAREST": 1} if op.mode == "nearest" else {}, 3)
    o = b.bind(0, outs[0], 0, total, write=True)
    x = b.bind(1, ins[0], 0, op.planes * h * w)
    t = b.bind(2, table)
    b.set(0, total, h, w, oh, ow, x, o, t)
    b.grid1d(total, 128)
    return KernelWork([b], op.mode)


def _plan_gather(be, op: A.Gather, ins, outs):
    total = op.outer * op.count * op.inner
    b = Builder(be, "gather", _element_defines(be, op.dtype, op.dtype), 3)
    o = b.bind(0, outs[0], 0, total, write=True)
    d = b.bind(1, ins[0], 0, op.outer * op.axis * op.inner)
    i = b.bind(2, ins[1], 0, op.count)
    b.set(0, total, op.axis, op.inner, op.count, d, i, o)
    _elements_grid(be, b, op.dtype, total, o)
    return KernelWork([b])


def _plan_select(be, op: A.Select, ins, outs):
    return KernelWork([_elementwise_builder(be, "select", _element_defines(be, op.dtype, op.dtype), op.out_shape,
                                            (op.c_strides, op.a_strides, op.b_strides), ins, outs)])


def _plan_cumsum(be, op: A.CumSum, ins, outs):
    count = op.outer * op.size * op.inner
    b = Builder(be, "cumsum", _int_defines(op.dtype), 2)
    o = b.bind(0, outs[0], 0, count, write=True)
    x = b.bind(1, ins[0], 0, count)
    b.set(0, op.outer, op.size, op.inner, x, o, int(op.exclusive), int(op.reverse))
    b.grid1d(op.outer * op.inner, 64)
    return KernelWork([b])


#: the most bindings a dispatch has: recurrent.comp's (out, gates, projection, state, one optional
#: float input, lengths); the Vulkan backend sizes its descriptor sets for it
MAX_BINDINGS = 6


def _plan_recurrent_cell(be, op: A.RecurrentCell, ins, outs):
    """One dispatch; the directions' values are parameters (recurrent.comp has room for two)."""
    if op.directions > 2:
        raise be.plan_error(f"recurrent.comp takes at most 2 directions, not {op.directions}")
    roles = dict(zip(op.input_roles(), ins))
    d, batch, h = op.directions, op.batch, op.hidden
    total = d * batch * h
    per = A.CELLS[op.cell][1]
    b = Builder(be, "recurrent", {}, MAX_BINDINGS)
    out = b.bind(0, outs[0], 0, op.output_blocks * total, write=True)
    gates = b.bind(1, roles["gates"])
    lo = min(op.x_offsets)
    hi = max(op.x_offsets) + (batch - 1) * op.x_row_stride + A.CELLS[op.cell][0] * h
    proj = b.bind(2, roles["projection"], lo, hi)
    state = b.bind(3, roles["state"])
    extra_handle = next((roles[r] for r in ("candidate", "recurrent_bias", "peephole") if r in roles), None)
    extra = b.bind(4, extra_handle) if extra_handle is not None else 0
    lengths = b.bind(5, roles["lengths"]) if "lengths" in roles else 0
    ids = [A.CELL_ACTIVATION_IDS[a[0]] for a in op.activations]
    packed = sum(ids[dd * per + k] << (4 * (3 * dd + k)) for dd in range(d) for k in range(per))
    b.set(0, total, batch, h, op.gate_blocks, op.x_row_stride)
    b.setf(5, op.clip)
    b.set(6, list(A.CELLS).index(op.cell), op.flags, packed, out, gates, proj, state, extra, lengths)
    for dd in range(d):
        acts = op.activations[dd * per:(dd + 1) * per]
        b.set(15 + 8 * dd, op.x_offsets[dd], op.steps[dd])
        b.setf(17 + 8 * dd, *[a[1] for a in acts])
        b.setf(20 + 8 * dd, *[a[2] for a in acts])
    b.grid1d(total, 64)
    return KernelWork([b], op.cell)


SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _plan_scatter(be, op: A.Scatter, ins, outs):
    """Two dispatches: data copied to out, then the rows written (the hazard tracker puts a
    barrier between them: both write out)."""
    data, index, updates = ins
    out = outs[0]
    n, items = op.rows * op.inner, op.count * op.inner
    if n == 0:
        return KernelWork([])
    copy = _region_builder(be, A.Region(0, 0, (0, 0, 0, 1), 0, (0, 0, 0, 1), (1, 1, 1, n)), data, out, op.dtype)
    defines = dict(_int_defines(op.dtype), **_element_defines(be, op.dtype, op.dtype),
                   REDUCTION=SCATTER_REDUCTIONS.index(op.reduction))
    b = Builder(be, "scatter", defines, 3)
    o = b.bind(0, out, 0, n, write=True)
    i = b.bind(1, index, 0, op.count)
    u = b.bind(2, updates, 0, items)
    b.set(0, items, op.rows, op.inner, o, i, u)
    b.grid1d(items, 128)
    return KernelWork([copy, b])


#: The schemes the planners build (Vulkan and OpenGL both use these planners).
SCHEMES: Mapping[type, frozenset[str]] = KERNEL_SCHEMES
TILED_SCHEMES: Mapping[type, frozenset[str]] = TILED_KERNEL_SCHEMES
#: the bindings of a convolution that adds a residual (conv2d.comp and winograd.comp -DHAS_RESIDUAL)
RESIDUAL_BINDINGS = 5
#: every convolution kernel of conv2d.comp (implicit GEMM, DIRECT_RB, DEPTHWISE) and winograd.comp
#: adds a residual; a backend lists these only where a shader may bind RESIDUAL_BINDINGS storage buffers
RESIDUAL_SCHEMES: Mapping[type, frozenset[str]] = family_residual_schemes("simd")
TILED_RESIDUAL_SCHEMES: Mapping[type, frozenset[str]] = family_residual_schemes("tiled")
schemes_for, residual_schemes_for = family_schemes, family_residual_schemes
#: the largest Winograd tile the scheme step rewrites a convolution into for these kernels: the
#: batched products of larger tiles run slower here than F(2x2, 3x3) on every model measured
#: (bench/RESULTS.md, "Convolution schemes per API")
WINOGRAD_REWRITE_MAX_TILE = 2
#: the kernels beyond float32 (see Backend.dtypes): Unary, Binary, Reduce, CumSum and Scatter's
#: reductions compute on int32 with -DIN_INT; Raster, Gather, Select and Scatter move elements of
#: every storage dtype (elements.glsl), Unary identity converts between any two (convert.comp), and
#: max pooling takes bytes (max_pool_bytes.comp)
DTYPES: Mapping[type, frozenset[str]] = {
    **{op: frozenset({A.INT32}) for op in (A.Binary, A.Reduce, A.CumSum)},
    **{op: frozenset(A.STORAGE_DTYPES) for op in (A.Raster, A.Unary, A.Gather, A.Select, A.Scatter)},
    A.QuantizedConv2D: frozenset({A.UINT8, A.INT8}), A.QuantizedAdd: frozenset({A.UINT8, A.INT8}),
    A.QuantizedMatMul: frozenset({A.UINT8}), A.Pool2D: frozenset({A.UINT8, A.INT8})}
#: the tiled kernels also take float16 storage for the products, pooling, elementwise math, softmax
#: and normalisation
#: where the device holds 16-bit elements in buffers (-DHALF: ``_half_defines``; A.FLOAT16_COMPUTE_OPS);
#: the simd family's vec4 and register-blocked kernels are float32 only
TILED_FLOAT16_DTYPES: Mapping[type, frozenset[str]] = {
    **DTYPES, **{op: DTYPES.get(op, frozenset()) | {A.FLOAT16}
                 for op in (A.Conv2D, A.MatMul, A.Pool2D, A.Binary, A.Softmax, A.Normalize)}}


def dtypes_for(kernels: str, native_narrow: frozenset[int]) -> Mapping[type, frozenset[str]]:
    """The storage dtypes beyond float32 the ``kernels`` family takes per op on a device holding
    the narrow element sizes ``native_narrow`` natively."""
    return TILED_FLOAT16_DTYPES if kernels == "tiled" and 2 in native_narrow else DTYPES


#: the id of each storage dtype in convert.comp's -DIN_KIND / -DOUT_KIND
KIND_IDS: dict[str, int] = {dtype: i for i, dtype in enumerate(A.STORAGE_DTYPES)}
#: the Unary, Binary and Reduce names the kernels implement (see Backend.op_names): all of them
OP_NAMES: Mapping[type, frozenset[str]] = {A.Unary: frozenset(A.UNARY_OPS), A.Binary: frozenset(A.BINARY_OPS),
                                           A.Reduce: frozenset(A.REDUCE_OPS)}

#: the schemes whose kernels take float32 storage only (Backend.float32_only_schemes): gemv.comp
#: and winograd.comp
FLOAT32_ONLY_SCHEMES: Mapping[type, frozenset[str]] = {A.MatMul: frozenset({"gemv"}), A.Conv2D: frozenset({"winograd"})}

PLANNERS: Mapping[type, Callable] = {
    A.Raster: _plan_raster, A.Unary: _plan_unary, A.Binary: _plan_binary, A.Reduce: _plan_reduce,
    A.MatMul: _plan_matmul, A.Conv2D: _plan_conv2d, A.ConvTranspose2D: _plan_conv_transpose2d,
    A.Pool2D: _plan_pool2d, A.Softmax: _plan_softmax, A.Normalize: _plan_normalize,
    A.Resize: _plan_resize, A.Gather: _plan_gather, A.Select: _plan_select, A.CumSum: _plan_cumsum,
    A.Scatter: _plan_scatter, A.RecurrentCell: _plan_recurrent_cell, A.QuantizedConv2D: _plan_quantized_conv2d,
    A.QuantizedMatMul: _plan_quantized_matmul, A.QuantizedAdd: _plan_quantized_add,
}


def plan(be: PlannerTarget, op: A.AtomicOp, inputs: Sequence[TensorHandle], outputs: Sequence[TensorHandle]) -> KernelWork:
    """One atomic op's KernelWork with the backend's dispatches as its work: its planner's builders,
    each built by ``be`` (empty grids dropped)."""
    planned = PLANNERS[type(op)](be, op, list(inputs), list(outputs))
    try:
        return dataclasses.replace(planned, work=[d for d in (b.build() for b in planned.work) if d is not None])
    except BaseException:  # a kernel that does not build: its scratch goes now
        release_scratch(be, planned.keep)
        raise


__all__ = ["BINARY_IDS", "Binding", "Builder", "DTYPES", "TILED_FLOAT16_DTYPES", "dtypes_for", "MAX_BINDINGS", "Hazards", "OP_NAMES", "PARAMS", "PLANNERS", "PlanError",
           "PlannerTarget", "REDUCE_IDS", "RESIDUAL_BINDINGS", "RESIDUAL_SCHEMES", "SCHEMES",
           "TILED_RESIDUAL_SCHEMES", "TILED_SCHEMES", "k_splits", "release_scratch", "residual_schemes_for", "schemes_for", "UNARY_IDS", "binding_limit", "check_shader_op_ids", "plan",
           "view_sizes"]
