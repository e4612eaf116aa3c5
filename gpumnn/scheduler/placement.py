"""Placement (hybrid scheduling): which backend runs each atomic op, and the copies it implies.

First form: every op goes to the requested backend unless that backend says it cannot run it,
in which case it goes to the CPU, visibly (the reason is kept for the report). The paper's
cost (Eq. 5: MUL / FLOPS * 1000 + t_schedule on a GPU) is computed for every op so reports
show it and the cost-model placement (``backend="auto"``) can reuse it.

The result is a schedule of steps: runs of consecutive ops on one backend (each becomes one
recording) and copies of tensors between backends, plus each backend's tensor lifetimes for
memory planning. Times are integers: op ``i`` runs at ``2i+1``, copies before it at ``2i``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .. import atomic as A
from ..backends.base import Backend, BackendInfo
from ..errors import UnsupportedOpError
from .memory import Lifetime


@dataclass
class Step:
    """Either ``run`` ops ``ops`` on ``backend``, or ``copy`` storage ``tensor`` from ``source``."""

    kind: str
    backend: str
    ops: list[int] = field(default_factory=list)
    tensor: str = ""
    source: str = ""


@dataclass
class Placement:
    op_backends: list[str]
    fallback_reasons: list[str | None]
    costs_ms: list[float]
    steps: list[Step]
    lifetimes: dict[str, list[Lifetime]]
    input_backends: dict[str, list[str]]  # graph input storage -> backends it is written to
    output_backends: dict[str, str]  # graph output name -> backend it is read from


def op_cost_ms(op: A.AtomicOp, info: BackendInfo) -> float:
    """Paper Eq. 5: MUL / FLOPS * 1000 (+ t_schedule on a GPU), in milliseconds."""
    cost = op.macs() / info.flops * 1000.0 if info.flops > 0 else 0.0
    return cost + (info.t_schedule_ms if info.is_gpu else 0.0)


def place(program: A.AtomicProgram, backends: Mapping[str, Backend], requested: str) -> Placement:
    storage = program.storage_of
    input_storages = {storage(n) for n in program.inputs}
    op_backends, reasons, costs = [], [], []
    for op in program.ops:
        reason = backends[requested].unsupported_reason(op)
        chosen = requested if reason is None else "cpu"
        if reason is not None and requested != "cpu":
            cpu_reason = backends["cpu"].unsupported_reason(op)
            if cpu_reason is not None:  # nowhere to run it: say so at creation, not mid-run
                raise UnsupportedOpError(f"atomic {op.kind}", op.source, f"{reason}; and {cpu_reason}")
        elif reason is not None:
            raise UnsupportedOpError(f"atomic {op.kind}", op.source, reason)
        op_backends.append(chosen)
        reasons.append(reason)
        costs.append(op_cost_ms(op, backends[chosen].info))

    spans: dict[str, dict[str, list[int]]] = {name: {} for name in backends}
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
                steps.append(Step("copy", b, tensor=s, source=src))
                spans[src][s][1] = max(spans[src][s][1], t - 1)
                resident[s] = [t - 1, t]
        for name in op.outputs:
            s = storage(name)
            home[s] = b
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
        else:  # an output that is (a view of) an input
            b = input_backends.get(s, [requested])[0]
            if s not in spans[b]:
                spans[b][s] = [0, end]
                input_backends.setdefault(s, []).append(b)
        spans[b][s][1] = end
        output_backends[name] = b

    lifetimes = {b: [Lifetime(s, 4 * _size(program.shapes[s]), first, last) for s, (first, last) in spans[b].items()]
                 for b in backends}
    return Placement(op_backends, reasons, costs, steps, lifetimes, input_backends, output_backends)


def _size(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
