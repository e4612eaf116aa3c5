"""When a run waits for a device: segments handed over without waiting, overlapping later steps.

A run is a list of steps (:func:`.placement.build_steps`): segments (one recording on one
backend) and copies (a tensor read from one backend and written to another through host
memory). Independent branches placed on different backends follow each other in that list, so
the run can hand a segment to its device (``Backend.submit_async``) and go on with the next
steps -- a branch on the CPU, copies between other backends -- while the device works; it
waits (``Backend.wait``) only where a later step needs the device again.

The rule, decided here once per placement (not per run): a step *touches* the backends it uses
(a segment its own; a copy its source and its target). A step first waits for every backend it
touches that has a submission in flight. That covers every data dependency -- a tensor reaches
another backend only through a copy, which touches its source -- and every hazard on the
device's memory besides: a write into a pool slot that a submission in flight still reads (the
pool layout reuses slots), a read through a mapped buffer, the one submit lane a run holds. A
segment is submitted without waiting only when the next step does not touch its backend
(otherwise there is nothing to overlap), and whatever is still in flight after the last step is
waited for before the outputs are read.

:func:`overlapped_ms` prices the steps under this rule for the cost model's estimate: a segment
in flight on a device of its own runs beside the steps after it, so the run takes the longest
path, not the sum. A device that computes on the host's own cores (a CPU OpenCL device,
lavapipe, llvmpipe: ``BackendInfo.is_gpu`` false) shares them with the NumPy backend and the
copies, so its segments are priced as if waited for at once: there is no second processor to
overlap with.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Sequence


@dataclass
class Step:
    """Either ``run`` ops ``ops`` on ``backend``, or ``copy`` storage ``tensor`` from ``source``
    (``nbytes`` bytes, estimated ``cost_ms``)."""

    kind: str
    backend: str
    ops: list[int] = field(default_factory=list)
    tensor: str = ""
    source: str = ""
    nbytes: int = 0
    cost_ms: float = 0.0


@dataclass(frozen=True)
class Sync:
    """Per step of a placement: ``waits`` -- the backends whose submission in flight it waits for
    before it runs; ``detached`` -- a segment submitted without waiting (``submit_async``);
    ``final`` -- the backends still in flight after the last step, waited for before outputs
    are read."""

    waits: tuple[tuple[str, ...], ...]
    detached: tuple[bool, ...]
    final: tuple[str, ...]

    @property
    def overlaps(self) -> int:
        """How many segments a run submits without waiting."""
        return sum(self.detached)


def touches(step: Step) -> tuple[str, ...]:
    """The backends a step uses: a segment its own, a copy its source and its target."""
    return (step.backend,) if step.kind == "run" else (step.source, step.backend)


def synchronisation(steps: Sequence[Step]) -> Sync:
    """Where a run of ``steps`` submits without waiting and where it waits (module docstring)."""
    in_flight: list[str] = []
    waits, detached = [], []
    for i, step in enumerate(steps):
        used = touches(step)
        waits.append(tuple(b for b in in_flight if b in used))
        in_flight = [b for b in in_flight if b not in used]
        detach = step.kind == "run" and i + 1 < len(steps) and step.backend not in touches(steps[i + 1])
        detached.append(detach)
        if detach:
            in_flight.append(step.backend)
    return Sync(tuple(waits), tuple(detached), tuple(in_flight))


def overlapped_ms(steps: Sequence[Step], sync: Sync, step_ms: Sequence[float],
                  host_devices: Collection[str]) -> float:
    """The time of ``steps`` (each ``step_ms``) run under ``sync``: the host goes through the
    steps in order, a detached segment on a device not in ``host_devices`` runs on that device
    from its submission until the step that waits for it, everything else takes the host's
    time. Without detached segments (or with only host devices) this is the plain sum."""
    host = 0.0
    done: dict[str, float] = {}
    for step, waits, detached, ms in zip(steps, sync.waits, sync.detached, step_ms):
        for b in waits:
            host = max(host, done.pop(b, host))
        if detached and step.backend not in host_devices:
            done[step.backend] = host + ms
        else:
            host += ms
    return max([host, *done.values()])


__all__ = ["Sync", "overlapped_ms", "synchronisation", "touches"]
