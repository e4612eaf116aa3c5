"""Bounded waits for submissions, shared by the GPU backends (issue 27: a hang is an error, not a wait).

An API whose wait has no timeout (OpenCL's ``clFinish`` / ``clWaitForEvents``, CUDA's
``cudaStreamSynchronize``) is waited on by polling a completion query (an event's status) with
``wait_until``, up to the session's ``submit_timeout``. Past it the backend raises DeviceLostError
with ``hang_reason`` (the device and the ops in flight, ``describe_ops``), marks its device lost so
later calls fail fast, and never waits for or releases what the hung work may use (``keep_forever``);
``DeviceWatch`` does all of that for one backend's device.
"""
from __future__ import annotations

import ctypes
import time
from typing import Any, Callable, Iterable, Sequence

from ..errors import DeviceLostError

#: busy polling first (a short submission ends without a sleep); then each sleep is a fraction
#: of the time waited so far, from the first to the longest: a wait ends at most that fraction
#: (plus the OS's timer slack) after the work did, and a long one wakes once per longest sleep
SPIN_SECONDS = 50e-6
FIRST_SLEEP = 50e-6
LONGEST_SLEEP = 1e-3
SLEEP_FRACTION = 1 / 16


def wait_until(done: Callable[[], bool], timeout: float, clock: Callable[[], float] = time.perf_counter,
               sleep: Callable[[float], Any] = time.sleep) -> bool:
    """Poll ``done()`` until it is true (True) or ``timeout`` seconds have passed (False).
    An exception from ``done`` (a failed command) propagates."""
    if done():
        return True
    start = clock()
    deadline = start + timeout
    while clock() - start < SPIN_SECONDS:
        if done():
            return True
    while True:
        now = clock()
        if now >= deadline:
            return bool(done())  # one last look: the work may have ended during the last sleep
        sleep(min(LONGEST_SLEEP, max(FIRST_SLEEP, (now - start) * SLEEP_FRACTION), deadline - now))
        if done():
            return True


def describe_ops(executions: Sequence[Any], most: int = 6) -> str:
    """The ops of a submission, for the message of a timeout: "3 ops: Conv2D (conv1), ..."."""
    names = [f"{type(exe.op).__name__} ({exe.op.source})" for exe in executions]
    more = f", and {len(names) - most} more" if len(names) > most else ""
    return f"{len(names)} op{'s' if len(names) != 1 else ''}: {', '.join(names[:most])}{more}"


def hang_reason(device: str, timeout: float, in_flight: str) -> str:
    """Why a device is lost after a submission past ``submit_timeout`` (DeviceLostError's
    message after "<api> backend: ", and what later calls on the device repeat)."""
    return f"{device}: a submission did not finish within submit_timeout={timeout:g} s; in flight: {in_flight}"


#: objects of hung devices, never released (see ``keep_forever``)
_KEPT: list[Any] = []


def keep_forever(*objects: Any) -> None:
    """Never release ``objects``, not even at interpreter exit: releasing what hung work may use
    can wait for that work (a command queue's release finishes it, ``cudaFree`` synchronises),
    so a process with a hung device could not exit. A reference is leaked on purpose."""
    for obj in objects:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
        _KEPT.append(obj)


class DeviceWatch:
    """One device's bounded waits and its lost mark (``lost``: why, once a wait expired): every
    later ``check`` raises DeviceLostError with the reason. ``api`` names the backend and
    ``device`` the device in the messages."""

    def __init__(self, api: str, device: str):
        self.api = api
        self.device = device
        self.lost: str | None = None

    def check(self) -> None:
        """DeviceLostError, with the reason, once the device is marked lost."""
        if self.lost is not None:
            raise DeviceLostError(f"{self.api} backend: the device is lost: {self.lost}")

    def wait(self, done: Callable[[], bool], timeout: float, ops: str,
             keep: Callable[[], Iterable[Any]] | None = None) -> None:
        """``wait_until(done, timeout)``; past the timeout, mark the device lost, never release
        what ``keep()`` returns (the objects the hung work may use) and raise DeviceLostError
        naming the device and ``ops``, what was in flight."""
        self.check()
        if wait_until(done, timeout):
            return
        self.lost = hang_reason(self.device, timeout, ops)
        if keep is not None:
            keep_forever(*keep())
        raise DeviceLostError(f"{self.api} backend: {self.lost}")


__all__ = ["DeviceWatch", "describe_ops", "hang_reason", "keep_forever", "wait_until"]
