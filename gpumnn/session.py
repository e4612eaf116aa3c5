"""Session: MNN's pre-inference, done once, and the run that only submits prerecorded work.

Creation: input shapes -> geometry lowering (shape inference, folding, Rasters) -> scheme
selection -> placement -> memory plan per backend -> pools, constants, executions and
recordings. ``run`` then writes inputs, submits recordings (with copies between backends where
placement split the graph) and reads outputs. With ``record=False`` (eager) the per-run
preparation is redone on every run, which is what the paper's Table 2 compares against.

Placement: ``backend`` names one backend, a list of them or ``"auto"`` (every available one);
with more than one, :mod:`.scheduler.placement` chooses each op's backend by the calibrated cost
model (:mod:`.scheduler.cost`), and ``placement={node name: backend}`` pins ops. Copies between
backends go through host memory prepared at creation (a CPU tensor's own pool view, or a
staging array), so a recorded run allocates nothing for them.

Threads: ``run`` may be called from several threads at once. Each run borrows a prepared run
state (pools, executions, recordings) of its own from a small pool (:mod:`.run_states`); the
backends bound how many may be in flight, and callers past that wait their turn.
"""
from __future__ import annotations

import time
import warnings
import weakref
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from . import atomic as A
from .backends import available_backends, create_backend
from .backends.base import Backend, Execution, TensorHandle
from .backends.cpu import CpuBackend
from .backends.limits import release_freed_memory
from .errors import BackendUnavailableError, InputError
from .geometry import lower
from .geometry.fast import expand_schemes
from .ir import Graph
from .run_states import RunStatePool
from .scheduler import MemoryPlan, Placement, place, plan_memory, select_schemes
from .scheduler.calibration import calibration_for
from .scheduler.cost import CostModel
from .scheduler.resources import check_memory_plan, run_states_that_fit


def resolve_input_shapes(graph: Graph, given: Mapping[str, Sequence[int]] | None) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for every graph input: the user's, else the model's static ones."""
    given = dict(given or {})
    expected = {v.name: v for v in graph.inputs}
    unknown = sorted(set(given) - set(expected))
    if unknown:
        raise InputError(f"input_shapes names unknown input(s) {unknown}; the model's inputs are "
                         f"{[v.describe() for v in graph.inputs]}")
    shapes = {}
    for name, info in expected.items():
        if name in given:
            shape = tuple(int(d) for d in given[name])
            if info.shape is not None:
                if len(shape) != len(info.shape):
                    raise InputError(f"input {name!r}: shape {list(shape)} has rank {len(shape)}, the model "
                                     f"expects rank {len(info.shape)} ({info.describe()})")
                for got, want in zip(shape, info.shape):
                    if isinstance(want, int) and want > 0 and got != want:
                        raise InputError(f"input {name!r}: shape {list(shape)} does not match the model's {info.describe()}")
        elif info.shape is not None and all(isinstance(d, int) and d > 0 for d in info.shape):
            shape = tuple(info.shape)
        else:
            raise InputError(f"input {name!r} has no fixed shape ({info.describe()}); pass "
                             f"input_shapes={{{name!r}: (...)}} when creating the session")
        if any(d < 0 for d in shape):
            raise InputError(f"input {name!r}: negative dimension in {list(shape)}")
        shapes[name] = shape
    return shapes


@dataclass
class _Prepared:
    """Everything a run needs: pools, tensor handles, executions and (recorded mode) recordings."""

    pools: dict[str, Any]
    executions: list[Execution]
    recordings: dict[int, Any]  # step index -> recording
    io: dict[tuple[str, str], TensorHandle]  # (backend, tensor) -> handle for writes, copies, reads
    copies: dict[int, Callable[[], None]]  # step index -> the copy between backends, host memory prepared


class Session:
    """A model prepared for one backend and one set of input shapes. Create with ``Net.session``."""

    def __init__(self, graph: Graph, backend: str | Sequence[str] = "cpu",
                 input_shapes: Mapping[str, Sequence[int]] | None = None,
                 record: bool = True, threads: int | None = None, fallback: bool = True,
                 max_concurrent_runs: int | None = None, placement: Mapping[str, str] | None = None,
                 **backend_options: Any):
        started = time.perf_counter()
        self.graph = graph
        self.record = record
        self.input_shapes = resolve_input_shapes(graph, input_shapes)
        self.fallback_reason: str | None = None
        self.pins = dict(placement or {})
        #: the backends placement chooses among (``backends`` also holds the CPU, for fallback, and pinned ones)
        self.candidates: list[str] = []
        self.backends = self._start_backends(backend, threads, fallback, backend_options)
        self._closer = weakref.finalize(self, _close_backends, list(self.backends.values()))  # close(), GC or exit
        self.backend = "+".join(self.candidates) if backend != "auto" or self.fallback_reason else "auto"
        try:
            with self._active():
                self._pre_inference(record, max_concurrent_runs)
        except BaseException:  # a model we refuse must not keep devices, pools or programs alive
            self.close()
            raise
        self.prepare_seconds = time.perf_counter() - started

    def _pre_inference(self, record: bool, max_concurrent_runs: int | None) -> None:
        """Lowering, schemes, placement, memory plans, constants and the first run state."""
        # several candidates: the cost model needs measured numbers (a quick calibration the first time)
        choosing = len(self.candidates) > 1
        calibrations = {b: calibration_for(be, measure=choosing) for b, be in self.backends.items()}
        cost_model = CostModel(calibrations, record=record)
        # schemes are decided once, for the requested backend (of several, the fastest at GEMMs),
        # then Winograd / Strassen become atomic ops that any backend runs
        primary = max(self.candidates, key=lambda b: calibrations[b].matmul_macs)
        program = expand_schemes(select_schemes(lower(self.graph, self.input_shapes), self.backends[primary]))
        self.program = program
        self._output_dtypes = {info.name: self._output_dtype(info) for info in self.graph.outputs}  # run() reads
        self.placement: Placement = place(program, self.backends, self.candidates, cost_model, self.pins)
        self.memory: dict[str, MemoryPlan] = {
            b: plan_memory(lifetimes, self.backends[b].alignment)
            for b, lifetimes in self.placement.lifetimes.items() if lifetimes}
        limits = check_memory_plan(program, self.placement, self.memory, self.backends)  # ResourceError, before allocating
        self._constants: dict[tuple[str, str], TensorHandle] = {}
        for op, b in zip(program.ops, self.placement.op_backends):
            for name in op.inputs:
                if name in program.constants and (b, name) not in self._constants:
                    self._constants[(b, name)] = self.backends[b].constant(program.constants[name])
        safe = min(b.max_concurrent_runs for b in self.backends.values())
        if max_concurrent_runs is None:  # what pays on these devices (see Backend.default_concurrent_runs)
            capacity = min(safe, *(b.default_concurrent_runs for b in self.backends.values()))
        elif int(max_concurrent_runs) < 1:
            raise ValueError(f"max_concurrent_runs must be at least 1, not {max_concurrent_runs}")
        else:  # asked for: as many as are safe
            capacity = min(safe, int(max_concurrent_runs))
        # every further run state needs pools of its own: no more states than the devices can hold
        self.max_concurrent_runs = run_states_that_fit(program, self.placement, self.memory, limits, capacity)
        self._first_state = self._prepare(recorded=True) if record else None  # for the report, even under load
        self._states: RunStatePool[_Prepared] = RunStatePool(
            lambda: self._prepare_active(recorded=record), self.max_concurrent_runs, keep=record, discard=self._release,
            first=self._first_state)

    # -- creation helpers ------------------------------------------------------------------
    def _start_backends(self, spec: str | Sequence[str], threads: int | None, fallback: bool,
                        options: dict) -> dict[str, Backend]:
        """Start the requested backends (``"auto"``: every available one), the CPU (fallback for
        ops they cannot run) and any a pin names; set ``candidates``. A requested backend that
        cannot start is dropped with a warning (or, ``fallback=False``, raises)."""
        if spec == "auto":
            names = available_backends()
        else:
            names = [spec] if isinstance(spec, str) else list(dict.fromkeys(spec))
        if not names:
            raise ValueError("backend=[] names no backend")
        if options and len(names) > 1:
            raise ValueError(f"backend options {sorted(options)} are for a session on one backend, not {names}")
        backends: dict[str, Backend] = {"cpu": CpuBackend(threads=threads)}
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

    @contextmanager
    def _active(self) -> Iterator[None]:
        """Every backend ready for use from the calling thread (see ``Backend.activate``)."""
        with ExitStack() as stack:
            for backend in self.backends.values():
                stack.enter_context(backend.activate())
            yield

    def _prepare_active(self, recorded: bool) -> _Prepared:
        """``_prepare`` inside one bracket of every backend (a run state prepared while serving a
        caller, outside the bracket of its run: see ``run``)."""
        with self._active():
            return self._prepare(recorded)

    def _release(self, prepared: _Prepared) -> None:
        """Free an eager run's pools (recorded states live until ``close``)."""
        with self._active():
            for b, pool in prepared.pools.items():
                self.backends[b].release(pool)

    def _handle(self, pools: dict[str, Any], backend: str, name: str) -> TensorHandle:
        """The handle of tensor ``name`` on ``backend``: its storage's slot, seen with its own shape."""
        if name in self.program.constants:
            return self._constants[(backend, name)]
        storage = self.program.storage_of(name)
        offset = self.memory[backend].element_offset(storage)
        return self.backends[backend].tensor(pools[backend], offset, self.program.shapes[name],
                                             self.program.storage_dtype_of(name))

    def _prepare(self, recorded: bool) -> _Prepared:
        pools = {b: self.backends[b].allocate(plan.pool_bytes) for b, plan in self.memory.items()}
        executions = []
        for op, b in zip(self.program.ops, self.placement.op_backends):
            ins = [self._handle(pools, b, n) for n in op.inputs]
            outs = [self._handle(pools, b, n) for n in op.outputs]
            executions.append(self.backends[b].create_execution(op, ins, outs))
        recordings = {}
        if recorded:
            for index, step in enumerate(self.placement.steps):
                if step.kind == "run":
                    recordings[index] = self.backends[step.backend].record([executions[i] for i in step.ops])
        io = {}
        for storage, backends in self.placement.input_backends.items():
            for b in backends:
                io[(b, storage)] = self._handle(pools, b, storage)
        copies = {}
        for index, step in enumerate(self.placement.steps):
            if step.kind == "copy":
                for b in (step.source, step.backend):
                    io[(b, step.tensor)] = self._handle(pools, b, step.tensor)
                copies[index] = self._copy(io[(step.source, step.tensor)], io[(step.backend, step.tensor)],
                                           self.backends[step.source], self.backends[step.backend])
        for name, b in self.placement.output_backends.items():
            io[(b, name)] = self._handle(pools, b, name)
        if recorded:  # what this state's runs will stage through, set aside now: a run allocates nothing
            for b in self.backends:
                self.backends[b].reserve_run(max((h.nbytes for (hb, _), h in io.items() if hb == b), default=0))
        return _Prepared(pools, executions, recordings, io, copies)

    @staticmethod
    def _copy(src: TensorHandle, dst: TensorHandle, source: Backend, target: Backend) -> Callable[[], None]:
        """One copy between backends through host memory chosen now: a side whose tensor is host
        memory (``host_view``) is read or written in place, else a staging array made here."""
        src_view, dst_view = source.host_view(src), target.host_view(dst)
        if src_view is not None:
            return lambda: target.write(dst, src_view)
        if dst_view is not None:
            return lambda: source.read_into(src, dst_view)
        staging = np.empty(src.shape, dtype=src.dtype)

        def through_staging() -> None:
            source.read_into(src, staging)
            target.write(dst, staging)
        return through_staging

    # -- running ---------------------------------------------------------------------------
    def _check_inputs(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if not isinstance(inputs, Mapping):
            raise InputError(f"run() takes a dict {{input name: array}}; got {type(inputs).__name__}")
        expected = {v.name: v for v in self.graph.inputs}
        unknown = sorted(set(inputs) - set(expected))
        missing = sorted(set(expected) - set(inputs))
        if unknown or missing:
            raise InputError(f"inputs {sorted(inputs)} do not match the model's inputs "
                             f"{[v.describe() for v in self.graph.inputs]}" + (f"; unknown: {unknown}" if unknown else "")
                             + (f"; missing: {missing}" if missing else ""))
        arrays = {}
        for name, value in inputs.items():
            array = np.asarray(value)
            want = np.dtype(expected[name].dtype)
            if array.dtype != want and not (want.kind in "iu" and array.dtype.kind in "iu"):
                raise InputError(f"input {name!r} has dtype {array.dtype}, expected {want}")
            if tuple(array.shape) != self.input_shapes[name]:
                raise InputError(f"input {name!r} has shape {list(array.shape)}, this session was prepared for "
                                 f"{list(self.input_shapes[name])} (create another session for other shapes)")
            arrays[name] = _to_storage(name, array, want)
        return arrays

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run the model; returns {output name: array}. A recorded run allocates and builds nothing.

        Safe to call from several threads at once: each run borrows a run state of its own.
        """
        arrays = self._check_inputs(inputs)
        with self._states.borrow() as prepared, self._active():
            return self._run(prepared, arrays)

    def _run(self, prepared: _Prepared, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        io = prepared.io
        for name, array in arrays.items():
            storage = self.program.storage_of(name)
            for b in self.placement.input_backends.get(storage, []):
                self.backends[b].write(io[(b, storage)], array)
        for index, step in enumerate(self.placement.steps):
            backend = self.backends[step.backend]
            if step.kind == "copy":
                prepared.copies[index]()
            elif self.record:
                backend.submit(prepared.recordings[index])
            else:
                backend.run_eager([prepared.executions[i] for i in step.ops])
        results = {}
        for info in self.graph.outputs:
            name = info.name
            if name in self.program.folded_outputs:
                value = np.array(self.program.folded_outputs[name])
            else:
                b = self.placement.output_backends[name]
                value = self.backends[b].read(io[(b, name)])
            results[name] = value.astype(self._output_dtypes[name], copy=False)
        return results

    __call__ = run

    def _output_dtype(self, info) -> np.dtype:
        """The dtype an output is returned in: the model's declaration, else what lowering inferred."""
        if info.dtype is not None and np.dtype(info.dtype) != np.float32:
            return np.dtype(info.dtype)
        return np.dtype(self.program.dtypes.get(info.name, info.dtype or np.float32))

    # -- introspection ---------------------------------------------------------------------
    @property
    def counters(self) -> dict[str, dict[str, int]]:
        """Per-backend counters (buffers allocated, programs built, executions, recordings, submits)."""
        return {name: dict(backend.counters) for name, backend in self.backends.items()}

    @property
    def run_states(self) -> int:
        """Run states prepared so far (recorded mode: grows up to ``max_concurrent_runs`` as
        threads overlap, then stays; eager mode: those lent to runs in flight)."""
        return self._states.prepared

    @property
    def output_shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: (tuple(np.shape(self.program.folded_outputs[n])) if n in self.program.folded_outputs
                    else self.program.shapes[n]) for n in self.program.outputs}

    def memory_summary(self) -> dict[str, dict[str, int]]:
        """Peak pool bytes beside the naive sum of all tensor sizes, per backend."""
        return {b: {"pool_bytes": p.pool_bytes, "naive_bytes": p.naive_bytes, "tensors": len(p.offsets)}
                for b, p in self.memory.items()}

    def report_rows(self) -> list[dict[str, Any]]:
        """Per atomic op: backend, scheme, shapes, bytes, MACs, estimated cost, bytes copied in
        from other backends, fallback reason."""
        rows = []
        moved = self.placement.moved_bytes()
        prepared = self._first_state
        executions = prepared.executions if prepared else [None] * len(self.program.ops)
        for i, (op, b) in enumerate(zip(self.program.ops, self.placement.op_backends)):
            exe = executions[i]
            out_shape = self.program.shapes[op.outputs[0]]
            rows.append({
                "index": i, "op": op.kind, "node": op.source, "backend": b,
                "scheme": exe.scheme if exe is not None else getattr(op, "scheme", "-"),
                "inputs": [list(self.program.shapes.get(n, np.shape(self.program.constants.get(n)))) for n in op.inputs],
                "output": list(out_shape), "bytes": 4 * int(np.prod(out_shape, dtype=np.int64)),
                "macs": op.macs(), "cost_ms": self.placement.costs_ms[i], "moved_bytes": moved[i],
                "fallback": self.placement.fallback_reasons[i],
            })
        return rows

    def report(self) -> str:
        """A readable table of the session's plan (one line per atomic op) and its memory."""
        lines = [f"session on {self.backend!r}" + (f" (fell back: {self.fallback_reason})" if self.fallback_reason else "")
                 + f", {len(self.program.ops)} atomic ops, prepared in {self.prepare_seconds * 1000:.1f} ms,"
                 f" {'recorded' if self.record else 'eager'}"]
        lines.append("costs: " + ", ".join(f"{b} {src}" for b, src in self.placement.cost_sources.items()))
        header = (f"{'#':>4} {'op':<17} {'backend':<7} {'scheme':<10} {'output':<20} {'bytes':>10} {'MMACs':>8} "
                  f"{'est ms':>7} {'moved':>9}  node")
        lines.append(header)
        for r in self.report_rows():
            note = f"  [cpu fallback: {r['fallback']}]" if r["fallback"] else ""
            lines.append(f"{r['index']:>4} {r['op']:<17} {r['backend']:<7} {r['scheme']:<10} {str(r['output']):<20} "
                         f"{r['bytes']:>10} {r['macs'] / 1e6:>8.2f} {r['cost_ms']:>7.3f} {r['moved_bytes']:>9}  "
                         f"{r['node']}{note}")
        est = self.placement.estimate
        if est is not None:
            lines.append(f"estimated total {est.total_ms:.3f} ms: ops {est.ops_ms:.3f}, {est.segments} segment(s) "
                         f"{est.segments_ms:.3f}, {est.transfers} copies of {est.moved_bytes} bytes between backends "
                         f"and inputs/outputs {est.transfers_ms:.3f}")
        lines.extend(self.scheme_lines())
        for b, m in self.memory_summary().items():
            lines.append(f"memory[{b}]: pool {m['pool_bytes'] / 2**20:.2f} MiB for {m['tensors']} tensors "
                         f"(naive sum {m['naive_bytes'] / 2**20:.2f} MiB)")
        return "\n".join(lines)

    def scheme_lines(self) -> list[str]:
        """One line per convolution and matrix product of the model: the scheme chosen and why."""
        decisions = self.program.decisions
        return ([f"schemes ({len(decisions)} convolutions and matrix products):"]
                + [f"  {d.describe()}" for d in decisions]) if decisions else []

    def close(self) -> None:
        """Wait for runs in flight, then free everything the session holds on its devices and on the
        host. Idempotent; a run after close raises SessionClosedError. A session that is
        garbage-collected (or still open at exit) is closed too."""
        states = getattr(self, "_states", None)
        if states is not None:
            states.close()  # waits for runs in flight; executions, recordings and pools go before their backends
        self._first_state = None
        self._constants = {}
        self._closer()

    @property
    def closed(self) -> bool:
        return not self._closer.alive

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Session backend={self.backend!r} ops={len(self.program.ops)} record={self.record}>"


def _to_storage(name: str, array: np.ndarray, want: np.dtype) -> np.ndarray:
    """An input as its storage dtype (float32 or int32, see gpumnn.atomic), C-contiguous. Integer
    values must fit int32: an int64 input outside that range is refused, not wrapped."""
    storage = np.dtype(A.storage_dtype(want))
    if storage == np.int32 and array.size and array.dtype.itemsize >= 4 and array.dtype != np.int32:
        lo, hi = int(array.min()), int(array.max())
        if lo < -2**31 or hi >= 2**31:
            raise InputError(f"input {name!r} ({array.dtype}) holds values in [{lo}, {hi}]; gpumnn keeps integer "
                             "tensors as int32 on every device, so values must lie in [-2**31, 2**31)")
    return np.ascontiguousarray(array, dtype=storage)


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
