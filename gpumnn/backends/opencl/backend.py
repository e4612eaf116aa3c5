"""The OpenCL backend: the plans of :mod:`.cl_plans` as pyopencl kernels on one device.

The backend's jobs are split by module: device choice and description (:mod:`.opencl_device`),
program building and the on-disk binary cache (:mod:`.opencl_programs`), the
``cl_khr_command_buffer`` binding and its probe (:mod:`.opencl_cmdbuf`), and what to launch for
each atomic op (:mod:`.cl_plans`, API-neutral, shared with a CUDA backend). This module turns
their launches into pyopencl calls.

Pre-inference (``create_execution``) asks the planner for the op's launches at its concrete
sizes, creates its scratch buffers, builds (or fetches from the memory / disk cache) the programs, runs its preparation
launches (weight packing) once, and creates each kernel object with every argument set.
``record`` turns a run of executions into a command buffer (``cl_khr_command_buffer`` through a
small ctypes binding, since pyopencl has none) or, where the device lacks it, into a flat launch
list that ``submit`` enqueues in a tight loop with one ``finish``. ``run_eager`` is the
un-decoupled baseline: it re-creates every kernel object and re-sets its arguments, and waits
after every op.

Waits: OpenCL's own (``clFinish``, ``clWaitForEvents``, blocking copies) have no timeout, so every
wait here flushes the queue and polls a marker's (or a copy's) event status, bounded by the
session's ``submit_timeout`` (:mod:`..waits`): past it, DeviceLostError names the ops in flight,
the backend's device is marked lost (later calls fail at once) and its queue and context are
never released (a release would finish the queue: the process could not exit).

Tensors are element offsets into pool buffers; kernels take ``(buffer, element offset)`` pairs,
so no sub-buffers (and no sub-buffer alignment rules) are involved. Two kernel families,
chosen by device type (``kernels="tiled"`` / ``"simd"`` overrides): see :mod:`.cl_plans`.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyopencl as cl

from ... import atomic as A
from ...errors import GpumnnError
from ..kernels import word_padded
from ..kernels.cl import planner as cl_plans
from ..kernels.int8_dot import choose as choose_int8_dot, int8_dot_option
from ..base import (Backend, Execution, KernelWork, TensorHandle, constant_words, host_out, kernel_family,
                   kernels_option)
from ..kernels.cl.planner import Scratch
from ..limits import MemoryLimits
from .command_buffers import CommandBufferAPI, CommandBufferError, probe as probe_command_buffers
from .device import device_info, integer_dot, is_gpu, memory_limits, pick_device
from .programs import load_program
from ..waits import DeviceWatch, describe_ops

_COMPLETE = cl.command_execution_status.COMPLETE


class OpenCLError(GpumnnError, RuntimeError):
    """A command the OpenCL device ran ended in an error (a negative execution status)."""


def _event_status(event: Any) -> int:
    """An event's CL_EVENT_COMMAND_EXECUTION_STATUS: COMPLETE (0), a state before it, or an error (< 0)."""
    return event.command_execution_status


class ConstantBuffer(cl.Buffer):
    """A buffer made by ``constant()``: uploaded once, never written by a kernel."""


@dataclass
class BoundLaunch:
    """A planned launch made ready: the built program, the kernel name and the arguments with
    scratch buffers substituted (to re-create the kernel in eager mode), and the kernel object
    made at creation with its arguments already set."""

    program: Any
    name: str
    args: tuple
    gsize: tuple[int, ...]
    lsize: tuple[int, ...] | None
    kernel: Any = None

    def make_kernel(self) -> Any:
        kernel = cl.Kernel(self.program, self.name)
        kernel.set_args(*self.args)
        return kernel


@dataclass
class Recording:
    """What ``record`` returns: the flat launch list, plus the command buffer if one was made."""

    launches: list[tuple[Any, tuple[int, ...], tuple[int, ...] | None]]
    command_buffer: int | None = None
    executions: list[Any] = field(default_factory=list)  # keeps kernels alive
    ops: str = ""  # what it runs (``describe_ops``), named by a timeout


class OpenCLBackend(Backend):
    """OpenCL 1.2+ on one device (a GPU if there is one, else e.g. PoCL on the CPU)."""

    name = "opencl"
    timer = "OpenCL profiling events"
    device_arrays_unsupported = ("an OpenCL buffer cannot wrap memory another API allocated (DLPack has no OpenCL "
                                 "device type, and pyopencl imports no CUDA memory), so a device array would "
                                 "need a host round trip; pass a host array, or use the cuda backend")
    #: runs on distinct run states touch distinct buffers and kernel objects; they share the one
    #: in-order queue (thread-safe in OpenCL 1.1+), so a run's finish also waits for the other's work
    max_concurrent_runs = 2
    kernel_table = cl_plans.PLANNERS
    int8_products = cl_plans.INT8_PRODUCTS
    schemes = cl_plans.SCHEMES
    op_names = cl_plans.OP_NAMES
    dtypes = cl_plans.DTYPES
    float32_only_schemes = cl_plans.FLOAT32_ONLY_SCHEMES
    #: float16 / int8 / uint8 tensors as themselves: OpenCL C addresses 16- and 8-bit buffer
    #: elements (ushort, uchar; vload_half / vstore_half for float16 conversions)
    narrow_storage = {1: "native: uchar buffer elements", 2: "native: ushort buffer elements, vload_half/vstore_half"}

    def __init__(self, device: str | int | None = None, kernels: str | None = None, int8_dot: str | None = None,
                 **unknown: Any):
        """``device``: index or name substring (or "gpu"/"cpu"); default a GPU, else any device.
        ``kernels``: "auto" (vectorised kernels on CPU devices, tiled ones on GPUs), "simd" or
        "tiled" to force one family (tests use "tiled" to cover the tiled kernels on PoCL).
        ``int8_dot``: "auto" (the int8 implicit GEMM on cl_khr_integer_dot_product where the
        device has it) or "off"; default ``$GPUMNN_INT8_DOT``, else "auto"."""
        super().__init__(**unknown)
        requested = kernels_option(kernels, self.name)
        dot_option = int8_dot_option(int8_dot, self.name)
        self.platform, self.device = pick_device(device)
        self.context = cl.Context([self.device])
        # Profiling on: ``measure_recording`` reads the device's timestamps of a run's own commands
        # (on PoCL it costs nothing measurable: bench/RESULTS.md). A second, profiling queue would not do: a command buffer
        # replays only on the queue it was made for.
        self.queue = cl.CommandQueue(self.context, self.device,
                                     properties=cl.command_queue_properties.PROFILING_ENABLE)
        dev = self.device
        # what the planners read (cl_plans.PlannerTarget)
        self.is_gpu = is_gpu(dev)
        self.compute_units = int(dev.max_compute_units)
        self.max_wg = int(dev.max_work_group_size)
        self.tf32 = False  # OpenCL C has no tensor-core instructions: float32 products only
        self.float16_tensor_cores = False
        #: CPU devices get explicitly vectorised kernels (gemm_cpu.cl, "simd"); GPUs the tiled ones
        self.kernels = kernel_family(requested, not self.is_gpu)
        self.schemes = cl_plans.schemes_for(self.kernels)
        self.dtypes = cl_plans.dtypes_for(self.kernels)
        self.residual_schemes = cl_plans.residual_schemes_for(self.kernels)
        self.int8_dot, self.int8_arithmetic = choose_int8_dot(dot_option, self.kernels,
                                                              *integer_dot(self.context, dev))
        if not self.is_gpu:  # the tiled family's Winograd kernels on a CPU device: only where forced (tests)
            self.winograd_min_saving = float("inf")
        self.alignment = max(64, int(dev.mem_base_addr_align) // 8)  # the query is in bits
        self._info = device_info(self.platform, dev)
        self._watch = DeviceWatch(self.name, self._info.device)  # bounded waits, the lost mark
        self._cmdbuf_api: CommandBufferAPI | None | bool = False  # False = not probed yet
        self._finalizers: list[weakref.finalize] = []
        self._closed = False

    # -- description -----------------------------------------------------------------------
    @property
    def driver(self) -> str:
        """The platform's version (e.g. "OpenCL 3.0 PoCL 3.1 ... LLVM 15.0.6") and the device's
        driver version."""
        return f"{self.platform.version.strip()}; driver {self.device.driver_version.strip()}"

    # -- programs --------------------------------------------------------------------------
    def _load_program(self, key: tuple) -> tuple[Any, bool]:
        """The program of (family, defines): from the disk cache, else built from source."""
        family, defines = key
        return load_program(self.context, self.platform, self.device, family, defines)

    # -- memory ----------------------------------------------------------------------------
    def memory_limits(self) -> MemoryLimits:
        return memory_limits(self.device)

    def _new_buffer(self, nbytes: int, kind: str, flags: int = cl.mem_flags.READ_WRITE, hostbuf: Any = None,
                    cls: type = cl.Buffer) -> Any:
        self._watch.check()
        if hostbuf is not None:
            return cls(self.context, flags | cl.mem_flags.COPY_HOST_PTR, hostbuf=hostbuf)
        size = max(4, (int(nbytes) + 3) // 4 * 4)
        buf = cls(self.context, flags, size)
        if kind == "pool":
            cl.enqueue_fill_buffer(self.queue, buf, np.float32(0), 0, size)
        return buf

    def constant(self, array: np.ndarray) -> TensorHandle:
        data, dtype = constant_words(array)
        buf = self.buffer(data.nbytes, "constant", flags=cl.mem_flags.READ_ONLY, hostbuf=word_padded(data),
                          cls=ConstantBuffer)
        return TensorHandle(buf, 0, tuple(np.shape(array)), dtype)

    @staticmethod
    def is_constant(handle: TensorHandle) -> bool:
        """True when ``handle`` lives in a buffer from ``constant`` (its contents never change),
        so kernels may pack it once at creation instead of on every run."""
        return isinstance(handle.buffer, ConstantBuffer)

    def write(self, handle: TensorHandle, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array, dtype=handle.dtype).reshape(-1)
        if data.size != handle.size:
            raise ValueError(f"write of {data.size} elements into a tensor of {handle.size}")
        if data.size:
            self._watch.check()
            copy = cl.enqueue_copy(self.queue, handle.buffer, data, dst_offset=handle.itemsize * handle.offset, is_blocking=False)
            self._await(copy, f"a copy of {data.nbytes} bytes to the device")

    def read_into(self, handle: TensorHandle, out: np.ndarray) -> None:
        """One clEnqueueReadBuffer from the tensor's offset straight into ``out``, waited for."""
        flat = host_out(handle, out)
        if flat.size:
            self._watch.check()
            copy = cl.enqueue_copy(self.queue, flat, handle.buffer, src_offset=handle.itemsize * handle.offset, is_blocking=False)
            self._await(copy, f"a copy of {flat.nbytes} bytes to the host")

    def release(self, buffer: Any) -> None:
        try:
            buffer.release()
        except Exception:
            pass

    # -- pre-inference ---------------------------------------------------------------------
    def _create_execution(self, op: A.AtomicOp, inputs: list[TensorHandle],
                          outputs: list[TensorHandle]) -> Execution:
        self._watch.check()
        planned = cl_plans.plan(self, op, inputs, outputs)
        scratch = {s: self._scratch_buffer(s) for s in planned.keep}
        for ln in planned.prepare:  # weight packing: once, now
            cl._cl.enqueue_nd_range_kernel(self.queue, self._bind(ln, scratch).make_kernel(), ln.gsize, ln.lsize)
        work = [self._bind(ln, scratch) for ln in planned.work]
        for ln in work:
            ln.kernel = ln.make_kernel()
        return Execution(op, inputs, outputs, KernelWork(work, planned.scheme, tuple(scratch.values())))

    def _scratch_buffer(self, scratch: Scratch) -> Any:
        if scratch.data is not None:
            return self.buffer(scratch.data.nbytes, "scratch", flags=cl.mem_flags.READ_ONLY, hostbuf=scratch.data)
        return self.buffer(scratch.nbytes, "scratch")

    def _bind(self, launch: cl_plans.Launch, scratch: dict[Scratch, Any]) -> BoundLaunch:
        """A planned launch with its program built and its scratch arguments made buffers."""
        args = tuple(scratch[a] if isinstance(a, Scratch) else a for a in launch.args)
        return BoundLaunch(self.program((launch.family, launch.defines)), launch.name, args, launch.gsize,
                           launch.lsize)

    def _command_buffers(self) -> CommandBufferAPI | None:
        if self._cmdbuf_api is False:
            self._cmdbuf_api = probe_command_buffers(self.platform, self.device, self.queue,
                                                     lambda: self.program(("raster", ())),
                                                     lambda nbytes: self.buffer(nbytes, "scratch"))
        return self._cmdbuf_api or None

    @property
    def uses_command_buffers(self) -> bool:
        """True when ``record`` produces cl_khr_command_buffer recordings on this device."""
        return self._command_buffers() is not None

    def _record(self, executions: list[Execution]) -> Recording:
        launches = [(ln.kernel, ln.gsize, ln.lsize) for exe in executions for ln in exe.work]
        rec = Recording(launches, None, list(executions), describe_ops(executions))
        api = self._command_buffers()
        if api is not None and launches:
            cmd = api.create(self.queue)
            try:
                sync = None
                for kernel, gsize, lsize in launches:
                    sync = api.add_ndrange(cmd, kernel, gsize, lsize, after=sync)
                api.finalize(cmd)
            except CommandBufferError:
                api.release(cmd)
                cmd = None
            rec.command_buffer = cmd
            if cmd is not None:  # released when the recording is dropped, or at close()
                self._finalizers = [fin for fin in self._finalizers if fin.alive]
                self._finalizers.append(weakref.finalize(rec, api.release, cmd))
        return rec

    # -- run -------------------------------------------------------------------------------
    def _submit(self, recording: Recording) -> None:
        self._enqueue(recording)
        self._await(cl.enqueue_marker(self.queue), recording.ops)

    def _submit_async(self, recording: Recording) -> Any:
        """Enqueue the recording and a marker after it, flush (the device starts now) and return
        (the marker's event, the ops): on the in-order queue the marker completes once the
        recording has. Not ``queue.finish``, which would also wait for another run's work on the
        shared queue (and has no timeout)."""
        self._enqueue(recording)
        marker = cl.enqueue_marker(self.queue)
        self.queue.flush()
        return marker, recording.ops

    def _wait(self, ticket: Any) -> None:
        marker, ops = ticket
        self._await(marker, ops)

    def _await(self, event: Any, ops: str) -> None:
        """Flush the queue and wait for ``event`` up to ``submit_timeout``: past it, DeviceLostError
        naming ``ops`` and the device marked lost; OpenCLError for a command that failed."""
        self.queue.flush()

        def done() -> bool:
            status = _event_status(event)
            if status < 0:
                raise OpenCLError(f"opencl backend: {self._info.device}: a command failed with status {status} "
                                  f"(an OpenCL error code); in flight: {ops}")
            return status == _COMPLETE

        self._watch.wait(done, self.submit_timeout, ops, self._hung_objects)

    def _hung_objects(self) -> tuple:
        """What a hung submission may use, never to be released."""
        return self.queue, self.context

    def _enqueue(self, recording: Recording) -> None:
        self._watch.check()
        if recording.command_buffer is not None:
            self._cmdbuf_api.enqueue(recording.command_buffer)  # type: ignore[union-attr]
        else:
            enqueue, queue = cl._cl.enqueue_nd_range_kernel, self.queue
            for kernel, gsize, lsize in recording.launches:
                enqueue(queue, kernel, gsize, lsize)

    def _timed_submit(self, recording: Recording) -> float:
        """Between two markers enqueued around the recording, as the device stamped them: the
        first's END (the device reached the recording) to the second's START (the in-order
        queue finished it). Markers rather than the commands' own events: a command buffer's one
        event is stamped when it is handed on, not when the replay ends, and the flat
        launch list would need an event per launch."""
        self._watch.check()
        before = cl.enqueue_marker(self.queue)
        self._enqueue(recording)
        after = cl.enqueue_marker(self.queue)
        self._await(after, recording.ops)
        return max(0, after.profile.start - before.profile.end) * 1e-9

    def _run_eager(self, executions: list[Execution]) -> None:
        self._watch.check()
        enqueue, queue = cl._cl.enqueue_nd_range_kernel, self.queue
        for exe in executions:
            for ln in exe.work:
                enqueue(queue, ln.make_kernel(), ln.gsize, ln.lsize)
            self._await(cl.enqueue_marker(queue), describe_ops([exe]))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._watch.lost is None:
            try:
                self._await(cl.enqueue_marker(self.queue), "the work left at close")
            except Exception:  # noqa: BLE001 -- a failed command, or the device lost just now
                pass
        if self._watch.lost is not None:  # hung work may use anything: wait for nothing, release nothing
            for fin in self._finalizers:
                fin.detach()
            self._finalizers.clear()
            self._programs.clear()
            return
        for fin in self._finalizers:
            fin()  # releases the command buffer if its recording is still alive
        self._finalizers.clear()
        self._programs.clear()


__all__ = ["OpenCLBackend", "OpenCLError", "Recording"]
