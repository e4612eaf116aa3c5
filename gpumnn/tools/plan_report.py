"""``gpumnn plan``: a session's placement, each op's estimated cost beside its measured time.

The estimate is the cost model's (:mod:`gpumnn.scheduler.cost`); the measurement is a profiling
run: after one ordinary run (so every tensor holds real data), each op is recorded on its own and
timed with its backend's ``measure_recording`` verb -- the device's own clock around the op's
commands where the backend has one (OpenCL profiling, Vulkan timestamps, GL timer queries, CUDA
events), so an op's time excludes the submission and wait a recorded run pays once per segment,
as its estimate does -- and each copy between backends with ``measure``. The totals set the
per-op sum and a whole recorded run beside the estimate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .charts import figure
from .benchmark import time_runs
from ..runtime.session import Session


@dataclass(frozen=True)
class OpTiming:
    index: int
    op: str
    node: str
    backend: str
    scheme: str
    estimated_ms: float
    measured_ms: float
    moved_bytes: int
    copy_ms: float  # measured copies into this op's inputs


@dataclass(frozen=True)
class Profile:
    rows: list[OpTiming]
    estimated_ms: float  # the cost model's total (segments and copies included)
    recorded_ms: float  # median wall time of whole recorded runs
    sources: dict[str, str]

    @property
    def measured_ops_ms(self) -> float:
        return sum(r.measured_ms + r.copy_ms for r in self.rows)


def profile(sess: Session, inputs: Mapping[str, Any], runs: int = 3) -> Profile:
    """Time every op and copy of ``sess`` on its own, and whole runs (see the module docstring)."""
    recorded_ms = float(np.median(time_runs(lambda: sess.run(inputs), max(1, runs))))
    rows = sess.report_rows()
    op_ms = [0.0] * len(rows)
    copy_ms = [0.0] * len(rows)
    # leased, so that another thread's shapes cannot evict the set while it is timed
    with sess._lease(inputs) as (shape_set, arrays), shape_set.lent_state(arrays) as prepared:
        # after one run: every tensor holds real data
        pending = 0.0
        for index, step in enumerate(shape_set.placement.steps):
            backend = sess.backends[step.backend]
            if step.kind == "copy":
                pending += backend.measure(prepared.copies[index], repeats=3) * 1e3
                continue
            copy_ms[step.ops[0]] += pending
            pending = 0.0
            for i in step.ops:
                exe = prepared.executions[i]
                op_ms[i] = backend.measure_recording(backend.record([exe]), repeats=3) * 1e3
    timings = [OpTiming(r["index"], r["op"], r["node"], r["backend"], r["scheme"], r["cost_ms"], op_ms[i],
                        r["moved_bytes"], copy_ms[i]) for i, r in enumerate(rows)]
    est = shape_set.placement.estimate
    return Profile(timings, est.total_ms if est else sum(shape_set.placement.costs_ms), recorded_ms,
                   dict(shape_set.placement.cost_sources))


def format_profile(sess: Session, prof: Profile) -> str:
    lines = [f"plan of {len(prof.rows)} atomic ops on {sess.backend!r} (candidates {sess.candidates}, "
             f"{'recorded' if sess.record else 'eager'}); costs: "
             + ", ".join(f"{b} {src}" for b, src in prof.sources.items()),
             f"{'#':>4} {'op':<10} {'backend':<7} {'scheme':<10} {'est ms':>8} {'meas ms':>8} {'moved':>9} "
             f"{'copy ms':>8}  node"]
    for r in prof.rows:
        lines.append(f"{r.index:>4} {r.op:<10} {r.backend:<7} {r.scheme:<10} {r.estimated_ms:>8.3f} "
                     f"{r.measured_ms:>8.3f} {r.moved_bytes:>9} {r.copy_ms:>8.3f}  {r.node}")
    per_backend: dict[str, list[float]] = {}
    for r in prof.rows:
        acc = per_backend.setdefault(r.backend, [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += r.estimated_ms
        acc[2] += r.measured_ms
    for b, (count, est, meas) in per_backend.items():
        lines.append(f"  {b:<7} {count:>4} ops: estimated {est:.3f} ms, measured {meas:.3f} ms (op by op)")
    lines.append(f"total: estimated {prof.estimated_ms:.3f} ms; measured {prof.recorded_ms:.3f} ms per recorded run "
                 f"(median), {prof.measured_ops_ms:.3f} ms op by op with copies")
    lines.append(sess.shape_set().launch_line())
    return "\n".join(lines)


def chart(prof: Profile, path: str, title: str = "") -> None:
    """Estimated vs measured milliseconds per op (bars), coloured by backend, written as a PNG."""
    fig = figure(max(8.0, len(prof.rows) * 0.12), 4.5)
    from matplotlib import colormaps
    from matplotlib.patches import Patch

    x = np.arange(len(prof.rows))
    backends = list(dict.fromkeys(r.backend for r in prof.rows))
    colours = {b: colormaps["tab10"](i) for i, b in enumerate(backends)}
    ax = fig.add_subplot()
    ax.bar(x - 0.2, [r.estimated_ms for r in prof.rows], 0.4, color=[colours[r.backend] for r in prof.rows],
           alpha=0.4, hatch="//")
    ax.bar(x + 0.2, [r.measured_ms for r in prof.rows], 0.4, color=[colours[r.backend] for r in prof.rows])
    handles = [Patch(facecolor="grey", alpha=0.4, hatch="//", label="estimated"),
               Patch(facecolor="grey", label="measured (each op recorded alone)")]
    handles += [Patch(facecolor=colours[b], label=b) for b in backends]
    ax.set_yscale("log")
    ax.set_xlabel("atomic op")
    ax.set_ylabel("ms")
    ax.set_title(title or f"estimated {prof.estimated_ms:.1f} ms vs measured {prof.recorded_ms:.1f} ms per run")
    ax.legend(handles=handles, fontsize=8)
    fig.savefig(path, dpi=100)


__all__ = ["OpTiming", "Profile", "chart", "format_profile", "profile"]


def plan_on_profile(net: Any, input_shapes: Mapping[str, tuple[int, ...]], backend: str, device: Any) -> str:
    """The plan ``backend`` of the profiled device (``device``: a
    :class:`~gpumnn.scheduler.device_profile.DeviceProfile`) would run, made here without the
    device: the scheme step and the rewrite as they read that backend, each atomic op's estimate
    from the device's calibration, a recorded run's total (one segment, inputs in, outputs out)."""
    from .. import atomic as A
    from ..geometry import lower
    from ..scheduler.concat import write_concats_in_place
    from ..scheduler.cost import HOST, CostModel, op_bytes, tensor_bytes
    from ..scheduler.expansion import expand_schemes
    from ..scheduler.schemes import EXPANDED, builds_kernel, select_schemes

    target = device.target(backend)
    program = expand_schemes(select_schemes(lower(net.graph, input_shapes), target, device.calibrations[backend]),
                             target)
    program, _ = write_concats_in_place(program, [backend] * len(program.ops), {backend: target.alignment})
    model = CostModel({backend: device.calibrations[backend]})
    rewritten = {d.node: f"{d.scheme} {d.detail.split(' (')[0]}".strip() for d in program.decisions
                 if d.scheme in EXPANDED
                 and not builds_kernel(target, A.Conv2D if d.kind.startswith("conv") else A.MatMul, d.scheme)}
    lines = [f"plan of {len(program.ops)} atomic ops on {backend!r} of {device.machine}, from its profile "
             f"(no session here); costs: {backend} {device.calibrations[backend].source}",
             f"{'#':>4} {'op':<10} {'scheme (of the node)':<26} {'est ms':>8}  node"]
    total = 0.0
    for index, op in enumerate(program.ops):
        ms = model.op_ms(op, backend, op_bytes(program, op), tensor_bytes(program, op.outputs[0]))
        total += ms
        scheme = rewritten.get(op.source) or getattr(op, "scheme", "") or "-"
        lines.append(f"{index:>4} {type(op).__name__.lower():<10} {scheme:<26} {ms:>8.3f}  {op.source}")
    copies = sum(model.transfer_ms(tensor_bytes(program, n), HOST, backend) for n in program.inputs
                 if n not in program.constants)
    copies += sum(model.transfer_ms(tensor_bytes(program, n), backend, HOST) for n in program.outputs)
    run = total + model.segment_ms(backend) + copies
    lines.append(f"total: estimated {total:.3f} ms in {len(program.ops)} ops; a recorded run {run:.3f} ms "
                 f"with its submission and the copies in and out")
    return "\n".join(lines)
