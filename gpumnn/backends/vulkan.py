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
* Kernels: one GLSL file per atomic-op family in ``gpumnn/shaders/glsl`` (API-neutral bodies,
  see ``gpumnn.shaders.compile``); per-op choices (op id, activation, tile sizes, bias) are
  ``#define`` variants, each compiled once and cached (memory + disk) and turned into one
  ``VkPipeline`` per backend.
* Recorded mode: ``create_execution`` builds (or fetches) the pipeline, the descriptor set, the
  push-constant block and the grid, once. ``record`` writes one command buffer with every
  dispatch in order; a global compute->compute memory barrier is inserted only in front of a
  dispatch that touches a byte range written (or writes a range read) since the last barrier.
  ``submit`` is one ``vkQueueSubmit`` and a wait on one reused fence.
* Eager mode: ``run_eager`` records, submits, waits and frees one command buffer per execution,
  writing fresh descriptor sets each time (the un-decoupled baseline of the paper).
"""
from __future__ import annotations

import math
import os
import re
import weakref
from typing import Any, NamedTuple, Sequence

import numpy as np

from .. import atomic as A
from ..strides import contiguous_strides, merge_dims
from ..errors import BackendUnavailableError
from .base import Backend, BackendInfo, Execution, TensorHandle
from .cpu import host_cpu_flops
from .sampling import resize_axis

try:
    import vulkan as vk  # ModuleNotFoundError propagates: the registry says "pip install"
except OSError as _exc:  # the binding is installed but the loader (libvulkan.so.1) is not
    vk = None
    _VK_IMPORT_ERROR: Exception | None = _exc
else:
    _VK_IMPORT_ERROR = None
    from .vulkan_device import DeviceBuffer, DescriptorAllocator, VulkanDevice, VulkanError

from ..shaders.compile import GLSL_DIR, ShaderCompilerNotFound, compile_glsl, find_compiler

PUSH_BYTES = 128
UNARY_IDS, BINARY_IDS, REDUCE_IDS = A.UNARY_IDS, A.BINARY_IDS, A.REDUCE_IDS
_SMALL_CONSTANT = 64 * 1024  # constants up to this size share arena chunks
_ARENA_CHUNK = 4 * 1024 * 1024
_GPU_DEFAULT_FLOPS = 4e9  # paper Appendix C fallback for an unknown GPU


def _shader_ids(path: str, prefix: str) -> dict[str, int]:
    text = (GLSL_DIR / path).read_text()
    return {m.group(1).lower(): int(m.group(2)) for m in re.finditer(rf"#define {prefix}_(\w+) (\d+)", text)}


def check_shader_op_ids() -> None:
    """The GLSL op ids must follow gpumnn.atomic's orders (one source of truth each side)."""
    if _shader_ids("activation.glsl", "U") != UNARY_IDS:
        raise RuntimeError("gpumnn/shaders/glsl/activation.glsl op ids do not match atomic.UNARY_OPS")
    if _shader_ids("binary.comp", "B") != BINARY_IDS:
        raise RuntimeError("gpumnn/shaders/glsl/binary.comp op ids do not match atomic.BINARY_OPS")


class _Binding(NamedTuple):
    buf: Any  # DeviceBuffer
    base: int  # byte offset of the bound window
    range: int  # bytes bound


class _Pipeline:
    __slots__ = ("handle", "module", "layout", "nbind", "key")

    def __init__(self, handle, module, layout, nbind, key):
        self.handle, self.module, self.layout, self.nbind, self.key = handle, module, layout, nbind, key


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


def _overlaps(ranges, others) -> bool:
    for b, lo, hi in ranges:
        for b2, lo2, hi2 in others:
            if b == b2 and lo < hi2 and lo2 < hi:
                return True
    return False


class _Hazards:
    """Byte ranges written / read since the last barrier, to place barriers only where needed."""

    def __init__(self):
        self.written: list = []
        self.read: list = []

    MAX_PENDING = 64  # beyond this a barrier is cheaper than checking (keeps recording linear)

    def needs_barrier(self, d: _Dispatch) -> bool:
        if not self.written and not self.read:
            return False
        if len(self.written) + len(self.read) > self.MAX_PENDING:
            return True
        return (_overlaps(d.reads, self.written) or _overlaps(d.writes, self.written)
                or _overlaps(d.writes, self.read))

    def add(self, d: _Dispatch) -> None:
        self.written.extend(d.writes)
        self.read.extend(d.reads)

    def clear(self) -> None:
        self.written.clear()
        self.read.clear()


class VulkanExecution(Execution):
    """An atomic op as a list of prepared dispatches (most ops: one)."""

    def __init__(self, op, inputs, outputs, dispatches: list[_Dispatch], scheme: str | None):
        super().__init__(op, inputs, outputs, scheme)
        self.dispatches = dispatches


class VulkanRecording:
    """A recorded primary command buffer; freed by the backend once this object is dropped."""

    def __init__(self, backend: "VulkanBackend", cmd, dispatches: int, barriers: int):
        self._backend = weakref.ref(backend)
        self.cmd = cmd
        self.dispatches = dispatches
        self.barriers = barriers

    def __repr__(self) -> str:
        return f"<VulkanRecording {self.dispatches} dispatches, {self.barriers} barriers>"

    def __del__(self):
        backend = self._backend()
        if backend is not None and not backend._closed:
            backend._garbage_cmds.append(self.cmd)


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


def _gemm_tiles(m: int, n: int) -> tuple[int, int, int, int]:
    """(TM, TN, RM, RN) of a 256-invocation tile shaped to the problem."""
    if m >= 48 and n >= 48:
        return 64, 64, 4, 4
    if m >= 48:
        return (64, 16, 4, 1) if n > 8 else (256, 4, 4, 1)
    if n >= 48:
        return (16, 64, 1, 4) if m > 8 else (4, 256, 1, 4)
    return 16, 16, 1, 1


def _row_variant(rows: int, size: int) -> tuple[bool, int]:
    """(one workgroup per row?, workgroup size) for row reductions."""
    if size >= 128 or (size >= 32 and rows < 1024):
        return True, (128 if size >= 1024 else 64)
    return False, 64


class _Builder:
    """Collects one dispatch: kernel variant, bindings (element offsets), parameters, grid."""

    def __init__(self, backend: "VulkanBackend", kernel: str, defines: dict, nbind: int):
        self.backend = backend
        self.kernel = kernel
        self.defines = dict(defines)
        self.nbind = nbind
        self.bindings: list[_Binding | None] = [None] * nbind
        self.params = np.zeros(32, dtype=np.int32)
        self.reads: list = []
        self.writes: list = []
        self.groups = (0, 0, 0)

    def bind(self, slot: int, handle: TensorHandle, lo: int = 0, hi: int | None = None, write: bool = False) -> int:
        """Bind ``handle``'s buffer at ``slot``; returns the element offset of the handle's first
        element inside the bound range. ``[lo, hi)`` is the element range used, relative to it."""
        hi = handle.size if hi is None else hi
        binding, base_elems = self.backend._binding(handle.buffer, handle.offset + lo, handle.offset + hi)
        self.bindings[slot] = binding
        rng = (handle.buffer.id, 4 * (handle.offset + lo), 4 * (handle.offset + hi))
        (self.writes if write else self.reads).append(rng)
        return handle.offset - base_elems

    def set(self, index: int, *values: int) -> None:
        for i, v in enumerate(values):
            v = int(v)
            if not -2**31 <= v < 2**31:
                raise VulkanError(f"kernel parameter {v} does not fit in int32")
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
        max_x, max_y, _ = self.backend.dev.max_group_count
        gx = min(groups, max_x)
        gy = math.ceil(groups / gx) if gx else 0
        if gy > max_y:
            raise VulkanError(f"{groups} workgroups exceed the device's grid limit")
        self.groups = (gx, gy, 1)

    def build(self) -> _Dispatch | None:
        if 0 in self.groups:
            return None
        first = next(b for b in self.bindings if b is not None)
        bindings = tuple(b if b is not None else first for b in self.bindings)
        pipeline = self.backend._pipeline(self.kernel, self.defines, self.nbind)
        push = vk.ffi.new("int32_t[32]", self.params.tolist())
        return _Dispatch(pipeline, bindings, push, self.groups, tuple(self.reads), tuple(self.writes))


class VulkanBackend(Backend):
    """Vulkan compute on one device (discrete GPU first, then integrated, virtual, CPU)."""

    name = "vulkan"
    alignment = 64

    def __init__(self, device: str | int | None = None, validation: bool | None = None,
                 force_staging: bool = False, kernels: str | None = None, **_: Any):
        super().__init__()
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
        # Kernel profile: "tiled" (shared-memory tiles, wide workgroups: GPUs) or "simd"
        # (register blocking, vec4 loads, narrow workgroups: CPU devices such as lavapipe).
        kernels = kernels or os.environ.get("GPUMNN_VULKAN_KERNELS") or "auto"
        kernels = {"gpu": "tiled", "cpu": "simd"}.get(kernels, kernels)  # the OpenCL backend's names
        if kernels not in ("auto", "simd", "tiled"):
            raise ValueError(f"kernels must be 'auto', 'simd' (alias 'cpu') or 'tiled' (alias 'gpu'), "
                             f"not {kernels!r}")
        if validation is None:
            validation = os.environ.get("GPUMNN_VULKAN_VALIDATION", "").strip().lower() in ("1", "true", "yes", "on")
        self.dev = VulkanDevice(device, validation=bool(validation))
        try:
            self._setup(kernels, force_staging)
        except BaseException:
            self.dev.close()
            raise
        self._closed = False

    def _setup(self, kernels: str, force_staging: bool) -> None:
        dev = self.dev
        self.alignment = max(64, dev.min_storage_align)
        # Direct mapping only where it is cheap both ways (unified memory); staging otherwise.
        self._direct = not force_staging and dev.device_type != vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU
        if kernels == "auto":
            kernels = "simd" if dev.device_type == vk.VK_PHYSICAL_DEVICE_TYPE_CPU else "tiled"
        self.kernels = kernels
        # SIMD lanes of a CPU device's vector unit (llvmpipe names its width: "..., 256 bits)").
        bits = re.search(r"(\d+) bits", dev.name)
        self.simd_lanes = min(16, max(4, int(bits.group(1)) // 32)) if bits else 8
        self._packed: dict[tuple, TensorHandle] = {}
        self._buffers: dict[int, DeviceBuffer] = {}
        self._staging: DeviceBuffer | None = None
        self._arena: DeviceBuffer | None = None
        self._arena_used = 0
        self._tables: dict[tuple, TensorHandle] = {}
        self._pipelines: dict[tuple, _Pipeline] = {}
        self._dsets: dict[tuple, tuple[Any, Any]] = {}
        self._dsets_by_buffer: dict[int, set[tuple]] = {}
        self._garbage_cmds: list = []
        self._transfer_cmd = dev.allocate_command_buffer()
        self._set_layouts: dict[int, Any] = {}
        self._pipeline_layouts: dict[int, Any] = {}
        for n in (2, 3, 4):
            bindings = [vk.VkDescriptorSetLayoutBinding(binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                        descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                        for i in range(n)]
            layout = vk.vkCreateDescriptorSetLayout(dev.device, vk.VkDescriptorSetLayoutCreateInfo(
                bindingCount=n, pBindings=bindings), None)
            push = vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=PUSH_BYTES)
            self._set_layouts[n] = layout
            self._pipeline_layouts[n] = vk.vkCreatePipelineLayout(dev.device, vk.VkPipelineLayoutCreateInfo(
                setLayoutCount=1, pSetLayouts=[layout], pushConstantRangeCount=1, pPushConstantRanges=[push]), None)
        self._descriptors = DescriptorAllocator(dev.device, 4, freeable=True)
        self._eager_descriptors = DescriptorAllocator(dev.device, 4, freeable=False)
        self._pipeline_cache = vk.vkCreatePipelineCache(dev.device, vk.VkPipelineCacheCreateInfo(), None)
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
        if dev.device_type == vk.VK_PHYSICAL_DEVICE_TYPE_CPU:
            # A software Vulkan (lavapipe) on the host's cores: measured ~10x below NumPy/BLAS on
            # the same cores (scalarised buffer loads), so a tenth of the CPU backend's estimate.
            flops = host_cpu_flops(os.cpu_count() or 1) / 10
        else:
            flops = _GPU_DEFAULT_FLOPS
        bandwidth = 8.0 if dev.device_type == vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU else 20.0
        self._info = BackendInfo("vulkan", dev.name, flops, 0.01, bandwidth,
                                 is_gpu=dev.device_type != vk.VK_PHYSICAL_DEVICE_TYPE_CPU)

    # -- description -----------------------------------------------------------------------
    @property
    def info(self) -> BackendInfo:
        return self._info

    @property
    def validation_messages(self) -> list[str]:
        """Messages of VK_LAYER_KHRONOS_validation (warnings and errors) since creation."""
        return self.dev.messages

    @property
    def validation_enabled(self) -> bool:
        return self.dev.validation

    def unsupported_reason(self, op: A.AtomicOp) -> str | None:
        reason = super().unsupported_reason(op)
        if reason is not None:
            return reason
        if isinstance(op, A.Pool2D) and op.op not in ("max", "avg"):
            return f"unknown pooling {op.op!r}"
        if isinstance(op, A.Resize) and op.mode not in ("nearest", "linear"):
            return f"unknown resize mode {op.mode!r}"
        if isinstance(op, (A.Conv2D, A.MatMul)):
            z = op.batch * getattr(op, "groups", 1)
            if z > self.dev.max_group_count[2]:
                return f"batch x groups = {z} exceeds the device's workgroup grid"
        return None

    # -- memory ----------------------------------------------------------------------------
    def _new_buffer(self, nbytes: int, kind: str) -> DeviceBuffer:
        self._check_open()
        buf = self.dev.create_buffer(nbytes, kind, host_visible=self._direct)
        self.counters["buffers_allocated"] += 1
        self._buffers[buf.id] = buf
        return buf

    def allocate(self, nbytes: int) -> DeviceBuffer:
        return self._new_buffer(max(int(nbytes), 16), "pool")

    def release(self, buffer: Any) -> None:
        if not isinstance(buffer, DeviceBuffer) or not buffer.alive or buffer.kind == "arena":
            return  # arena chunks hold many constants and live as long as the backend
        if buffer is self._staging:
            self._staging = None
        for key in self._dsets_by_buffer.pop(buffer.id, ()):
            entry = self._dsets.pop(key, None)
            if entry is not None:
                self._descriptors.free(entry[1], entry[0])
        self._buffers.pop(buffer.id, None)
        self.dev.destroy_buffer(buffer)

    def constant(self, array: np.ndarray) -> TensorHandle:
        data = np.ascontiguousarray(np.asarray(array, dtype=np.float32)).reshape(-1)
        nbytes = max(data.nbytes, 4)
        if nbytes <= _SMALL_CONSTANT:
            start = -(-self._arena_used // self.alignment) * self.alignment
            if self._arena is None or start + nbytes > self._arena.size:
                self._arena = self._new_buffer(_ARENA_CHUNK, "arena")
                start = 0
            self._arena_used = start + nbytes
            handle = TensorHandle(self._arena, start // 4, tuple(np.shape(array)))
        else:
            handle = TensorHandle(self._new_buffer(nbytes, "constant"), 0, tuple(np.shape(array)))
        if data.size:
            self._upload(handle, data)
        return handle

    def write(self, handle: TensorHandle, array: np.ndarray) -> None:
        data = np.ascontiguousarray(np.asarray(array, dtype=np.float32)).reshape(-1)
        if data.size != handle.size:
            raise ValueError(f"write of {data.size} elements into a tensor of {handle.size}")
        if data.size:
            self._upload(handle, data)

    def read(self, handle: TensorHandle) -> np.ndarray:
        self._check_open()
        n = handle.size
        buf = handle.buffer
        if n == 0:
            return np.zeros(handle.shape, dtype=np.float32)
        if self._direct and buf.mapped is not None:
            return buf.mapped[handle.offset:handle.offset + n].reshape(handle.shape).copy()
        staging = self._staging_buffer(4 * n)
        self._copy(buf, 4 * handle.offset, staging, 0, 4 * n)
        return staging.mapped[:n].reshape(handle.shape).copy()

    def _upload(self, handle: TensorHandle, data: np.ndarray) -> None:
        self._check_open()
        buf = handle.buffer
        if self._direct and buf.mapped is not None:
            buf.mapped[handle.offset:handle.offset + data.size] = data
            return
        staging = self._staging_buffer(data.nbytes)
        staging.mapped[:data.size] = data
        self._copy(staging, 0, buf, 4 * handle.offset, data.nbytes)

    def _staging_buffer(self, nbytes: int) -> DeviceBuffer:
        if self._staging is None or self._staging.size < nbytes:
            if self._staging is not None:
                old, self._staging = self._staging, None
                self.release(old)
            size = 1 << max(20, (nbytes - 1).bit_length())  # >= 1 MiB, powers of two: grows rarely
            buf = self.dev.create_buffer(size, "staging", host_visible=True, prefer_device_local=False)
            if buf.mapped is None:
                self.dev.destroy_buffer(buf)
                raise VulkanError(f"{self.dev.name}: no host-visible coherent memory for staging")
            self.counters["buffers_allocated"] += 1
            self._buffers[buf.id] = buf
            self._staging = buf
        return self._staging

    def _copy(self, src: DeviceBuffer, src_offset: int, dst: DeviceBuffer, dst_offset: int, nbytes: int) -> None:
        cmd = self._transfer_cmd
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        vk.vkCmdPipelineBarrier(cmd, self._stages_in, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1,
                                [self._barrier_xfer_in], 0, None, 0, None)
        vk.vkCmdCopyBuffer(cmd, src.handle, dst.handle, 1,
                           [vk.VkBufferCopy(srcOffset=src_offset, dstOffset=dst_offset, size=nbytes)])
        vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, self._stages_out, 0, 1,
                                [self._barrier_xfer_out], 0, None, 0, None)
        vk.vkEndCommandBuffer(cmd)
        self.dev.submit_and_wait(cmd)

    def _binding(self, buf: DeviceBuffer, lo: int, hi: int) -> tuple[_Binding, int]:
        """The descriptor range covering elements [lo, hi) of ``buf`` and the element index its
        start corresponds to. The range starts at ``lo`` aligned down to
        minStorageBufferOffsetAlignment and ends at ``hi``: binding exactly what a dispatch
        touches lets the validation layer's synchronization checks see the true ranges, and
        lifts the maxStorageBufferRange limit from the pool to a single tensor."""
        align = max(4, self.dev.min_storage_align)
        base = (4 * lo) // align * align
        size = max(4 * hi - base, 4)
        if size > self.dev.max_storage_range:
            raise VulkanError(f"a tensor view spans {size} bytes, more than the device's "
                              f"maxStorageBufferRange ({self.dev.max_storage_range} bytes)")
        return _Binding(buf, base, min(size, buf.size - base)), base // 4

    # -- kernels -----------------------------------------------------------------------------
    def _pipeline(self, kernel: str, defines: dict, nbind: int) -> _Pipeline:
        key = (kernel, tuple(sorted(defines.items())), nbind)
        pipe = self._pipelines.get(key)
        if pipe is not None:
            return pipe
        spirv = compile_glsl(kernel, defines)
        device = self.dev.device
        module = vk.vkCreateShaderModule(device, vk.VkShaderModuleCreateInfo(codeSize=len(spirv), pCode=spirv), None)
        stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module, pName="main")
        info = vk.VkComputePipelineCreateInfo(stage=stage, layout=self._pipeline_layouts[nbind], basePipelineIndex=-1)
        handle = vk.vkCreateComputePipelines(device, self._pipeline_cache, 1, [info], None)[0]
        self.counters["programs_built"] += 1
        pipe = _Pipeline(handle, module, self._pipeline_layouts[nbind], nbind, key)
        self._pipelines[key] = pipe
        return pipe

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
    def create_execution(self, op: A.AtomicOp, inputs: Sequence[TensorHandle],
                         outputs: Sequence[TensorHandle]) -> VulkanExecution:
        self._check_open()
        planner = _PLANNERS.get(type(op))
        if planner is None:
            raise NotImplementedError(f"Vulkan backend: no kernel for {type(op).__name__} (node {op.source!r})")
        self.counters["executions_created"] += 1
        builders, scheme = planner(self, op, list(inputs), list(outputs))
        dispatches = [d for d in (b.build() for b in builders) if d is not None]
        for d in dispatches:
            d.dset = self._descriptor_set(d)
        return VulkanExecution(op, inputs, outputs, dispatches, scheme)

    def _record_into(self, cmd, executions: Sequence[Execution], eager: bool) -> tuple[int, int]:
        """Record dispatches with hazard barriers; returns (dispatches, barriers)."""
        hazards = _Hazards()
        bound = None
        n = barriers = 0
        device = self.dev.device
        compute = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
        bind_point = vk.VK_PIPELINE_BIND_POINT_COMPUTE
        vk.vkCmdPipelineBarrier(cmd, self._stages_in, compute, 0, 1, [self._barrier_in], 0, None, 0, None)
        for exe in executions:
            for d in exe.dispatches:  # type: ignore[attr-defined]
                if hazards.needs_barrier(d):
                    vk.vkCmdPipelineBarrier(cmd, compute, compute, 0, 1, [self._barrier_cc], 0, None, 0, None)
                    hazards.clear()
                    barriers += 1
                hazards.add(d)
                if d.pipeline is not bound:
                    vk.vkCmdBindPipeline(cmd, bind_point, d.pipeline.handle)
                    bound = d.pipeline
                if eager:  # an engine without decoupling writes its descriptors at run time
                    dset, _ = self._eager_descriptors.allocate(self._set_layouts[d.pipeline.nbind])
                    self._write_set(dset, d.bindings)
                else:
                    dset = d.dset
                vk.vkCmdBindDescriptorSets(cmd, bind_point, d.pipeline.layout, 0, 1, [dset], 0, None)
                vk.vkCmdPushConstants(cmd, d.pipeline.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, PUSH_BYTES, d.push)
                vk.vkCmdDispatch(cmd, *d.groups)
                n += 1
        vk.vkCmdPipelineBarrier(cmd, compute, self._stages_out, 0, 1, [self._barrier_out], 0, None, 0, None)
        return n, barriers

    def record(self, executions: Sequence[Execution]) -> VulkanRecording:
        self._check_open()
        self._collect_garbage()
        cmd = self.dev.allocate_command_buffer()
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo())
        n, barriers = self._record_into(cmd, executions, eager=False)
        vk.vkEndCommandBuffer(cmd)
        self.counters["recordings_made"] += 1
        return VulkanRecording(self, cmd, n, barriers)

    # -- run -------------------------------------------------------------------------------
    def submit(self, recording: VulkanRecording) -> None:
        self._check_open()
        self.counters["submits"] += 1
        self.dev.submit_and_wait(recording.cmd)

    def run_eager(self, executions: Sequence[Execution]) -> None:
        self._check_open()
        for exe in executions:
            cmd = self.dev.allocate_command_buffer()
            try:
                vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
                    flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
                self._record_into(cmd, [exe], eager=True)
                vk.vkEndCommandBuffer(cmd)
                self.counters["recordings_made"] += 1
                self.counters["submits"] += 1
                self.dev.submit_and_wait(cmd)
            finally:
                self.dev.free_command_buffer(cmd)
                self._eager_descriptors.reset()

    # -- lifetime --------------------------------------------------------------------------
    def _collect_garbage(self) -> None:
        while self._garbage_cmds:
            self.dev.free_command_buffer(self._garbage_cmds.pop())

    def _check_open(self) -> None:
        if self._closed:
            raise VulkanError("the Vulkan backend is closed")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        dev = self.dev
        device = dev.device
        dev.wait_idle()
        self._garbage_cmds.clear()  # freed with the command pool
        for pipe in self._pipelines.values():
            vk.vkDestroyPipeline(device, pipe.handle, None)
            vk.vkDestroyShaderModule(device, pipe.module, None)
        self._pipelines.clear()
        vk.vkDestroyPipelineCache(device, self._pipeline_cache, None)
        self._descriptors.destroy()
        self._eager_descriptors.destroy()
        self._dsets.clear()
        for layout in self._pipeline_layouts.values():
            vk.vkDestroyPipelineLayout(device, layout, None)
        for layout in self._set_layouts.values():
            vk.vkDestroyDescriptorSetLayout(device, layout, None)
        for buf in list(self._buffers.values()):
            dev.destroy_buffer(buf)
        self._buffers.clear()
        self._tables.clear()
        self._packed.clear()
        dev.close()

    def __repr__(self) -> str:
        return f"<VulkanBackend {self.dev.name!r} ({self.dev.type_name})>"


# --------------------------------------------------------------------------------------------
# Planners: one per atomic op; each returns (builders, scheme).
# --------------------------------------------------------------------------------------------

def _plan_raster(be: VulkanBackend, op: A.Raster, ins, outs):
    out = outs[0]
    builders = []
    if op.fill is not None and out.size:
        b = _Builder(be, "raster", {"FILL": 1}, 2)
        o = b.bind(0, out, write=True)
        b.set(0, out.size, o)
        b.setf(2, op.fill)
        b.grid1d(out.size, 128)
        builders.append(b)
    for r in op.regions:
        if r.count == 0:
            continue
        size = _pad4(r.size, 1)
        sst, dst = _pad4(r.src_strides, 0), _pad4(r.dst_strides, 0)
        src = ins[r.src]
        slo, shi = _extent(r.src_offset, size, sst)
        dlo, dhi = _extent(r.dst_offset, size, dst)
        ndim, csize, (csst, cdst) = _collapse(size, sst, dst)
        b = _Builder(be, "raster", {"NDIM": ndim}, 2)
        do = b.bind(0, out, dlo, dhi, write=True)
        so = b.bind(1, src, slo, shi)
        b.set(0, r.count, csize[1], csize[2], csize[3], so + r.src_offset, *csst, do + r.dst_offset, *cdst)
        b.grid1d(r.count, 128)
        builders.append(b)
    return builders, "raster"


def _plan_unary(be, op: A.Unary, ins, outs):
    b = _Builder(be, "unary", {"OP": UNARY_IDS[op.op]}, 2)
    o = b.bind(0, outs[0], 0, op.count, write=True)
    x = b.bind(1, ins[0], 0, op.count)
    b.set(0, op.count, x, o)
    b.setf(3, *(tuple(op.params) + (0.0, 0.0, 0.0))[:3])
    b.grid1d(op.count, 128)
    return [b], None


def _plan_binary(be, op: A.Binary, ins, outs):
    shape = _pad4(op.out_shape, 1)
    total = math.prod(shape)
    sa, sb = _pad4(op.a_strides, 0), _pad4(op.b_strides, 0)
    ndim, cshape, (csa, csb, _) = _collapse(shape, sa, sb, contiguous_strides(shape))
    b = _Builder(be, "binary", {"OP": BINARY_IDS[op.op], "NDIM": ndim}, 3)
    o = b.bind(0, outs[0], 0, total, write=True)
    a_off = b.bind(1, ins[0], *_extent(0, shape, sa))
    b_off = b.bind(2, ins[1], *_extent(0, shape, sb))
    b.set(0, total, cshape[1], cshape[2], cshape[3], a_off, *csa, b_off, *csb, o)
    b.activation(15, op.activation)
    b.grid1d(total, 128)
    return [b], None


def _row_builder(be, kernel: str, defines: dict, nbind: int, rows: int, size: int) -> _Builder:
    per_row, wg = _row_variant(rows, size)
    if per_row:
        defines = dict(defines, WG_PER_ROW=1, WG=wg)
    b = _Builder(be, kernel, defines, nbind)
    if per_row:
        b.rows(rows)
    else:
        b.grid1d(rows, wg)
    return b


def _reduce_builder(be, op_name: str, outer: int, size: int, inner: int, x: TensorHandle, out: TensorHandle):
    b = _row_builder(be, "reduce", {"OP": REDUCE_IDS[op_name]}, 2, outer * inner, size)
    o = b.bind(0, out, 0, outer * inner, write=True)
    xo = b.bind(1, x, 0, outer * size * inner)
    b.set(0, outer, size, inner, xo, o)
    return b


def _plan_reduce(be, op: A.Reduce, ins, outs):
    return [_reduce_builder(be, op.op, op.outer, op.size, op.inner, ins[0], outs[0])], None


def _plan_matmul(be, op: A.MatMul, ins, outs):
    m, n, k, batch = op.m, op.n, op.k, op.batch
    a_bs, b_bs = op.a_batch_stride, op.b_batch_stride
    sam, sak = (1, m) if op.trans_a else (k, 1)
    sbk, sbn = (1, k) if op.trans_b else (n, 1)
    bias_sm, bias_sn = op.bias_strides
    if (batch > 1 and b_bs == 0 and not op.trans_a and a_bs == m * k
            and (not op.has_bias or bias_sm == 0)):  # shared weights: one [batch*M, K] GEMM
        m, batch = m * batch, 1
    if be.kernels == "simd":
        rm = min(16, 1 << (m - 1).bit_length())
        rn = min(16, 4 << max(0, (n - 1).bit_length() - 2)) if n > 4 else 4
        defines = {"REGBLOCK": 1, "RM": rm, "RN": rn, "WG": 16}
        groups = (math.ceil(math.ceil(n / rn) / 16), math.ceil(m / rm), batch)
    else:
        tm, tn, rm, rn = _gemm_tiles(m, n)
        defines = {"TM": tm, "TN": tn, "RM": rm, "RN": rn, "NT": (tm // rm) * (tn // rn)}
        groups = (math.ceil(n / tn), math.ceil(m / tm), batch)
    if op.has_bias:
        defines["HAS_BIAS"] = 1
    b = _Builder(be, "matmul", defines, 4)
    total = op.batch * op.m * op.n
    c = b.bind(0, outs[0], 0, total, write=True)
    a = b.bind(1, ins[0], 0, (op.batch - 1) * a_bs + op.m * op.k)
    w = b.bind(2, ins[1], 0, (op.batch - 1) * b_bs + op.k * op.n)
    bias = 0
    if op.has_bias:
        bias = b.bind(3, ins[2], *_extent(0, (op.m, op.n), (bias_sm, bias_sn)))
    b.set(0, m, n, k, batch, a, w, bias, c, a_bs, b_bs, sam, sak, sbk, sbn)
    b.setf(14, op.alpha, op.beta)
    b.set(16, bias_sm, bias_sn)
    b.activation(18, op.activation)
    if (be.kernels == "simd" and sbn == 1 and n % 4 == 0 and w % 4 == 0 and sbk % 4 == 0
            and (batch == 1 or b_bs % 4 == 0)):
        b.defines["B_VEC4"] = 1
    b.groups = groups
    _check_grid(be, b.groups)
    return [b], "gemm_regblock" if be.kernels == "simd" else "gemm_tiled"


def _check_grid(be, groups) -> None:
    for g, limit in zip(groups, be.dev.max_group_count):
        if g > limit:
            raise VulkanError(f"workgroup grid {groups} exceeds the device limit {be.dev.max_group_count}")


def _plan_conv2d(be, op: A.Conv2D, ins, outs):
    n, c, oc, g = op.batch, op.in_channels, op.out_channels, op.groups
    (h, w), (oh, ow), (kh, kw) = op.in_hw, op.out_hw, op.kernel
    (sh, sw), (ph, pw), (dh, dw) = op.strides, op.pads, op.dilations
    x_len, w_len, o_len = n * c * h * w, oc * (c // g) * kh * kw, n * oc * oh * ow
    defines: dict = {"HAS_BIAS": 1} if op.has_bias else {}
    if g == c == oc and g > 1:
        max_rn = 16 if be.kernels == "simd" else 4
        rn = -(-ow // -(-ow // max_rn))  # <= max_rn pixels, evenly split rows
        row_groups = -(-ow // rn)
        b = _Builder(be, "conv2d", dict(defines, DEPTHWISE=1, RN=rn, KW=kw, SW=sw, DW=dw), 4)
        o = b.bind(0, outs[0], 0, o_len, write=True)
        x = b.bind(1, ins[0], 0, x_len)
        wt = b.bind(2, ins[1], 0, w_len)
        bias = b.bind(3, ins[2], 0, oc) if op.has_bias else 0
        items = n * c * oh * row_groups
        b.set(0, items, c, h, w, oh, ow, kh, 0, sh, 0, ph, pw, dh, 0, x, wt, bias, o, row_groups)
        b.activation(22, op.activation)
        b.grid1d(items, 16 if be.kernels == "simd" else 64)
        return [b], "depthwise"
    if be.kernels == "simd" and _is_constant(ins[1]):
        return _plan_conv2d_direct_rb(be, op, ins, outs)
    cg, ocg = c // g, oc // g
    big_m, big_n, big_k = ocg, oh * ow, cg * kh * kw
    tm, tn, rm, rn = _gemm_tiles(big_m, big_n)
    defines.update(TM=tm, TN=tn, RM=rm, RN=rn, NT=(tm // rm) * (tn // rn))
    pointwise = (kh, kw) == (1, 1) and (sh, sw) == (1, 1) and (ph, pw) == (0, 0) and (oh, ow) == (h, w)
    if pointwise:
        defines["POINTWISE"] = 1
    b = _Builder(be, "conv2d", defines, 4)
    o = b.bind(0, outs[0], 0, o_len, write=True)
    x = b.bind(1, ins[0], 0, x_len)
    wt = b.bind(2, ins[1], 0, w_len)
    bias = b.bind(3, ins[2], 0, oc) if op.has_bias else 0
    b.set(0, big_m, big_n, big_k, g, x, wt, bias, o, c, h, w, ow, oc, cg, kh, kw, sh, sw, ph, pw, dh, dw)
    b.activation(22, op.activation)
    b.groups = (math.ceil(big_n / tn), math.ceil(big_m / tm), n * g)
    _check_grid(be, b.groups)
    return [b], "gemm1x1" if pointwise else "implicit_gemm"


def _is_constant(handle: TensorHandle) -> bool:
    return getattr(handle.buffer, "kind", "") in ("constant", "arena")


def _packed_conv_weights(be: VulkanBackend, weight: TensorHandle, groups: int, m: int, k: int, rm: int) -> TensorHandle:
    """Weights [G, M, K] repacked to [G, ceil(M/RM), K, RM] (zero rows pad M), once per weight."""
    key = (weight.buffer.id, weight.offset, weight.shape, groups, rm)
    packed = be._packed.get(key)
    if packed is None:
        w = be.read(weight).reshape(groups, m, k)
        blocks = -(-m // rm)
        padded = np.zeros((groups, blocks * rm, k), dtype=np.float32)
        padded[:, :m] = w
        packed = be.constant(padded.reshape(groups, blocks, rm, k).transpose(0, 1, 3, 2).copy())
        be._packed[key] = packed
    return packed


def _rb_blocks(m: int, oh: int, ow: int, lanes: int) -> tuple[int, int]:
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
        for max_rn in (16, 8, 4):
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
    pointwise = (kh, kw) == (1, 1) and (sh, sw) == (1, 1) and (ph, pw) == (0, 0) and (oh, ow) == (h, w)
    if pointwise:  # one row of H*W pixels: no row-boundary waste
        h, w, oh, ow = 1, h * w, 1, oh * ow
    lanes = be.simd_lanes
    rm, rn = _rb_blocks(m, oh, ow, lanes)
    blocks = -(-m // rm)
    packed = _packed_conv_weights(be, ins[1], g, m, cg * kh * kw, rm)
    defines: dict = {"DIRECT_RB": 1, "RM": rm, "RN": rn, "KW": kw, "SW": sw, "DW": dw, "WG": lanes}
    if op.has_bias:
        defines["HAS_BIAS"] = 1
    b = _Builder(be, "conv2d", defines, 4)
    o = b.bind(0, outs[0], 0, n * oc * oh * ow, write=True)
    x = b.bind(1, ins[0], 0, n * c * h * w)
    wp = b.bind(2, packed)
    bias = b.bind(3, ins[2], 0, oc) if op.has_bias else 0
    if wp % 4:
        raise VulkanError("packed weights are not vec4-aligned")
    if pointwise and rn % 4 == 0 and x % 4 == 0 and w % 4 == 0 and (c * w) % 4 == 0:
        b.defines["X_VEC4"] = 1
    row_groups = -(-ow // rn)
    b.set(0, m, oh, ow, g, x, wp // 4, bias, o, c, h, w, oc, cg, kh, sh, ph, pw, dh, row_groups, blocks)
    b.activation(22, op.activation)
    b.groups = (math.ceil(oh * row_groups / lanes), blocks, n * g)
    _check_grid(be, b.groups)
    return [b], "direct_regblock"


def _plan_conv_transpose2d(be, op: A.ConvTranspose2D, ins, outs):
    n, c, oc, g = op.batch, op.in_channels, op.out_channels, op.groups
    (h, w), (oh, ow), (kh, kw) = op.in_hw, op.out_hw, op.kernel
    (sh, sw), (ph, pw), (dh, dw) = op.strides, op.pads, op.dilations
    total = n * oc * oh * ow
    b = _Builder(be, "conv_transpose2d", {"HAS_BIAS": 1} if op.has_bias else {}, 4)
    o = b.bind(0, outs[0], 0, total, write=True)
    x = b.bind(1, ins[0], 0, n * c * h * w)
    wt = b.bind(2, ins[1], 0, c * (oc // g) * kh * kw)
    bias = b.bind(3, ins[2], 0, oc) if op.has_bias else 0
    b.set(0, total, c, h, w, oc, oh, ow, c // g, oc // g, kh, kw, sh, sw, ph, pw, dh, dw, x, wt, bias, o)
    b.activation(22, op.activation)
    b.grid1d(total, 128)
    return [b], "direct"


def _plan_pool2d(be, op: A.Pool2D, ins, outs):
    n, c = op.batch, op.channels
    (h, w), (oh, ow), (kh, kw), (sh, sw) = op.in_hw, op.out_hw, op.kernel, op.strides
    is_max = op.op == "max"
    if (kh, kw) == (h, w) and (oh, ow) == (1, 1) and not any(op.pads):
        return [_reduce_builder(be, "max" if is_max else "mean", n * c, h * w, 1, ins[0], outs[0])], "global"
    total = n * c * oh * ow
    defines = {"MAX": 1} if is_max else ({"COUNT_PAD": 1} if op.count_include_pad else {})
    b = _Builder(be, "pool2d", defines, 2)
    o = b.bind(0, outs[0], 0, total, write=True)
    x = b.bind(1, ins[0], 0, n * c * h * w)
    b.set(0, total, h, w, oh, ow, kh, kw, sh, sw, *op.pads, x, o)
    b.grid1d(total, 128)
    return [b], "direct"


def _plan_softmax(be, op: A.Softmax, ins, outs):
    rows, count = op.outer * op.inner, op.outer * op.size * op.inner
    b = _row_builder(be, "softmax", {"LOG": 1} if op.log else {}, 2, rows, op.size)
    o = b.bind(0, outs[0], 0, count, write=True)
    x = b.bind(1, ins[0], 0, count)
    b.set(0, op.outer, op.size, op.inner, x, o)
    return [b], None


def _plan_normalize(be, op: A.Normalize, ins, outs):
    count = op.outer * op.size
    b = _row_builder(be, "normalize", {"AFFINE": 1} if op.has_affine else {}, 4, op.outer, op.size)
    o = b.bind(0, outs[0], 0, count, write=True)
    x = b.bind(1, ins[0], 0, count)
    scale = b.bind(2, ins[1], 0, op.size) if op.has_affine else 0
    shift = b.bind(3, ins[2], 0, op.size) if op.has_affine else 0
    b.set(0, op.outer, op.size, x, o)
    b.setf(4, op.eps)
    b.set(5, scale, shift)
    return [b], None


def _resize_table(be: VulkanBackend, op: A.Resize) -> TensorHandle:
    """Per-axis source indices and weights, computed in float64 exactly as the reference does."""
    key = (op.in_hw, op.out_hw, op.scales, op.mode, op.coord, op.nearest_mode)
    table = be._tables.get(key)
    if table is not None:
        return table
    parts = []
    for axis in range(2):
        sampling = resize_axis(op, axis)
        parts += [sampling.lo, sampling.hi, sampling.frac]
    table = be.constant(np.concatenate([np.asarray(p, dtype=np.float32) for p in parts]))
    be._tables[key] = table
    return table


def _plan_resize(be, op: A.Resize, ins, outs):
    (h, w), (oh, ow) = op.in_hw, op.out_hw
    total = op.planes * oh * ow
    table = _resize_table(be, op)
    b = _Builder(be, "resize", {"NEAREST": 1} if op.mode == "nearest" else {}, 3)
    o = b.bind(0, outs[0], 0, total, write=True)
    x = b.bind(1, ins[0], 0, op.planes * h * w)
    t = b.bind(2, table)
    b.set(0, total, h, w, oh, ow, x, o, t)
    b.grid1d(total, 128)
    return [b], op.mode


def _plan_gather(be, op: A.Gather, ins, outs):
    total = op.outer * op.count * op.inner
    b = _Builder(be, "gather", {}, 3)
    o = b.bind(0, outs[0], 0, total, write=True)
    d = b.bind(1, ins[0], 0, op.outer * op.axis * op.inner)
    i = b.bind(2, ins[1], 0, op.count)
    b.set(0, total, op.axis, op.inner, op.count, d, i, o)
    b.grid1d(total, 128)
    return [b], None


VulkanBackend.kernel_table = _PLANNERS = {
    A.Raster: _plan_raster, A.Unary: _plan_unary, A.Binary: _plan_binary, A.Reduce: _plan_reduce,
    A.MatMul: _plan_matmul, A.Conv2D: _plan_conv2d, A.ConvTranspose2D: _plan_conv_transpose2d,
    A.Pool2D: _plan_pool2d, A.Softmax: _plan_softmax, A.Normalize: _plan_normalize,
    A.Resize: _plan_resize, A.Gather: _plan_gather,
}

__all__ = ["VulkanBackend", "VulkanExecution", "VulkanRecording", "check_shader_op_ids"]
