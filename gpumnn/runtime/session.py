"""Session: a model on one backend, prepared for each set of input shapes it is run with.

MNN's pre-inference (lowering, schemes, placement, pool layout, pools, executions, recordings)
depends on the input shapes; it lives in :class:`~gpumnn.runtime.shape_set.ShapeSet`. The session holds
what does not depend on them -- the loaded graph, the started backends with their compiled
programs, the uploaded weights (:mod:`.session_shared`) -- and a bounded cache of prepared shape
sets (:mod:`.shape_sets`): ``run`` with shapes it has not prepared prepares them (MNN's
``resizeSession``), keeping the ``shape_cache`` most recently used sets so that alternating shapes
are prepared once each. A model whose inputs all have static dims is prepared at creation; one
with symbolic dims and no ``input_shapes`` waits for its first run. Small graph inputs that decide
shapes (a Reshape's target, Resize's scales, Slice's starts, ...) are found when lowering refuses
them: their values join the shapes in the cache key and are lowered as constants, so a run with
new values prepares a shape set and one with known values replays it. ``run`` then writes inputs,
submits recordings and reads outputs. With ``record=False`` (eager) the per-run preparation is
redone on every run, which is what the paper's Table 2 compares against.

Placement: ``backend`` names one backend, a list of them or ``"auto"`` (every available one);
with more than one, :mod:`.scheduler.placement` chooses each op's backend by the calibrated cost
model (:mod:`.scheduler.cost`), and ``placement={node name: backend}`` pins ops. Copies between
backends go through host memory prepared with each run state (a CPU tensor's own pool view, or a
staging array), so a recorded run allocates nothing for them.

Threads: ``run`` may be called from several threads at once, with the same or different shapes.
Each run leases its shape set (an evicted set is closed when its last run ends) and borrows one
of its run states (:mod:`.run_states`); at most ``max_concurrent_runs`` runs are in flight across
all shape sets, the backends bounding how many may be, and callers past that wait their turn.
Preparation (of a shape set or a run state) and release go one at a time (``build_lock``).
"""
from __future__ import annotations

import functools
import math
import threading
import time
import warnings
import weakref
from contextlib import ExitStack, contextmanager
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .. import atomic as A
from ..backends import available_backends, check_name, create_backend
from ..backends import deferred
from ..backends.base import DEFAULT_SUBMIT_TIMEOUT, Backend
from ..backends.cpu.backend import CpuBackend
from ..backends.limits import release_freed_memory
from .device_arrays import host_array, is_device_array
from ..errors import BackendUnavailableError, DataDependentError, DeviceArrayError, InputError, ModelError
from ..input_shapes import (ShapeKey, check_input_shape, declared_shapes, is_static, key_shapes, key_values,
                            resolve_input_shapes, shape_key)
from ..ir import Graph, inputs_behind
from .shape_set import SessionParts, ShapeSet
from ..scheduler import PoolLayout, Placement
from ..scheduler.calibration import calibration_for
from ..scheduler.cost import CostModel
from ..scheduler.precision import backend_options as precision_backend_options, check_precision, precision_run
from .shared import ConstantStore, RunReservations
from .shape_set_cache import ShapeSetCache
from .run_states import RunSlots

#: prepared shape sets a session keeps unless told otherwise (``shape_cache=``)
DEFAULT_SHAPE_CACHE = 4
#: where ``run`` returns its outputs: NumPy arrays, or device arrays of the session's backend
OUTPUT_PLACES = ("host", "device")
#: the most elements a graph input may have to have its values decide shapes (part of the cache key)
BIND_LIMIT = 1024


class Session:
    """A model prepared for one backend, following its inputs' shapes. Create with ``Net.session``.

    ``shape_cache=N`` keeps the N most recently used prepared shape sets (N >= 1; 1 prepares again
    at every change of shape, as MNN's ``resizeSession`` does); ``shape_cache=0`` fixes the session
    to its first shape set, and a run with other shapes raises InputError.
    """

    def __init__(self, graph: Graph, backend: str | Sequence[str] = "cpu",
                 input_shapes: Mapping[str, Sequence[int]] | None = None,
                 record: bool = True, threads: int | None = None, fallback: bool = True,
                 max_concurrent_runs: int | None = None, shape_cache: int = DEFAULT_SHAPE_CACHE,
                 placement: Mapping[str, str] | None = None, submit_timeout: float | None = None,
                 precision: str = "fp32", **backend_options: Any):
        started = time.perf_counter()
        #: the arithmetic of the products (``gpumnn.scheduler.precision``): "fp32", "tf32" (cuda's tensor
        #: cores), "int8" or "int4" (dynamic quantization) or "fp16" (float16 storage on a GPU backend)
        self.precision = check_precision(precision)
        backend_options = {**backend_options, **precision_backend_options(self.precision, backend)}
        self.graph = graph
        self.record = record
        if int(shape_cache) < 0:
            raise ValueError(f"shape_cache must be 0 (fixed shapes) or more, not {shape_cache}")
        if max_concurrent_runs is not None and int(max_concurrent_runs) < 1:
            raise ValueError(f"max_concurrent_runs must be at least 1, not {max_concurrent_runs}")
        self.shape_cache = int(shape_cache)
        #: graph inputs whose values decide shapes (found at preparation): their values key shape sets
        self.bound_inputs: frozenset[str] = frozenset()
        initial = declared_shapes(graph, input_shapes)  # InputError for shapes the model refuses; None: wait for a run
        self.fallback_reason: str | None = None
        self.pins = dict(placement or {})
        #: the backends placement chooses among (``backends`` also holds the CPU, for fallback, and pinned ones)
        self.candidates: list[str] = []
        timeout = DEFAULT_SUBMIT_TIMEOUT if submit_timeout is None else float(submit_timeout)
        if not timeout > 0:
            raise ValueError(f"submit_timeout must be a positive number of seconds, not {submit_timeout}")
        self.backends = self._start_backends(backend, threads, fallback, backend_options)
        for started_backend in self.backends.values():
            started_backend.submit_timeout = timeout
        # close() closes at once; a dropped session's finalizer only queues the close (_finalize)
        self._closer = weakref.finalize(self, _finalize, list(self.backends.values()))
        _open_sessions.add(self)
        self.backend = "+".join(self.candidates) if backend != "auto" or self.fallback_reason else "auto"
        self.precision = precision_run(self.precision, self.candidates)  # "fp32" where the backend fell back
        #: whose device arrays runs take and return: the first device backend among the candidates
        self.device_backend = next((b for b in self.candidates if b != "cpu"), self.candidates[0])
        # several candidates: the cost model needs measured numbers (a quick calibration the first time)
        calibrations = {b: calibration_for(be, measure=len(self.candidates) > 1) for b, be in self.backends.items()}
        cost_model = CostModel(calibrations, record=record,
                               host_devices=frozenset(b for b, be in self.backends.items() if not be.info.is_gpu))
        scheme_backend = max(self.candidates, key=lambda b: calibrations[b].matmul_macs)
        safe = min(b.max_concurrent_runs for b in self.backends.values())
        if max_concurrent_runs is None:  # what pays on these devices (see Backend.default_concurrent_runs)
            concurrent = min(safe, *(b.default_concurrent_runs for b in self.backends.values()))
        else:  # asked for: as many as are safe
            concurrent = min(safe, int(max_concurrent_runs))
        self._run_slots = RunSlots(concurrent)  # runs in flight, across shape sets
        self._fast_inputs = _fast_input_checks(graph)
        build_lock = threading.RLock()
        self._parts = SessionParts(graph, self.backends, tuple(self.candidates), self.pins, cost_model, scheme_backend,
                                   self.device_backend, record, concurrent, ConstantStore(self.backends),
                                   RunReservations(self.backends, concurrent), build_lock,
                                   functools.partial(_activate, dict(self.backends)), self.precision)
        parts = self._parts
        self._cache: ShapeSetCache[ShapeKey, ShapeSet] = ShapeSetCache(
            max(1, self.shape_cache), lambda key: ShapeSet(parts, key_shapes(key), key_values(key)), ShapeSet.close, build_lock,
            fixed=_fixed_shapes_error if self.shape_cache == 0 else None)
        try:
            if initial is not None:
                try:
                    with self._cache.lease(shape_key(graph, initial)):
                        pass
                except DataDependentError as exc:
                    if not self._bind(exc, initial):
                        raise  # else: prepared at the first run, which brings the values
        except BaseException:  # a model we refuse must not keep devices, pools or programs alive
            self.close()
            raise
        self.prepare_seconds = time.perf_counter() - started

    # -- creation helpers ------------------------------------------------------------------
    def _start_backends(self, spec: str | Sequence[str], threads: int | None, fallback: bool,
                        options: dict) -> dict[str, Backend]:
        """Start the requested backends (``"auto"``: every available one), the CPU (fallback for
        ops they cannot run) and any a pin names; set ``candidates``. A requested backend that
        cannot start is dropped with a warning (or, ``fallback=False``, raises); a name gpumnn
        does not know raises UnknownBackendError."""
        names = available_backends() if spec == "auto" else [spec] if isinstance(spec, str) else list(dict.fromkeys(spec))
        if not names:
            raise ValueError("backend=[] names no backend")
        for name in [*names, *self.pins.values()]:  # a misspelt name raises; only a known one falls back
            check_name(name)
        if options and len(names) > 1:
            raise ValueError(f"backend options {sorted(options)} are for a session on one backend, not {names}")
        # a cpu-only session's options are the cpu backend's own (checked there)
        backends: dict[str, Backend] = {"cpu": CpuBackend(threads=threads, **(options if names == ["cpu"] else {}))}
        failed = []
        for name in dict.fromkeys([*names, *self.pins.values()]):
            if name in backends:
                continue
            try:
                backends[name] = create_backend(name, **(options if name in names else {}))
            except BackendUnavailableError as exc:
                if not fallback or name not in names:
                    _close_backends(list(backends.values()))
                    raise
                failed.append(str(exc))
        self.candidates = [n for n in names if n in backends] or ["cpu"]
        if failed:
            self.fallback_reason = "; ".join(failed)
            instead = "the cpu backend" if self.candidates == ["cpu"] else f"{self.candidates}"
            warnings.warn(f"{self.fallback_reason}; running on {instead} instead (pass fallback=False to refuse)",
                          RuntimeWarning, stacklevel=4)
        return {n: backends[n] for n in [*self.candidates, *backends] if n in backends}

    # -- shape sets ------------------------------------------------------------------------
    def _key(self, shapes: Mapping[str, Sequence[int]], values: Mapping[str, np.ndarray] | None = None) -> ShapeKey:
        """The cache key of complete, checked input shapes and of the bound inputs' values."""
        return shape_key(self.graph, shapes, values)

    def _bind(self, exc: DataDependentError, shapes: Mapping[str, Sequence[int]]) -> bool:
        """Bind the small graph inputs ``exc``'s tensor is computed from (their values then key shape
        sets); False when there is none left to bind."""
        wanted = {n for n in inputs_behind(self.graph, exc.tensor) - self.bound_inputs
                  if math.prod(shapes[n]) <= BIND_LIMIT}
        if not wanted:
            return False
        with self._parts.build_lock:  # replaced, not changed in place: other threads may be reading it
            self.bound_inputs = self.bound_inputs | wanted
        return True

    def shape_set(self, input_shapes: Mapping[str, Sequence[int]] | None = None) -> ShapeSet:
        """The prepared shape set for ``input_shapes`` (prepared now if not kept; static dims may
        be left out), or, without them, the one most recently run (or prepared at creation).
        InputError, saying how to give shapes, when there is none yet."""
        if input_shapes is None and self._cache.recent is not None:
            kept = self._cache.peek(self._cache.recent)
            if kept is not None:
                return kept
            if self.bound_inputs:
                with self._cache.lease(self._cache.recent) as shape_set:
                    return shape_set
            input_shapes = key_shapes(self._cache.recent)
        shapes = resolve_input_shapes(self.graph, input_shapes)
        if self.bound_inputs:  # values decide: the shape set most recently used at these shapes
            keys = [k for k in self._cache.keys() if key_shapes(k) == shapes]
            if keys and (kept := self._cache.peek(keys[-1])) is not None:
                return kept
        key = self._key(shapes)
        kept = self._cache.peek(key)
        if kept is not None:
            return kept
        with self._cache.lease(key) as shape_set:
            return shape_set

    @property
    def stats(self) -> dict[str, int]:
        """How the session followed its inputs' shapes: shape sets prepared, runs that found
        theirs kept (cache hits), sets evicted, sets kept now and the bound; constants uploaded
        and uploads reused by a later shape set instead of uploading again."""
        constants = self._parts.constants
        return {**self._cache.stats(), "constant_uploads": constants.uploads, "constant_reuses": constants.reuses}

    @property
    def shape_sets(self) -> list[dict[str, tuple[int, ...]]]:
        """The input shapes of every prepared shape set kept, least recently used first."""
        return [key_shapes(key) for key in self._cache.keys()]

    # -- running ---------------------------------------------------------------------------
    def _device_backend(self, what: str) -> Backend:
        """The session's backend, where it takes device arrays; else DeviceArrayError saying why
        not (``what``: the device array or request refused)."""
        backend = self.backends[self.device_backend]
        if backend.device_arrays_unsupported is None:
            return backend
        fell_back = f" (the session fell back to cpu: {self.fallback_reason})" if self.fallback_reason else ""
        raise DeviceArrayError(f"{what}: the session runs on the {self.device_backend} backend{fell_back}, which takes and "
                               f"returns host arrays only: {backend.device_arrays_unsupported}")

    def _check_inputs(self, inputs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[int, ...]], dict[str, Any]]:
        """The inputs in storage dtypes, their shapes (taken before the conversion, which makes a
        0-d array 1-d) and the arrays as given. A device array (see ``gpumnn.runtime.device_arrays``)
        becomes the backend's own, still on the device; its conversion to the storage dtype is the
        backend's ``write``."""
        if not isinstance(inputs, Mapping):
            raise InputError(f"run() takes a dict {{input name: array}}; got {type(inputs).__name__}")
        expected = {v.name: v for v in self.graph.inputs}
        unknown = sorted(set(inputs) - set(expected))
        missing = sorted(set(expected) - set(inputs))
        if unknown or missing:
            raise InputError(f"inputs {sorted(inputs)} do not match the model's inputs "
                             f"{[v.describe() for v in self.graph.inputs]}" + (f"; unknown: {unknown}" if unknown else "")
                             + (f"; missing: {missing}" if missing else ""))
        arrays, shapes, given = {}, {}, {}
        for name, value in inputs.items():
            if is_device_array(value):
                array = self._device_backend(f"input {name!r} is a device array ({type(value).__name__})").device_array(value)
            else:
                array = host_array(value)
            want = np.dtype(expected[name].dtype)
            try:
                A.storage_dtype(want)
            except TypeError:  # as lowering words it, for a session not prepared yet
                raise ModelError(f"graph input {expected[name].describe()}: gpumnn runs float, integer and "
                                 "bool tensors only") from None
            declared = expected[name].declared
            if array.dtype != want and not (want.kind in "iu" and array.dtype.kind in "iu") \
                    and array.dtype.name != declared:
                raise InputError(f"input {name!r} has dtype {array.dtype}, expected {declared or want}")
            if expected[name].value_range is not None:
                _check_value_range(name, declared, expected[name].value_range, array)
            shapes[name] = check_input_shape(expected[name], tuple(array.shape))
            arrays[name] = _to_storage(name, array, want)
            given[name] = array
        return arrays, shapes, given

    @contextmanager
    def _lease(self, inputs: Mapping[str, Any]) -> Iterator[tuple[ShapeSet, dict[str, Any]]]:
        """The shape set for these inputs, leased (prepared now if new), and the arrays a run of it
        writes (in storage dtypes; the bound inputs are its constants). Lowering refusing a small
        graph input that decides a shape binds it, and the key then holds its values."""
        arrays, shapes, given = self._check_inputs(inputs)
        with ExitStack() as stack:
            while True:
                values = {n: self._host(given[n]) for n in self.bound_inputs}
                try:
                    shape_set = stack.enter_context(self._cache.lease(self._key(shapes, values)))
                    break
                except DataDependentError as exc:
                    if not self._bind(exc, shapes):
                        raise
            yield shape_set, {n: a for n, a in arrays.items() if n not in shape_set.values}

    def _host(self, array: Any) -> np.ndarray:
        if isinstance(array, np.ndarray):
            return array
        return np.asarray(self.backends[self.device_backend].to_host(array))

    def run(self, inputs: Mapping[str, Any], outputs: str = "host") -> dict[str, Any]:
        """Run the model; returns {output name: array}. Inputs of shapes the session has not
        prepared are prepared for first (then kept, see ``shape_cache``); a recorded run on
        prepared shapes allocates and builds nothing.

        Inputs are host arrays (NumPy, or anything ``numpy.asarray`` or ``numpy.from_dlpack``
        takes) or, on a backend that takes them (cuda), device arrays: CuPy arrays and DLPack
        tensors on its GPU, copied device to device. ``outputs="device"`` returns the backend's
        device arrays (CuPy) instead of NumPy arrays; elsewhere it is a DeviceArrayError saying
        why the backend cannot.

        Safe to call from several threads at once, with the same or different shapes.
        """
        if outputs not in OUTPUT_PLACES:
            raise ValueError(f"outputs={outputs!r}: expected one of {', '.join(map(repr, OUTPUT_PLACES))}")
        device = self._device_backend('outputs="device"') if outputs == "device" else None
        ready = self._ready_inputs(inputs) if device is None and not self.bound_inputs else None
        if ready is not None:  # every input passed the fast checks: key them by shape alone
            arrays, key = ready
            try:
                entry = self._cache.acquire(key)
            except DataDependentError:
                pass  # a graph input decides a shape: the full path binds it
            else:
                try:
                    with self._run_slots:
                        return entry.value.run(arrays)
                finally:
                    self._cache.release(entry)
        with self._lease(inputs) as (shape_set, arrays), self._run_slots:
            return shape_set.run(arrays, device_outputs=device is not None)

    def _ready_inputs(self, inputs: Any) -> tuple[dict[str, np.ndarray], ShapeKey] | None:
        """The inputs in their storage dtypes, in graph-input order, and their shape-set key, when
        each is a C-contiguous NumPy array of the input's own dtype, of the declared rank with every
        static dim matched: as they are, or converted by ``_to_storage`` as the full checks
        (``_check_inputs``) would (an int64 input to int32, its values' range checked); else None,
        and the full checks decide (converting, or raising InputError). The key is ``shape_key``'s
        for these shapes and no bound values."""
        checks = self._fast_inputs
        if checks is None or type(inputs) is not dict or len(inputs) != len(checks):
            return None
        arrays, key = {}, []
        for name, dtype, rank, static, converted in checks:
            array = inputs.get(name)
            if type(array) is not np.ndarray or array.dtype != dtype or not array.flags.c_contiguous:
                return None
            shape = array.shape
            if not shape or (rank is not None and len(shape) != rank):
                return None
            for axis, size in static:
                if shape[axis] != size:
                    return None
            arrays[name] = _to_storage(name, array, dtype) if converted else array
            key.append((name, shape))
        return arrays, tuple(key)

    __call__ = run

    # -- introspection (of the shape set most recently run, unless shapes are given) --------
    @property
    def counters(self) -> dict[str, dict[str, int]]:
        """Per-backend counters (buffers allocated, programs built, executions, recordings, submits)."""
        return {name: dict(backend.counters) for name, backend in self.backends.items()}

    @property
    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        """The input shapes of the shape set most recently run (or prepared at creation)."""
        return dict(self.shape_set().input_shapes)

    @property
    def program(self) -> A.AtomicProgram:
        return self.shape_set().program

    @property
    def placement(self) -> Placement:
        return self.shape_set().placement

    @property
    def memory(self) -> dict[str, PoolLayout]:
        return self.shape_set().memory

    @property
    def max_concurrent_runs(self) -> int:
        """Runs that may be in flight at once: the session's bound, lowered by what the pools of
        the current shape set leave room for on the devices."""
        if self._cache.recent is None:
            return self._parts.concurrent_runs
        return self.shape_set().max_concurrent_runs

    @property
    def run_states(self) -> int:
        """Run states of the current shape set prepared so far (recorded mode: grows up to
        ``max_concurrent_runs`` as threads overlap, then stays; eager mode: those lent to runs in flight)."""
        return self.shape_set().run_states

    @property
    def output_shapes(self) -> dict[str, tuple[int, ...]]:
        return self.shape_set().output_shapes

    def memory_summary(self, input_shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, dict[str, int]]:
        """Per backend: peak pool bytes beside the naive sum of all tensor sizes, and the weights' bytes."""
        return self.shape_set(input_shapes).memory_summary()

    def report_rows(self, input_shapes: Mapping[str, Sequence[int]] | None = None) -> list[dict[str, Any]]:
        """Per atomic op: backend, scheme, shapes, bytes, MACs, estimated cost, fallback reason."""
        return self.shape_set(input_shapes).report_rows()

    def scheme_lines(self, input_shapes: Mapping[str, Sequence[int]] | None = None) -> list[str]:
        """One line per convolution and matrix product of the model: the scheme chosen and why."""
        return self.shape_set(input_shapes).scheme_lines()

    def report(self, input_shapes: Mapping[str, Sequence[int]] | None = None) -> str:
        """A readable table of one shape set's plan (one line per atomic op) and its memory: the
        set for ``input_shapes``, else the one most recently run."""
        shape_set = self.shape_set(input_shapes)
        stats = self._cache.stats()
        lines = [f"session on {self.backend!r}" + (f" (fell back: {self.fallback_reason})" if self.fallback_reason else "")
                 + f", input shapes {shape_set.describe_shapes()}: {len(shape_set.program.ops)} atomic ops, prepared in "
                 f"{shape_set.prepare_seconds * 1000:.1f} ms, {'recorded' if self.record else 'eager'}"
                 f" ({stats['cached']} of at most {stats['limit']} shape sets kept, {stats['prepares']} prepared)"]
        placement = shape_set.placement
        lines.append("costs: " + ", ".join(f"{b} {src}" for b, src in placement.cost_sources.items()))
        lines.append(f"{'#':>4} {'op':<17} {'backend':<7} {'scheme':<10} {'output':<20} {'bytes':>10} {'MMACs':>8} "
                     f"{'est ms':>7} {'moved':>9} {'launches':>8}  node")
        for r in shape_set.report_rows():
            note = f"  [cpu fallback: {r['fallback']}]" if r["fallback"] else ""
            launches = "-" if r["launches"] is None else r["launches"]
            lines.append(f"{r['index']:>4} {r['op']:<17} {r['backend']:<7} {r['scheme']:<10} {str(r['output']):<20} "
                         f"{r['bytes']:>10} {r['macs'] / 1e6:>8.2f} {r['cost_ms']:>7.3f} {r['moved_bytes']:>9} "
                         f"{launches:>8}  {r['node']}{note}")
        lines.append(shape_set.launch_line())
        est = placement.estimate
        if est is not None:
            lines.append(f"estimated total {est.total_ms:.3f} ms: ops {est.ops_ms:.3f}, {est.segments} segment(s) "
                         f"{est.segments_ms:.3f}, {est.transfers} copies of {est.moved_bytes} bytes between backends "
                         f"and inputs/outputs {est.transfers_ms:.3f}"
                         + (f", less {est.overlap_ms:.3f} overlapped" if est.overlap_ms else ""))
        if placement.sync is not None and placement.sync.overlaps:
            lines.append(f"overlap: {placement.sync.overlaps} segment(s) submitted without waiting, their branch "
                         f"on another backend running meanwhile")
        lines.extend(shape_set.scheme_lines())
        lines.extend(shape_set.precision_lines)
        for b, m in shape_set.memory_summary().items():
            lines.append(f"memory[{b}]: pool {m['pool_bytes'] / 2**20:.2f} MiB for {m['tensors']} tensors "
                         f"(naive sum {m['naive_bytes'] / 2**20:.2f} MiB), weights {m['constant_bytes'] / 2**20:.2f} MiB")
        return "\n".join(lines)

    def close(self) -> None:
        """Wait for runs in flight, then free everything the session holds on its devices and on the
        host. Idempotent; a run after close raises SessionClosedError. A session that is
        garbage-collected (or still open at exit) is closed too."""
        cache = getattr(self, "_cache", None)
        if cache is not None:
            for shape_set in cache.close():
                shape_set.close()  # waits for its runs in flight; pools and constants go before their backends
        parts = getattr(self, "_parts", None)
        closer = self._closer.detach()  # None: closed before (or by its finalizer)
        if closer is not None:
            _, _, (backends,), _ = closer
            if parts is not None:
                with parts.build_lock:  # no preparation half done on a closed device
                    _close_backends(backends)
            else:
                _close_backends(backends)

    @property
    def closed(self) -> bool:
        return not self._closer.alive

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        recent = self._cache.recent
        return (f"<Session backend={self.backend!r} shapes={_describe(recent) if recent else 'not yet known'} "
                f"shape_sets={len(self._cache)} record={self.record}>")


def _fast_input_checks(graph: Graph) -> tuple[tuple[str, np.dtype, int | None, tuple[tuple[int, int], ...], bool], ...] | None:
    """Per graph input, what ``Session._ready_inputs`` compares an array with: its name, dtype,
    rank (None: any), static dims as (axis, size), and whether the dtype is stored as another
    (float64 as float32, int64 as int32), so that the array is converted. None when some input's
    arrays always need the full checks: a dtype gpumnn does not run, or one with a value range (int4)."""
    checks = []
    for info in graph.inputs:
        try:
            dtype = np.dtype(info.dtype)
            converted = np.dtype(A.storage_dtype(dtype)) != dtype
        except TypeError:
            return None
        if info.value_range is not None:
            return None
        rank = None if info.shape is None else len(info.shape)
        static = () if info.shape is None else tuple((axis, d) for axis, d in enumerate(info.shape) if is_static(d))
        checks.append((info.name, dtype, rank, static, converted))
    return tuple(checks)


def _fixed_shapes_error(key: ShapeKey, fixed: ShapeKey) -> InputError:
    return InputError(f"input shapes {_describe(key)} differ from {_describe(fixed)}, which this session is "
                      "prepared for; it was created with shape_cache=0, which fixes its shapes (a session "
                      "with shape_cache >= 1 prepares for new shapes)")


def _describe(key: ShapeKey) -> str:
    values = key_values(key)
    return "{" + ", ".join(f"{name}: {list(shape)}" + (f" = {values[name].tolist()}" if name in values else "")
                           for name, shape in key_shapes(key).items()) + "}"


@contextmanager
def _activate(backends: Mapping[str, Backend], names: Iterable[str] | None = None) -> Iterator[None]:
    """The backends ``names`` (None: every one) ready for use from the calling thread (see
    ``Backend.activate``), in the session's order."""
    wanted = set(backends) if names is None else set(names)
    with ExitStack() as stack:
        for name, backend in backends.items():
            if name in wanted:
                stack.enter_context(backend.activate())
        yield


def _check_value_range(name: str, declared: str, value_range: tuple[int, int], array: Any) -> None:
    """An input of a type NumPy lacks (int4, uint4), given one value an element in a wider integer
    dtype, must hold values of its type's range."""
    lo, hi = value_range
    if array.size and (int(array.min()) < lo or int(array.max()) > hi):
        raise InputError(f"input {name!r} is {declared}: its values must lie in [{lo}, {hi}], one per element of an "
                         f"integer array; got values in [{int(array.min())}, {int(array.max())}]")


def _to_storage(name: str, array: Any, want: np.dtype) -> Any:
    """An input as its storage dtype (see gpumnn.atomic: float16, int8 and uint8 as themselves,
    wider floats as float32, other integers and bool as int32), C-contiguous. Integer values must
    fit the storage dtype: an int64 input outside int32 is refused, not wrapped. A device array is
    checked alike (on its device) and left to the backend's ``write`` to convert."""
    storage = np.dtype(A.storage_dtype(want))
    if storage.kind in "iu" and array.size and array.dtype.kind in "iu" and not np.can_cast(array.dtype, storage):
        lo, hi, limits = int(array.min()), int(array.max()), np.iinfo(storage)
        if lo < limits.min or hi > limits.max:
            raise InputError(f"input {name!r} ({array.dtype}) holds values in [{lo}, {hi}]; gpumnn keeps {want} "
                             f"tensors as {storage} on every device, so values must lie in [{limits.min}, {limits.max}]")
    if not isinstance(array, np.ndarray):
        return array
    return np.ascontiguousarray(array, dtype=storage)


#: sessions not yet closed, closed first at interpreter exit (``deferred.on_exit``)
_open_sessions: "weakref.WeakSet[Session]" = weakref.WeakSet()


def _close_open_sessions() -> None:
    for session in list(_open_sessions):
        session._closer()


deferred.on_exit(_close_open_sessions, first=True)


def _finalize(backends: list[Backend]) -> None:
    """A dropped session's finalizer. It may run inside another session's call on the same
    device (wherever the garbage collector starts) or on another thread, so it frees nothing
    there: each backend queues its close for its device's next safe point (``close_later``,
    see ``backends.deferred``). At interpreter exit nothing is in flight: it closes at once."""
    if deferred.exiting:
        _close_backends(backends)
        return
    for backend in backends:
        backend.close_later()


def _close_backends(backends: list[Backend]) -> None:
    """Close every backend (the first error is raised after all were tried), then hand the heap
    pages their drivers freed back to the operating system."""
    error: BaseException | None = None
    for backend in backends:
        try:
            backend.close()
        except BaseException as exc:  # noqa: BLE001 -- close the others first
            error = error or exc
    release_freed_memory()
    if error is not None:
        raise error
