"""Nothing leaks: sessions created, run and closed over and over keep resident memory flat.

The soak is bench/soak.py's loop, short: a small model, a warm-up (caches that are meant to
stay fill up: compiled programs, pooled contexts, allocator arenas), then cycles of
create -> run -> close, resident memory compared after both. Before the fixes of issue 7 this
grew by 2.5-6.5 MiB on gl and vulkan over 60 cycles (a GL context and a Vulkan device with its
pipelines per session never fully came back); it is now within noise (well under 1 MiB).
"""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import gpumnn
from conftest import bench_script
from gpumnn.backends import backend_class, deferred

WARMUP, CYCLES = 20, 100
LIMIT = 2 * 2 ** 20  # bytes of RSS growth allowed over CYCLES (leaks of today: 4-10 MiB)


def _soak():
    return bench_script("soak")


@pytest.fixture(scope="module")
def tiny():
    return _soak().load_model("tiny")


def test_create_run_close_keeps_memory_flat(backend, tiny):
    """A leak grows with every cycle, so a soak past LIMIT is soaked again: a leak grows as much
    again, where a one-off step (an allocator arena or a driver cache filling once: 2-4 MiB in one
    25-cycle interval, then flat, seen in a few full runs) does not repeat."""
    net, inputs = tiny
    for attempt in ("first", "second"):
        result = _soak().soak(net, inputs, backend, CYCLES, WARMUP if attempt == "first" else 0, "tiny", every=25)
        if result.growth < LIMIT:
            return
    samples = ", ".join(f"{c}: {rss / 2 ** 20:.1f} MiB" for c, rss in result.samples)
    assert result.growth < LIMIT, f"grew past the limit in two soaks; the second: {result.line()}\n  samples: {samples}"


def test_close_frees_device_objects_without_the_garbage_collector(backend, tiny):
    """A closed session keeps no execution (kernels, scratch buffers, the device context they hold),
    and a dropped one goes by reference counting alone. Device objects left to the cyclic garbage
    collector (a shape set and its run-state pool referring to each other) were freed at some later
    collection, after the close had trimmed the heap: resident memory stepped up by 5-30 MiB."""
    net, inputs = tiny
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        sess = net.session(backend=backend, fallback=False)
        sess.run(inputs)
        shape_set = sess.shape_set()
        executions = [weakref.ref(e) for e in shape_set.first_state.executions]
        kept = [weakref.ref(o) for o in (shape_set, *sess.backends.values())]
        del shape_set
        sess.close()
        assert not [e for e in executions if e() is not None], "a closed session still holds executions"
        del sess
        assert not [r() for r in kept if r() is not None], "a dropped session left cyclic garbage"
    finally:
        if was_enabled:
            gc.enable()


def test_a_second_session_compiles_nothing(backend, tiny):
    """Compiled programs outlive a session (bounded caches), so sessions of a model after the
    first build no programs, which is both what keeps memory flat and what makes them cheap."""
    net, inputs = tiny
    with net.session(backend=backend, fallback=False) as first:
        first.run(inputs)
    with net.session(backend=backend, fallback=False) as second:
        second.run(inputs)
        assert second.counters[backend]["programs_built"] == 0


def test_session_is_a_context_manager_and_close_is_idempotent(backend, tiny):
    net, inputs = tiny
    with net.session(backend=backend, fallback=False) as sess:
        out = sess.run(inputs)["output"]
        assert np.all(np.isfinite(out)) and not sess.closed
    assert sess.closed
    sess.close()  # a second close does nothing
    with pytest.raises(gpumnn.GpumnnError, match="closed"):
        sess.run(inputs)


@pytest.fixture
def closes(monkeypatch, backend):
    """How many times the tested backend's ``close`` ran."""
    calls: list[int] = []
    cls = backend_class(backend)
    original = cls.close

    def spy(self):
        calls.append(1)
        return original(self)
    monkeypatch.setattr(cls, "close", spy)
    return calls


def test_a_session_that_fails_or_is_dropped_closes_its_backend(backend, tiny, closes):
    net, inputs = tiny
    model = _soak().tiny_model()
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "height", "width"
    with pytest.raises(gpumnn.ResourceError):  # refused after the backend started
        gpumnn.load(model).session(backend=backend, input_shapes={"input": (1, 3, 2 ** 20, 2 ** 20)},
                                   fallback=False)
    gc.collect()
    assert closes == [1], "the backend of a session that failed during creation was not closed"
    sess = net.session(backend=backend, fallback=False)
    sess.run(inputs)
    del sess  # never closed: its finalizer queues the close for the device's next safe point (issue 27)
    gc.collect()
    deferred.drain_all()  # what the next call on the device, or interpreter exit, does first
    assert closes == [1, 1], "the backend of a dropped session was not closed"
