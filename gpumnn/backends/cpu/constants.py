"""Constant weights in the layouts the cpu kernels read (panels of the register tile, Winograd's
G W G^T), made once per backend and shared by every run state that asks.

Each run state builds its executions, and an execution used to pack its weights for itself. A
recorded session does that once, but a second run state (a second thread's run) packed every
weight again, and an eager run, which prepares a state per run, packed them on every run, which
cost many times the run itself (measured: bench/RESULTS.md). Packed weights are only read, so one copy serves every state, keyed by the constant's
buffer (a constant is uploaded once per session) and dropped when that buffer goes.
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable, Hashable

import numpy as np

from ..base import TensorHandle


def is_constant(handle: TensorHandle) -> bool:
    """Whether ``handle`` lives in a constant's buffer (its contents never change): the cpu backend
    hands constants out read-only (``CpuBackend.constant``), the pools' buffers are writable."""
    return not handle.buffer.flags.writeable


class PackedConstants:
    """``get(handle, recipe, make)``: ``make()`` for a constant ``handle`` and a ``recipe`` (what
    layout, from which view of it), made on the first call and the same array on every later one."""

    def __init__(self) -> None:
        self._made: dict[tuple, np.ndarray] = {}
        self._lock = threading.Lock()

    def get(self, handle: TensorHandle, recipe: Hashable, make: Callable[[], np.ndarray]) -> np.ndarray:
        buffer = handle.buffer
        if not is_constant(handle):
            return make()
        key = (id(buffer), handle.offset, recipe)
        with self._lock:
            made = self._made.get(key)
        if made is not None:
            return made
        made = make()  # outside the lock: packing a large weight takes a while
        with self._lock:
            if key not in self._made:
                self._made[key] = made
                weakref.finalize(buffer, self._made.pop, key, None)  # before the buffer's id can be reused
            return self._made[key]


def made_once(constants: PackedConstants | None, handle: TensorHandle, recipe: Hashable,
              make: Callable[[], np.ndarray]) -> np.ndarray:
    """``constants.get(...)``, or ``make()`` where there is no shared store (an op made alone)."""
    return make() if constants is None else constants.get(handle, recipe, make)
