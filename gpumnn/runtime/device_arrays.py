"""Host arrays and device arrays among a run's inputs, told apart without importing any GPU
library.

A value is a *device array* when it says it lives on a device: a DLPack tensor
(``__dlpack__``) whose ``__dlpack_device__`` is not the CPU, or an object with the CUDA array
interface (``__cuda_array_interface__``: CuPy, Numba, PyTorch CUDA tensors). The session hands
those to its backend (``Backend.device_array``), which copies them device to device or says why
it cannot; everything else is a host array: NumPy arrays, anything ``numpy.asarray`` takes, and
CPU DLPack tensors (read through ``numpy.from_dlpack``, without a copy, where they offer no NumPy
array interface of their own).
"""
from __future__ import annotations

from typing import Any

import numpy as np

#: DLPack's device type of host memory (``DLDeviceType.kDLCPU``)
DLPACK_CPU = 1


def is_device_array(value: Any) -> bool:
    """Whether ``value`` is a tensor on a device rather than in host memory."""
    if isinstance(value, (np.ndarray, np.generic, list, tuple, int, float, bool)):
        return False
    device = getattr(value, "__dlpack_device__", None)
    if device is not None:
        try:
            return int(device()[0]) != DLPACK_CPU
        except Exception:  # noqa: BLE001 -- a malformed DLPack object: let numpy judge it
            return False
    return hasattr(value, "__cuda_array_interface__")


def host_array(value: Any) -> np.ndarray:
    """A host value as a NumPy array (a CPU DLPack tensor without a NumPy interface through
    ``numpy.from_dlpack``, anything else through ``numpy.asarray``)."""
    if isinstance(value, np.ndarray):
        return value
    if (hasattr(value, "__dlpack__") and not hasattr(value, "__array__")
            and not hasattr(value, "__array_interface__")):
        return np.from_dlpack(value)
    return np.asarray(value)


__all__ = ["DLPACK_CPU", "host_array", "is_device_array"]
