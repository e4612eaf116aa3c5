"""The on-disk program caches (OpenCL binaries, SPIR-V) never load a damaged entry, and can be
warmed by two processes at once.

A flipped byte or a truncated file in the cache is found by its checksum, rebuilt and rewritten,
and the answer stays right; two child processes filling one empty cache at the same moment both
succeed. The model is tiny (a MatMul with bias and ReLU: a GEMM and an elementwise program).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from conftest import require_backend
from gpumnn import diskcache
from gpumnn.backends.kernels.glsl import compile as shader_compile

CACHE_KIND = {"opencl": "opencl", "vulkan": "spirv"}  # backend -> its folder in the cache

RNG = np.random.default_rng(5)
W = RNG.standard_normal((8, 16)).astype(np.float32)
B = RNG.standard_normal(16).astype(np.float32)
X = RNG.standard_normal((4, 8)).astype(np.float32)
EXPECTED = np.maximum(X @ W + B, 0)


def _model():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["a"], name="bias"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 8))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4, 16))],
                              [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run_new_session(backend: str, monkeypatch) -> dict[str, int]:
    """One session as a new process would make it (no SPIR-V in memory, no Vulkan device kept
    with its pipelines from an earlier session); its backend's counters."""
    monkeypatch.setattr(shader_compile, "_memory_cache", {})
    if backend == "vulkan":
        import gc
        from gpumnn.backends.vulkan.device import release_idle_devices
        gc.collect()  # sessions earlier tests dropped without closing give their device back
        release_idle_devices()
    sess = gpumnn.load(_model()).session(backend=backend, fallback=False)
    try:
        np.testing.assert_allclose(sess.run({"x": X})["y"], EXPECTED, rtol=1e-4, atol=1e-4)
        return sess.counters[backend]
    finally:
        sess.close()


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) * 2 // 3] ^= 0x5A  # inside the payload, past the header
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage", [_flip, _truncate], ids=["flipped_byte", "truncated"])
@pytest.mark.parametrize("backend", list(CACHE_KIND))
def test_damaged_entry_is_rebuilt_not_loaded(backend, damage, tmp_path, monkeypatch):
    require_backend(backend)
    monkeypatch.setenv("GPUMNN_CACHE_DIR", str(tmp_path))
    _run_new_session(backend, monkeypatch)
    entries = sorted((tmp_path / CACHE_KIND[backend]).iterdir())
    assert entries and all(diskcache.read(p) is not None for p in entries)
    for path in entries:
        damage(path)

    before = diskcache.counters["corrupt"]
    counters = _run_new_session(backend, monkeypatch)  # asserts the answer
    assert diskcache.counters["corrupt"] - before == len(entries)
    if backend == "opencl":
        assert counters["programs_built"] == len(entries)
    assert all(diskcache.read(p) is not None for p in entries), "a rebuilt entry was not rewritten"

    before = diskcache.counters["corrupt"]
    counters = _run_new_session(backend, monkeypatch)
    assert diskcache.counters["corrupt"] == before
    if backend == "opencl":
        assert counters["programs_built"] == 0


CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {tests!r}); sys.path.insert(0, {root!r})
    import numpy as np
    import gpumnn
    from test_program_cache import _model, X, EXPECTED
    ready = Path({cache!r}) / "ready"
    ready.mkdir(parents=True, exist_ok=True)
    (ready / sys.argv[1]).touch()
    deadline = time.monotonic() + 60
    while len(list(ready.iterdir())) < 2 and time.monotonic() < deadline:  # start compiling together
        time.sleep(0.01)
    for backend in sys.argv[2:]:
        sess = gpumnn.load(_model()).session(backend=backend, fallback=False)
        np.testing.assert_allclose(sess.run({{"x": X}})["y"], EXPECTED, rtol=1e-4, atol=1e-4)
        sess.close()
    print("ok", sys.argv[1])
""")


def test_two_processes_warm_one_empty_cache(tmp_path):
    backends = list(CACHE_KIND)
    for backend in backends:
        require_backend(backend)
    cache = tmp_path / "cache"
    tests = Path(__file__).resolve().parent
    script = CHILD.format(tests=str(tests), root=str(tests.parent), cache=str(cache))
    env = dict(os.environ, GPUMNN_CACHE_DIR=str(cache))
    children = [subprocess.Popen([sys.executable, "-c", script, str(i), *backends], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    try:
        outputs = [child.communicate(timeout=240)[0] for child in children]
    finally:
        for child in children:  # a hung child is stopped, not left behind
            if child.poll() is None:
                child.kill()
                child.wait()
    for child, output in zip(children, outputs):
        assert child.returncode == 0, output
    for backend in backends:
        entries = list((cache / CACHE_KIND[backend]).iterdir())
        assert entries and all(diskcache.read(p) is not None for p in entries), entries
        assert not [p for p in entries if p.name.endswith(".tmp")], "a temporary file was left behind"
