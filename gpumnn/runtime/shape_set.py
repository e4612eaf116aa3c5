"""One shape set prepared: MNN's pre-inference for one set of concrete input shapes.

Input shapes -> geometry lowering (shape inference, folding, Rasters) -> scheme selection ->
placement -> pool layout per backend -> constants, then run states (pools, executions and
recordings: :mod:`.run_states`) lent to runs. Everything here depends on the input shapes;
what does not (the loaded graph, the backends with their compiled programs, uploaded weights)
belongs to the :class:`~gpumnn.runtime.session.Session`, which keeps several shape sets
(:mod:`.shape_set_cache`) and hands each the shared parts.
"""
from __future__ import annotations

import threading
import time
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from .. import atomic as A
from ..backends.base import Backend, Execution, TensorHandle
from ..geometry import lower
from ..scheduler.expansion import expand_schemes
from ..scheduler.precision import (apply_precision, apply_storage_precision, int8_channels_last,
                                   int8_global_average_pool, lowers_static_int8, one_pass_quantize)
from ..input_shapes import shape_key
from ..ir import Graph, ValueInfo
from .run_states import RunStatePool
from ..scheduler import PoolLayout, Placement, place, lay_out_pool, select_schemes, write_concats_in_place
from ..scheduler.placement import without_ops
from ..scheduler.cost import CostModel
from ..scheduler.resources import check_pool_layouts, run_states_that_fit
from .shared import ConstantStore, RunReservations


@dataclass
class RunState:
    """Everything a run needs: pools, tensor handles, executions and (recorded mode) recordings."""

    pools: dict[str, Any]
    executions: list[Execution]
    recordings: dict[int, Any]  # step index -> recording
    io: dict[tuple[str, str], TensorHandle]  # (backend, tensor) -> handle for writes, copies, reads
    copies: dict[int, Callable[[], None]]  # step index -> the copy between backends, host memory prepared
    #: what a run of host arrays does, resolved once from ``io``: per input, the backends and handles it is written to
    writes: tuple[tuple[str, tuple[tuple[Backend, TensorHandle], ...]], ...] = ()
    #: per output: (name, backend and handle to read, or None for a folded output, dtype returned)
    reads: tuple[tuple[str, tuple[Backend, TensorHandle] | None, np.dtype], ...] = ()
    #: the recordings to submit in order, where every step is one submitted and waited for; else None (``_steps``)
    submits: tuple[tuple[Backend, Any], ...] | None = None


@dataclass(frozen=True)
class SessionParts:
    """What a session's shape sets share (see :mod:`.session_shared`)."""

    graph: Graph
    backends: Mapping[str, Backend]
    candidates: tuple[str, ...]  # the backends placement chooses among ("cpu" alone after a fallback)
    pins: Mapping[str, str]  # node name -> backend, for ops pinned by the caller
    cost_model: CostModel  # calibrated (or the paper's) costs per backend, for placement
    scheme_backend: str  # schemes are decided once, for this one: of several, the fastest at GEMMs
    device_backend: str  # whose device arrays runs take and return
    record: bool
    concurrent_runs: int  # run states a shape set may prepare: the session's bound
    constants: ConstantStore
    reservations: RunReservations
    build_lock: threading.RLock  # one preparation (or release) at a time across the session
    #: ``active(names)``: those backends (None: every one) usable from this thread, for a bracket
    active: Callable[..., AbstractContextManager[None]]
    #: the arithmetic the program is rewritten for (``gpumnn.scheduler.precision``): "fp32", "int8", "int4" or "fp16"
    precision: str = "fp32"


class ShapeSet:
    """A model prepared for one set of input shapes on the session's backends."""

    def __init__(self, parts: SessionParts, input_shapes: Mapping[str, tuple[int, ...]],
                 values: Mapping[str, np.ndarray] | None = None):
        started = time.perf_counter()
        self.parts = parts
        self.input_shapes = {v.name: tuple(input_shapes[v.name]) for v in parts.graph.inputs}
        #: inputs whose values decide shapes, lowered as constants of these values (not written by runs)
        self.values = dict(values or {})
        self.key = shape_key(parts.graph, self.input_shapes, self.values)
        self.closed = False
        self._states: RunStatePool[RunState] | None = None
        self.first_state: RunState | None = None
        try:
            with parts.active():
                self._pre_inference()
        except BaseException:  # a shape set we refuse must not keep pools or constants
            self.close()
            raise
        self.prepare_seconds = time.perf_counter() - started

    def _pre_inference(self) -> None:
        parts = self.parts
        # schemes are decided once, for one backend, then Winograd / Strassen become atomic ops any backend runs
        scheme_backend = parts.backends[parts.scheme_backend]
        lowered = apply_precision(lower(parts.graph, self.input_shapes, self.values,
                                        int8_ops=lowers_static_int8(scheme_backend),
                                        int8_channels_last=int8_channels_last(scheme_backend),
                                        int8_average_pool=int8_global_average_pool(scheme_backend),
                                        one_pass_quantize=one_pass_quantize(scheme_backend)),
                                  parts.precision)
        program = expand_schemes(select_schemes(lowered, scheme_backend,
                                                parts.cost_model.calibrations.get(parts.scheme_backend)),
                                 scheme_backend)
        #: what the session's precision did to the program (report lines; none for fp32 and int8)
        program, self.precision_lines = apply_storage_precision(program, parts.precision, scheme_backend)
        self.program = program
        self.output_dtypes = {info.name: self._output_dtype(info) for info in parts.graph.outputs}  # run() reads
        placement = place(program, parts.backends, parts.candidates, parts.cost_model, parts.pins)
        program, kept = write_concats_in_place(program, placement.op_backends,
                                               {b: backend.alignment for b, backend in parts.backends.items()})
        if len(kept) < len(placement.op_backends):
            placement = without_ops(program, placement, kept, list(parts.backends), parts.cost_model)
        self.program = program
        self.placement: Placement = placement
        #: the backends a run of this set touches: a run activates only these (an OpenGL context
        #: made current per run, and its lock, cost an auto session that placed nothing there)
        self.run_backends = frozenset(self.placement.op_backends) | set(self.placement.output_backends.values()) | {
            b for backends in self.placement.input_backends.values() for b in backends}
        #: whether a run of host arrays may skip the ``active`` bracket: no backend it touches has one
        self.bracket_free = all(type(parts.backends[b]).activate is Backend.activate for b in self.run_backends)
        self.memory: dict[str, PoolLayout] = {
            b: lay_out_pool(lifetimes, parts.backends[b].alignment)
            for b, lifetimes in self.placement.lifetimes.items() if lifetimes}
        limits = check_pool_layouts(program, self.placement, self.memory, parts.backends)  # before allocating
        self._constants: dict[tuple[str, str], TensorHandle] = {}
        for op, b in zip(program.ops, self.placement.op_backends):
            for name in op.inputs:
                if name in program.constants and (b, name) not in self._constants:
                    self._constants[(b, name)] = parts.constants.acquire(self, b, program.constants[name])
        # every further run state needs pools of its own: no more states than the devices can hold
        self.max_concurrent_runs = run_states_that_fit(program, self.placement, self.memory, limits,
                                                       parts.concurrent_runs)
        self.first_state = self._prepare(recorded=True) if parts.record else None
        #: per op, the scheme its backend runs (read from the executions now: they go at ``close``)
        self.schemes: list[str] = ([exe.scheme for exe in self.first_state.executions] if self.first_state
                                   else [getattr(op, "scheme", "-") for op in program.ops])
        #: per op, the kernel launches (dispatches, work items) a recorded run submits for it; None
        #: where nothing was recorded (an eager session)
        self.launches: list[int | None] = ([len(exe.work) for exe in self.first_state.executions] if self.first_state
                                           else [None] * len(program.ops))
        self._states = RunStatePool(self.max_concurrent_runs, keep=parts.record, first=self.first_state,
                                    make_lock=parts.build_lock)

    # -- run states ------------------------------------------------------------------------
    def _prepare_active(self) -> RunState:
        """``_prepare`` inside one bracket of every backend (a run state prepared while serving a
        caller, outside the bracket of its run: see ``run``)."""
        with self.parts.active():
            return self._prepare(self.parts.record)

    def _borrow(self) -> AbstractContextManager[RunState]:
        """A run state lent by the pool (made or discarded with this set's methods, handed over
        per borrow so that the pool holds no reference back to the set)."""
        assert self._states is not None
        return self._states.borrow(self._prepare_active, self._release)

    def _release(self, state: RunState) -> None:
        """Free a run state's executions' own buffers and its pools (eager runs after each run;
        recorded states at close)."""
        with self.parts.active():
            for exe, b in zip(state.executions, self.placement.op_backends):
                self.parts.backends[b].release_execution(exe)
            for b, pool in state.pools.items():
                self.parts.backends[b].release(pool)

    def _handle(self, pools: dict[str, Any], backend: str, name: str) -> TensorHandle:
        """The handle of tensor ``name`` on ``backend``: its storage's slot, seen with its own shape."""
        if name in self.program.constants:
            return self._constants[(backend, name)]
        storage = self.program.storage_of(name)
        dtype = self.program.storage_dtype_of(name)
        offset = (self.memory[backend].offsets[storage] + self.program.offset_in_storage(name)) // A.ITEMSIZE[dtype]
        return self.parts.backends[backend].tensor(pools[backend], offset, self.program.shapes[name], dtype)

    def _prepare(self, recorded: bool) -> RunState:
        backends = self.parts.backends
        pools = {b: backends[b].allocate(layout.pool_bytes) for b, layout in self.memory.items()}
        executions = []
        for op, b in zip(self.program.ops, self.placement.op_backends):
            ins = [self._handle(pools, b, n) for n in op.inputs]
            outs = [self._handle(pools, b, n) for n in op.outputs]
            executions.append(backends[b].create_execution(op, ins, outs))
        recordings = {}
        if recorded:
            for index, step in enumerate(self.placement.steps):
                if step.kind == "run":
                    recordings[index] = backends[step.backend].record([executions[i] for i in step.ops])
        io = {}
        for storage, bs in self.placement.input_backends.items():
            for b in bs:
                io[(b, storage)] = self._handle(pools, b, storage)
        copies = {}
        for index, step in enumerate(self.placement.steps):
            if step.kind == "copy":
                for b in (step.source, step.backend):
                    io[(b, step.tensor)] = self._handle(pools, b, step.tensor)
                copies[index] = _copy_between(io[(step.source, step.tensor)], io[(step.backend, step.tensor)],
                                              backends[step.source], backends[step.backend])
        for name, b in self.placement.output_backends.items():
            io[(b, name)] = self._handle(pools, b, name)
        if recorded:  # what this state's runs will stage through, set aside now: a run allocates nothing
            for b in self.run_backends | {self.parts.device_backend}:  # not on backends the runs never touch
                self.parts.reservations.reserve(b, max((h.nbytes for (hb, _), h in io.items() if hb == b), default=0))
        writes = tuple((name, tuple((backends[b], io[(b, self.program.storage_of(name))])
                                    for b in self.placement.input_backends.get(self.program.storage_of(name), ())))
                       for name in self.input_shapes if name not in self.values)
        reads = tuple((info.name, None if info.name in self.program.folded_outputs else
                       (backends[self.placement.output_backends[info.name]],
                        io[(self.placement.output_backends[info.name], info.name)]),
                       self.output_dtypes[info.name]) for info in self.parts.graph.outputs)
        sync = self.placement.sync
        submits = None
        if recorded and all(step.kind == "run" for step in self.placement.steps) and (
                sync is None or not any(sync.detached) and not any(sync.waits) and not sync.final):
            submits = tuple((backends[step.backend], recordings[index]) for index, step in enumerate(self.placement.steps))
        return RunState(pools, executions, recordings, io, copies, writes, reads, submits)

    # -- running ---------------------------------------------------------------------------
    def run(self, arrays: Mapping[str, Any], device_outputs: bool = False) -> dict[str, Any]:
        """Run on a borrowed run state; ``arrays`` are checked, in storage dtypes, of this set's
        shapes: NumPy arrays, or device arrays of the session's backend (``Backend.device_array``).
        ``device_outputs``: return the session backend's device arrays instead of NumPy arrays."""
        assert self._states is not None
        state = self._states.take(self._prepare_active)
        try:
            if not device_outputs and self.bracket_free and _all_host(arrays):
                return self._run(state, arrays, False)
            with self.parts.active(self._touched(arrays, device_outputs)):
                return self._run(state, arrays, device_outputs)
        finally:
            self._states.give_back(state, self._release)

    def _run_host(self, state: RunState, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``_run`` of NumPy inputs to NumPy outputs, through the state's resolved writes, submits and reads."""
        for name, targets in state.writes:
            array = arrays[name]
            for backend, handle in targets:
                backend.write(handle, array)
        if state.submits is None:
            self._steps(state)
        else:
            for backend, recording in state.submits:
                backend.submit(recording)
        results = {}
        for name, source, dtype in state.reads:
            value = np.array(self.program.folded_outputs[name]) if source is None else source[0].read(source[1])
            results[name] = value.astype(dtype, copy=False)
        return results

    @contextmanager
    def lent_state(self, arrays: Mapping[str, Any]) -> Iterator[RunState]:
        """A run state, borrowed with the backends its runs touch active, after one run of
        ``arrays`` (so every tensor holds real data): what ``gpumnn plan`` times op by op."""
        with self._borrow() as state, self.parts.active(self._touched(arrays, False)):
            self._run(state, arrays, False)
            yield state

    def _touched(self, arrays: Mapping[str, Any], device_outputs: bool) -> frozenset[str]:
        """The backends a run touches: ``run_backends``, and the session's device backend where
        device arrays come in or go out (its ``to_host`` / ``to_device``)."""
        if device_outputs or any(not isinstance(a, np.ndarray) for a in arrays.values()):
            return self.run_backends | {self.parts.device_backend}
        return self.run_backends

    def _run(self, state: RunState, arrays: Mapping[str, Any], device_outputs: bool) -> dict[str, Any]:
        if not device_outputs and _all_host(arrays):
            return self._run_host(state, arrays)
        backends, io = self.parts.backends, state.io
        owner = backends[self.parts.device_backend]  # whose device arrays the inputs may be
        for name, array in arrays.items():
            storage = self.program.storage_of(name)
            host_copy = None
            for b in self.placement.input_backends.get(storage, []):
                if not isinstance(array, np.ndarray) and backends[b] is not owner:  # a cpu fallback op reads it
                    host_copy = owner.to_host(array) if host_copy is None else host_copy
                    backends[b].write(io[(b, storage)], host_copy)
                else:
                    backends[b].write(io[(b, storage)], array)
        self._steps(state)
        results = {}
        for info in self.parts.graph.outputs:
            name = info.name
            if name in self.program.folded_outputs:
                value = np.array(self.program.folded_outputs[name])
                value = owner.to_device(value) if device_outputs else value
            else:
                b = self.placement.output_backends[name]
                if device_outputs and backends[b] is owner:
                    value = owner.read_device(io[(b, name)])
                elif device_outputs:  # computed by a cpu fallback op
                    value = owner.to_device(backends[b].read(io[(b, name)]))
                else:
                    value = backends[b].read(io[(b, name)])
            results[name] = value.astype(self.output_dtypes[name], copy=False)
        return results

    def _steps(self, state: RunState) -> None:
        """Every step in order. Recorded, a segment whose backend the next step does not touch is
        submitted without waiting, and waited for just before a later step touches its backend,
        or after the last step (``placement.sync``, decided at preparation): independent
        branches on different backends run at once. Nothing stays in flight after a failure."""
        backends, sync = self.parts.backends, self.placement.sync
        tickets: dict[str, Any] = {}  # backend -> its submission in flight
        try:
            for index, step in enumerate(self.placement.steps):
                backend = backends[step.backend]
                if sync is not None:
                    for b in sync.waits[index]:
                        backends[b].wait(tickets.pop(b))
                if step.kind == "copy":
                    state.copies[index]()
                elif not self.parts.record:
                    backend.run_eager([state.executions[i] for i in step.ops])
                elif sync is not None and sync.detached[index]:
                    tickets[step.backend] = backend.submit_async(state.recordings[index])
                else:
                    backend.submit(state.recordings[index])
            for b in (sync.final if sync is not None else ()):
                backends[b].wait(tickets.pop(b))
        finally:
            for b, ticket in tickets.items():  # a step failed: the run state must be idle when lent again
                try:
                    backends[b].wait(ticket)
                except Exception:  # noqa: BLE001 -- the step's own error is the one to raise
                    pass

    def _output_dtype(self, info: ValueInfo) -> np.dtype:
        """The dtype an output is returned in: the model's declaration, else what lowering inferred."""
        if info.dtype is not None and np.dtype(info.dtype) != np.float32:
            return np.dtype(info.dtype)
        return np.dtype(self.program.dtypes.get(info.name, info.dtype or np.float32))

    # -- introspection ---------------------------------------------------------------------
    @property
    def run_states(self) -> int:
        return self._states.prepared if self._states is not None else 0

    @property
    def output_shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: (tuple(np.shape(self.program.folded_outputs[n])) if n in self.program.folded_outputs
                    else self.program.shapes[n]) for n in self.program.outputs}

    def memory_summary(self) -> dict[str, dict[str, int]]:
        """Per backend: peak pool bytes beside the naive sum of all tensor sizes, and the bytes of the
        constants (weights) the session holds there, shared by its shape sets."""
        return {b: {"pool_bytes": p.pool_bytes, "naive_bytes": p.naive_bytes, "tensors": len(p.offsets),
                    "constant_bytes": self.parts.constants.nbytes(b)} for b, p in self.memory.items()}

    def report_rows(self) -> list[dict[str, Any]]:
        """Per atomic op: backend, scheme, shapes, bytes, MACs, estimated cost, bytes copied in
        from other backends, fallback reason."""
        rows = []
        moved = self.placement.moved_bytes()
        for i, (op, b) in enumerate(zip(self.program.ops, self.placement.op_backends)):
            out_shape = self.program.shapes[op.outputs[0]]
            rows.append({
                "index": i, "op": op.kind, "node": op.source, "backend": b,
                "scheme": self.schemes[i],
                "inputs": [list(self.program.shapes.get(n, np.shape(self.program.constants.get(n)))) for n in op.inputs],
                "output": list(out_shape), "bytes": self.program.nbytes_of(op.outputs[0]),
                "macs": op.macs(), "cost_ms": self.placement.costs_ms[i], "moved_bytes": moved[i],
                "launches": self.launches[i], "copied_bytes": raster_bytes(self.program, op),
                "fallback": self.placement.fallback_reasons[i],
            })
        return rows

    def launch_line(self) -> str:
        """Kernel launches a recorded run submits and the bytes its Raster ops copy, in total."""
        counts = [n for n in self.launches if n is not None]
        copied = sum(raster_bytes(self.program, op) for op in self.program.ops)
        launches = f"kernel launches per run: {sum(counts)}" if counts else "kernel launches: not recorded (eager)"
        rasters = sum(isinstance(op, A.Raster) for op in self.program.ops)
        return f"{launches}; Raster copies: {copied} bytes in {rasters} ops"

    def scheme_lines(self) -> list[str]:
        """One line per convolution and matrix product of the model: the scheme chosen and why."""
        decisions = self.program.decisions
        return ([f"schemes ({len(decisions)} convolutions and matrix products):"]
                + [f"  {d.describe()}" for d in decisions]) if decisions else []

    def describe_shapes(self) -> str:
        return ", ".join(f"{name} {list(shape)}" for name, shape in self.input_shapes.items())

    def close(self) -> None:
        """Wait for this set's runs in flight, then free its pools, release its constants and drop
        its run states, so that no execution, recording or scratch buffer (nor the device context
        they hold) outlives the close: the session trims the heap right after closing its
        backends, and device objects freed later would stay resident. Idempotent. Introspection
        (program, placement, report rows) stays readable."""
        if self.closed:
            return
        self.closed = True
        states = self._states.close() if self._states is not None else []  # waits, holding no lock
        if self.first_state is not None and all(s is not self.first_state for s in states):
            states.append(self.first_state)  # prepared, but the pool was never made (creation failed)
        with self.parts.build_lock:
            for state in states:
                self._release(state)
            self.parts.constants.release(self)
        self.first_state, self._constants = None, {}  # the pool handed over every other state


def _all_host(arrays: Mapping[str, Any]) -> bool:
    """Whether every array of a run is a NumPy array (none a device array)."""
    for array in arrays.values():  # a loop, not all() over a generator: this is on every run's path
        if type(array) is not np.ndarray:
            return False
    return True


def raster_bytes(program: A.AtomicProgram, op: A.AtomicOp) -> int:
    """Bytes a Raster op copies (every region's elements, read and written once); 0 for other ops."""
    if not isinstance(op, A.Raster):
        return 0
    return sum(r.count for r in op.regions) * np.dtype(program.storage_dtype_of(op.outputs[0])).itemsize


__all__ = ["RunState", "SessionParts", "ShapeSet", "raster_bytes"]


def _copy_between(src: TensorHandle, dst: TensorHandle, source: Backend, target: Backend) -> Callable[[], None]:
    """One copy between backends through host memory chosen now, so a run allocates nothing: a
    side whose tensor is host memory (``host_view``) is read or written in place, else through a
    staging array made here."""
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
