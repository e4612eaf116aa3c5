"""Placement (hybrid scheduling): which backend runs each atomic op, and the copies it implies.

Three parts, each its own function:

1. :func:`allowed_backends`: per op, the backends that may run it -- the session's candidates
   (one backend, a list, or every available one for ``backend="auto"``), or the backend a node
   is pinned to -- less those that say they cannot (``Backend.unsupported_reason``). An op none
   of them can run goes to the CPU, visibly: the reason is kept for the report.
2. :func:`assign`: the backend of every op, minimising the estimated time of the whole schedule
   (op costs, one submission per segment, copies between backends, inputs written and outputs
   read) from the cost table of :mod:`.cost`: a dynamic programme over the op order. :func:`place`
   keeps a split only where it is estimated ``SPLIT_MARGIN`` faster than the best single backend.
3. :func:`build_steps`: the schedule -- runs of consecutive ops on one backend (each becomes one
   recording) and copies of tensors between backends -- plus each backend's tensor lifetimes for
   pool layout. Times are integers: op ``i`` runs at ``2i+1``, copies before it at ``2i``.

:func:`estimate` prices any assignment with the same model, from the schedule :func:`build_steps`
makes of it (reports, ``gpumnn plan``, tests): the DP's residency rule and the schedule's are the
two places that track where copies of a tensor are.
:func:`place` adds where a recorded run may overlap segments on different backends
(:mod:`.overlap`): the estimate then counts independent segments as the longest path, not the
sum. The dynamic programme does not: its state (the current op's backend) cannot say which
later steps a segment would overlap, so it minimises the serial time and overlap only lowers
the estimate of what it chose.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from .. import atomic as A
from ..backends.base import Backend
from ..errors import InputError, ModelError, UnsupportedOpError
from .cost import HOST, CostModel, cost_table, tensor_bytes
from .memory import Lifetime
from .overlap import Step, Sync, overlapped_ms, synchronisation


@dataclass
class Placement:
    op_backends: list[str]
    fallback_reasons: list[str | None]
    costs_ms: list[float]  # estimated cost of each op on its backend (copies and segments apart)
    steps: list[Step]
    lifetimes: dict[str, list[Lifetime]]
    input_backends: dict[str, list[str]]  # graph input storage -> backends it is written to
    output_backends: dict[str, str]  # graph output name -> backend it is read from
    estimate: "Estimate | None" = None
    cost_sources: dict[str, str] = field(default_factory=dict)  # backend -> calibrated / paper constants
    sync: Sync | None = None  # where a recorded run submits without waiting, and where it waits

    def moved_bytes(self) -> list[int]:
        """Per op, the bytes copied from other backends just before it runs (its inputs)."""
        moved = [0] * len(self.op_backends)
        pending = 0
        for step in self.steps:
            if step.kind == "copy":
                pending += step.nbytes
            else:
                moved[step.ops[0]] += pending
                pending = 0
        return moved


@dataclass(frozen=True)
class Estimate:
    """An assignment priced by the cost model (milliseconds)."""

    ops_ms: float
    segments_ms: float
    transfers_ms: float
    segments: int
    transfers: int
    moved_bytes: int
    overlap_ms: float = 0.0  # saved where a segment on a device of its own overlaps later steps

    @property
    def total_ms(self) -> float:
        return self.ops_ms + self.segments_ms + self.transfers_ms - self.overlap_ms


# -- 1. who may run what -----------------------------------------------------------------------

def allowed_backends(program: A.AtomicProgram, backends: Mapping[str, Backend], candidates: Sequence[str],
                     pins: Mapping[str, str] | None = None) -> tuple[list[list[str]], list[str | None]]:
    """Per op: the backends that may run it, and why it fell back to the CPU (None if it did not).

    ``pins`` maps ONNX node names to a backend; a pinned op considers only that backend. An op
    that none of its backends can run goes to the CPU (raises UnsupportedOpError if the CPU
    cannot run it either)."""
    pins = dict(pins or {})
    unknown = sorted(set(pins) - {op.source for op in program.ops})
    if unknown:
        raise InputError(f"placement names node(s) {unknown} that this session does not run "
                         f"(folded at creation, or not in the model)")
    allowed, reasons = [], []
    for op in program.ops:
        wanted = [pins[op.source]] if op.source in pins else list(candidates)
        why = {b: backends[b].unsupported_reason(op) for b in wanted}
        ok = [b for b in wanted if why[b] is None]
        reason = None
        if not ok:
            reason = "; ".join(r for r in why.values() if r)
            cpu_reason = backends["cpu"].unsupported_reason(op) if "cpu" not in wanted else reason
            if cpu_reason is not None:  # nowhere to run it: say so at creation, not mid-run
                raise UnsupportedOpError(f"atomic {op.kind}", op.source,
                                         reason if "cpu" in wanted else f"{reason}; and {cpu_reason}")
            ok = ["cpu"]
        allowed.append(ok)
        reasons.append(reason)
    return allowed, reasons


# -- 2. who runs what --------------------------------------------------------------------------

def _reads(program: A.AtomicProgram, op: A.AtomicOp) -> list[tuple[str, int]]:
    """(storage, bytes) of every run-time tensor ``op`` reads, each storage once."""
    seen: dict[str, int] = {}
    for name in op.inputs:
        if name not in program.constants:
            seen.setdefault(program.storage_of(name), tensor_bytes(program, name))
    return list(seen.items())


def _final_reads(program: A.AtomicProgram) -> list[tuple[str, int]]:
    return [(program.storage_of(n), tensor_bytes(program, n)) for n in program.outputs
            if n not in program.folded_outputs]


def assign(program: A.AtomicProgram, allowed: list[list[str]], table: list[dict[str, float]],
           model: CostModel) -> list[str]:
    """The backend of every op, minimising the estimated time of the whole schedule.

    A dynamic programme over the op order whose state is the backend of the current op: for
    each op ``i`` and backend ``b`` it keeps the cheapest schedule of ops ``0..i`` that ends
    with ``i`` on ``b``, extending each of the previous op's states by op ``i``'s cost on ``b``,
    a segment's submission if the backend changes, and a copy of every input not yet on ``b``.

    The approximation is in the tensors' residency (where copies of each tensor already are),
    which the state does not hold. Each state carries the residency of its own best schedule,
    and an extension charges copies against that (a Viterbi search with one survivor per
    backend). For a chain -- every tensor read only by the next op -- this is exact. A tensor
    read later (a residual branch, a Concat of branches) is charged against the survivor's
    placement of its producer, which may differ from that of the schedule that is best
    overall: the search is exact on chains and a good, cheap heuristic on DAGs, keeping
    ``len(backends)`` candidate schedules instead of exponentially many. Graph inputs start on
    the host and outputs are read back from wherever they end, so both are charged.
    """
    n = len(program.ops)
    if n == 0:
        return []
    reads = [_reads(program, op) for op in program.ops]
    writes = [[program.storage_of(o) for o in op.outputs] for op in program.ops]
    home0 = {program.storage_of(name): HOST for name in program.inputs}
    # a state: (cost, residency {storage: set of locations}, home {storage: producer location})
    states: dict[str, tuple[float, dict[str, frozenset[str]], dict[str, str]]] = {
        "": (0.0, {s: frozenset({HOST}) for s in home0}, home0)}
    parents: list[dict[str, str]] = []
    for i in range(n):
        nxt, back = {}, {}
        for b in allowed[i]:
            best = None
            for p, (cost, resident, home) in states.items():
                c = cost + table[i][b] + (model.segment_ms(b) if b != p else 0.0)
                for s, nbytes in reads[i]:
                    if b not in resident.get(s, ()):
                        c += model.transfer_ms(nbytes, home.get(s, HOST), b)
                if best is None or c < best[0]:
                    best = (c, p)
            cost, p = best
            resident, home = dict(states[p][1]), dict(states[p][2])
            for s, _ in reads[i]:
                resident[s] = resident.get(s, frozenset()) | {b}
            for s in writes[i]:
                resident[s], home[s] = frozenset({b}), b
            nxt[b], back[b] = (cost, resident, home), p
        states = nxt
        parents.append(back)
    finals = _final_reads(program)

    def final_cost(b: str) -> float:
        cost, _, home = states[b]
        return cost + sum(model.transfer_ms(nbytes, home.get(s, HOST), HOST) for s, nbytes in finals)

    b = min(states, key=final_cost)
    chosen = [b]
    for i in range(n - 1, 0, -1):
        b = parents[i][b]
        chosen.append(b)
    return chosen[::-1]


def estimate(program: A.AtomicProgram, op_backends: Sequence[str], table: list[dict[str, float]],
             model: CostModel) -> Estimate:
    """Price one assignment: the schedule :func:`build_steps` makes of it, by :func:`price`."""
    steps, _, inputs, outputs = build_steps(program, op_backends, sorted(set(op_backends)), model)
    return price(program, op_backends, table, model, steps, inputs, outputs)


def price(program: A.AtomicProgram, op_backends: Sequence[str], table: list[dict[str, float]], model: CostModel,
          steps: Sequence[Step], input_backends: Mapping[str, list[str]],
          output_backends: Mapping[str, str]) -> Estimate:
    """Op costs, a submission per segment, every copy between backends, each graph input
    written to every backend that reads it and each output read back to the host."""
    runs = [step for step in steps if step.kind == "run"]
    copies = [step for step in steps if step.kind == "copy"]
    writes = [(tensor_bytes(program, s), b) for s, backends in input_backends.items() for b in backends]
    reads = [(tensor_bytes(program, program.storage_of(name)), b) for name, b in output_backends.items()]
    transfers_ms = (sum(step.cost_ms for step in copies) + sum(model.transfer_ms(n, HOST, b) for n, b in writes)
                    + sum(model.transfer_ms(n, b, HOST) for n, b in reads))
    return Estimate(ops_ms=sum(table[i][b] for i, b in enumerate(op_backends)),
                    segments_ms=sum(model.segment_ms(step.backend) for step in runs), transfers_ms=transfers_ms,
                    segments=len(runs), transfers=len(copies) + len(writes),
                    moved_bytes=sum(step.nbytes for step in copies) + sum(n for n, _ in writes))


# -- 3. the schedule ---------------------------------------------------------------------------

def build_steps(program: A.AtomicProgram, op_backends: Sequence[str], backend_names: Sequence[str],
                model: CostModel | None = None) -> tuple[list[Step], dict[str, list[Lifetime]],
                                                      dict[str, list[str]], dict[str, str]]:
    """Steps (segments and copies), per-backend lifetimes, input and output backends."""
    storage = program.storage_of
    input_storages = {storage(n) for n in program.inputs}
    spans: dict[str, dict[str, list[int]]] = {name: {} for name in backend_names}
    home: dict[str, str] = {}
    input_backends: dict[str, list[str]] = {}
    steps: list[Step] = []
    for i, (op, b) in enumerate(zip(program.ops, op_backends)):
        t = 2 * i + 1
        for name in op.inputs:
            if name in program.constants:
                continue
            s = storage(name)
            resident = spans[b]
            if s in resident:
                resident[s][1] = t
            elif s in input_storages:
                resident[s] = [0, t]
                input_backends.setdefault(s, []).append(b)
            else:
                src = home[s]
                nbytes = tensor_bytes(program, s)
                steps.append(Step("copy", b, tensor=s, source=src, nbytes=nbytes,
                                  cost_ms=model.transfer_ms(nbytes, src, b) if model else 0.0))
                spans[src][s][1] = max(spans[src][s][1], t - 1)
                resident[s] = [t - 1, t]
        for name in op.outputs:
            s = storage(name)
            home[s] = b
            if s in spans[b]:  # a storage written in parts (inputs of a concatenation written in place)
                spans[b][s][1] = t
            else:
                spans[b][s] = [t, t]
        if steps and steps[-1].kind == "run" and steps[-1].backend == b:
            steps[-1].ops.append(i)
        else:
            steps.append(Step("run", b, ops=[i]))

    end = 2 * len(program.ops) + 1
    output_backends: dict[str, str] = {}
    for name in program.outputs:
        if name in program.folded_outputs:
            continue
        s = storage(name)
        if s in home:
            b = home[s]
        else:  # an output that is (a view of) an input: a narrow one on the cpu, which holds every dtype
            first = "cpu" if program.storage_dtype_of(s) in A.NARROW_DTYPES and "cpu" in backend_names else (
                op_backends[0] if op_backends else backend_names[0])
            b = input_backends.get(s, [first])[0]
            if s not in spans[b]:
                spans[b][s] = [0, end]
                input_backends.setdefault(s, []).append(b)
        spans[b][s][1] = end
        output_backends[name] = b

    lifetimes = {b: [Lifetime(s, tensor_bytes(program, s), first, last) for s, (first, last) in spans[b].items()]
                 for b in backend_names}
    return steps, lifetimes, input_backends, output_backends


#: how much faster (estimated) a split across backends must be than the best single backend to be
#: chosen over it: the model's estimates are within about 30% of measured times per backend, and a
#: split adds copies and synchronisations whose real cost varies most, so a split estimated to
#: save a few percent is as likely to lose (measured: bench/RESULTS.md)
SPLIT_MARGIN = 0.10


def place(program: A.AtomicProgram, backends: Mapping[str, Backend], candidates: Sequence[str], model: CostModel,
          pins: Mapping[str, str] | None = None) -> Placement:
    """Decide every op's backend among ``candidates`` (or its pin), then build the schedule: the
    dynamic programme's split where it is estimated ``SPLIT_MARGIN`` faster than every single
    candidate (each with the CPU only for what it cannot run), else the best single candidate."""
    allowed, reasons = allowed_backends(program, backends, candidates, pins)
    table = cost_table(program, allowed, model)
    chosen = _schedule(program, assign(program, allowed, table, model), list(backends), table, model)
    if len(candidates) > 1 and not pins:
        singles = [assign(program, [[b] if b in ok else ok for ok in allowed], table, model) for b in candidates]
        single = min((_schedule(program, one, list(backends), table, model) for one in singles),
                     key=lambda placed: placed.estimate.total_ms)
        if chosen.estimate.total_ms > (1 - SPLIT_MARGIN) * single.estimate.total_ms:
            chosen = single
    chosen.fallback_reasons = reasons
    chosen.cost_sources = model.sources()
    _check_storage(program, chosen, backends)
    return chosen


def without_ops(program: A.AtomicProgram, placement: Placement, kept: Sequence[int], backend_names: list[str],
                model: CostModel) -> Placement:
    """``placement`` rescheduled for ``program``, whose ops are the placed program's ``kept`` ones
    (each on its backend, at its cost): after a pass removed ops that placement priced."""
    op_backends = [placement.op_backends[i] for i in kept]
    table = [{b: placement.costs_ms[i]} for i, b in zip(kept, op_backends)]
    chosen = _schedule(program, op_backends, backend_names, table, model)
    chosen.fallback_reasons = [placement.fallback_reasons[i] for i in kept]
    chosen.cost_sources = placement.cost_sources
    return chosen


def holds_dtype(backend: Backend, dtype: str) -> bool:
    """Whether ``backend`` has tensors of storage ``dtype``: a compute dtype, or a narrow one that
    some kernel of its takes (``Backend.dtypes``)."""
    return dtype in A.COMPUTE_DTYPES or any(dtype in dtypes for dtypes in backend.dtypes.values())


def _check_storage(program: A.AtomicProgram, placement: Placement, backends: Mapping[str, Backend]) -> None:
    """Refuse a schedule that would put a tensor or constant on a backend without its storage dtype
    (allocated, uploaded, written, read or copied there): placement sends every op on a narrow
    dtype where a kernel takes it, so such a tensor is a scheduler error, never a backend's."""
    placed = [(b, lifetime.name) for b, lifetimes in placement.lifetimes.items() for lifetime in lifetimes]
    placed += [(b, name) for op, b in zip(program.ops, placement.op_backends) for name in op.inputs
               if name in program.constants]
    for b, name in placed:
        dtype = program.storage_dtype_of(name)
        if not holds_dtype(backends[b], dtype):
            raise ModelError(f"internal: the schedule puts tensor {name!r} of storage dtype {dtype} on backend {b!r}, "
                             f"which has no {dtype} tensors")


def _schedule(program: A.AtomicProgram, op_backends: list[str], backend_names: list[str],
              table: list[dict[str, float]], model: CostModel) -> Placement:
    """The schedule of one assignment, priced, with where a recorded run overlaps segments."""
    steps, lifetimes, inputs, outputs = build_steps(program, op_backends, backend_names, model)
    costs = [table[i][b] for i, b in enumerate(op_backends)]
    sync = synchronisation(steps) if model.record else None  # eager runs wait after every op
    priced = price(program, op_backends, table, model, steps, inputs, outputs)
    if sync is not None and sync.overlaps:
        step_ms = [step.cost_ms if step.kind == "copy" else sum(costs[i] for i in step.ops) + model.segment_ms(step.backend)
                   for step in steps]
        serial = sum(step_ms)
        priced = replace(priced, overlap_ms=serial - overlapped_ms(steps, sync, step_ms, model.host_devices))
    return Placement(op_backends, [None] * len(op_backends), costs, steps, lifetimes, inputs, outputs, priced, {}, sync)

