"""The OpenGL backend: the Vulkan backend's GLSL compute shaders on an OpenGL 4.3+ context.

Design
------
* Context: one standalone moderngl context per backend (taken from a small pool, see
  :mod:`.gl_context`), created through EGL (no display needed; falls back to moderngl's default
  platform backend). A GL context is current in at most one thread, so it is current nowhere
  between uses: every entry point runs inside ``activate()``, which takes the backend's lock,
  makes the context current in the calling thread and releases it when the outermost bracket
  closes (an eglMakeCurrent pair, cheap). The session brackets creation and each whole run, so
  any thread may create, run and close, one at a time.
* Memory: the session pool (``allocate``) and every constant are GL buffer objects
  (``ctx.buffer``); ``write`` / ``read`` are glBufferSubData / glGetBufferSubData.
* Kernels: the same API-neutral sources as Vulkan (``gpumnn/backends/kernels/glsl``), preprocessed with
  the GL prelude (``prelude_gl.glsl``: ``#version 430``, ``uniform int gpumnn_params[32]``) and
  compiled by the driver into one compute program per (kernel, defines), cached with the
  context. Contexts are pooled (:mod:`.gl_context`): a closing backend deletes its buffers and
  hands its context, programs included, to the next backend.
* Planning: what to dispatch per atomic op is shared with Vulkan (:mod:`gpumnn.backends.kernels.glsl.planner`): kernel
  variant, storage-buffer windows (start aligned down to GL_SHADER_STORAGE_BUFFER_OFFSET_ALIGNMENT,
  element offsets relative to the window passed as parameters), 32 int32 parameters, grid.
* Recorded mode: ``create_execution`` compiles (or fetches) the programs and precomputes per
  dispatch the SSBO ranges, the parameter bytes (sized to the uniform array the driver kept)
  and the grid, once. GL has no command buffers: ``record`` flattens the executions into one
  dispatch list, drops redundant state changes (re-binding an unchanged range, re-writing a
  program's unchanged uniforms) and places glMemoryBarrier only in front of a dispatch that
  touches bytes written (or writes bytes read) since the last barrier. ``submit`` replays that
  list -- bind, uniforms, glDispatchCompute, barrier -- and waits with glFinish.
* Eager mode: ``run_eager`` re-plans every op (planner, program look-up, parameter packing),
  binds everything, dispatches and waits with glFinish after each op (the paper's baseline).
"""
from __future__ import annotations

import ctypes
import functools
import itertools
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

import numpy as np

import moderngl  # ModuleNotFoundError propagates: the registry says "pip install 'gpumnn[gl]'"

from ... import atomic as A
from ...errors import BackendUnavailableError, DeviceLostError, GpumnnError
from ..kernels.glsl.compile import ShaderCompileError, preprocess
from . import device as gl_context
from ..kernels import word_padded
from ..kernels.int8_dot import choose as choose_int8_dot
from ..base import Backend, BackendInfo, Execution, TensorHandle, constant_words, host_out, kernel_family, kernels_option
from ..kernels.glsl.planner import dtypes_for as glsl_dtypes_for
from ..kernels.glsl.planner import (RESIDUAL_BINDINGS, DTYPES as GLSL_DTYPES, FLOAT32_ONLY_SCHEMES as GLSL_FLOAT32_ONLY_SCHEMES, OP_NAMES as GLSL_OP_NAMES, PLANNERS, SCHEMES, WINOGRAD_REWRITE_MAX_TILE, residual_schemes_for, schemes_for, Builder, Hazards, binding_limit, check_shader_op_ids,
                         grid_limit, plan, release_scratch, window)
from ..limits import MemoryLimits, host_memory
from ..speed import (CPU_DEVICE_COMPUTE_UNITS, GPU_DEFAULT_COMPUTE_UNITS, GPU_DEFAULT_FLOPS, simd_lanes,
                     software_renderer_flops)
from ..waits import describe_ops, hang_reason
from ..kernels.glsl.planner import INT8_PRODUCTS as GLSL_INT8_PRODUCTS

_GL_SHADER_STORAGE_BUFFER_OFFSET_ALIGNMENT = 0x90DF
_GL_MAX_COMPUTE_SHARED_MEMORY_SIZE = 0x8262
_GL_GPU_MEMORY_INFO_TOTAL_AVAILABLE_MEMORY_NVX = 0x9048  # KiB
_GL_GPU_MEMORY_INFO_CURRENT_AVAILABLE_VIDMEM_NVX = 0x9049  # KiB
_GL_VBO_FREE_MEMORY_ATI = 0x87FB  # four KiB values, the first is the free total
_GL_SM_COUNT_NV = 0x933B  # GL_NV_shader_thread_group
_SOFTWARE = ("llvmpipe", "softpipe", "swrast", "software")
#: why QuantizedConv2D multiplies in plain int32 here: the dot-product variant is a SPIR-V
#: instruction (quantized_conv2d.comp -DINT8_DOT), and this backend hands the driver GLSL text
GL_NO_INTEGER_DOT = "the integer dot-product variant is SPIR-V, which the GL backend does not load"
_ids = itertools.count(1)
_Method = TypeVar("_Method", bound=Callable[..., Any])


def _in_context(method: _Method) -> _Method:
    """Run a GLBackend verb inside ``activate()`` (its context current in this thread); on a lost
    context, DeviceLostError with the reason instead."""
    @functools.wraps(method)
    def wrapper(self: "GLBackend", *args: Any, **kwargs: Any) -> Any:
        if self._lost is not None:
            raise DeviceLostError(f"gl backend: the context is lost: {self._lost}")
        with self.activate():
            return method(self, *args, **kwargs)
    return wrapper  # type: ignore[return-value]


class GLError(GpumnnError, RuntimeError):
    """An OpenGL backend failure (closed backend, device limit, ...)."""


class GLBuffer:
    """A GL buffer object with the ``id``/``kind``/``size`` the planners use."""

    __slots__ = ("id", "kind", "size", "obj", "__weakref__")

    def __init__(self, obj: Any, kind: str, size: int):
        self.id = next(_ids)
        self.kind = kind
        self.size = size
        self.obj = obj

    @property
    def alive(self) -> bool:
        return self.obj is not None

    def __repr__(self) -> str:
        return f"<GLBuffer #{self.id} {self.kind} {self.size} bytes>"


class _Program:
    __slots__ = ("prog", "uniform", "nparams", "key")

    def __init__(self, prog, key):
        self.prog = prog
        self.key = key
        try:
            self.uniform = prog["gpumnn_params"]
        except KeyError:  # a kernel that reads no parameter (the driver dropped the array)
            self.uniform = None
        # The driver keeps the array only up to the highest index used; write exactly that.
        self.nparams = self.uniform.array_length if self.uniform is not None else 0


class _Dispatch:
    """One glDispatchCompute: program, SSBO ranges, parameter bytes, grid and bytes touched."""

    __slots__ = ("program", "binds", "params", "groups", "reads", "writes")

    def __init__(self, program: _Program, binds, params: bytes, groups, reads, writes):
        self.program = program
        self.binds = binds  # ((slot, moderngl.Buffer, byte offset, byte size), ...)
        self.params = params
        self.groups = groups
        self.reads = reads
        self.writes = writes


class GLRecording:
    """The flattened dispatch list of a run of executions, redundant state changes removed.

    ``steps``: (barrier?, program, binds to (re)issue, uniform or None, parameter bytes, grid).
    """

    def __init__(self, steps: list[tuple], dispatches: int, barriers: int, ops: str = "a submission"):
        self.steps = steps
        self.dispatches = dispatches
        self.barriers = barriers
        self.ops = ops  # the ops it runs (``describe_ops``), named by a timeout

    def __repr__(self) -> str:
        return f"<GLRecording {self.dispatches} dispatches, {self.barriers} barriers>"


def _create_context(platform: str | None):
    """A new standalone OpenGL 4.3 context on ``platform`` ("egl", or None for moderngl's
    default); backends get theirs through the pool in :mod:`.gl_context`."""
    if platform is None:
        return moderngl.create_standalone_context(require=430)
    return moderngl.create_standalone_context(backend=platform, require=430)


def _gl_get_integer(pname: int, count: int = 1) -> int | None:
    """glGetIntegerv for a value moderngl's ``ctx.info`` lacks (None if no GL library loads);
    ``count`` values are fetched (GL_VBO_FREE_MEMORY_ATI has four) and the first is returned."""
    gl = gl_context.gl_library()
    if gl is None:
        return None
    fn = gl.glGetIntegerv
    values = (ctypes.c_int * max(count, 1))(*([-1] * max(count, 1)))
    fn.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_int)]
    fn(pname, values)
    return values[0] if values[0] > 0 else None


class GLBackend(Backend):
    """OpenGL 4.3+ compute shaders on one context (llvmpipe, or a GPU driver)."""

    name = "gl"
    device_arrays_unsupported = ("OpenGL buffers cannot import CUDA or other device memory without interop "
                                 "extensions gpumnn does not use; pass a host array, or use the cuda backend")
    alignment = 64
    plan_error = GLError
    _lost: str | None = None  # set by a submission past submit_timeout
    kernel_table = PLANNERS
    int8_products = GLSL_INT8_PRODUCTS
    schemes = SCHEMES
    winograd_rewrite_max_tile = WINOGRAD_REWRITE_MAX_TILE
    op_names = GLSL_OP_NAMES
    dtypes = GLSL_DTYPES
    float32_only_schemes = GLSL_FLOAT32_ONLY_SCHEMES
    #: the GLSL planner's cooperative-matrix GEMM: Vulkan's only (GL_KHR_cooperative_matrix is a SPIR-V one)
    cooperative_gemm = None

    def __init__(self, kernels: str | None = None, **unknown: Any):
        """``kernels``: "auto" (simd on software renderers, tiled on GPUs), "simd" or "tiled".
        (No ``device``: the context is EGL's default display's.)"""
        super().__init__(**unknown)
        requested = kernels_option(kernels, self.name)
        self._closed = True
        self._lock = threading.RLock()
        self._depth = 0  # nesting of activate() brackets in the thread holding the lock
        check_shader_op_ids()
        previous = gl_context.current_egl()
        self._pooled = gl_context.acquire(_create_context)  # a reused context (with its programs), current here
        self.ctx = self._pooled.ctx
        self._egl_context = gl_context.current_context()  # what activate() checks it made current
        self._lost: str | None = None  # why the context is unusable (a submission that never finished)
        try:
            self._setup(requested)
        except BaseException:
            self._pooled.release()  # the context is gone: nothing to let go of below
            self.ctx = None
            raise
        finally:  # current nowhere (or what was current before) until a bracket opens
            if previous is not None:
                gl_context.make_current_egl(previous)
            elif self.ctx is not None:
                self.ctx.__exit__(None, None, None)
        self._closed = False

    def _setup(self, requested: str) -> None:
        ctx = self.ctx
        info = ctx.info
        if ctx.version_code < 430:
            raise BackendUnavailableError(f"OpenGL {ctx.version_code} < 4.3: no compute shaders")
        self.renderer = str(info.get("GL_RENDERER", "?"))
        self.version = str(info.get("GL_VERSION", "?"))
        self.vendor = str(info.get("GL_VENDOR", "?"))
        if self._pooled.timestamps() is not None:
            self.timer = "GL timestamp queries"
        self.software = any(s in self.renderer.lower() for s in _SOFTWARE)
        self.max_group_count = tuple(int(v) for v in info["GL_MAX_COMPUTE_WORK_GROUP_COUNT"])
        self.max_storage_range = int(info.get("GL_MAX_SHADER_STORAGE_BLOCK_SIZE", 1 << 27))
        storage_blocks = int(info.get("GL_MAX_COMPUTE_SHADER_STORAGE_BLOCKS", 0))
        if storage_blocks < 4:
            raise BackendUnavailableError(f"{self.renderer}: fewer than 4 storage blocks per compute shader")
        self.storage_align = _gl_get_integer(_GL_SHADER_STORAGE_BUFFER_OFFSET_ALIGNMENT) or 256
        self.alignment = max(64, self.storage_align)
        self.kernels = kernel_family(requested, self.software)
        self.schemes = schemes_for(self.kernels)
        self.int8_dot, self.int8_arithmetic = choose_int8_dot("auto", self.kernels, "", GL_NO_INTEGER_DOT)
        # a convolution that adds a residual binds one storage block more than the other kernels
        self.residual_schemes = residual_schemes_for(self.kernels) if storage_blocks >= RESIDUAL_BINDINGS else {}
        if self.software:  # the tiled family's Winograd kernel on a CPU device: only where forced (tests)
            self.winograd_min_saving = float("inf")
        # float16 / int8 / uint8 tensors as themselves where GLSL may declare 16- / 8-bit buffer
        # elements, else packed in 32-bit words (gpumnn.backends.kernels.glsl.elements.glsl)
        extensions = ctx.extensions
        self.narrow_storage = {size: (f"native: {ext}" if ext in extensions else f"packed: no {ext}")
                               for size, ext in ((1, "GL_EXT_shader_8bit_storage"), (2, "GL_EXT_shader_16bit_storage"))}
        self.native_narrow = frozenset(size for size, why in self.narrow_storage.items() if why.startswith("native"))
        self.dtypes = glsl_dtypes_for(self.kernels, self.native_narrow)  # float16 arithmetic: tiled, 16-bit storage
        self.simd_lanes = simd_lanes(self.renderer)
        #: SMs / CUs the tiled GEMM fills (``compute_units_source`` says who said so)
        self.compute_units, self.compute_units_source = self._compute_units(extensions)
        self._buffers: dict[int, GLBuffer] = {}
        self.packed: dict[tuple, TensorHandle] = {}
        self.tables: dict[tuple, TensorHandle] = {}
        flops = software_renderer_flops() if self.software else GPU_DEFAULT_FLOPS
        self._info = BackendInfo("gl", f"{self.renderer} / OpenGL {self.version}", flops, 0.05,
                                 20.0 if self.software else 8.0, is_gpu=not self.software)

    def _compute_units(self, extensions: Any) -> tuple[int, str]:
        """(compute units, where the figure comes from): GL_SM_COUNT_NV where the driver has
        GL_NV_shader_thread_group (core GL has no such query), ``CPU_DEVICE_COMPUTE_UNITS`` on a
        software renderer, else ``GPU_DEFAULT_COMPUTE_UNITS``."""
        if self.software:
            return CPU_DEVICE_COMPUTE_UNITS, "a software renderer"
        if "GL_NV_shader_thread_group" in extensions:
            units = _gl_get_integer(_GL_SM_COUNT_NV)
            if units:
                return units, "GL_NV_shader_thread_group GL_SM_COUNT_NV"
        return GPU_DEFAULT_COMPUTE_UNITS, "default: the driver reports none"

    # -- description -----------------------------------------------------------------------
    @property
    def driver(self) -> str:
        """GL_VENDOR, GL_VERSION (with the driver's own version: "4.5 (Core Profile) Mesa 22.3.6")
        and GL_RENDERER (llvmpipe names its LLVM)."""
        return f"{self.vendor}; OpenGL {self.version}; {self.renderer}"

    def unsupported_reason(self, op: A.AtomicOp) -> str | None:
        return (super().unsupported_reason(op) or grid_limit(op, self.max_group_count)
                or binding_limit(op, self.max_storage_range, "GL_MAX_SHADER_STORAGE_BLOCK_SIZE"))

    @staticmethod
    def rb_max_rn(op: A.Conv2D) -> int:
        """Largest pixel block of the register-blocked convolution (glsl_plans). GLSL 4.30 has no
        unroll hint (Vulkan's [[unroll]]): Mesa's unroll heuristic leaves the 16-pixel epilogue
        loop rolled when the activation is more than a relu, which indexes the accumulators
        dynamically and spills them (several times slower on llvmpipe); 8 pixels stay unrolled."""
        return 16 if op.activation is None or op.activation[0] in ("identity", "relu") else 8

    # -- context -----------------------------------------------------------------------------
    @contextmanager
    def activate(self) -> Iterator[None]:
        """This backend's context current in the calling thread, exclusively, until the
        outermost bracket closes; then what was current before (usually nothing, so the context
        is current in no thread, ready for any other)."""
        with gl_context.releases.bracket(), self._lock:  # an outermost GL bracket: queued closes run first
            if self._closed:
                raise GLError("the OpenGL backend is closed")
            outermost = self._depth == 0
            if outermost:
                previous = gl_context.current_egl()  # another backend's bracket in this thread, if any
                self.ctx.__enter__()
                if self._egl_context is not None and gl_context.current_context() != self._egl_context:
                    if previous is not None:
                        gl_context.make_current_egl(previous)
                    raise GLError(f"{self.renderer}: the backend's OpenGL context could not be made current in this "
                                  "thread (it is current in another one); nothing was done in another context")
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if outermost:
                    if previous is not None:
                        gl_context.make_current_egl(previous)
                    elif self.ctx is not None:
                        self.ctx.__exit__(None, None, None)

    # -- memory ----------------------------------------------------------------------------
    @_in_context
    def memory_limits(self) -> MemoryLimits:
        """GL has no core query of memory: GL_NVX_gpu_memory_info (NVIDIA) or GL_ATI_meminfo (AMD)
        where the driver has them, the host's RAM for software renderers (llvmpipe) and
        GL_MAX_SHADER_STORAGE_BLOCK_SIZE for the largest tensor one kernel binds."""
        total, available, host_source = host_memory()
        in_host, used, source = True, None, f"host memory ({host_source})"
        extensions = self.ctx.extensions
        if not self.software and "GL_NVX_gpu_memory_info" in extensions:
            total_kib = _gl_get_integer(_GL_GPU_MEMORY_INFO_TOTAL_AVAILABLE_MEMORY_NVX)
            free_kib = _gl_get_integer(_GL_GPU_MEMORY_INFO_CURRENT_AVAILABLE_VIDMEM_NVX)
            if total_kib and free_kib is not None:
                total, available, in_host = 1024 * total_kib, 1024 * free_kib, False
                used, source = total - available, "GL_NVX_gpu_memory_info"
        elif not self.software and "GL_ATI_meminfo" in extensions:
            free_kib = _gl_get_integer(_GL_VBO_FREE_MEMORY_ATI, 4)
            if free_kib:
                total = available = 1024 * free_kib
                in_host, source = False, "GL_ATI_meminfo"
        return MemoryLimits(total, available, available, self.max_storage_range, host_memory=in_host,
                            used=used, source=f"{source}; GL_MAX_SHADER_STORAGE_BLOCK_SIZE {self.max_storage_range}")

    @_in_context
    def _new_buffer(self, nbytes: int, kind: str, data: bytes | None = None) -> GLBuffer:
        if kind == "pool":
            nbytes = max(int(nbytes), 16)
        obj = self.ctx.buffer(data) if data is not None else self.ctx.buffer(reserve=nbytes)
        buf = GLBuffer(obj, kind, obj.size)
        self._buffers[buf.id] = buf
        return buf

    def release(self, buffer: Any) -> None:
        if self._closed or self._lost is not None or not isinstance(buffer, GLBuffer) or not buffer.alive:
            return
        with self.activate():
            if self._buffers.pop(buffer.id, None) is None:
                return  # another backend's buffer
            buffer.obj.release()
            buffer.obj = None

    def scratch(self, nbytes: int) -> Any:
        """A buffer of one execution's own (a split-K GEMM's partial sums: the GLSL planner)."""
        return self.buffer(nbytes, "scratch")

    def release_execution(self, execution: Execution) -> None:
        release_scratch(self, execution.keep)

    @_in_context
    def constant(self, array: np.ndarray) -> TensorHandle:
        data, dtype = constant_words(array)
        padded = word_padded(data)
        buf = self.buffer(padded.nbytes, "constant", data=padded.tobytes())
        return TensorHandle(buf, 0, tuple(np.shape(array)), dtype)

    @_in_context
    def write(self, handle: TensorHandle, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array, dtype=handle.dtype).reshape(-1)
        if data.size != handle.size:
            raise ValueError(f"write of {data.size} elements into a tensor of {handle.size}")
        if data.size:
            handle.buffer.obj.write(data, offset=handle.itemsize * handle.offset)

    @_in_context
    def read_into(self, handle: TensorHandle, out: np.ndarray) -> None:
        """glGetBufferSubData from the tensor's offset straight into ``out``."""
        flat = host_out(handle, out)
        if flat.size:
            handle.buffer.obj.read_into(flat, size=flat.nbytes, offset=handle.itemsize * handle.offset)

    def binding(self, buf: GLBuffer, lo: int, hi: int):
        return window(buf, lo, hi, self.storage_align, self.max_storage_range, GLError,
                      "GL_MAX_SHADER_STORAGE_BLOCK_SIZE")

    # -- kernels -----------------------------------------------------------------------------
    def _program(self, kernel: str, defines: dict) -> _Program:
        return self.program((kernel, tuple(sorted(defines.items()))))

    @_in_context
    def _load_program(self, key: tuple) -> tuple[_Program, bool]:
        kernel, defines = key

        def build() -> _Program:
            source = preprocess(kernel, dict(defines), api="gl")
            try:
                return _Program(self.ctx.compute_shader(source), key)
            except moderngl.Error as exc:
                raise ShaderCompileError(f"the OpenGL driver rejected kernel {kernel} {dict(defines)}:\n{exc}") from exc

        return self._pooled.program(key, build)  # kept with the context (gl_context)

    def dispatch(self, builder: Builder, bindings: tuple) -> _Dispatch:
        """A Builder (see glsl_plans) turned into GL objects: program, SSBO ranges, uniform bytes."""
        program = self._program(builder.kernel, builder.defines)
        binds = tuple((slot, b.buf.obj, b.base, b.range) for slot, b in enumerate(bindings))
        params = builder.params[:program.nparams].tobytes()
        return _Dispatch(program, binds, params, builder.groups, tuple(builder.reads), tuple(builder.writes))

    # -- pre-inference ---------------------------------------------------------------------
    @_in_context
    def _create_execution(self, op: A.AtomicOp, inputs: list[TensorHandle],
                          outputs: list[TensorHandle]) -> Execution:
        return Execution(op, inputs, outputs, plan(self, op, inputs, outputs))

    @_in_context
    def _record(self, executions: list[Execution]) -> GLRecording:
        hazards = Hazards()
        bound: dict[int, tuple] = {}  # slot -> (buffer, offset, size) bound by an earlier step
        uniforms: dict[int, bytes] = {}  # id(program) -> parameter bytes written by an earlier step
        steps = []
        barriers = 0
        for exe in executions:
            for d in exe.work:
                barrier = hazards.needs_barrier(d)
                if barrier:
                    hazards.clear()
                    barriers += 1
                hazards.add(d)
                binds = tuple(b for b in d.binds if bound.get(b[0]) != b[1:])
                for slot, obj, off, size in binds:
                    bound[slot] = (obj, off, size)
                uniform = None
                if d.program.uniform is not None and uniforms.get(id(d.program)) != d.params:
                    uniform = d.program.uniform
                    uniforms[id(d.program)] = d.params
                steps.append((barrier, d.program.prog, binds, uniform, d.params, d.groups))
        return GLRecording(steps, len(steps), barriers, describe_ops(executions))

    # -- run -------------------------------------------------------------------------------
    @_in_context
    def _submit(self, recording: GLRecording) -> None:
        """Issue, then wait (for a fence sync, bounded by ``submit_timeout``, where the GL has them)."""
        self._issue(recording)
        fences = self._pooled.fences()
        if fences is None:
            self.ctx.finish()
            return
        self._wait_fence(fences, fences.fence(), recording.ops)

    def _wait_fence(self, fences: Any, sync: int, ops: str) -> None:
        done = fences.wait(sync, self.submit_timeout)
        if done is None:
            self._lost = hang_reason(self.renderer, self.submit_timeout, ops)
            raise DeviceLostError(f"gl backend: {self._lost}")
        if not done:
            raise GLError("glClientWaitSync failed: the GL lost the context or the submission")

    @_in_context
    def _submit_async(self, recording: GLRecording) -> Any:
        """The recording's commands issued, then a fence sync behind them, flushed: the ticket.
        (On llvmpipe a compute dispatch runs to its end inside glDispatchCompute, so the host is
        busy until the last one returns and little is left to overlap; a hardware GL returns at
        once.) Without fence syncs in the GL library, it waits here (ticket None). The ticket
        is (fence, the ops it runs)."""
        self._issue(recording)
        fences = self._pooled.fences()
        if fences is None:
            self.ctx.finish()
            return None
        return fences.fence(), recording.ops

    @_in_context
    def _wait(self, ticket: Any) -> None:
        sync, ops = ticket
        self._wait_fence(self._pooled.fences(), sync, ops)

    def _issue(self, recording: GLRecording) -> None:
        """Issue a recording's dispatches (and the barrier after them) without waiting."""
        ctx = self.ctx
        storage = moderngl.SHADER_STORAGE_BARRIER_BIT
        for barrier, prog, binds, uniform, params, (gx, gy, gz) in recording.steps:
            if barrier:
                ctx.memory_barrier(storage)
            for slot, obj, off, size in binds:
                obj.bind_to_storage_buffer(slot, offset=off, size=size)
            if uniform is not None:
                uniform.write(params)
            prog.run(gx, gy, gz)
        ctx.memory_barrier()  # all bits: buffer reads/updates and later dispatches see the results

    @_in_context
    def _timed_submit(self, recording: GLRecording) -> float:
        """Timestamp queries written just before and after the submit's commands (see
        ``gl_context.Timestamps``): the GPU's time from reaching the recording's first dispatch to
        finishing its last. GL has no command buffers, so this includes what the GPU waits for
        the host to issue the next dispatch (binding buffers, writing uniforms); nothing else is
        issued on the context meanwhile."""
        stamps = self._pooled.timestamps()
        if stamps is None:
            return super()._timed_submit(recording)
        stamps.stamp(0)
        self._submit(recording)
        stamps.stamp(1)
        return stamps.seconds()

    @_in_context
    def _run_eager(self, executions: list[Execution]) -> None:
        ctx = self.ctx
        storage = moderngl.SHADER_STORAGE_BARRIER_BIT
        for exe in executions:
            # An engine without decoupling plans, looks up programs, packs arguments and makes its
            # scratch per run (freed once the op is done).
            planned = plan(self, exe.op, exe.inputs, exe.outputs)
            try:
                hazards = Hazards()
                for d in planned.work:
                    if hazards.needs_barrier(d):
                        ctx.memory_barrier(storage)
                        hazards.clear()
                    hazards.add(d)
                    for slot, obj, off, size in d.binds:
                        obj.bind_to_storage_buffer(slot, offset=off, size=size)
                    if d.program.uniform is not None:
                        d.program.uniform.write(d.params)
                    d.program.prog.run(*d.groups)
                ctx.memory_barrier()
                ctx.finish()
            finally:
                release_scratch(self, planned.keep)

    # -- lifetime --------------------------------------------------------------------------
    def close_later(self) -> None:
        """A dropped session's finalizer (perhaps on a thread where another context is current,
        or inside another backend's bracket): the close waits for the next outermost GL bracket."""
        if not self._closed:
            gl_context.releases.defer(self.close)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            if self._lost is not None:  # a submission may still run in the context: leave it be
                self._closed = True
                return
            try:
                with self.activate():
                    self._closed = True
                    self.ctx.finish()
                    for buf in self._buffers.values():
                        if buf.obj is not None:
                            buf.obj.release()
                            buf.obj = None
                    pooled, self._pooled = self._pooled, None
                    self.ctx = None  # no longer ours (the bracket's exit must not touch it)
                    gl_context.give_back(pooled)  # pooled (current in no thread) or released
            finally:
                self._closed = True
                self._programs.clear()  # they stay compiled in the context, for its next backend
                self._buffers.clear()
                self.packed.clear()
                self.tables.clear()

    def __repr__(self) -> str:
        return f"<GLBackend {self.renderer!r} (OpenGL {self.version})>"


__all__ = ["GLBackend", "GLBuffer", "GLError", "GLRecording"]
