"""A minimal ctypes binding of ``cl_khr_command_buffer`` (pyopencl has none as of 2026.1).

Only five entry points are used: create, record an NDRange, finalize, enqueue, release. They
are fetched with ``clGetExtensionFunctionAddressForPlatform`` from the ICD loader pyopencl is
linked against, and take pyopencl objects through their ``int_ptr``. The signatures are those of
the provisional extension (0.9.x), which have not changed for these five functions.
``CommandBufferAPI.load`` returns None whenever anything is missing; :func:`probe` also runs a
self-test before trusting it, and the backend falls back to an enqueue loop without it.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any, Callable, Sequence

import numpy as np

from ... import atomic as A

_cl_int = ctypes.c_int32
_cl_uint = ctypes.c_uint32
_ptr = ctypes.c_void_p
_size_p = ctypes.POINTER(ctypes.c_size_t)


def _opencl_library() -> ctypes.CDLL | None:
    for name in (ctypes.util.find_library("OpenCL"), "libOpenCL.so.1", "libOpenCL.so", "OpenCL.dll",
                 "/System/Library/Frameworks/OpenCL.framework/OpenCL"):
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


class CommandBufferError(RuntimeError):
    pass


class CommandBufferAPI:
    """The extension's entry points for one platform."""

    def __init__(self, fns: dict[str, Any]):
        self._create = fns["clCreateCommandBufferKHR"]
        self._ndrange = fns["clCommandNDRangeKernelKHR"]
        self._finalize = fns["clFinalizeCommandBufferKHR"]
        self._enqueue = fns["clEnqueueCommandBufferKHR"]
        self._release = fns["clReleaseCommandBufferKHR"]

    @classmethod
    def load(cls, platform: Any, device: Any) -> "CommandBufferAPI | None":
        if "cl_khr_command_buffer" not in device.extensions.split():
            return None
        lib = _opencl_library()
        if lib is None or not hasattr(lib, "clGetExtensionFunctionAddressForPlatform"):
            return None
        get = lib.clGetExtensionFunctionAddressForPlatform
        get.restype = _ptr
        get.argtypes = [_ptr, ctypes.c_char_p]
        protos = {
            "clCreateCommandBufferKHR": ctypes.CFUNCTYPE(
                _ptr, _cl_uint, ctypes.POINTER(_ptr), _ptr, ctypes.POINTER(_cl_int)),
            "clCommandNDRangeKernelKHR": ctypes.CFUNCTYPE(
                _cl_int, _ptr, _ptr, _ptr, _ptr, _cl_uint, _size_p, _size_p, _size_p,
                _cl_uint, _ptr, _ptr, _ptr),
            "clFinalizeCommandBufferKHR": ctypes.CFUNCTYPE(_cl_int, _ptr),
            "clEnqueueCommandBufferKHR": ctypes.CFUNCTYPE(
                _cl_int, _cl_uint, ctypes.POINTER(_ptr), _ptr, _cl_uint, _ptr, _ptr),
            "clReleaseCommandBufferKHR": ctypes.CFUNCTYPE(_cl_int, _ptr),
        }
        fns = {}
        for name, proto in protos.items():
            addr = get(_ptr(platform.int_ptr), name.encode())
            if not addr:
                return None
            fns[name] = proto(addr)
        return cls(fns)

    def create(self, queue: Any) -> int:
        err = _cl_int(0)
        queues = (_ptr * 1)(queue.int_ptr)
        handle = self._create(1, queues, None, ctypes.byref(err))
        if err.value != 0 or not handle:
            raise CommandBufferError(f"clCreateCommandBufferKHR failed ({err.value})")
        return handle

    def add_ndrange(self, cmdbuf: int, kernel: Any, gsize: Sequence[int], lsize: Sequence[int] | None,
                    after: int | None = None) -> int:
        """Record one launch; ``after`` is the sync point it must wait for (the previous launch:
        commands in a command buffer are otherwise unordered). Returns its own sync point."""
        dim = len(gsize)
        g = (ctypes.c_size_t * dim)(*gsize)
        lptr = (ctypes.c_size_t * dim)(*lsize) if lsize is not None else None
        sync = ctypes.c_uint32(0)
        wait = (ctypes.c_uint32 * 1)(after) if after is not None else None
        err = self._ndrange(_ptr(cmdbuf), None, None, _ptr(kernel.int_ptr), dim, None, g, lptr,
                            1 if after is not None else 0, ctypes.cast(wait, _ptr) if wait is not None else None,
                            ctypes.cast(ctypes.pointer(sync), _ptr), None)
        if err != 0:
            raise CommandBufferError(f"clCommandNDRangeKernelKHR failed ({err})")
        return sync.value

    def finalize(self, cmdbuf: int) -> None:
        err = self._finalize(_ptr(cmdbuf))
        if err != 0:
            raise CommandBufferError(f"clFinalizeCommandBufferKHR failed ({err})")

    def enqueue(self, cmdbuf: int) -> None:
        err = self._enqueue(0, None, _ptr(cmdbuf), 0, None, None)
        if err != 0:
            raise CommandBufferError(f"clEnqueueCommandBufferKHR failed ({err})")

    def release(self, cmdbuf: int) -> None:
        self._release(_ptr(cmdbuf))


def probe(platform: Any, device: Any, queue: Any, raster_program: Callable[[], Any],
          make_buffer: Callable[[int], Any]) -> CommandBufferAPI | None:
    """The extension's entry points where the device has them and a self-test passes, else None
    (also with ``GPUMNN_OPENCL_CMDBUF=0``). ``raster_program`` gives the built "raster" family,
    ``make_buffer(nbytes)`` a device buffer for the test."""
    if os.environ.get("GPUMNN_OPENCL_CMDBUF", "1") == "0":
        return None
    try:
        api = CommandBufferAPI.load(platform, device)
        if api is not None and not _self_test(api, queue, raster_program(), make_buffer(4 * 256)):
            api = None
    except Exception:
        api = None
    return api


def _self_test(api: CommandBufferAPI, queue: Any, prg: Any, buf: Any) -> bool:
    """Record two dependent launches into a command buffer, replay twice, check the result."""
    import pyopencl as cl

    k1 = cl.Kernel(prg, "raster_fill")
    k1.set_args(buf, np.int32(0), np.int32(128), np.uint32(A.fill_bits(3.0, A.FLOAT32)))
    k2 = cl.Kernel(prg, "raster_copy_flat")
    k2.set_args(buf, np.int32(0), buf, np.int32(128), np.int32(128))
    cmd = api.create(queue)
    try:
        sp = api.add_ndrange(cmd, k1, (128,), (64,))
        api.add_ndrange(cmd, k2, (128,), (64,), after=sp)
        api.finalize(cmd)
        for _ in range(2):
            api.enqueue(cmd)
            queue.finish()
        out = np.empty(256, dtype=np.float32)
        cl.enqueue_copy(queue, out, buf, is_blocking=True)
        return bool(np.all(out == 3.0))
    except CommandBufferError:
        return False
    finally:
        api.release(cmd)
        buf.release()
