"""The Vulkan backend: GLSL compute shaders (compiled to SPIR-V) on one compute queue.

Design
------
* Memory: the session pool (``allocate``) and constants are storage buffers in device-local
  memory. On devices whose device-local memory is also host-visible and coherent and that are
  not discrete GPUs (integrated GPUs, lavapipe) they are persistently mapped and ``write`` /
  ``read`` copy directly; otherwise a host-visible staging buffer (created lazily, grown
  rarely, reused) and a ``vkCmdCopyBuffer`` carry the data. Small constants share arena chunks.
* Bindings: every kernel binds storage buffers (the pool, a constant, ...) through a descriptor
  range that covers exactly the elements the dispatch touches (start aligned down to
  minStorageBufferOffsetAlignment) and receives element offsets relative to that range, sizes
  and strides as 32 x int32 push constants (128 bytes). Descriptor sets are written once per
  distinct set of ranges and cached.
* Planning: what to dispatch per atomic op (kernel variant, bound element ranges, parameters,
  grid, barrier placement) is API-neutral and shared with the OpenGL backend
  (``gpumnn.backends.kernels.glsl.planner``); this module turns their work into Vulkan objects.
* Kernels: one GLSL file per atomic-op family in ``gpumnn/backends/kernels/glsl`` (API-neutral bodies,
  see ``gpumnn.backends.kernels.glsl.compile``); per-op choices (op id, activation, tile sizes, bias) are
  ``#define`` variants, each compiled once and cached (memory + disk) and turned into one
  ``VkPipeline`` per device, kept by the device that the backends on it share (bounded; see
  ``vulkan_device``), so that a new session on a device compiles nothing it compiled before.
* Recorded mode: ``create_execution`` builds (or fetches) the pipeline, the descriptor set, the
  push-constant block and the grid, once. ``record`` writes one command buffer with every
  dispatch in order; a global compute->compute memory barrier is inserted only in front of a
  dispatch that touches a byte range written (or writes a range read) since the last barrier.
  ``submit`` is one ``vkQueueSubmit`` and a wait on the fence of the submit lane it borrowed;
  ``submit_async`` keeps the lane as its ticket and ``wait`` waits on that fence later.
* Threads: preparation verbs (allocate, constant, create_execution, record, release) share
  descriptor pools, the recording command pool and the buffer registry, so they take the
  backend's lock. Run verbs (write, read, submit, run_eager) borrow a *submit lane* instead
  (``vulkan_device.SubmitLane``: its own command pool, transfer command buffer, fence, staging
  buffer and eager descriptor pool; lent by :class:`~gpumnn.backends.lanes.LanePool`, which the
  cuda backend shares); the queue itself is held only for each ``vkQueueSubmit``. So two runs
  of one session (on separate run states) overlap, and a run overlaps the preparation of
  another state.
* Eager mode: ``run_eager`` records, submits, waits and frees one command buffer per execution,
  writing fresh descriptor sets each time (the un-decoupled baseline of the paper).
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Sequence

import numpy as np

from ... import atomic as A
from ...errors import BackendOptionError, BackendUnavailableError
from ..base import Backend, BackendInfo, Execution, TensorHandle, constant_words, host_out, kernel_family, kernels_option
from ..lanes import LanePool
from ..kernels.glsl.planner import INT8_PRODUCTS as GLSL_INT8_PRODUCTS
from ..limits import MemoryLimits, host_memory
from ..speed import GPU_DEFAULT_FLOPS, simd_lanes, software_renderer_flops
from ..waits import describe_ops
# The API-neutral half (what to dispatch per atomic op) is shared with the OpenGL backend.
from ..kernels.glsl.planner import dtypes_for as glsl_dtypes_for
from ..kernels.glsl.planner import (MAX_BINDINGS, RESIDUAL_BINDINGS, DTYPES as GLSL_DTYPES, FLOAT32_ONLY_SCHEMES as GLSL_FLOAT32_ONLY_SCHEMES, OP_NAMES as GLSL_OP_NAMES, PLANNERS as _PLANNERS, SCHEMES as _SCHEMES, WINOGRAD_REWRITE_MAX_TILE, residual_schemes_for, schemes_for, Binding as _Binding, Builder as _Builder,  # noqa: F401 (re-exported)
                         Hazards as _Hazards, binding_limit, grid_limit, PlanError, _rb_blocks, check_shader_op_ids, plan, release_scratch, window)

try:
    import vulkan as vk  # ModuleNotFoundError propagates: the registry says "pip install"
except OSError as _exc:  # the binding is installed but the loader (libvulkan.so.1) is not
    vk = None
    _VK_IMPORT_ERROR: Exception | None = _exc
else:
    _VK_IMPORT_ERROR = None
    from .device import DeviceBuffer, DescriptorAllocator, SubmitLane, VulkanDevice, VulkanError
    from .device import Pipeline as _Pipeline
    from .device import describe_cooperative_matrices

from ..kernels import word_padded
from ..kernels.int8_dot import choose as choose_int8_dot, int8_dot_option
from ..kernels.glsl.compile import ShaderCompilerNotFound, compile_glsl, cooperative_matrix_missing, find_compiler
from ..kernels.glsl.coopmat import choose as choose_cooperative_gemm, cooperative_matrix_option

PUSH_BYTES = 128
_SMALL_CONSTANT = 64 * 1024  # constants up to this size share arena chunks
_ARENA_CHUNK = 4 * 1024 * 1024


class _Dispatch:
    """One vkCmdDispatch: pipeline, bindings, push constants, grid and the byte ranges touched."""

    __slots__ = ("pipeline", "bindings", "push", "groups", "reads", "writes", "dset")

    def __init__(self, pipeline, bindings, push, groups, reads, writes):
        self.pipeline = pipeline
        self.bindings = bindings
        self.push = push
        self.groups = groups
        self.reads = reads
        self.writes = writes
        self.dset = None


class VulkanRecording:
    """A recorded primary command buffer; freed by the backend once this object is dropped."""

    def __init__(self, backend: "VulkanBackend", cmd, dispatches: int, barriers: int, ops: str = ""):
        self._backend = weakref.ref(backend)
        self.cmd = cmd
        self.ops = ops  # what it runs, named when a submission of it times out
        self.dispatches = dispatches
        self.barriers = barriers

    def __repr__(self) -> str:
        return f"<VulkanRecording {self.dispatches} dispatches, {self.barriers} barriers>"

    def __del__(self):
        backend = self._backend()
        if backend is not None and not backend._closed:
            backend._garbage_cmds.append(self.cmd)


class VulkanBackend(Backend):
    """Vulkan compute on one device (discrete GPU first, then integrated, virtual, CPU)."""

    name = "vulkan"
    device_arrays_unsupported = ("importing another API's GPU memory into Vulkan needs external-memory "
                                 "interop (VK_KHR_external_memory_fd), which gpumnn does not use; pass a host "
                                 "array, or use the cuda backend")
    alignment = 64
    #: runs borrow submit lanes of their own (see the module docstring)
    max_concurrent_runs = 2
    kernel_table = _PLANNERS
    int8_products = GLSL_INT8_PRODUCTS
    schemes = _SCHEMES
    winograd_rewrite_max_tile = WINOGRAD_REWRITE_MAX_TILE
    op_names = GLSL_OP_NAMES
    dtypes = GLSL_DTYPES
    float32_only_schemes = GLSL_FLOAT32_ONLY_SCHEMES
    plan_error = VulkanError if vk is not None else PlanError

    def __init__(self, device: str | int | None = None, validation: bool | None = None,
                 force_staging: bool = False, kernels: str | None = None, narrow_storage: str | None = None,
                 int8_dot: str | None = None, cooperative_matrix: str | None = None, **unknown: Any):
        """``narrow_storage``: "auto" (float16 / int8 / uint8 tensors held as themselves where the
        device has 16- / 8-bit storage in buffers, else packed in 32-bit words) or "packed"
        (always packed: the path of devices without them); default ``$GPUMNN_VULKAN_NARROW_STORAGE``,
        else "auto". ``int8_dot``: "auto" (the int8 implicit GEMM on integer dot products where
        the device has VK_KHR_shader_integer_dot_product) or "off" (plain int32 products);
        default ``$GPUMNN_INT8_DOT``, else "auto". ``cooperative_matrix``: "auto" (the tiled GEMMs
        on the device's cooperative matrices where it has them: ``kernels.glsl.coopmat``) or "off"
        (the plain tiled GEMM); default ``$GPUMNN_VULKAN_COOPERATIVE_MATRIX``, else "auto"."""
        super().__init__(**unknown)
        requested = kernels_option(kernels, self.name)
        dot_option = int8_dot_option(int8_dot, self.name)
        coopmat_option = cooperative_matrix_option(cooperative_matrix, self.name)
        if narrow_storage is None:
            narrow_storage = os.environ.get("GPUMNN_VULKAN_NARROW_STORAGE", "").strip().lower() or "auto"
        if narrow_storage not in ("auto", "packed"):
            raise BackendOptionError(f"backend 'vulkan': narrow_storage={narrow_storage!r}; expected 'auto' or 'packed' "
                                     "(also $GPUMNN_VULKAN_NARROW_STORAGE)")
        self._closed = True
        if _VK_IMPORT_ERROR is not None:
            raise BackendUnavailableError(
                f"the Vulkan loader cannot be loaded ({_VK_IMPORT_ERROR}); install libvulkan1 and a driver "
                "(e.g. mesa-vulkan-drivers)")
        try:
            find_compiler()
        except ShaderCompilerNotFound as exc:
            raise BackendUnavailableError(f"backend 'vulkan' cannot start: {exc}") from exc
        check_shader_op_ids()
        if validation is None:
            validation = os.environ.get("GPUMNN_VULKAN_VALIDATION", "").strip().lower() in ("1", "true", "yes", "on")
        self.dev = VulkanDevice(device, validation=bool(validation))
        self._deferred = self.dev.shared.deferred  # closes of dropped sessions on this device (see activate)
        #: the narrow element sizes held natively (gpumnn.backends.kernels.glsl.elements.glsl)
        self.native_narrow: frozenset[int] = self.dev.native_narrow if narrow_storage == "auto" else frozenset()
        self.narrow_storage = {size: (why if narrow_storage == "auto" else "packed: narrow_storage='packed'")
                               for size, why in self.dev.narrow_storage.items()}
        try:
            self._setup(requested, force_staging, dot_option, coopmat_option)
        except BaseException:
            self.dev.close()
            raise
        self._closed = False

    def _setup(self, requested: str, force_staging: bool, dot_option: str, coopmat_option: str) -> None:
        dev = self.dev
        self.alignment = max(64, dev.min_storage_align)
        # Direct mapping only where it is cheap both ways (unified memory); staging otherwise.
        self._direct = not force_staging and dev.device_type != vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU
        # Kernel profile: "tiled" (shared-memory tiles, wide workgroups: GPUs) or "simd"
        # (register blocking, vec4 loads, narrow workgroups: CPU devices such as lavapipe).
        self.kernels = kernel_family(requested, dev.device_type == vk.VK_PHYSICAL_DEVICE_TYPE_CPU)
        self.schemes = schemes_for(self.kernels)
        self.int8_dot, self.int8_arithmetic = choose_int8_dot(dot_option, self.kernels, dev.integer_dot,
                                                              dev.integer_dot_missing)
        if dev.device_type == vk.VK_PHYSICAL_DEVICE_TYPE_CPU:  # the tiled family's Winograd kernel: only where forced
            self.winograd_min_saving = float("inf")
        self.dtypes = glsl_dtypes_for(self.kernels, self.native_narrow)  # float16 arithmetic: tiled, 16-bit storage
        # a convolution that adds a residual binds one buffer more than Vulkan guarantees a stage
        self.residual_schemes = residual_schemes_for(self.kernels) if dev.max_storage_buffers >= RESIDUAL_BINDINGS else {}
        self.simd_lanes = simd_lanes(dev.name)  # of a CPU device's vector unit
        #: SMs / CUs / cores the tiled GEMM fills (``compute_units_source`` says who said so)
        self.compute_units: int = dev.compute_units
        self.compute_units_source: str = dev.compute_units_source
        #: what the device's VK_KHR_cooperative_matrix computes, for ``gpumnn info``
        self.cooperative_matrices = describe_cooperative_matrices(dev.cooperative_matrices, dev.cooperative_matrices_why)
        #: the tiled GEMMs' cooperative-matrix build (None: the plain one) and which GEMM it is, in words
        self.cooperative_gemm, self.gemm_kind = choose_cooperative_gemm(
            dev.cooperative_support, coopmat_option, cooperative_matrix_missing)
        if self.kernels != "tiled":  # the register-blocked kernels of CPU devices have no tiles to put on them
            self.cooperative_gemm = None
            self.gemm_kind = f"register-blocked GEMM of the {self.kernels} kernels (kernels='tiled': {self.gemm_kind})"
        self.packed: dict[tuple, TensorHandle] = {}
        self._buffers: dict[int, DeviceBuffer] = {}
        self._lock = threading.RLock()  # preparation verbs: descriptor pools, recording pool, registry
        self._lanes: LanePool[SubmitLane] = LanePool(self._make_lane, self._make_staging, lambda buf: buf.size,
                                                     self.release)  # holds them weakly
        self._arena: DeviceBuffer | None = None
        self._arena_used = 0
        self.tables: dict[tuple, TensorHandle] = {}
        self._dsets: dict[tuple, tuple[Any, Any]] = {}
        self._dsets_by_buffer: dict[int, set[tuple]] = {}
        self._garbage_cmds: list = []
        self._set_layouts: dict[int, Any] = {}
        for n in (2, 3, 4, RESIDUAL_BINDINGS, MAX_BINDINGS):  # owned by the shared device, like the pipelines built with them
            if n <= dev.max_storage_buffers:  # Vulkan guarantees 4; wider ops are refused (unsupported_reason)
                self._set_layouts[n] = dev.shared.layouts(n, PUSH_BYTES)[0]
        self._descriptors = DescriptorAllocator(dev.device, MAX_BINDINGS, freeable=True)
        # Barriers reused by every recording.
        self._barrier_in = vk.VkMemoryBarrier(
            srcAccessMask=(vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT | vk.VK_ACCESS_HOST_WRITE_BIT),
            dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT)
        self._barrier_cc = vk.VkMemoryBarrier(
            srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_SHADER_READ_BIT,
            dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT)
        # (Every access bit must belong to a stage of its barrier's stage mask, so compute and
        # transfer each get their own closing barrier.)
        self._barrier_out = vk.VkMemoryBarrier(
            srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT,
            dstAccessMask=(vk.VK_ACCESS_HOST_READ_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT
                           | vk.VK_ACCESS_SHADER_READ_BIT))
        self._barrier_xfer_in = vk.VkMemoryBarrier(
            srcAccessMask=(vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT | vk.VK_ACCESS_HOST_WRITE_BIT),
            dstAccessMask=vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT)
        self._barrier_xfer_out = vk.VkMemoryBarrier(
            srcAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            dstAccessMask=(vk.VK_ACCESS_HOST_READ_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT
                           | vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT))
        self._stages_in = (vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
                           | vk.VK_PIPELINE_STAGE_HOST_BIT)
        self._stages_out = (vk.VK_PIPELINE_STAGE_HOST_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
                            | vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT)
        if dev.timestamp_bits:
            self.timer = "Vulkan timestamp queries"
        cpu_device = dev.device_type == vk.VK_PHYSICAL_DEVICE_TYPE_CPU  # lavapipe
        flops = software_renderer_flops() if cpu_device else GPU_DEFAULT_FLOPS
        bandwidth = 8.0 if dev.device_type == vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU else 20.0
        self._info = BackendInfo("vulkan", dev.name, flops, 0.01, bandwidth,
                                 is_gpu=dev.device_type != vk.VK_PHYSICAL_DEVICE_TYPE_CPU)

    # -- description -----------------------------------------------------------------------
    @property
    def driver(self) -> str:
        """The Vulkan version the device implements, the driver's name and version text, and
        driverVersion (e.g. "Vulkan 1.3.230; llvmpipe Mesa 22.3.6 (LLVM 15.0.6); driverVersion 0x1")."""
        return self.dev.driver

    @property
    def submit_timeout(self) -> float:
        """Seconds a submission may take before the device is called hung (DeviceLostError)."""
        return self.dev.submit_timeout

    @submit_timeout.setter
    def submit_timeout(self, seconds: float) -> None:
        self.dev.submit_timeout = float(seconds)

    def activate(self):
        """A bracket of the shared device in this thread: at the outermost one, the closes that
        dropped sessions' finalizers queued on the device run first (see ``deferred``)."""
        return self._deferred.bracket()

    @property
    def validation_messages(self) -> list[str]:
        """Messages of VK_LAYER_KHRONOS_validation (warnings and errors) since creation."""
        return self.dev.messages

    @property
    def validation_enabled(self) -> bool:
        return self.dev.validation

    def unsupported_reason(self, op: A.AtomicOp) -> str | None:
        return (super().unsupported_reason(op) or grid_limit(op, self.dev.max_group_count)
                or binding_limit(op, self.dev.max_storage_range, "the device's maxStorageBufferRange")
                or self._bindings_limit(op))

    def _bindings_limit(self, op: A.AtomicOp) -> str | None:
        """The recurrent cell's shader binds MAX_BINDINGS buffers; Vulkan guarantees only 4 per stage."""
        if isinstance(op, A.RecurrentCell) and self.dev.max_storage_buffers < MAX_BINDINGS:
            return (f"its shader binds {MAX_BINDINGS} storage buffers and the device's "
                    f"maxPerStageDescriptorStorageBuffers is {self.dev.max_storage_buffers}")
        return None

    def memory_limits(self) -> MemoryLimits:
        """The largest device-local heap (what is left of its budget with VK_EXT_memory_budget),
        maxMemoryAllocationSize and maxStorageBufferRange; CPU devices and integrated GPUs are
        further bounded by the host's free RAM, which is their memory."""
        self._check_open()
        dev = self.dev
        total = dev.shared.device_heap_size()
        # without a budget to ask, what other backends on this (shared) device hold is not free
        available, used, source = total - dev.shared.allocated, None, "device-local heap size less gpumnn's buffers"
        budget = dev.shared.memory_budget()
        if budget is not None:
            available, used, source = max(0, budget[0] - budget[1]), budget[1], "VK_EXT_memory_budget"
        in_host = dev.device_type in (vk.VK_PHYSICAL_DEVICE_TYPE_CPU, vk.VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU)
        if in_host:
            _, host_available, host_source = host_memory()
            if host_available < available:
                available, source = host_available, f"host memory ({host_source})"
        return MemoryLimits(total, available, dev.max_allocation, dev.max_storage_range, host_memory=in_host,
                            used=used, source=f"{source}; maxMemoryAllocationSize {dev.max_allocation}")

    # -- memory ----------------------------------------------------------------------------
    def _new_buffer(self, nbytes: int, kind: str, **options: Any) -> DeviceBuffer:
        self._check_open()
        options.setdefault("host_visible", self._direct)
        buf = self.dev.create_buffer(max(int(nbytes), 16) if kind == "pool" else nbytes, kind, **options)
        with self._lock:
            self._buffers[buf.id] = buf
        return buf

    def release(self, buffer: Any) -> None:
        if not isinstance(buffer, DeviceBuffer) or not buffer.alive or buffer.kind == "arena":
            return  # arena chunks hold many constants and live as long as the backend
        with self._lock:
            for key in self._dsets_by_buffer.pop(buffer.id, ()):
                entry = self._dsets.pop(key, None)
                if entry is not None:
                    self._descriptors.free(entry[1], entry[0])
                for other, _, _ in key[1]:  # the set is gone for the other buffers it bound too
                    if other != buffer.id and other in self._dsets_by_buffer:
                        self._dsets_by_buffer[other].discard(key)
            if self._buffers.pop(buffer.id, None) is not None:
                self.dev.destroy_buffer(buffer)

    def scratch(self, nbytes: int) -> Any:
        """A buffer of one execution's own (a split-K GEMM's partial sums: the GLSL planner)."""
        return self.buffer(nbytes, "scratch")

    def release_execution(self, execution: Execution) -> None:
        release_scratch(self, execution.keep)

    def constant(self, array: np.ndarray) -> TensorHandle:
        words, dtype = constant_words(array)
        data = word_padded(words)
        nbytes = data.nbytes
        itemsize = words.itemsize
        if nbytes <= _SMALL_CONSTANT:
            with self._lock:
                start = -(-self._arena_used // self.alignment) * self.alignment
                if self._arena is None or start + nbytes > self._arena.size:
                    self._arena = self.buffer(_ARENA_CHUNK, "arena")
                    start = 0
                self._arena_used = start + nbytes
                handle = TensorHandle(self._arena, start // itemsize, tuple(np.shape(array)), dtype)
        else:
            handle = TensorHandle(self.buffer(nbytes, "constant"), 0, tuple(np.shape(array)), dtype)
        if words.size:
            self._upload(handle, data)
        return handle

    def write(self, handle: TensorHandle, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array, dtype=handle.dtype).reshape(-1)
        if data.size != handle.size:
            raise ValueError(f"write of {data.size} elements into a tensor of {handle.size}")
        if data.size:
            self._upload(handle, data)

    def read_into(self, handle: TensorHandle, out: np.ndarray) -> None:
        """Bytes copied into ``out`` from the mapped buffer itself (direct mapping), else from the
        lane's staging buffer (set aside by ``reserve_run``) after a vkCmdCopyBuffer into it."""
        raw = host_out(handle, out).view(np.uint8)  # bit-exact, whatever the storage dtype
        self._check_open()
        n, buf, start = raw.size, handle.buffer, handle.itemsize * handle.offset
        if n == 0:
            return
        if self._direct and buf.mapped is not None:
            np.copyto(raw, buf.mapped[start:start + n])
            return
        with self._lanes.lend() as lane:
            staging = self._lanes.staging(lane, n)
            self._copy(lane, buf, start, staging, 0, n)
            np.copyto(raw, staging.mapped[:n])

    def _upload(self, handle: TensorHandle, data: np.ndarray) -> None:
        """The bytes of ``data`` written from the handle's first byte (vkCmdCopyBuffer takes any
        byte offset and size)."""
        self._check_open()
        buf, start, raw = handle.buffer, handle.itemsize * handle.offset, data.reshape(-1).view(np.uint8)
        if self._direct and buf.mapped is not None:
            buf.mapped[start:start + raw.size] = raw
            return
        with self._lanes.lend() as lane:
            staging = self._lanes.staging(lane, raw.size)
            staging.mapped[:raw.size] = raw
            self._copy(lane, staging, 0, buf, start, raw.size)

    def reserve_run(self, io_bytes: int) -> None:
        """One more submit lane, made now with its staging buffer for ``io_bytes``, so a recorded
        run borrows a ready lane (one per run state) instead of creating one."""
        self._check_open()
        self._lanes.reserve(0 if self._direct else io_bytes)

    def _make_lane(self) -> SubmitLane:
        with self._lock:
            self._check_open()
            return SubmitLane(self.dev)

    def _make_staging(self, nbytes: int) -> DeviceBuffer:
        """A host-visible staging buffer of at least ``nbytes``."""
        size = 1 << max(20, (nbytes - 1).bit_length())  # >= 1 MiB, powers of two: grows rarely
        buf = self.buffer(size, "staging", host_visible=True, prefer_device_local=False)
        if buf.mapped is None:
            self.release(buf)
            raise VulkanError(f"{self.dev.name}: no host-visible coherent memory for staging")
        return buf

    def _copy(self, lane: SubmitLane, src: DeviceBuffer, src_offset: int, dst: DeviceBuffer, dst_offset: int,
              nbytes: int) -> None:
        cmd = lane.transfer_cmd
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        vk.vkCmdPipelineBarrier(cmd, self._stages_in, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1,
                                [self._barrier_xfer_in], 0, None, 0, None)
        vk.vkCmdCopyBuffer(cmd, src.handle, dst.handle, 1,
                           [vk.VkBufferCopy(srcOffset=src_offset, dstOffset=dst_offset, size=nbytes)])
        vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, self._stages_out, 0, 1,
                                [self._barrier_xfer_out], 0, None, 0, None)
        vk.vkEndCommandBuffer(cmd)
        lane.submit_and_wait(cmd)

    def binding(self, buf: DeviceBuffer, lo: int, hi: int) -> tuple[_Binding, int]:
        """The descriptor range covering elements [lo, hi) of ``buf`` and the element index its
        start corresponds to. The range starts at ``lo`` aligned down to
        minStorageBufferOffsetAlignment and ends at ``hi``: binding exactly what a dispatch
        touches lets the validation layer's synchronization checks see the true ranges, and
        lifts the maxStorageBufferRange limit from the pool to a single tensor."""
        return window(buf, lo, hi, self.dev.min_storage_align, self.dev.max_storage_range, VulkanError,
                      "the device's maxStorageBufferRange")

    # -- kernels -----------------------------------------------------------------------------
    def _pipeline(self, kernel: str, defines: dict, nbind: int) -> _Pipeline:
        """The pipeline of a kernel variant: this backend's, else the shared device's (built
        there once per process; see vulkan_device)."""
        return self.program((kernel, tuple(sorted(defines.items())), nbind))

    def _load_program(self, key: tuple) -> tuple[_Pipeline, bool]:
        kernel, defines, nbind = key
        return self.dev.shared.pipeline(key, nbind, PUSH_BYTES, lambda: compile_glsl(kernel, dict(defines)))

    def _write_set(self, dset, bindings: Sequence[_Binding]) -> None:
        infos = [vk.VkDescriptorBufferInfo(buffer=b.buf.handle, offset=b.base, range=b.range) for b in bindings]
        writes = [vk.VkWriteDescriptorSet(dstSet=dset, dstBinding=i, dstArrayElement=0, descriptorCount=1,
                                          descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, pBufferInfo=[info])
                  for i, info in enumerate(infos)]
        vk.vkUpdateDescriptorSets(self.dev.device, len(writes), writes, 0, None)

    def _descriptor_set(self, d: _Dispatch):
        nbind = d.pipeline.nbind
        key = (nbind, tuple((b.buf.id, b.base, b.range) for b in d.bindings))
        entry = self._dsets.get(key)
        if entry is None:
            dset, pool = self._descriptors.allocate(self._set_layouts[nbind])
            self._write_set(dset, d.bindings)
            entry = (dset, pool)
            self._dsets[key] = entry
            for b in d.bindings:
                self._dsets_by_buffer.setdefault(b.buf.id, set()).add(key)
        return entry[0]

    # -- pre-inference ---------------------------------------------------------------------
    def _create_execution(self, op: A.AtomicOp, inputs: list[TensorHandle],
                          outputs: list[TensorHandle]) -> Execution:
        self._check_open()
        with self._lock:
            planned = plan(self, op, inputs, outputs)
            for d in planned.work:
                d.dset = self._descriptor_set(d)
        return Execution(op, inputs, outputs, planned)

    def _record_into(self, cmd, executions: Sequence[Execution],
                     eager_descriptors: DescriptorAllocator | None = None) -> tuple[int, int]:
        """Record dispatches with hazard barriers; returns (dispatches, barriers). Eager mode
        passes the allocator its descriptor sets are written from at run time."""
        hazards = _Hazards()
        bound = None
        n = barriers = 0
        compute = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
        bind_point = vk.VK_PIPELINE_BIND_POINT_COMPUTE
        vk.vkCmdPipelineBarrier(cmd, self._stages_in, compute, 0, 1, [self._barrier_in], 0, None, 0, None)
        for exe in executions:
            for d in exe.work:
                if hazards.needs_barrier(d):
                    vk.vkCmdPipelineBarrier(cmd, compute, compute, 0, 1, [self._barrier_cc], 0, None, 0, None)
                    hazards.clear()
                    barriers += 1
                hazards.add(d)
                if d.pipeline is not bound:
                    vk.vkCmdBindPipeline(cmd, bind_point, d.pipeline.handle)
                    bound = d.pipeline
                if eager_descriptors is not None:  # an engine without decoupling writes them at run time
                    dset, _ = eager_descriptors.allocate(self._set_layouts[d.pipeline.nbind])
                    self._write_set(dset, d.bindings)
                else:
                    dset = d.dset
                vk.vkCmdBindDescriptorSets(cmd, bind_point, d.pipeline.layout, 0, 1, [dset], 0, None)
                vk.vkCmdPushConstants(cmd, d.pipeline.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, PUSH_BYTES, d.push)
                vk.vkCmdDispatch(cmd, *d.groups)
                n += 1
        vk.vkCmdPipelineBarrier(cmd, compute, self._stages_out, 0, 1, [self._barrier_out], 0, None, 0, None)
        return n, barriers

    def _record(self, executions: list[Execution]) -> VulkanRecording:
        self._check_open()
        with self._lock:
            self._collect_garbage()
            cmd = self.dev.allocate_command_buffer()
            vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo())
            n, barriers = self._record_into(cmd, executions)
            vk.vkEndCommandBuffer(cmd)
        return VulkanRecording(self, cmd, n, barriers, describe_ops(executions))

    # -- run -------------------------------------------------------------------------------
    def _submit(self, recording: VulkanRecording) -> None:
        self._check_open()
        with self._lanes.lend() as lane:
            lane.submit_and_wait(recording.cmd, recording.ops)

    def _submit_async(self, recording: VulkanRecording) -> SubmitLane:
        """One vkQueueSubmit on a borrowed lane, signalling its fence; the lane is the ticket and
        stays lent (its fence in use) until ``wait``. A recorded run holds at most one lane at a
        time (it waits before it touches the backend again), the one ``reserve_run`` made."""
        self._check_open()
        lane = self._lanes.take()
        try:
            lane.submit(recording.cmd, recording.ops)
        except BaseException:
            self._lanes.give(lane)
            raise
        return lane

    def _wait(self, ticket: SubmitLane) -> None:
        try:
            ticket.wait()
        finally:
            self._lanes.give(ticket)  # (not a hung one)

    def _timed_submit(self, recording: VulkanRecording) -> float:
        """Timestamp queries in the same submission, just before and after the recording (see
        ``vulkan_device._Timestamps``); the host's clock where the queue writes none."""
        if self.timer == "host":
            return super()._timed_submit(recording)
        self._check_open()
        with self._lanes.lend() as lane:
            return lane.timed_submit(recording.cmd, recording.ops)

    def _run_eager(self, executions: list[Execution]) -> None:
        self._check_open()
        with self._lanes.lend() as lane:
            if lane.eager_descriptors is None:
                lane.eager_descriptors = DescriptorAllocator(self.dev.device, MAX_BINDINGS, freeable=False)
            for exe in executions:
                cmd = lane.allocate_command_buffer()
                try:
                    vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
                        flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
                    self._record_into(cmd, [exe], lane.eager_descriptors)
                    vk.vkEndCommandBuffer(cmd)
                    lane.submit_and_wait(cmd, describe_ops([exe]))
                finally:
                    if not lane.hung:
                        lane.free_command_buffer(cmd)
                        lane.eager_descriptors.reset()

    # -- lifetime --------------------------------------------------------------------------
    def _collect_garbage(self) -> None:
        while self._garbage_cmds:
            self.dev.free_command_buffer(self._garbage_cmds.pop())

    def _check_open(self) -> None:
        if self._closed:
            raise VulkanError("the Vulkan backend is closed")
        self.dev.check_alive()

    def close_later(self) -> None:
        """A dropped session's finalizer: the close waits for the device's next safe point."""
        if not self._closed:
            self._deferred.defer(self.close)

    def close(self) -> None:
        """Wait for the queue, then free this backend's objects; then run the closes finalizers
        queued on the device (a session's close is a safe point). On a hung device nothing is
        freed: a submission that never finished may still use it."""
        if self._closed:
            return
        self._closed = True
        dev = self.dev
        try:
            if dev.shared is None or dev.shared.hung or dev.shared.device is None:
                return
            dev.wait_idle()  # nothing of this backend may be in flight when it is destroyed
            self._garbage_cmds.clear()  # freed with the command pool
            dev.shared.release_pipelines(self._programs)  # the shared device keeps them (bounded)
            self._programs.clear()
            self._descriptors.destroy()
            for lane in self._lanes.drain():
                lane.destroy()
            self._dsets.clear()
            self._dsets_by_buffer.clear()
            for buf in list(self._buffers.values()):
                dev.destroy_buffer(buf)
            self._buffers.clear()
            self.tables.clear()
            self.packed.clear()
            self._arena = None
        finally:
            dev.close()  # this backend's command pool; the device is shared
            self._deferred.drain()

    def __repr__(self) -> str:
        return f"<VulkanBackend {self.dev.name!r} ({self.dev.type_name})>"

    # -- planning (gpumnn.backends.kernels.glsl.planner) -----------------------------------------------
    @property
    def max_group_count(self) -> tuple[int, int, int]:
        return self.dev.max_group_count

    def dispatch(self, builder: _Builder, bindings: tuple) -> _Dispatch:
        pipeline = self._pipeline(builder.kernel, builder.defines, builder.nbind)
        push = vk.ffi.new("int32_t[32]", builder.params.tolist())
        return _Dispatch(pipeline, bindings, push, builder.groups, tuple(builder.reads), tuple(builder.writes))


__all__ = ["VulkanBackend", "VulkanRecording", "check_shader_op_ids"]
