"""A hang is an error, not a wait, on OpenCL and CUDA too (issue 27).

* ``gpumnn.backends.waits``: the polling schedule of ``wait_until`` on a fake clock, the ops named
  by ``describe_ops``, and ``DeviceWatch``'s lost mark.
* OpenCL on this machine's device, with the hang planted: a marker whose status stays RUNNING.
  DeviceLostError names the ops, later calls fail fast, close returns, the process exits.
* CUDA without CuPy: the backend module imported over stand-ins for CuPy's objects, with events
  that never complete.
* Neither backend keeps an unbounded wait (``clFinish``, ``cudaStreamSynchronize``, ...).
"""
from __future__ import annotations

import importlib
import re
import sys
import textwrap
import time
import types
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest

import gpumnn
from conftest import require_backend
from gpumnn.backends import waits
from gpumnn.backends.waits import DeviceWatch, describe_ops, wait_until

ROOT = Path(__file__).resolve().parent.parent


# -- the shared helper ---------------------------------------------------------------------------
class FakeClock:
    """A clock that moves a microsecond per reading and by each sleep; the sleeps are logged."""

    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        self.now += 1e-6
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_a_finished_wait_costs_no_sleep():
    fake = FakeClock()
    assert wait_until(lambda: True, 1.0, fake.clock, fake.sleep) and fake.sleeps == []
    polls = iter([False] * 5 + [True])  # done during the spin
    assert wait_until(lambda: next(polls), 1.0, fake.clock, fake.sleep) and fake.sleeps == []


def test_sleeps_grow_from_the_first_to_the_longest_and_stop_at_the_deadline():
    fake = FakeClock()
    assert not wait_until(lambda: False, 0.05, fake.clock, fake.sleep)
    sleeps = fake.sleeps
    assert sleeps[0] == pytest.approx(waits.FIRST_SLEEP)
    assert all(b >= a for a, b in zip(sleeps, sleeps[1:-1])), sleeps  # the last one ends at the deadline
    assert max(sleeps) == pytest.approx(waits.LONGEST_SLEEP) and sleeps.count(max(sleeps)) > 10
    assert 0.05 - 1e-4 < fake.now < 0.05 + 1e-4  # no sleep past the deadline


@pytest.mark.parametrize("work", [1e-4, 1e-3, 1e-2, 1.0])
def test_a_wait_ends_soon_after_the_work_does(work):
    fake = FakeClock()
    assert wait_until(lambda: fake.now >= work, 10.0, fake.clock, fake.sleep)
    late = fake.now - work
    assert late <= max(waits.FIRST_SLEEP, min(waits.LONGEST_SLEEP, work * waits.SLEEP_FRACTION)) + 1e-5, late
    assert len(fake.sleeps) < 100 + work / waits.LONGEST_SLEEP  # a long wait wakes once per longest sleep


def test_an_error_from_done_propagates():
    def done():
        raise RuntimeError("failed command")

    with pytest.raises(RuntimeError, match="failed command"):
        wait_until(done, 1.0)


def _exe(kind: str, source: str):
    return types.SimpleNamespace(op=type(kind, (), {"source": source})())


def test_describe_ops_names_the_first_few():
    assert describe_ops([_exe("Conv2D", "conv1")]) == "1 op: Conv2D (conv1)"
    text = describe_ops([_exe("Unary", f"relu{i}") for i in range(9)])
    assert text.startswith("9 ops: Unary (relu0), ") and text.endswith("Unary (relu5), and 3 more"), text


def test_a_device_watch_marks_lost_keeps_the_objects_and_fails_fast():
    watch = DeviceWatch("api", "dev0")
    watch.wait(lambda: True, 1.0, "nothing")  # a finished wait: nothing happens
    hung = object()
    with pytest.raises(gpumnn.DeviceLostError,
                       match=r"^api backend: dev0: a submission did not finish within submit_timeout=0.001 s; "
                             r"in flight: 2 ops"):
        watch.wait(lambda: False, 1e-3, "2 ops", lambda: [hung])
    assert watch.lost is not None and any(obj is hung for obj in waits._KEPT)
    with pytest.raises(gpumnn.DeviceLostError, match="the device is lost: dev0: a submission did not finish"):
        watch.check()
    with pytest.raises(gpumnn.DeviceLostError, match="the device is lost"):
        watch.wait(lambda: True, 1.0, "more")


# -- OpenCL, the hang planted --------------------------------------------------------------------
def _conv_model():
    from op_cases import one_conv_model
    return one_conv_model(4, 16, "the_conv")


X = {"x": np.ones((1, 4, 16, 16), np.float32)}


def _hang_markers(monkeypatch, status: int = 1):
    """Every marker's status stays ``status`` (RUNNING unless told): the submission never ends."""
    import pyopencl as cl

    from gpumnn.backends.opencl import backend as ocl

    real = ocl._event_status
    monkeypatch.setattr(ocl, "_event_status",
                        lambda event: status if event.command_type == cl.command_type.MARKER else real(event))


def test_an_opencl_submission_past_submit_timeout_is_an_error_and_the_process_exits():
    """In a process of its own, which must exit with the hung queue never finished or released."""
    require_backend("opencl")
    script = textwrap.dedent("""
        import sys, time, numpy as np, gpumnn, pytest
        sys.path.insert(0, "tests")
        from test_submit_timeout import _conv_model, _hang_markers, X
        from gpumnn.backends import waits
        patch = pytest.MonkeyPatch()
        net = gpumnn.load(_conv_model())
        sess = net.session(backend="opencl", fallback=False, submit_timeout=0.05)
        print("OK", round(float(sess.run(X)["y"][0, 0, 5, 5]), 4))
        _hang_markers(patch)
        try:
            sess.run(X)
        except gpumnn.DeviceLostError as exc:
            print("FIRST", exc)
        patch.undo()  # the status is real again: the device stays lost all the same
        start = time.perf_counter()
        try:
            sess.run(X)
        except gpumnn.DeviceLostError as exc:
            print("AGAIN", round(time.perf_counter() - start, 3) < 0.05, exc)
        backend = sess.backends["opencl"]
        sess.close()
        print("CLOSED", any(obj is backend.queue for obj in waits._KEPT))
        with net.session(backend="opencl", fallback=False) as fresh:
            print("FRESH", round(float(fresh.run(X)["y"][0, 0, 5, 5]), 4))
    """)
    from op_cases import run_script
    proc = run_script(script)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    lines = {line.split(" ", 1)[0]: line for line in proc.stdout.splitlines()}
    assert lines.get("OK") == "OK 0.36", out  # 4 channels x 9 taps x 0.01 on ones
    first = lines.get("FIRST", "")
    assert re.match(r"FIRST opencl backend: .+: a submission did not finish within submit_timeout=0.05 s; "
                    r"in flight: 1 op: Conv2D \(the_conv\)$", first), out
    assert lines.get("AGAIN", "").startswith("AGAIN True opencl backend: the device is lost: "), out
    assert lines.get("CLOSED") == "CLOSED True", out  # the hung queue is never released
    assert lines.get("FRESH") == "FRESH 0.36", out


def test_an_opencl_eager_op_past_submit_timeout_names_the_op(monkeypatch):
    require_backend("opencl")
    sess = gpumnn.load(_conv_model()).session(backend="opencl", fallback=False, record=False, submit_timeout=0.02)
    _hang_markers(monkeypatch)
    with pytest.raises(gpumnn.DeviceLostError, match=r"submit_timeout=0.02 s; in flight: 1 op: Conv2D \(the_conv\)"):
        sess.run(X)
    with pytest.raises(gpumnn.DeviceLostError, match="the device is lost"):
        sess.run(X)
    sess.close()


def test_an_opencl_ticket_past_submit_timeout_is_an_error(monkeypatch):
    require_backend("opencl")
    sess = gpumnn.load(_conv_model()).session(backend="opencl", fallback=False, submit_timeout=0.02)
    backend = sess.backends["opencl"]
    recording = backend.record([])
    backend.wait(backend.submit_async(recording))  # a marker that completes
    _hang_markers(monkeypatch)
    ticket = backend.submit_async(recording)
    with pytest.raises(gpumnn.DeviceLostError, match="submit_timeout=0.02 s; in flight: 0 ops"):
        backend.wait(ticket)
    with pytest.raises(gpumnn.DeviceLostError, match="the device is lost"):
        backend.submit_async(recording)
    sess.close()


def test_a_failed_opencl_command_is_an_error_not_a_lost_device(monkeypatch):
    require_backend("opencl")
    from gpumnn.backends.opencl.backend import OpenCLError

    sess = gpumnn.load(_conv_model()).session(backend="opencl", fallback=False)
    _hang_markers(monkeypatch, status=-5)  # CL_OUT_OF_RESOURCES
    with pytest.raises(OpenCLError, match=r"a command failed with status -5 .*in flight: 1 op: Conv2D \(the_conv\)"):
        sess.run(X)
    monkeypatch.undo()
    assert sess.run(X)["y"].shape == (1, 4, 16, 16)
    sess.close()


# -- CUDA, with stand-ins for CuPy ---------------------------------------------------------------
class _Event:
    """Stands for ``cupy.cuda.Event``: ``done`` as the test says."""

    done_after_record = True

    def __init__(self, *args, **kwargs):
        self.done = True

    def record(self, stream=None):
        self.done = type(self).done_after_record


class _Stream:
    def synchronize(self):
        raise AssertionError("an unbounded wait: cudaStreamSynchronize")


class _Graph:
    def __init__(self):
        self.launches = 0

    def launch(self, stream):
        self.launches += 1


@pytest.fixture
def cuda_backend_module(monkeypatch):
    """gpumnn.backends.cuda.backend imported over a stand-in ``cupy`` (removed afterwards)."""
    cupy = types.ModuleType("cupy")
    cuda = types.ModuleType("cupy.cuda")
    runtime = types.ModuleType("cupy.cuda.runtime")
    runtime.streamCaptureModeRelaxed = 1
    cuda.runtime, cuda.Event, cuda.get_elapsed_time = runtime, _Event, lambda start, end: 1.0
    cupy.cuda, cupy.ndarray, cupy.__version__ = cuda, type("ndarray", (), {}), "stand-in"
    for name, module in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.runtime", runtime)):
        monkeypatch.setitem(sys.modules, name, module)
    import gpumnn.backends.cuda as package

    for name in ("backend", "device"):  # all gone afterwards: a later import finds the real CuPy or none
        monkeypatch.delitem(sys.modules, f"gpumnn.backends.cuda.{name}", raising=False)
        monkeypatch.setattr(package, name, None, raising=False)
    _Event.done_after_record = True
    return importlib.import_module("gpumnn.backends.cuda.backend")


def _stand_in_cuda_backend(module, timeout: float):
    """A CudaBackend as ``__init__`` leaves it, with stand-ins for the GPU's objects."""
    from gpumnn.backends.base import Backend
    from gpumnn.backends.cuda.launch import Lane
    from gpumnn.backends.lanes import LanePool

    backend = module.CudaBackend.__new__(module.CudaBackend)
    Backend.__init__(backend)
    backend.device_id, backend._device, backend._kernels, backend._closed = 0, nullcontext(), {}, False
    backend._info = types.SimpleNamespace(device="Stand-in GPU")
    backend._watch = DeviceWatch("cuda", "Stand-in GPU")
    backend._buffers = __import__("weakref").WeakSet()
    backend._make_lane = lambda: Lane(_Stream(), _Event())  # the pool holds the backend's makers weakly
    backend._make_staging = lambda nbytes: np.zeros(nbytes, np.uint8)
    backend._lanes = LanePool(backend._make_lane, backend._make_staging)
    backend.submit_timeout = timeout
    return backend


def test_cuda_waits_poll_an_event_and_a_hang_marks_the_device_lost(cuda_backend_module):
    backend = _stand_in_cuda_backend(cuda_backend_module, timeout=0.02)
    graph = _Graph()
    recording = cuda_backend_module.Recording(graph, 3, [], "1 op: Conv2D (conv1)")
    backend.submit(recording)
    backend.wait(backend.submit_async(recording))
    assert backend.measure_recording(recording, repeats=1) == pytest.approx(1e-3)
    assert graph.launches == 4

    _Event.done_after_record = False  # the GPU never finishes what it is given now
    with pytest.raises(gpumnn.DeviceLostError,
                       match=r"^cuda backend: Stand-in GPU: a submission did not finish within submit_timeout=0.02 s; "
                             r"in flight: 1 op: Conv2D \(conv1\)$"):
        backend.submit(recording)
    assert any(obj is backend._lanes for obj in waits._KEPT)  # nothing the hung graph uses is freed
    start = time.perf_counter()
    for call in (lambda: backend.submit(recording), lambda: backend.submit_async(recording),
                 lambda: backend.run_eager([]), lambda: backend.measure_recording(recording, repeats=1)):
        with pytest.raises(gpumnn.DeviceLostError, match="the device is lost: Stand-in GPU"):
            call()
    assert time.perf_counter() - start < 0.02 and graph.launches == 5  # fast, and nothing more launched
    backend.close()  # returns: nothing waited for


def test_a_cuda_ticket_and_an_eager_op_past_submit_timeout(cuda_backend_module):
    backend = _stand_in_cuda_backend(cuda_backend_module, timeout=0.02)
    recording = cuda_backend_module.Recording(_Graph(), 1, [], "2 ops: Unary (a), Unary (b)")
    ticket = backend.submit_async(recording)
    _Event.done_after_record = False
    with pytest.raises(gpumnn.DeviceLostError, match=r"in flight: 2 ops: Unary \(a\), Unary \(b\)$"):
        backend.wait(ticket)

    backend = _stand_in_cuda_backend(cuda_backend_module, timeout=0.02)
    calls = []
    exe = types.SimpleNamespace(op=type("Conv2D", (), {"source": "c9"})(), work=[calls.append])
    with pytest.raises(gpumnn.DeviceLostError, match=r"in flight: 1 op: Conv2D \(c9\)$"):
        backend.run_eager([exe, exe])
    assert len(calls) == 1  # the second op never launched
    backend.close()


# -- no unbounded wait left ----------------------------------------------------------------------
@pytest.mark.parametrize("path", ["gpumnn/backends/opencl/backend.py", "gpumnn/backends/cuda/backend.py"])
def test_no_unbounded_wait_is_left(path):
    source = (ROOT / path).read_text()
    found = re.findall(r"\.finish\(\)|\.synchronize\(\)|\.wait\(\)|[^_]blocking=True|cl\.wait_for_events", source)
    assert not found, f"{path} waits without submit_timeout: {found}"
