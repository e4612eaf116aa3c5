"""A process forked after the cpu backend's regions ran runs its sessions in the child.

Each case runs in a subprocess of its own (a fork of pytest's process would copy the other
backends' driver threads): it runs a session on two region threads, forks, and the child runs the
same session and a new one. On TBB (``NUMBA_THREADING_LAYER=tbb``) the child keeps its threads; on
GNU OpenMP (the default layer) it runs its regions on one thread (``cpu_parallel._after_fork_in_child``),
where without that Numba ends the child at its first region and a team of two would wait forever.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import require_tool
from gpumnn.backends.cpu import jit as cpu_jit

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    import gpumnn
    from gpumnn.backends.cpu import parallel as cpu_parallel

    rng = np.random.default_rng(int(sys.argv[1]))
    weight = rng.standard_normal((64, 32, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "fork", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 40, 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    feed = {"x": rng.standard_normal((1, 32, 40, 40)).astype(np.float32)}
    sess = gpumnn.load(model).session(backend="cpu", threads=2)
    ref = sess.run(feed)["y"]
    backend = sess.backends["cpu"]
    print("layer", cpu_parallel.available_layer(), "regions", backend.regions, flush=True)
    pid = os.fork()
    if pid == 0:
        code = 5
        try:
            same = np.array_equal(sess.run(feed)["y"], ref)  # the parts recorded before the fork
            fresh = gpumnn.load(model).session(backend="cpu", threads=2).run(feed)["y"]
            err = float(np.linalg.norm(fresh - ref) / np.linalg.norm(ref))
            print("child", same, f"{err:.1e}", cpu_parallel.threads_for(2), flush=True)
            code = 0 if same and err < 1e-5 else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print("child status", status, flush=True)
    again = sess.run(feed)["y"]  # the parent's own threads are untouched
    sys.exit(0 if os.waitstatus_to_exitcode(status) == 0 and np.array_equal(again, ref) else 1)
""")


def _openmp_missing() -> str | None:
    """Why Numba's GNU OpenMP layer cannot load here, or None."""
    try:
        from numba.np.ufunc import omppool  # noqa: F401 -- loads libgomp
    except ImportError as exc:
        return f"Numba's OpenMP layer does not load ({exc}); install libgomp1"
    return None


@pytest.mark.parametrize("layer", ["tbb", "omp"])
def test_a_forked_child_runs_sessions_made_before_and_after_the_fork(layer, fresh_rng):
    require_tool("numba", cpu_jit.MISSING)
    if layer == "omp":
        require_tool("openmp", _openmp_missing())
    env = dict(os.environ, NUMBA_THREADING_LAYER=layer, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", CHILD, str(int(fresh_rng.integers(1 << 62)))], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    out = done.stdout + done.stderr
    assert f"layer {layer} regions 2" in out, out
    assert done.returncode == 0, out
    if layer == "omp":  # GNU OpenMP's child: its regions on one thread
        assert "child True" in out and out.split("child True")[1].split()[1] == "1", out
