"""The CUDA backend: the plans of :mod:`.cl_plans` as CuPy kernels on one NVIDIA GPU.

One kernel source for two APIs: the OpenCL C programs compiled as CUDA C++ behind a prelude of
macros (:mod:`gpumnn.shaders.cuda_source`), with NVRTC through ``cupy.RawModule``, in the GPU
("tiled") family the OpenCL backend uses on GPUs. The jobs are split by module as for OpenCL:
device choice, description, memory, versions and module compilation (:mod:`.cuda_device`),
launch translation, graph capture and the per-call stream lanes, which need no GPU
(:mod:`.cuda_launch`); this module turns the planners' launches into CuPy calls.

Memory: every buffer is one ``cudaMalloc`` of its own (``cupy.cuda.Memory``, not CuPy's memory
pool, so that a closed session's memory goes back to the driver and ``cudaMemGetInfo`` sees what
the session holds): the session's pool (tensors are element offsets into it, as on OpenCL;
kernels take ``(pointer, element offset)`` pairs), each constant (uploaded once) and each scratch
buffer of a kernel. Host copies go through pinned staging (``cudaHostAlloc``) held by a lane.

Lanes (:class:`.launch.Lane`, lent by :class:`~gpumnn.backends.lanes.LanePool`, which the vulkan
backend shares): each verb call (write, read, record, submit, eager run) borrows a lane -- its
own non-blocking stream, an event and pinned staging -- and waits for its stream before
returning the lane (``wait_lane``: an event recorded after the work, polled up to the session's
``submit_timeout``; past it DeviceLostError names the ops in flight, the backend's device is
marked lost so later calls fail at once, and nothing the hung work may use is freed), so
concurrent runs of a session (``max_concurrent_runs``)
never share a stream or a staging buffer, and no work is left pending between calls.
``reserve_run`` makes a lane per run in flight at session creation, with staging for the
largest input or output, so a recorded run allocates nothing.

Recorded mode (default): ``record`` captures the executions' launches on a lane's stream into a
CUDA graph (``Stream.begin_capture`` / ``end_capture``), instantiated and uploaded at session
creation; a run is copy in, ``Graph.launch``, copy out. Eager mode (``record=False``): every
op's kernels are launched one by one, with a synchronisation after each op (the paper's
baseline). Modules are compiled and loaded, and kernel functions looked up, at
``create_execution``, never inside a capture.

GEMM: MatMul, Conv2D (implicit im2col, 1x1 as a plain GEMM) and ConvTranspose2D run the shared
tiled GEMM kernels (``gemm.cl``), not cuBLAS: those kernels fuse what the atomic ops carry --
bias, alpha and beta, the activation, batch and group strides, the convolution's gather -- in
one launch, while ``cupy.matmul`` on pool views would add launches for the epilogue, needs
CuPy's memory pool and a cuBLAS workspace inside the graph capture, and covers only the
MatMul case. Whether cuBLAS pays for large GEMM-shaped MatMuls is a measurement to make on the
GPU first (bench), then a kernel with its own scheme.

Device arrays: ``run`` takes CuPy arrays and any DLPack (``__dlpack__``) or CUDA-array-interface
tensor on this GPU, copied device to device into the pool, ordered after the caller's current
stream (and, through DLPack's stream handshake, after the producer's); ``outputs="device"``
returns CuPy arrays. See :meth:`CudaBackend.device_array`.

Numerics: CuPy's NVRTC compile adds ``-ftz=true`` (denormals flushed to zero), which the OpenCL
GPU compilers typically do as well; results on normal numbers are unaffected.
"""
from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from typing import Any, Hashable, Iterator

import cupy
import numpy as np
from cupy.cuda import runtime

from ... import atomic as A
from ...errors import BackendOptionError, DeviceArrayError
from ..kernels.cl.cuda_source import NVRTC_OPTIONS, cuda_source
from ..kernels import word_padded
from ..kernels.cl import planner as cl_plans
from ..kernels.int8_dot import choose as choose_int8_dot, int8_dot_option
from ..base import Backend, Execution, KernelWork, TensorHandle, constant_words, host_out, kernels_option
from ..kernels.cl.planner import Scratch
from .device import attribute, describe_versions, device_info, load_kernels, memory_limits, pick_device
from .launch import CudaLaunch, DeviceBuffer, Lane, Recording, bind, capture, wait_lane
from ..lanes import LanePool
from ..waits import DeviceWatch, describe_ops
from ..limits import MemoryLimits

#: compiled modules by (device id, family, defines), shared by every backend in the process (a
#: second session compiles nothing, as the OpenCL and Vulkan backends' caches do)
_MODULES: dict[tuple, Any] = {}
_MODULES_LOCK = threading.Lock()


#: the compute capability (major * 10 + minor) from which __dp4a exists: the int8 GEMM's dot products
DP4A_MIN_CAPABILITY = 61


class CudaBackend(Backend):
    """CUDA on one NVIDIA GPU, through CuPy."""

    name = "cuda"
    timer = "CUDA events"
    #: runs in flight borrow lanes of their own (stream, event, staging), and touch their own
    #: pools and graphs (see the module docstring)
    max_concurrent_runs = 2
    kernel_table = cl_plans.PLANNERS
    int8_products = cl_plans.INT8_PRODUCTS
    schemes = cl_plans.TILED_SCHEMES
    residual_schemes = cl_plans.TILED_RESIDUAL_SCHEMES
    op_names = cl_plans.OP_NAMES
    dtypes = cl_plans.TILED_DTYPES
    float32_only_schemes = cl_plans.FLOAT32_ONLY_SCHEMES
    #: float16 / int8 / uint8 tensors as themselves: CUDA addresses 16- and 8-bit elements
    narrow_storage = {1: "native: unsigned char elements", 2: "native: unsigned short elements, cvt.f16 conversions"}
    device_arrays_unsupported = None
    alignment = 256  # cudaMalloc's alignment: every tensor starts where a fresh allocation would

    def __init__(self, device: str | int | None = None, kernels: str | None = None, tf32: bool = False,
                 int8_dot: str | None = None, **unknown: Any):
        """``device``: index or name substring; default the first GPU. ``kernels``: "auto" or
        "tiled" (the GPU kernels, the only family CUDA builds: the "simd" kernels use OpenCL
        vector types CUDA lacks); ``$GPUMNN_KERNELS=simd`` is a preference for devices with
        both families and means tiled here. ``tf32``: the convolution and GEMM tiles multiply on
        tensor cores in TF32 (mma.sync, compute capability 8.0 or later), which a session's
        ``precision="tf32"`` asks for (``gpumnn.scheduler.precision``); default float32.
        ``int8_dot``: "auto" (the int8 implicit GEMM on __dp4a, compute capability 6.1 and later)
        or "off"; default ``$GPUMNN_INT8_DOT``, else "auto"."""
        super().__init__(**unknown)
        dot_option = int8_dot_option(int8_dot, self.name)
        if not isinstance(tf32, bool):
            raise BackendOptionError(f"backend 'cuda': tf32 must be True or False, not {tf32!r}")
        if kernels == "simd":
            raise BackendOptionError("backend 'cuda': kernels='simd' names the kernels for CPU OpenCL devices; "
                                     "CUDA builds the GPU kernels only (kernels='auto' or 'tiled')")
        kernels_option(kernels, self.name)  # a value outside the vocabulary is an error here too
        self.device_id = pick_device(device)
        self._device = cupy.cuda.Device(self.device_id)
        # what the planners read (cl_plans.PlannerTarget)
        self.kernels = "tiled"
        self.is_gpu = True
        with self._device:
            self.compute_units = attribute(self.device_id, "MultiProcessorCount") or 1
            self.max_wg = attribute(self.device_id, "MaxThreadsPerBlock") or 1024
            self._info = device_info(self.device_id)
            capability = int(cupy.cuda.Device(self.device_id).compute_capability)  # "90": sm_90
        if tf32 and not cl_plans.tensor_cores("tf32", capability):
            raise BackendOptionError(f"backend 'cuda': tf32 needs tensor cores with TF32 (compute capability "
                                     f"{cl_plans.TENSOR_CORE_CAPABILITY['tf32'] / 10:.1f} or later); {self._info.device} has "
                                     f"{capability // 10}.{capability % 10}")
        self.tf32 = tf32
        self.compute_capability = capability
        # float16-storage GEMM tiles (precision="fp16") on tensor cores where the GPU has them
        self.float16_tensor_cores = cl_plans.tensor_cores("fp16", capability)
        has_dp4a = capability >= DP4A_MIN_CAPABILITY
        self.int8_dot, self.int8_arithmetic = choose_int8_dot(
            dot_option, self.kernels, "__dp4a (compute capability 6.1 and later)" if has_dp4a else "",
            f"__dp4a needs compute capability 6.1; the device has {capability // 10}.{capability % 10}")
        self._watch = DeviceWatch(self.name, self._info.device)  # bounded waits, the lost mark
        self._buffers: weakref.WeakSet[DeviceBuffer] = weakref.WeakSet()  # kept forever if the device hangs
        self._kernels: dict[tuple, Any] = {}
        self._lanes: LanePool[Lane] = LanePool(self._make_lane, self._make_staging)  # holds them weakly
        self._closed = False

    # -- description -----------------------------------------------------------------------
    @property
    def driver(self) -> str:
        """CuPy's version and the CUDA runtime, driver and NVRTC versions."""
        return describe_versions()

    def activate(self) -> Any:
        """This backend's GPU current in the calling thread (CuPy's device context, which nests)."""
        return self._device

    # -- programs --------------------------------------------------------------------------
    def _load_program(self, key: Hashable) -> tuple[Any, bool]:
        """The module of (family, defines): from the process's cache, else compiled now (NVRTC
        through CuPy, whose on-disk kernel cache may answer; CuPy does not say, so a module new
        to this process counts as built)."""
        family, defines = key  # type: ignore[misc]
        cache_key = (self.device_id, family, defines)
        with _MODULES_LOCK:
            module = _MODULES.get(cache_key)
        if module is not None:
            return module, False
        try:
            with self._device:
                module = load_kernels(cuda_source(family, dict(defines)), NVRTC_OPTIONS)
        except Exception as exc:
            raise RuntimeError(f"CUDA build of {family!r} ({dict(defines) or 'no defines'}) failed on "
                               f"{self._info.device}: {type(exc).__name__}: {exc}") from None
        with _MODULES_LOCK:
            module = _MODULES.setdefault(cache_key, module)
        return module, True

    def _kernel(self, family: str, defines: tuple, name: str) -> Any:
        """Kernel ``name`` of program (family, defines), loaded on this GPU now."""
        key = (family, defines, name)
        kernel = self._kernels.get(key)
        if kernel is None:
            with self._device:
                kernel = self.program((family, defines)).get_function(name)
            self._kernels[key] = kernel
        return kernel

    # -- memory ----------------------------------------------------------------------------
    def memory_limits(self) -> MemoryLimits:
        return memory_limits(self.device_id)

    def _new_buffer(self, nbytes: int, kind: str, data: np.ndarray | None = None) -> Any:
        """Device memory (``data`` its contents, else zeros), or for "staging" pinned host
        memory as a uint8 NumPy array."""
        size = max(4, (int(nbytes) + 3) // 4 * 4)
        with self._device:
            if kind == "staging":
                pinned = cupy.cuda.PinnedMemoryPointer(cupy.cuda.PinnedMemory(size), 0)
                return np.frombuffer(pinned, dtype=np.uint8, count=size)  # keeps the pinned memory alive
            pointer = cupy.cuda.MemoryPointer(cupy.cuda.Memory(size), 0)
        buffer = DeviceBuffer(pointer, size, constant=kind == "constant")
        self._buffers.add(buffer)
        with self._lane() as lane:
            if data is not None:
                data = np.ascontiguousarray(data)
                pointer.copy_from_host_async(data.ctypes.data, data.nbytes, lane.stream)
            else:
                pointer.memset_async(0, size, lane.stream)
            self._sync(lane, f"a {kind} buffer's {'upload' if data is not None else 'zero fill'}")
        return buffer

    def constant(self, array: np.ndarray) -> TensorHandle:
        data, dtype = constant_words(array)
        padded = word_padded(data)
        return TensorHandle(self.buffer(padded.nbytes, "constant", data=padded), 0, tuple(np.shape(array)), dtype)

    @staticmethod
    def is_constant(handle: TensorHandle) -> bool:
        """True when ``handle`` lives in a buffer from ``constant`` (packed once by a kernel's prepare launches)."""
        return isinstance(handle.buffer, DeviceBuffer) and handle.buffer.constant

    @staticmethod
    def _pointer(handle: TensorHandle) -> Any:
        return handle.buffer.pointer + handle.itemsize * handle.offset

    def write(self, handle: TensorHandle, array: Any) -> None:
        """A host array through the lane's pinned staging; a CuPy array (from ``device_array``)
        device to device, converted to the storage dtype on the device where it differs."""
        if isinstance(array, cupy.ndarray):
            self._write_device(handle, array)
            return
        data = np.ascontiguousarray(array, dtype=handle.dtype).reshape(-1)
        if data.size != handle.size:
            raise ValueError(f"write of {data.size} elements into a tensor of {handle.size}")
        if not data.size:
            return
        with self._lane() as lane:
            staging = self._lanes.staging(lane, data.nbytes)
            staging[:data.nbytes] = data.view(np.uint8)
            self._pointer(handle).copy_from_host_async(staging.ctypes.data, data.nbytes, lane.stream)
            self._sync(lane, f"a copy of {data.nbytes} bytes to the device")

    def read_into(self, handle: TensorHandle, out: np.ndarray) -> None:
        """Device to the lane's pinned staging (set aside by ``reserve_run``: a full-speed DMA),
        then into ``out`` on the host."""
        flat = host_out(handle, out)
        nbytes = flat.nbytes
        if not nbytes:
            return
        with self._lane() as lane:
            staging = self._lanes.staging(lane, nbytes)
            self._pointer(handle).copy_to_host_async(staging.ctypes.data, nbytes, lane.stream)
            self._sync(lane, f"a copy of {nbytes} bytes to the host")
            np.copyto(flat.view(np.uint8), staging[:nbytes])

    def release(self, buffer: Any) -> None:
        """Nothing to do: the memory goes back to the driver with the last reference to it (the
        pool's handles and the executions' arguments)."""

    def reserve_run(self, io_bytes: int) -> None:
        self._lanes.reserve(io_bytes)

    # -- lanes -----------------------------------------------------------------------------
    def _make_lane(self) -> Lane:
        with self._device:
            return Lane(cupy.cuda.Stream(non_blocking=True), cupy.cuda.Event(disable_timing=True))

    def _make_staging(self, nbytes: int) -> np.ndarray:
        return self.buffer(nbytes, "staging")

    @contextmanager
    def _lane(self) -> Iterator[Lane]:
        """A lane lent for one call, with this GPU current (DeviceLostError on a lost device)."""
        self._watch.check()
        with self._device, self._lanes.lend() as lane:
            yield lane

    def _sync(self, lane: Lane, ops: str, event: Any = None) -> None:
        """Wait for the lane's work so far (``ops``: what it runs), bounded by ``submit_timeout``."""
        wait_lane(self._watch, lane, self.submit_timeout, ops, self._hung_objects, event)

    def _hung_objects(self) -> list:
        """What a hung submission may use, never to be freed (``cudaFree`` would wait for it):
        the lanes (streams, events, pinned staging), the buffers and this GPU's modules."""
        with _MODULES_LOCK:
            modules = [m for key, m in _MODULES.items() if key[0] == self.device_id]
        return [self._lanes, *self._buffers, *modules]

    @staticmethod
    def _after_caller(lane: Lane) -> None:
        """Order the lane's stream after the calling thread's current CuPy stream, where a
        device array handed to us was made (DLPack's handshake ordered its producer before that
        stream)."""
        lane.event.record(cupy.cuda.get_current_stream())
        lane.stream.wait_event(lane.event)

    # -- device arrays ---------------------------------------------------------------------
    def device_array(self, value: Any) -> Any:
        """``value`` as a CuPy array without a copy: a CuPy array itself, a DLPack tensor through
        ``cupy.from_dlpack`` (which hands the caller's current stream to the producer, so its
        pending work comes first), a CUDA-array-interface object through ``cupy.asarray``.
        DeviceArrayError for a tensor on another GPU or of another kind."""
        with self._device:
            if isinstance(value, cupy.ndarray):
                array = value
            elif hasattr(value, "__dlpack__"):
                try:
                    array = cupy.from_dlpack(value)
                except Exception as exc:
                    raise DeviceArrayError(f"the cuda backend cannot take a {type(value).__name__} through DLPack: "
                                           f"{type(exc).__name__}: {exc}") from None
            elif hasattr(value, "__cuda_array_interface__"):
                array = cupy.asarray(value)
            else:
                raise DeviceArrayError(f"a {type(value).__name__} is neither a DLPack tensor nor a CUDA array")
        if array.device.id != self.device_id:
            raise DeviceArrayError(f"a device array on GPU {array.device.id}, while the cuda backend runs on GPU "
                                   f"{self.device_id} ({self._info.device}): copy it there first")
        return array

    def _write_device(self, handle: TensorHandle, array: Any) -> None:
        if array.size != handle.size:
            raise ValueError(f"write of {array.size} elements into a tensor of {handle.size}")
        if not array.size:
            return
        with self._lane() as lane:
            self._after_caller(lane)
            with lane.stream:  # a conversion runs (and allocates its copy) on the lane's stream
                source = cupy.ascontiguousarray(array, dtype=np.dtype(handle.dtype))
            self._pointer(handle).copy_from_device_async(source.data, handle.nbytes, lane.stream)
            self._sync(lane, f"a copy of {handle.nbytes} bytes on the device")

    def read_device(self, handle: TensorHandle) -> Any:
        with self._lane() as lane:
            with lane.stream:
                out = cupy.empty(handle.shape, dtype=np.dtype(handle.dtype))
            if handle.nbytes:
                out.data.copy_from_device_async(self._pointer(handle), handle.nbytes, lane.stream)
            self._sync(lane, f"a copy of {handle.nbytes} bytes on the device")
        return out

    def to_device(self, array: np.ndarray) -> Any:
        with self._lane() as lane:
            with lane.stream:
                out = cupy.asarray(np.ascontiguousarray(array))
            self._sync(lane, f"a copy of {out.nbytes} bytes to the device")
        return out

    def to_host(self, array: Any) -> np.ndarray:
        with self._lane() as lane:
            self._after_caller(lane)
            host = cupy.asnumpy(array, stream=lane.stream, blocking=False)
            self._sync(lane, f"a copy of {host.nbytes} bytes to the host")
            return host

    # -- pre-inference ---------------------------------------------------------------------
    def _create_execution(self, op: A.AtomicOp, inputs: list[TensorHandle],
                          outputs: list[TensorHandle]) -> Execution:
        planned = cl_plans.plan(self, op, inputs, outputs)
        scratch = {s: self._scratch_buffer(s) for s in planned.keep}
        prepare = [self._bind(ln, scratch) for ln in planned.prepare]
        work = [self._bind(ln, scratch) for ln in planned.work]  # every kernel loaded before any capture
        if prepare:  # weight packing: once, now
            with self._lane() as lane:
                for ln in prepare:
                    ln(lane.stream)
                self._sync(lane, f"the weight packing of {type(op).__name__} ({op.source})")
        return Execution(op, inputs, outputs, KernelWork(work, planned.scheme, tuple(scratch.values())))

    def _scratch_buffer(self, scratch: Scratch) -> DeviceBuffer:
        if scratch.data is not None:
            return self.buffer(scratch.data.nbytes, "scratch", data=scratch.data)
        return self.buffer(scratch.nbytes, "scratch")

    def _bind(self, launch: cl_plans.Launch, scratch: dict[Scratch, DeviceBuffer]) -> CudaLaunch:
        return bind(launch, self._kernel(launch.family, launch.defines, launch.name), scratch)

    def _record(self, executions: list[Execution]) -> Recording:
        launches = [ln for exe in executions for ln in exe.work]
        with self._lane() as lane:
            graph = capture(lane.stream, launches, runtime.streamCaptureModeRelaxed)
            if graph is not None:
                graph.upload(lane.stream)  # the first run launches a graph already on the device
            self._sync(lane, f"the upload of a graph of {describe_ops(executions)}")
        return Recording(graph, len(launches), list(executions), describe_ops(executions))

    # -- run -------------------------------------------------------------------------------
    def _submit(self, recording: Recording) -> None:
        if recording.graph is None:
            return
        with self._lane() as lane:
            recording.graph.launch(lane.stream)
            self._sync(lane, recording.ops)

    def _submit_async(self, recording: Recording) -> tuple[Lane, str] | None:
        """The graph launched on a borrowed lane's stream; the ticket is (the lane, the ops), and
        the lane stays lent until ``wait`` (a recorded run holds one lane at a time)."""
        if recording.graph is None:
            return None
        self._watch.check()
        with self._device:
            lane = self._lanes.take()
            try:
                recording.graph.launch(lane.stream)
            except BaseException:
                self._lanes.give(lane)
                raise
        return lane, recording.ops

    def _wait(self, ticket: tuple[Lane, str]) -> None:
        lane, ops = ticket
        try:
            with self._device:
                self._sync(lane, ops)
        finally:
            self._lanes.give(lane)

    def _timed_submit(self, recording: Recording) -> float:
        """Two timing events recorded on the lane's stream just before and after the graph's
        launch: the GPU's time for the graph alone."""
        if recording.graph is None:
            return 0.0
        with self._lane() as lane:
            if lane.timing is None:
                lane.timing = (cupy.cuda.Event(), cupy.cuda.Event())
            start, end = lane.timing
            start.record(lane.stream)
            recording.graph.launch(lane.stream)
            end.record(lane.stream)
            self._sync(lane, recording.ops, event=end)
            return cupy.cuda.get_elapsed_time(start, end) * 1e-3

    def _run_eager(self, executions: list[Execution]) -> None:
        with self._lane() as lane:
            for exe in executions:
                for ln in exe.work:
                    ln(lane.stream)
                self._sync(lane, describe_ops([exe]))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:  # bounded: a hang found here marks the device lost too
            with self._device:
                for lane in list(self._lanes.all):
                    self._sync(lane, "the work left at close")
        except Exception:  # noqa: BLE001 -- a device lost (now or before): nothing to wait for
            pass
        self._kernels.clear()
        self._programs.clear()


__all__ = ["CudaBackend", "Recording"]
