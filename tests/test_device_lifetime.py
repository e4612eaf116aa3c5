"""Device objects live until no call can reach them, and a hung submission is an error (issue 27).

* The lifetime soak (bench/soak_lifetime.py, short): sessions of convolution, LSTM and If models on
  every backend, closed, dropped, dropped in reference cycles and kept, from two threads, with the
  collector forced often, under the Vulkan validation layer and PYTHONMALLOC=debug, in a process
  of its own (a double free kills it at exit). Before the fix it failed in every run (GL sessions
  closed by another thread's collector deleted buffers in the wrong context).
* A dropped session's finalizer only queues its close; the device runs it at a safe point.
* A submission past ``submit_timeout`` raises DeviceLostError naming the ops in flight, later
  calls fail fast, a new session works, and the process exits cleanly.
"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import gpumnn
from conftest import bench_script, require_backend
from gpumnn.backends import REGISTRY, probe

ROOT = Path(__file__).resolve().parent.parent
GPU_APIS = ("vulkan", "gl")  # the backends that defer closes (the others close anywhere)


def _soak_models():
    return bench_script("soak_lifetime")


def test_lifetime_soak_in_one_process():
    backends = [b for b in REGISTRY if probe(b) is None]
    env = dict(os.environ, PYTHONMALLOC="debug", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "soak_lifetime.py"), "--cycles", "100",
                           "--threads", "2", "--backend", ",".join(backends), "--hang-seconds", "240"],
                          capture_output=True, text=True, env=env, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "clean exit" in proc.stdout, out[-4000:]


@pytest.mark.parametrize("api", GPU_APIS)
def test_a_dropped_session_is_closed_at_the_devices_next_safe_point(api):
    require_backend(api)
    net = gpumnn.load(_soak_models().conv_model())
    x = {"x": np.ones((1, 1, 8, 16), np.float32)}
    keep = net.session(backend=api, fallback=False)
    dropped = net.session(backend=api, fallback=False)
    dropped.run(x)
    backend = dropped.backends[api]
    with keep.backends[api].activate():  # inside another session's call on the device
        del dropped
        gc.collect()
        assert not backend._closed, "a finalizer closed a backend inside another call on its device"
    assert backend._closed, "the queued close did not run when the outermost bracket closed"
    assert keep.run(x)["y"].shape == (1, 5)
    keep.close()


def _hang_model():
    """One convolution big enough that lavapipe needs milliseconds for it."""
    from op_cases import one_conv_model
    return one_conv_model(16, 128, "big_conv")


def test_a_submission_past_submit_timeout_is_an_error_and_the_device_fails_fast():
    """A real submission that takes longer than a (tiny) submit_timeout, in a process of its own,
    which must then exit cleanly: the hung device's objects are left alone."""
    require_backend("vulkan")
    script = textwrap.dedent("""
        import numpy as np, gpumnn, sys
        sys.path.insert(0, "tests")
        from test_device_lifetime import _hang_model
        net = gpumnn.load(_hang_model())
        x = {"x": np.ones((1, 16, 128, 128), np.float32)}
        sess = net.session(backend="vulkan", fallback=False, submit_timeout=1e-6)
        try:
            sess.run(x)
        except gpumnn.DeviceLostError as exc:
            print("FIRST", exc)
        try:
            sess.run(x)
        except gpumnn.DeviceLostError as exc:
            print("AGAIN", exc)
        with net.session(backend="vulkan", fallback=False) as fresh:
            print("FRESH", round(float(fresh.run(x)["y"][0, 0, 5, 5]), 4))
    """)
    from op_cases import run_script
    proc = run_script(script)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    first = next(line for line in proc.stdout.splitlines() if line.startswith("FIRST"))
    assert "vulkan" in first and "submit_timeout=1e-06" in first and "Conv2D (big_conv)" in first, first
    assert any(line.startswith("AGAIN") and "lost" in line for line in proc.stdout.splitlines()), out
    assert "FRESH 1.44" in proc.stdout, out  # 16 channels x 9 taps x 0.01 on ones


def test_a_gl_fence_past_submit_timeout_is_an_error(monkeypatch):
    """llvmpipe finishes a dispatch inside the call that issues it, so the hang is planted: a
    fence wait that never finishes (what ``Fences.wait`` says when the timeout passes)."""
    require_backend("gl")
    from gpumnn.backends.gl import device as gl_context

    net = gpumnn.load(_soak_models().conv_model())
    x = {"x": np.ones((1, 1, 8, 16), np.float32)}
    sess = net.session(backend="gl", fallback=False, submit_timeout=0.5)
    if sess.backends["gl"]._pooled.fences() is None:
        pytest.skip("this GL library has no fence syncs")
    monkeypatch.setattr(gl_context.Fences, "wait", lambda self, sync, timeout=None: None)
    with pytest.raises(gpumnn.DeviceLostError, match=r"gl backend: .*submit_timeout=0.5 s"):
        sess.run(x)
    monkeypatch.undo()
    with pytest.raises(gpumnn.DeviceLostError, match="the context is lost"):
        sess.run(x)
    sess.close()
    with net.session(backend="gl", fallback=False) as fresh:
        assert fresh.run(x)["y"].shape == (1, 5)


def test_submit_timeout_must_be_positive():
    net = gpumnn.load(_soak_models().conv_model())
    with pytest.raises(ValueError, match="submit_timeout"):
        net.session(backend="cpu", submit_timeout=0)
