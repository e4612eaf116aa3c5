"""The NumPy backend's own threads (``gpumnn.backends.cpu.workers``): an op cut into chunks and
shared between threads gives what one thread gives, and the pool runs every chunk once.

Chunking is forced on the small atomic-op cases of ``test_atomic_ops`` (no size threshold, chunks
of a few hundred bytes: one output row or channel each), so the row-block, channel-span,
weight-row-span and column-span paths and their epilogues all run on three threads, against the
same backend on one thread (the reference semantics, which runs every op whole) and against a
float64 computation written here from the atomic op's docstring (the same code runs chunked and
whole, so only an independent reference catches a block's wrong bias or offset).
"""
from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from gpumnn import atomic as A
from gpumnn.backends.cpu import backend as cpu_module, engines as cpu_engines
from gpumnn.backends.cpu.backend import CpuBackend
from gpumnn.backends.cpu.elementwise import unary_function
from gpumnn.backends.cpu.workers import Workers
from test_atomic_ops import CASES, _conv, _prepare, check, rel_err, run_case

def _winograd(case, tile: int):
    """``case`` with its convolution built as the cpu's Winograd kernel F(tile, k)."""
    return dataclasses.replace(case, op=dataclasses.replace(case.op, scheme="winograd", winograd_tile=tile))


#: more channels than output pixels: the columns once, then spans of the weights' rows
LOCAL_CASES = {
    "conv-3x3-few-pixels-bias": lambda rng: _conv(rng, c=6, hw=(4, 4), oc=40, k=(3, 3), p=(1, 1), bias=True,
                                                  act=("relu", ())),
    "conv-1x1-few-pixels-groups2-bias": lambda rng: _conv(rng, c=8, hw=(3, 3), oc=36, k=(1, 1), g=2, bias=True),
    "conv-3x3-few-pixels-groups2-bias": lambda rng: _conv(rng, c=4, hw=(3, 4), oc=48, k=(3, 3), p=(1, 1), g=2,
                                                          bias=True),
    # the cpu's own Winograd kernel (chunks of tile rows), partial border tiles, bias, activation, batch 2
    "conv-winograd-F4-bias-relu": lambda rng: _winograd(_conv(rng, c=5, hw=(11, 9), oc=7, k=(3, 3), p=(1, 1),
                                                              bias=True, act=("relu", ())), 4),
    "conv-winograd-F2-k5-batch2": lambda rng: _winograd(_conv(rng, n=2, c=3, hw=(9, 10), oc=4, k=(5, 5), p=(2, 1)), 2),
}
ALL_CASES = {**CASES, **LOCAL_CASES}
CHUNKED = sorted(name for name in ALL_CASES if name.startswith(("conv-", "matmul-")))


@pytest.fixture(scope="module")
def one_thread():
    return CpuBackend(threads=1)


@pytest.fixture(scope="module")
def threaded():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpu_engines, "PARALLEL_MIN_MACS", 0)
        patch.setattr(cpu_engines, "DEPTHWISE_PARALLEL_MIN", 0)
        patch.setattr(cpu_engines, "CHUNK_BYTES", 256)
        yield CpuBackend(threads=3)


@pytest.mark.parametrize("name", CHUNKED)
def test_chunked_op_matches_one_thread(threaded, one_thread, name):
    seed = CHUNKED.index(name)
    case = ALL_CASES[name](np.random.default_rng(seed))
    assert len(threaded.create_execution(case.op, *_handles(threaded, case)).work) == 1
    check(threaded, one_thread, case, seed)
    garbage = {n: np.zeros(s, np.float32) for n, s in case.outputs.items()}
    got = run_case(threaded, case, garbage)["y"]
    assert rel_err(got, _reference(case)) < 1e-5


def _activate(y: np.ndarray, activation) -> np.ndarray:
    if activation is None:
        return y
    out = np.empty_like(y)
    unary_function(activation[0], activation[1], y.dtype)(y, out)
    return out


def _reference(case) -> np.ndarray:
    """The op in float64, straight from its definition (``gpumnn.atomic``)."""
    op, x = case.op, {k: np.asarray(v, np.float64) for k, v in case.inputs.items()}
    if isinstance(op, A.MatMul):
        a = x["a"].reshape((op.batch, op.k, op.m) if op.trans_a else (op.batch, op.m, op.k))
        b = x["b"].reshape((-1, op.n, op.k) if op.trans_b else (-1, op.k, op.n))
        a = a.transpose(0, 2, 1) if op.trans_a else a
        b = b.transpose(0, 2, 1) if op.trans_b else b
        y = op.alpha * (a @ b)
        if op.has_bias:
            rows, cols = np.arange(op.m)[:, None], np.arange(op.n)[None, :]
            y = y + op.beta * x["bias"].reshape(-1)[rows * op.bias_strides[0] + cols * op.bias_strides[1]]
        return _activate(y, op.activation)
    n, g, (kh, kw), (oh, ow) = op.batch, op.groups, op.kernel, op.out_hw
    (sh, sw), (dh, dw), (top, left) = op.strides, op.dilations, op.pads
    xp = np.zeros((n, op.in_channels, op.in_hw[0] + top + kh * dh + oh * sh, op.in_hw[1] + left + kw * dw + ow * sw))
    xp[:, :, top:top + op.in_hw[0], left:left + op.in_hw[1]] = x["x"]
    xp = xp.reshape(n, g, op.in_channels // g, *xp.shape[2:])
    w = x["w"].reshape(g, op.out_channels // g, op.in_channels // g, kh, kw)
    y = np.zeros((n, g, op.out_channels // g, oh, ow))
    for i in range(kh):
        for j in range(kw):
            window = xp[:, :, :, i * dh:i * dh + oh * sh:sh, j * dw:j * dw + ow * sw:sw]
            y += np.einsum("goc,ngchw->ngohw", w[:, :, :, i, j], window)
    y = y.reshape(n, op.out_channels, oh, ow)
    if op.has_bias:
        y = y + x["bias"].reshape(1, -1, 1, 1)
    return _activate(y, op.activation)


def _handles(be, case):
    garbage = {n: np.zeros(s, np.float32) for n, s in case.outputs.items()}
    _, _, ins, outs = _prepare(be, case, garbage)
    return ins, outs


def test_every_chunk_runs_once_on_some_thread():
    pool = Workers(3)
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def chunk(k: int, slot: int) -> None:
        with lock:
            seen.append((k, slot))
    for _ in range(20):
        seen.clear()
        pool.run(37, chunk)
        assert sorted(k for k, _ in seen) == list(range(37))
        assert {slot for _, slot in seen} <= {0, 1, 2}


def test_a_failing_chunk_raises_in_the_caller_and_the_pool_goes_on():
    pool = Workers(2)

    def chunk(k: int, slot: int) -> None:
        if k == 5:
            raise ValueError("chunk 5")
    with pytest.raises(ValueError, match="chunk 5"):
        pool.run(12, chunk)
    done = []
    pool.run(4, lambda k, slot: done.append(k))
    assert sorted(done) == [0, 1, 2, 3]


def test_a_busy_pool_runs_the_second_caller_inline():
    """Two runs at once: the one that finds the pool busy runs its chunks on its own thread."""
    pool = Workers(2)
    inside, release = threading.Event(), threading.Event()
    slots: list[int] = []

    def blocking(k: int, slot: int) -> None:
        inside.set()
        release.wait(5)
    first = threading.Thread(target=pool.run, args=(2, blocking))
    first.start()
    assert inside.wait(5)
    pool.run(3, lambda k, slot: slots.append(slot))
    release.set()
    first.join(5)
    assert slots == [0, 0, 0]


def test_blas_threads_are_limited_during_runs_and_restored_after(monkeypatch):
    """While a run is in flight BLAS runs on the limiter's thread count (one: the backend's own
    threads share the work), nested runs keep the limit until the last leaves, and the library's
    own count comes back after."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    controller = threadpoolctl.ThreadpoolController()
    if not controller.lib_controllers:
        pytest.skip("threadpoolctl finds no BLAS or OpenMP library in this process")

    def counts():
        return [lib.get_num_threads() for lib in controller.lib_controllers]

    # the limiter finds the libraries once, at its first run: one loaded later (SciPy's OpenBLAS, by
    # cpu_parallel) is not limited, so which tests ran before decided this one; find them afresh
    monkeypatch.setattr(cpu_module._ThreadLimiter, "_probed", False)
    monkeypatch.setattr(cpu_module._ThreadLimiter, "_controller", None)

    before = counts()
    with threadpoolctl.threadpool_limits(2):  # a count of its own to come back to, whatever the machine's
        outside = counts()
        first, second = cpu_module._ThreadLimiter(1), cpu_module._ThreadLimiter(1)
        with first:
            assert set(counts()) <= {1, None}
            with second:
                assert set(counts()) <= {1, None}
            assert set(counts()) <= {1, None}  # one run left, the other is still in flight
        assert counts() == outside
    assert counts() == before


def test_region_threads_restore_each_threads_own_numba_count():
    """A run's region thread count is set for the run and the calling thread's own Numba count
    comes back after, on each thread separately, nested entries included."""
    numba = pytest.importorskip("numba")
    from gpumnn.backends.cpu import parallel as cpu_parallel
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("Numba has one thread here")
    scope = cpu_parallel.RegionThreads(1)
    seen = {}

    def on_thread(name, own):
        numba.set_num_threads(own)
        with scope:
            inside = numba.get_num_threads()
            with scope:
                nested = numba.get_num_threads()
            seen[name] = (inside, nested, numba.get_num_threads())
        seen[name] += (numba.get_num_threads(),)

    threads = [threading.Thread(target=on_thread, args=(name, 2)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == {"a": (1, 1, 1, 2), "b": (1, 1, 1, 2)}


def test_blas_limit_leaves_a_library_already_at_the_limit_alone(monkeypatch):
    """A library already on the limiter's count is neither set nor restored."""
    calls = []
    monkeypatch.setattr(cpu_module._ThreadLimiter, "_probed", True)
    monkeypatch.setattr(cpu_module._ThreadLimiter, "_calls", [(lambda: 1, calls.append), (lambda: 4, calls.append)])
    with cpu_module._ThreadLimiter(1):
        assert calls == [1]
    assert calls == [1, 4]
