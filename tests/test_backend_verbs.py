"""Backend verbs every backend implements its own way: copies into prepared host memory
(``read_into``) and from it (``write``) without host temporaries, device-clock timing of a
recording (``measure_recording``), and the ``driver`` string a calibration is kept under."""
from __future__ import annotations

import dataclasses
import time
import tracemalloc

import numpy as np
import pytest

from conftest import require_backend
from gpumnn import atomic as A
from gpumnn.backends import REGISTRY, create_backend
from gpumnn.scheduler import calibration as C

#: every backend as the session makes it, and Vulkan once more through its staging buffers (the
#: path of a discrete GPU; lavapipe maps device memory directly)
CASES = [(name, {}) for name in REGISTRY] + [("vulkan", {"force_staging": True})]
CASE_IDS = [name + ("-staging" if options else "") for name, options in CASES]
#: elements of the tensors copied: large enough that a temporary shows in tracemalloc's peak
ELEMENTS = 1 << 16


@pytest.fixture(params=CASES, ids=CASE_IDS)
def made(request):
    name, options = request.param
    require_backend(name)
    backend = create_backend(name, **options)
    try:
        with backend.activate():
            yield backend
    finally:
        backend.close()


def _gemm(backend, n: int):
    """A recording of one n x n x n MatMul on ``backend``, its inputs filled with ones."""
    op = A.MatMul(inputs=("a", "b"), outputs=("c",), source="gemm", m=n, n=n, k=n)
    pool = backend.allocate(3 * 4 * n * n)
    a, b, c = (backend.tensor(pool, i * n * n, (n, n)) for i in range(3))
    for h in (a, b):
        backend.write(h, np.ones((n, n), np.float32))
    return backend.record([backend.create_execution(op, [a, b], [c])]), c, pool


def test_read_into_and_write_copy_at_offsets_without_host_temporaries(made):
    backend = made
    rng = np.random.default_rng(0)
    pool = backend.allocate(4 * (3 * ELEMENTS + 64))
    floats = backend.tensor(pool, 16, (ELEMENTS,), A.FLOAT32)  # tensors at offsets into the pool
    ints = backend.tensor(pool, 32 + ELEMENTS, (2, ELEMENTS // 2), A.INT32)
    backend.reserve_run(4 * ELEMENTS)  # what a session sets aside for a run's staging
    x = rng.standard_normal(ELEMENTS).astype(np.float32)
    x[:3] = [np.nan, -0.0, np.inf]
    k = rng.integers(-2**31, 2**31 - 1, size=(2, ELEMENTS // 2), dtype=np.int32)
    out_x, out_k = np.empty_like(x), np.empty_like(k)

    def cycle():
        backend.write(floats, x)
        backend.write(ints, k)
        backend.read_into(floats, out_x)
        backend.read_into(ints, out_k)

    cycle()  # warm: lazily made staging, kernels of the first copy
    allocated = backend.counters["buffers_allocated"]
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(3):
            cycle()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert out_x.tobytes() == x.tobytes() and np.array_equal(out_k, k)  # bit-exact, NaN and -0 included
    assert np.array_equal(backend.read(ints), k) and backend.read(floats).tobytes() == x.tobytes()
    assert peak < x.nbytes // 4, f"{peak} bytes of host memory allocated by copies of {x.nbytes}-byte tensors"
    assert backend.counters["buffers_allocated"] == allocated
    with pytest.raises(ValueError, match="C-contiguous"):
        backend.read_into(floats, np.empty(2 * ELEMENTS, np.float32)[::2])
    with pytest.raises(ValueError, match="int32"):
        backend.read_into(ints, np.empty(ELEMENTS, np.float32))


def test_measure_recording_reads_the_device_clock_within_the_host_time(made):
    backend = made
    if backend.name != "cpu":  # every GPU API here has device timestamps (the cpu's device is the host)
        assert backend.timer != "host"
    n = 192
    recording, c, _ = _gemm(backend, n)
    submits = backend.counters["submits"]
    start = time.perf_counter()
    device = backend.measure_recording(recording, repeats=3)
    wall = time.perf_counter() - start
    host = backend.measure(lambda: backend.submit(recording), repeats=3, best=True)
    assert backend.counters["submits"] == submits + 4 + 4
    assert np.all(backend.read(c) == n)
    # a median of 3 is at most the larger two, which the 4 submits' wall time contains
    assert 0 < 2 * device <= wall, (device, wall)
    # the device did the work: far more than nothing beside the host's own time for a submit
    assert device >= host / 50, (device, host)


def test_driver_names_the_driver_and_a_new_one_is_calibrated_anew(made, tmp_path, monkeypatch):
    backend = made
    driver = backend.driver
    assert isinstance(driver, str) and driver and driver == backend.driver
    monkeypatch.setenv("GPUMNN_CACHE_DIR", str(tmp_path))
    C.forget()
    try:
        measured = dataclasses.replace(C.paper_constants(backend), source=C.MEASURED, measured_at=1.0)
        C.store(backend, measured)
        assert C.stored(backend) == measured and measured.driver == driver
        old_path = C.cache_path(backend)
        monkeypatch.setattr(type(backend), "driver", property(lambda self: driver + " (updated)"))
        C.forget()  # a new process, after a driver update
        assert C.cache_path(backend) != old_path
        assert C.stored(backend) is None  # the old driver's figures are not reused
        assert C.calibration_for(backend).source == C.PAPER
    finally:
        C.forget()
