"""The Backend interface every compute API implements (after the MNN paper's Figure 5).

A backend knows nothing of ONNX and the session knows nothing of any API. The session drives
every backend through the same verbs, in two phases:

Pre-inference (once, at session creation; MNN's *resize*)
    ``allocate`` one pool buffer per backend (the pool layout lays tensors into it),
    ``tensor`` views into the pool, ``constant`` uploads of weights,
    ``create_execution`` per atomic op (MNN's ``onCreate``: kernels built, weights packed,
    arguments set), and ``record`` of a contiguous run of executions into one replayable unit
    (a command buffer, a CUDA graph, an enqueue list) -- MNN's ``onResizeEnd``.

Run (every inference; MNN's *execute*)
    ``write`` inputs, ``submit`` recordings (submit and wait), ``read`` outputs. Where a run's
    next steps are on other backends, ``submit_async`` hands a recording over without waiting
    and ``wait`` on its ticket comes later, just before the run next touches that backend (see
    ``gpumnn.scheduler.overlap``): a GPU segment runs while the CPU works on another branch.

Eager mode (``record=False``) is the paper's baseline: the session repeats allocation and
``create_execution`` on every run and calls ``run_eager``, which waits after every op.

``counters`` lets tests prove that a recorded run allocates, builds and records nothing. They
mean the same on every backend because they are counted here, in template methods that call
the backend's hooks (``_new_buffer``, ``_load_program``, ``_create_execution``, ``_record``,
``_submit``, ``_submit_async``, ``_run_eager``), never by a backend itself; see ``COUNTERS``.

Measuring: ``measure`` times any host callable with the backend's own synchronisation, on the
host's clock (for calibration, ``gpumnn.scheduler.calibration``, and the per-op profile of
``gpumnn plan``); ``measure_recording`` times one recording's commands on the device's own clock
(``timer`` says which) where the API has one.

Threads: a session lends each run its own pools, executions and recordings (a *run state*,
see ``gpumnn.run_states``), so verbs of different runs never touch the same tensors. A backend
says through ``max_concurrent_runs`` how many run states of one session may be in flight at
once: more than one only where its verbs share no mutable per-backend state (a staging buffer,
a fence, a command pool). ``activate`` brackets every use from a thread; an API whose context
belongs to one thread at a time (OpenGL) makes it current there and holds it for the bracket.
"""
from __future__ import annotations

import inspect
import os
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Hashable, Mapping, Protocol, Sequence

import numpy as np

from .. import atomic as A
from ..atomic import AtomicOp
from ..errors import BackendOptionError, DeviceArrayError
from .limits import MemoryLimits, host_limits

#: Seconds a backend waits for one submission before it calls the device hung (``submit_timeout``,
#: a session option): the longest submission in CI, a whole zoo model recorded on lavapipe or
#: llvmpipe on two busy cores, takes seconds, so two minutes is a hang and not a slow device.
DEFAULT_SUBMIT_TIMEOUT = 120.0

#: The schemes every backend's kernel for these ops builds: the general algorithms (sliding
#: window, plain GEMM) that are correct for any geometry. Faster ones are listed per backend.
GENERAL_SCHEMES: Mapping[type, frozenset[str]] = {A.Conv2D: frozenset({"im2col"}), A.MatMul: frozenset({"gemm"})}
#: ... plus the depthwise and 1x1-as-GEMM convolution kernels, which every backend here has.
KERNEL_SCHEMES: Mapping[type, frozenset[str]] = {A.Conv2D: frozenset({"depthwise", "gemm1x1", "im2col"}),
                                                 A.QuantizedConv2D: frozenset({"depthwise", "gemm1x1", "im2col"}),
                                                 A.MatMul: frozenset({"gemm"})}
#: ... plus what both GPU kernel families build in their GPU ("tiled") variant: Winograd convolutions
#: and matrix-vector products as kernels of their own (winograd.cl / winograd.comp, gemv.cl / gemv.comp)
TILED_KERNEL_SCHEMES: Mapping[type, frozenset[str]] = {**KERNEL_SCHEMES,
                                                       A.Conv2D: KERNEL_SCHEMES[A.Conv2D] | {"winograd"},
                                                       A.MatMul: KERNEL_SCHEMES[A.MatMul] | {"gemv"}}


def family_schemes(kernels: str) -> Mapping[type, frozenset[str]]:
    """The schemes a GPU kernel family's ``kernels`` variant ("simd" or "tiled") builds."""
    return TILED_KERNEL_SCHEMES if kernels == "tiled" else KERNEL_SCHEMES


def family_residual_schemes(kernels: str) -> Mapping[type, frozenset[str]]:
    """The schemes whose convolution kernels of a GPU family's ``kernels`` variant add a residual:
    every one of them, in both families."""
    return {A.Conv2D: family_schemes(kernels)[A.Conv2D]}

#: Schemes that name a kernel specialised for part of a general scheme's work: a backend without
#: that kernel runs the op with the general one (a ``gemv`` MatMul is a GEMM of one row), so an op
#: whose scheme was chosen for one backend still runs wherever placement puts it.
SCHEME_FALLBACKS: Mapping[str, str] = {"gemv": "gemm"}

#: The ``kernels=`` option of every backend, one vocabulary: "simd" (kernels for a CPU device's
#: vector units: explicit vectors, register blocking, narrow work-groups, no barriers), "tiled"
#: (kernels for a GPU: shared/local-memory tiles, wide work-groups) or "auto" (simd on CPU
#: devices, tiled on GPUs). Unset, ``$GPUMNN_KERNELS`` decides, else "auto". The NumPy backend
#: has one family and checks the value only, so a session's options work on every backend.
KERNEL_FAMILIES = ("auto", "simd", "tiled")
KERNELS_ENV = "GPUMNN_KERNELS"


def kernels_option(kernels: str | None, backend: str) -> str:
    """The ``kernels=`` value asked for ("auto", "simd" or "tiled"; unset: ``$GPUMNN_KERNELS``,
    else "auto"), or a BackendOptionError naming the valid values."""
    where = "kernels="
    if kernels is None:
        kernels, where = os.environ.get(KERNELS_ENV) or "auto", f"${KERNELS_ENV}="
    if kernels not in KERNEL_FAMILIES:
        raise BackendOptionError(f"backend {backend!r}: {where}{kernels!r} is not one of "
                                 f"{', '.join(map(repr, KERNEL_FAMILIES))}")
    return kernels


def kernel_family(requested: str, cpu_device: bool) -> str:
    """The family a backend with kernels for both uses: ``requested``, or for "auto" simd on a
    CPU device and tiled on a GPU."""
    return requested if requested != "auto" else ("simd" if cpu_device else "tiled")


#: The counters of every backend, each counted by one template method of :class:`Backend`:
#: ``buffers_allocated`` -- device buffers created (pools, constants' storage, scratch, staging), by ``buffer``;
#: ``programs_built`` -- kernel variants compiled, not found in any cache (memory, disk, a shared
#: device or pooled context), by ``program``; ``executions_created`` -- by ``create_execution``;
#: ``recordings_made`` -- by ``record``; ``submits`` -- device work handed over and waited for: one
#: per ``submit``, one per execution in ``run_eager`` (the eager baseline waits after every op);
#: ``async_submits`` -- of those submits, the ones handed over by ``submit_async`` (waited for
#: later, by ``wait``; a backend without its own ``_submit_async`` still waits inside it).
COUNTERS = ("buffers_allocated", "programs_built", "executions_created", "recordings_made", "submits",
            "async_submits")


@dataclass(frozen=True)
class BackendInfo:
    """What the scheduler needs to know about a device (paper Eq. 5 and Appendix C)."""

    name: str
    device: str
    flops: float  # multiply-accumulates per second the cost model assumes
    t_schedule_ms: float  # fixed cost of one kernel launch / dispatch
    bandwidth_gbs: float  # host <-> device copy bandwidth, GB/s (inf for host memory)
    is_gpu: bool


@dataclass
class TensorHandle:
    """A tensor living in a backend buffer: ``shape`` elements of ``dtype`` from ``offset``.

    ``offset`` counts elements of ``dtype`` from the start of ``buffer``. ``buffer`` is whatever the
    backend allocated (a NumPy array, a ``cl.Buffer``, a ``VkBuffer`` wrapper, ...). ``dtype`` is
    a storage dtype (``A.STORAGE_DTYPES``; see ``gpumnn.atomic``); the NumPy backend's
    constant folding also passes arrays of any NumPy dtype, named by ``dtype``.
    """

    buffer: Any
    offset: int
    shape: tuple[int, ...]
    dtype: str = A.FLOAT32

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return A.ITEMSIZE.get(self.dtype) or np.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return self.itemsize * self.size


def host_out(handle: TensorHandle, out: np.ndarray) -> np.ndarray:
    """``out`` as the flat view a ``read_into`` copies into, or a ValueError: it must be C-contiguous
    (a reshape of anything else would be a copy, and the data would land in it instead), of
    ``handle.dtype`` and ``handle.size`` elements."""
    if not out.flags.c_contiguous or out.dtype != np.dtype(handle.dtype) or out.size != handle.size:
        raise ValueError(f"read_into needs a C-contiguous {handle.dtype} array of {handle.size} elements, "
                         f"got {out.dtype} {out.shape}{'' if out.flags.c_contiguous else ' (not contiguous)'}")
    return out.reshape(-1)


def constant_words(array: np.ndarray) -> tuple[np.ndarray, str]:
    """A weight as the flat, contiguous array of its storage dtype that ``constant`` uploads."""
    dtype = A.storage_dtype(np.asarray(array).dtype)
    return np.ascontiguousarray(array, dtype=dtype).reshape(-1), dtype


@dataclass(frozen=True)
class KernelWork:
    """What every backend's kernel maker returns for one atomic op: one shape on every backend,
    so that ``create_execution`` reads a maker's answer the same way everywhere.

    ``work``: the backend's work items in run order (NumPy: callables; OpenCL: kernel launches;
    Vulkan and OpenGL: dispatches), empty where there is nothing to compute; ``scheme``: the
    algorithm the work uses, shown by ``Session.report`` (None: the op's own ``scheme``);
    ``keep``: objects the work references that must live as long as the execution (scratch
    buffers, sampling tables), beyond the op's own tensors; ``prepare``: work items to run once,
    at creation, before any run (packing a constant weight; see ``backends.kernels.cl.planner``).
    """

    work: tuple = ()
    scheme: str | None = None
    keep: tuple = ()
    prepare: tuple = ()

    def __post_init__(self) -> None:
        for name in ("work", "keep", "prepare"):
            object.__setattr__(self, name, tuple(getattr(self, name)))


class PlannerTarget(Protocol):
    """What an API-neutral planner (``backends/kernels/<family>/planner.py``) reads from the backend
    it plans for; each family's planner extends it with the device figures it needs."""

    kernels: str  # the kernel family: "simd" (CPU devices) or "tiled" (GPUs)


class Execution:
    """One atomic op made ready to run on one backend: its kernel's work, arguments bound."""

    def __init__(self, op: AtomicOp, inputs: Sequence[TensorHandle], outputs: Sequence[TensorHandle],
                 kernel: KernelWork):
        self.op = op
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.work = kernel.work
        self.keep = kernel.keep
        self._scheme = kernel.scheme

    @property
    def scheme(self) -> str:
        """The algorithm this execution actually uses (shown by ``Session.report``)."""
        return self._scheme or getattr(self.op, "scheme", "-")


def contract_violation(op: AtomicOp) -> str | None:
    """Why ``op`` names something outside the atomic-op contract (an unknown unary, binary or
    reduce op, or one not defined on its dtype), or None. Every backend checks this before it
    looks for a kernel."""
    activation = getattr(op, "activation", None)
    if activation is not None and activation[0] not in A.UNARY_OPS:
        return f"unknown activation {activation[0]!r}"
    for dtype in {op.dtype, op.output_dtype()}:
        if dtype not in A.STORAGE_DTYPES:
            return f"unknown storage dtype {dtype!r}"
    narrow = {op.dtype, op.output_dtype()} & A.NARROW_DTYPES
    if isinstance(op, A.QuantizedMatMul) and op.prequantized and op.dtype == A.UINT8 or A.computes_on_float16(op):
        narrow = set()  # its uint8 x is defined (see A.NARROW_OPS), as is float16 storage of these (A.FLOAT16_COMPUTE_OPS)
    if isinstance(op, A.QuantizedMatMul) and op.block and (op.block % A.INT4_BLOCK_STEP or op.prequantized):
        return f"QuantizedMatMul's int4 block is a multiple of {A.INT4_BLOCK_STEP} steps of a row it quantizes, " \
               f"not {op.block}{' on prequantized rows' if op.prequantized else ''}"
    if isinstance(op, (A.QuantizedConv2D, A.QuantizedAdd, A.QuantizedGlobalAveragePool)):
        if op.dtype not in (A.UINT8, A.INT8) or op.out_dtype not in (A.UINT8, A.INT8):
            return f"{type(op).__name__} reads and writes uint8 or int8, not {op.dtype} -> {op.out_dtype}"
        narrow = set()
    if isinstance(op, A.Quantize):
        if op.dtype != A.FLOAT32 or op.out_dtype not in (A.UINT8, A.INT8):
            return f"Quantize reads float32 and writes uint8 or int8, not {op.dtype} -> {op.out_dtype}"
        narrow = set()
    if isinstance(op, A.Pool2D) and op.op == "max" and op.dtype in (A.UINT8, A.INT8):
        narrow = set()  # it compares and copies elements (see A.Pool2D)
    if narrow and (op.kind not in A.NARROW_OPS or isinstance(op, A.Unary) and op.op != "identity"
                   or isinstance(op, A.Scatter) and op.reduction != "none" or getattr(op, "activation", None)):
        return f"{type(op).__name__}{' ' + op.op if isinstance(op, A.Unary) else ''} is not defined on " \
               f"{'/'.join(sorted(narrow))}: the narrow storage dtypes are moved and converted, not computed on"
    if isinstance(op, A.Unary) and op.op not in A.UNARY_OPS:
        return f"unknown unary op {op.op!r}"
    if isinstance(op, A.Unary) and A.INT32 in (op.dtype, op.out_dtype) and op.op not in A.INT_UNARY_OPS:
        return f"unary op {op.op!r} is not defined on int32"
    if isinstance(op, A.Binary) and op.op not in A.BINARY_OPS:
        return f"unknown binary op {op.op!r}"
    if isinstance(op, A.Binary) and op.op in A.BOOL_BINARY_OPS and activation is not None:
        return f"binary op {op.op!r} gives 0/1 and takes no activation"
    if isinstance(op, A.Binary) and op.dtype == A.INT32 and (op.op not in A.INT_BINARY_OPS or activation is not None):
        return f"binary op {op.op!r}{' with an activation' if activation else ''} is not defined on int32"
    if isinstance(op, A.Reduce) and op.op not in A.REDUCE_OPS:
        return f"unknown reduce op {op.op!r}"
    if isinstance(op, A.Scatter) and op.reduction not in ("none", "add", "mul", "max", "min"):
        return f"unknown scatter reduction {op.reduction!r}"
    if isinstance(op, A.Pool2D) and op.op not in ("max", "avg"):
        return f"unknown pooling {op.op!r}"
    if isinstance(op, A.Pool2D) and op.dtype == A.INT32 and op.op != "max":
        return "average pooling is not defined on int32"
    if isinstance(op, A.Resize) and op.mode not in ("nearest", "linear"):
        return f"unknown resize mode {op.mode!r}"
    if isinstance(op, A.RecurrentCell):
        return A.recurrent_cell_violation(op)
    return None


class Backend(ABC):
    """One compute API on one device."""

    #: registry name: "cpu", "opencl", "vulkan", "gl", "cuda"
    name: str = "?"
    #: byte alignment of tensor offsets inside a pool (the pool layout honours it)
    alignment: int = 64
    #: atomic op type -> how this backend builds its kernel (checked by ``unsupported_reason``)
    kernel_table: ClassVar[Mapping[type, Any]] = {}
    #: atomic op type -> the ``scheme`` values it builds (``gpumnn.scheduler.schemes`` decides which
    #: one an op uses, asking the backend; a backend builds what ``op.scheme`` names, never re-derives
    #: it). Every backend builds the general schemes; a backend lists more where it has kernels.
    schemes: ClassVar[Mapping[type, frozenset[str]]] = GENERAL_SCHEMES
    #: atomic op type -> the schemes whose kernels add a residual in their epilogue (Conv2D's
    #: ``has_residual``); the scheme step fuses a residual add only into those
    residual_schemes: ClassVar[Mapping[type, frozenset[str]]] = {}
    #: atomic op type -> the schemes whose kernels take float32 storage only (no float16 build):
    #: ``precision="fp16"`` leaves those ops in float32
    float32_only_schemes: ClassVar[Mapping[type, frozenset[str]]] = {}
    #: how the backend's int8 kernels (QuantizedConv2D) compute, for ``gpumnn info`` ("": none);
    #: the GPU backends set it at start with ``int8_dot`` (gpumnn.backends.kernels.int8_dot)
    int8_arithmetic: str = ""
    #: the integer dot-product instruction the int8 implicit GEMM builds with ("": plain int32)
    int8_dot: str = ""
    #: whether static int8 activations stay channels-last (NHWC) between the int8 ops that take them:
    #: the backend builds the ``channels_last`` depthwise QuantizedConv2D and the ``out_channels_last``
    #: one over a few NCHW channels (read by the lowering,
    #: ``gpumnn.scheduler.precision.int8_channels_last``)
    int8_channels_last: ClassVar[bool] = False
    #: whether the QuantizedMatMul kernel takes int4 weights in blocks (``precision="int4"``)
    int4_weights: ClassVar[bool] = False
    #: how the backend's QuantizedMatMul kernels (``precision="int8"``, dynamic quantization)
    #: compute, for ``gpumnn info`` ("": the cpu's own line says it)
    int8_products: ClassVar[str] = ""
    #: run states of one session that may run at once on this backend (1: runs take turns) --
    #: what is *safe*; ``default_concurrent_runs`` says what *pays*
    max_concurrent_runs: ClassVar[int] = 1
    #: atomic op type -> the storage dtypes (``op.dtype`` and the output's) its kernel takes
    #: besides float32, which every kernel takes
    dtypes: ClassVar[Mapping[type, frozenset[str]]] = {}
    #: atomic op type -> the ``op`` names (of Unary, Binary, Reduce) its kernel implements; a type
    #: not listed implements every name the contract defines (fused activations are Unary names)
    op_names: ClassVar[Mapping[type, frozenset[str]]] = {}
    #: why this backend takes and returns host (NumPy) arrays only; None where it takes device
    #: arrays (DLPack or CUDA-array-interface tensors on its GPU) and returns them without a host
    #: round trip (``device_array``, ``write``, ``read_device``, ``to_device``, ``to_host``)
    device_arrays_unsupported: ClassVar[str | None] = "it has no way to use another API's device memory"

    #: seconds a wait for one submission may take before the backend raises DeviceLostError and
    #: marks its device lost (Vulkan fences, GL fence syncs, OpenCL and CUDA events polled through
    #: ``gpumnn.backends.waits``); the session sets it from its ``submit_timeout`` option
    submit_timeout: float = DEFAULT_SUBMIT_TIMEOUT

    #: the clock ``measure_recording`` reads: "host" (perf_counter around a submit: the default) or
    #: the device's own ("OpenCL profiling events", "Vulkan timestamp queries", ...)
    timer: str = "host"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """``read`` and ``read_into`` are each defined by the other here: a backend overrides one."""
        super().__init_subclass__(**kwargs)
        if cls.read is Backend.read and cls.read_into is Backend.read_into:
            raise TypeError(f"{cls.__name__} must override read_into (or read)")

    def __init__(self, **unknown: Any) -> None:
        """Every backend passes the keyword options its own ``__init__`` does not take here,
        where any left is a BackendOptionError listing the ones it does (``options``)."""
        if unknown:
            raise BackendOptionError(
                f"backend {self.name!r} has no option {', '.join(map(repr, sorted(unknown)))}; "
                f"its options: {', '.join(self.options()) or 'none'}")
        self.counters: Counter[str] = Counter({k: 0 for k in COUNTERS})
        self._counters_lock = threading.Lock()  # verbs of concurrent runs count at once
        #: compiled programs (kernel variants) by key, see ``program``
        self._programs: dict[Hashable, Any] = {}

    def _count(self, counter: str, n: int = 1) -> None:
        with self._counters_lock:
            self.counters[counter] += n

    @classmethod
    def options(cls) -> tuple[str, ...]:
        """The keyword options this backend takes (those its ``__init__`` names)."""
        params = inspect.signature(cls.__init__).parameters.values()
        return tuple(p.name for p in params if p.name != "self"
                     and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))

    # -- description -----------------------------------------------------------------------
    #: set by each backend's ``__init__`` once it knows its device (``info`` returns it)
    _info: BackendInfo

    @property
    def info(self) -> BackendInfo:
        """Device name and the cost-model numbers (FLOPS, t_schedule, bandwidth)."""
        return self._info

    def unsupported_reason(self, op: AtomicOp) -> str | None:
        """None when this backend can run ``op``; otherwise why not (shown in the report)."""
        if type(op) not in self.kernel_table:
            return f"the {self.name} backend has no kernel for atomic op {type(op).__name__}"
        scheme = getattr(op, "scheme", None)
        built = self.schemes.get(type(op), GENERAL_SCHEMES.get(type(op), ()))
        if scheme is not None and scheme not in built and SCHEME_FALLBACKS.get(scheme) not in built:
            return f"the {self.name} backend has no {scheme!r} kernel for atomic op {type(op).__name__}"
        if getattr(op, "has_residual", False) and scheme not in self.residual_schemes.get(type(op), ()):
            return f"the {self.name} backend's {scheme!r} kernel for atomic op {type(op).__name__} adds no residual"
        for dtype in {op.dtype, op.output_dtype()} - {A.FLOAT32}:
            if dtype not in self.dtypes.get(type(op), ()):
                return f"the {self.name} backend has no {dtype} kernel for atomic op {type(op).__name__}"
        channels_last = getattr(op, "channels_last", False) or getattr(op, "out_channels_last", False)
        if channels_last and not self.int8_channels_last:
            return f"the {self.name} backend has no channels-last kernel for atomic op {type(op).__name__}"
        if getattr(op, "block", 0) and not self.int4_weights:
            return f"the {self.name} backend has no int4 kernel for atomic op {type(op).__name__}"
        if A.FLOAT16 in {op.dtype, op.output_dtype()} and scheme in self.float32_only_schemes.get(type(op), ()):
            return f"the {self.name} backend's {scheme!r} kernel for atomic op {type(op).__name__} has no float16 build"
        names = self.op_names.get(type(op))
        if names is not None and getattr(op, "op", None) not in names:
            return f"the {self.name} backend has no kernel for {type(op).__name__} {op.op!r}"
        activation = getattr(op, "activation", None)
        unary_names = self.op_names.get(A.Unary)
        if activation is not None and unary_names is not None and activation[0] not in unary_names:
            return f"the {self.name} backend has no kernel for the activation {activation[0]!r}"
        return contract_violation(op)

    # -- schemes ---------------------------------------------------------------------------
    #: where ``schemes`` lists ``winograd`` for Conv2D (a kernel of the backend's own, not the
    #: rewrite into atomic ops): the fewest output tiles and input channels, and the least
    #: factor of multiplications saved, from which the scheme step chooses it
    winograd_min_tiles: ClassVar[int] = 0
    winograd_min_channels: ClassVar[int] = 0
    winograd_min_saving: ClassVar[float] = 0.0
    #: where that kernel transforms tiles on register tiles of fixed size, whatever alpha:
    #: (square, row, mr) = the side of the 2D input transform's square tile, the width of a 1D
    #: tile's row, the rows of the output transform's tile (``schemes.winograd_kernel_cost``
    #: prices the transforms by them); None: by Eq. 2's counts
    winograd_transform_tiles: ClassVar[tuple[int, int, int] | None] = None
    #: whether that kernel runs image by image (its product per tile position over one image's
    #: tiles), so that ``winograd_min_tiles`` counts one image's tiles; else the whole batch's
    winograd_per_image: ClassVar[bool] = False
    #: the largest tile of the Winograd rewrite (``gpumnn.geometry.fast``) the scheme step may
    #: choose here by Eq. 2; None: any tile Eq. 2 prefers
    winograd_rewrite_max_tile: ClassVar[int | None] = None

    @property
    def cost_model_expansions(self) -> frozenset[str]:
        """The rewritten schemes (Winograd, Strassen: ``gpumnn.scheduler.expansion``) the scheme step
        may choose here by the paper's multiplication counts. Not on CPU devices: there the
        sliding window / plain GEMM is one large GEMM at full speed, while the rewrites add
        passes over memory and GEMMs with m or k of 4-8 far below peak. Measured slower on
        every CPU device here: NumPy at every Table 1 / Table 3 size (bench/schemes.py), and
        ResNet-18 on PoCL, lavapipe and llvmpipe (bench/RESULTS.md). They stay
        available when forced (``schemes.forced_schemes``)."""
        return frozenset({"winograd", "strassen"}) if self.info.is_gpu else frozenset()

    # -- threads ---------------------------------------------------------------------------
    @property
    def default_concurrent_runs(self) -> int:
        """Run states a session prepares for overlapping callers unless told otherwise: as many
        as are safe, except where one run already keeps every core of the device busy and a
        second would only compete for them (a CPU device), where callers take turns."""
        return self.max_concurrent_runs if self.info.is_gpu else 1

    def activate(self) -> AbstractContextManager[Any]:
        """A bracket inside which the calling thread may use this backend's verbs.

        Backends whose API objects may be used from any thread need nothing (the default); the
        OpenGL backend makes its context current in the calling thread and holds it until the
        bracket closes. Brackets nest; the session opens one around creation and each run.
        """
        return nullcontext()

    def reserve_run(self, io_bytes: int) -> None:
        """Set aside, at session creation, what one more run in flight needs at run time beyond
        its pools (staging of up to ``io_bytes`` per write or read, a submission slot), so that
        a recorded run allocates nothing. Called once per recorded run state."""

    # -- memory ----------------------------------------------------------------------------
    def memory_limits(self) -> MemoryLimits:
        """What this backend's device can give: total and available bytes, the largest single
        allocation and tensor binding. The session checks its pool layout against it before it
        allocates anything. The default is the host's RAM (a device without memory of its own)."""
        return host_limits()

    def allocate(self, nbytes: int) -> Any:
        """Allocate one device buffer of at least ``nbytes`` (the session's pool)."""
        return self.buffer(nbytes, "pool")

    def buffer(self, nbytes: int, kind: str, **how: Any) -> Any:
        """A new device buffer of at least ``nbytes``, counted in ``buffers_allocated``: every
        buffer a backend creates (pool, constant storage, scratch, staging) is made here."""
        buf = self._new_buffer(nbytes, kind, **how)
        self._count("buffers_allocated")
        return buf

    @abstractmethod
    def _new_buffer(self, nbytes: int, kind: str, **how: Any) -> Any:
        """Hook of ``buffer``: create one buffer. ``kind`` says what for ("pool": the session's
        pool; backends add their own kinds: "constant", "scratch", "staging", ...);
        ``how`` carries backend-specific details (initial contents, memory flags)."""

    def tensor(self, buffer: Any, offset: int, shape: tuple[int, ...], dtype: str = A.FLOAT32) -> TensorHandle:
        """A view of ``shape`` elements of storage ``dtype`` at element ``offset`` of ``buffer``."""
        return TensorHandle(buffer, offset, tuple(shape), dtype)

    @abstractmethod
    def constant(self, array: np.ndarray) -> TensorHandle:
        """Upload a weight (float32 or int32) once; the handle, of the array's dtype, stays valid
        for the backend's lifetime."""

    @abstractmethod
    def write(self, handle: TensorHandle, array: np.ndarray) -> None:
        """Copy a host array (of ``handle.dtype``, C-contiguous, ``handle.size`` elements) into the
        device; a backend that takes device arrays also takes its ``device_array`` results here
        (``handle.size`` elements of any dtype, converted on the device)."""

    def read(self, handle: TensorHandle) -> np.ndarray:
        """Copy a tensor back to a new host array of ``handle.shape`` and ``handle.dtype``: the
        array made here, filled by ``read_into``."""
        out = np.empty(handle.shape, dtype=handle.dtype)
        self.read_into(handle, out)
        return out

    @abstractmethod
    def read_into(self, handle: TensorHandle, out: np.ndarray) -> None:
        """Copy a tensor straight into ``out``, a C-contiguous host array of ``handle.size``
        elements of ``handle.dtype`` prepared beforehand (the session's copies between backends
        use it, so a recorded run allocates nothing; ``host_out`` checks it)."""

    def host_view(self, handle: TensorHandle) -> np.ndarray | None:
        """A host array that *is* the tensor's memory (reads and writes go straight to it), or
        None where the device's memory cannot be seen from the host this way (the default).
        A copy between this backend and another then needs no staging buffer."""
        return None

    def release(self, buffer: Any) -> None:
        """Free a buffer from ``allocate`` (eager mode frees its per-run pool)."""

    def release_execution(self, execution: Execution) -> None:
        """Free what ``execution`` holds of its own beyond the op's tensors (the scratch buffers a
        backend that keeps a registry of its buffers made for it), when its run state is released.
        The default frees nothing: what the execution references goes with it."""

    # -- device arrays (see ``device_arrays_unsupported``) ---------------------------------
    def _device_arrays_refused(self) -> DeviceArrayError:
        return DeviceArrayError(f"the {self.name} backend takes and returns host arrays only: "
                                f"{self.device_arrays_unsupported}")

    def device_array(self, value: Any) -> Any:
        """``value``, a tensor on a device (``__dlpack__`` with a non-CPU ``__dlpack_device__``,
        or ``__cuda_array_interface__``), as this backend's device array, without a copy: an
        object with ``shape``, a NumPy ``dtype``, ``size``, ``min`` and ``max`` that ``write``
        takes. DeviceArrayError where the backend cannot (``device_arrays_unsupported``)."""
        raise self._device_arrays_refused()

    def read_device(self, handle: TensorHandle) -> Any:
        """A tensor copied into a new device array of this backend (``outputs="device"``)."""
        raise self._device_arrays_refused()

    def to_device(self, array: np.ndarray) -> Any:
        """A host array as a new device array of this backend (an output computed elsewhere)."""
        raise self._device_arrays_refused()

    def to_host(self, array: Any) -> np.ndarray:
        """A device array from ``device_array`` copied to the host (for another backend of the
        session that reads the same input)."""
        raise self._device_arrays_refused()

    # -- programs --------------------------------------------------------------------------
    def program(self, key: Hashable) -> Any:
        """The compiled program (one kernel variant) ``key`` names, from this backend's memory
        cache, else from ``_load_program``; one it had to compile counts in ``programs_built``."""
        prog = self._programs.get(key)
        if prog is None:
            prog, built = self._load_program(key)
            if built:
                self._count("programs_built")
            self._programs[key] = prog
        return prog

    def _load_program(self, key: Hashable) -> tuple[Any, bool]:
        """Hook of ``program``: (the program ``key`` names, whether it was compiled now rather
        than found compiled: on disk, in a shared device or a pooled context)."""
        raise NotImplementedError(f"the {self.name} backend compiles no programs")

    # -- pre-inference ---------------------------------------------------------------------
    def create_execution(self, op: AtomicOp, inputs: Sequence[TensorHandle],
                         outputs: Sequence[TensorHandle]) -> Execution:
        """MNN's onCreate: everything an op needs before it can run, done once."""
        if type(op) not in self.kernel_table:
            raise NotImplementedError(f"{self.unsupported_reason(op)} (node {op.source!r})")
        exe = self._create_execution(op, list(inputs), list(outputs))
        self._count("executions_created")
        return exe

    @abstractmethod
    def _create_execution(self, op: AtomicOp, inputs: list[TensorHandle],
                          outputs: list[TensorHandle]) -> Execution:
        """Hook of ``create_execution``: ``op`` is of a type in ``kernel_table``."""

    def record(self, executions: Sequence[Execution]) -> Any:
        """Record executions (in order) into one replayable unit for ``submit``."""
        recording = self._record(list(executions))
        self._count("recordings_made")
        return recording

    @abstractmethod
    def _record(self, executions: list[Execution]) -> Any:
        """Hook of ``record``."""

    # -- run -------------------------------------------------------------------------------
    def submit(self, recording: Any) -> None:
        """Run a recording and wait until its results are visible to ``read``."""
        self._submit(recording)
        self._count("submits")

    @abstractmethod
    def _submit(self, recording: Any) -> None:
        """Hook of ``submit``."""

    def submit_async(self, recording: Any) -> Any:
        """Hand a recording to the device and return without waiting for it: a *ticket* that
        ``wait`` takes. Until then the recording's results are not visible, and the caller must
        not touch this backend's tensors (write, read, another submit) -- the run loop waits on
        the ticket first (``gpumnn.scheduler.overlap``). Every ticket must be waited on exactly
        once, from the thread that submitted (an OpenGL context is current there). Counts in
        ``submits`` and ``async_submits``."""
        ticket = self._submit_async(recording)
        self._count("submits")
        self._count("async_submits")
        return ticket

    def _submit_async(self, recording: Any) -> Any:
        """Hook of ``submit_async``; returns the ticket ``_wait`` takes. The default submits and
        waits at once (a backend whose work runs on the calling thread, like NumPy's, has nothing
        to hand over) and returns None."""
        self._submit(recording)
        return None

    def wait(self, ticket: Any) -> None:
        """Wait until the submission behind ``ticket`` (from ``submit_async``) is done and its
        results are visible to ``read`` and the other verbs; frees what it held (a lane, a fence)."""
        if ticket is not None:
            self._wait(ticket)

    def _wait(self, ticket: Any) -> None:
        """Hook of ``wait`` (never called with None): a backend with its own ``_submit_async``
        overrides both."""
        raise NotImplementedError(f"the {self.name} backend issued a ticket it cannot wait for")

    def run_eager(self, executions: Sequence[Execution]) -> None:
        """Run executions one by one, waiting after each (the paper's un-decoupled baseline)."""
        executions = list(executions)
        self._run_eager(executions)
        self._count("submits", len(executions))

    @abstractmethod
    def _run_eager(self, executions: list[Execution]) -> None:
        """Hook of ``run_eager``."""

    def finish(self) -> None:
        """Wait until all work handed to the device is done. The verbs above already wait
        (``submit``, ``run_eager``, ``write``, ``read``), so the default does nothing; a backend
        that returns before the device is done overrides it."""

    def measure(self, work: Callable[[], None], repeats: int = 3, best: bool = False) -> float:
        """The median wall time, in seconds, of ``work()`` followed by ``finish``, over
        ``repeats`` calls (after one untimed call that warms caches and lazy initialisation);
        with ``best``, the fastest call instead (what the device does when nothing else competes
        for it: calibration on a shared machine).

        The host's ``perf_counter`` brackets the work and the wait, so the time includes the
        submission overhead a run pays too -- and it is the only clock that is right for an
        arbitrary callable: whatever device work the callable does (several submits, copies,
        host-side NumPy) is not bracketed by anything the backend controls, so device timestamps
        placed around the call would miss or mis-attribute it. Device-side time of recorded work
        is ``measure_recording``'s."""
        work()
        self.finish()
        times = []
        for _ in range(max(1, repeats)):
            start = time.perf_counter()
            work()
            self.finish()
            times.append(time.perf_counter() - start)
        return float(min(times) if best else np.median(times))

    def measure_recording(self, recording: Any, repeats: int = 3, best: bool = False) -> float:
        """The median (with ``best``: the least) time, in seconds, the device spends on one
        ``submit`` of ``recording``, over ``repeats`` submits after one untimed one, on the clock
        ``timer`` names: device timestamps written around the recording's commands inside the
        submission itself (so they bracket exactly its work, and exclude the host's submission and
        wait overhead), or where the backend has none the host's ``perf_counter`` around the
        submit. Every submit counts in ``submits``."""
        self.submit(recording)
        times = []
        for _ in range(max(1, repeats)):
            times.append(self._timed_submit(recording))
            self._count("submits")
        return float(min(times) if best else np.median(times))

    def _timed_submit(self, recording: Any) -> float:
        """Hook of ``measure_recording``: submit ``recording``, wait, and return the seconds it
        took on ``timer``'s clock. The default reads the host's clock around ``_submit``."""
        start = time.perf_counter()
        self._submit(recording)
        return time.perf_counter() - start

    @property
    def driver(self) -> str:
        """The driver and library versions behind this backend (a calibration is kept per device
        and driver, so a new driver is measured again). Empty by default: the device name alone."""
        return ""

    def close(self) -> None:
        """Free device resources; the backend is unusable afterwards."""

    def close_later(self) -> None:
        """What a dropped session's finalizer calls (see ``gpumnn.backends.deferred``): a backend
        whose objects must not be freed inside another call on its device (Vulkan, OpenGL)
        queues its close for the device's next safe point. The default closes at once: NumPy
        arrays, and OpenCL and CUDA objects, which their drivers keep alive while enqueued
        work uses them, may go anywhere."""
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.info.device!r}>"
