"""Latency measurement after the paper's protocol (Section 4.1), with ONNX Runtime beside us.

Batch 1, one warm-up run, then the mean of ``runs`` timed runs. Every figure comes from the
same process and the same input, so rows are comparable. Nothing here asserts speed: it
prints tables (and JSON) for people and scripts to read.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from . import zoo
from .backends import probe
from .net import load
from .feeds import random_input


@dataclass
class BenchRow:
    model: str
    backend: str
    device: str = ""
    recorded_ms: float | None = None
    eager_ms: float | None = None
    onnxruntime_ms: float | None = None
    prepare_ms: float | None = None
    pool_mib: float | None = None
    naive_mib: float | None = None
    rel_error: float | None = None
    note: str = ""
    samples: dict[str, list[float]] = field(default_factory=dict)

    @property
    def decoupling_gain(self) -> float | None:
        """Time saved by recording, as the paper's Table 2 reports it (negative = faster)."""
        if self.recorded_ms is None or not self.eager_ms:
            return None
        return (self.recorded_ms - self.eager_ms) / self.eager_ms


def time_runs(fn: Callable[[], object], runs: int = 10, warmup: int = 1) -> list[float]:
    """Milliseconds of ``runs`` calls after ``warmup`` untimed calls (paper: 1 warm-up, 10 runs)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000.0)
    return samples


def _onnxruntime_ms(model_bytes: bytes, x: np.ndarray, threads: int, runs: int, warmup: int):
    try:
        import onnxruntime as ort
    except ImportError:
        return None, None
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    sess = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    out = sess.run(None, {name: x})[0]
    return statistics.fmean(time_runs(lambda: sess.run(None, {name: x}), runs, warmup)), out


class Progress:
    """One status line on stderr for anything that takes more than a moment."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.enabled = total, 0, enabled and total > 0
        self.started = time.perf_counter()

    def step(self, label: str) -> None:
        if self.enabled:
            elapsed = time.perf_counter() - self.started
            print(f"\r[{self.done + 1}/{self.total}] {label:<48} {elapsed:6.1f}s", end="", file=sys.stderr, flush=True)
        self.done += 1

    def close(self) -> None:
        if self.enabled:
            print(file=sys.stderr)


def resolve_backends(names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Expand "all" to every backend that starts here; return (runnable, {skipped: reason})."""
    from .backends import REGISTRY
    wanted = list(REGISTRY) if "all" in names else list(names)
    runnable, skipped = [], {}
    for name in wanted:
        reason = probe(name)
        if reason is None:
            runnable.append(name)
        else:
            skipped[name] = reason
    return runnable, skipped


def benchmark(models: Iterable[str], backends: Sequence[str], threads: int | None = None, runs: int = 10,
              warmup: int = 1, eager: bool = True, progress: bool = True) -> list[BenchRow]:
    """Time each zoo model (or ONNX path) on each backend, recorded and eager, and on ONNX Runtime."""
    threads = threads or os.cpu_count() or 1
    models = list(models)
    bar = Progress(len(models) * (len(backends) + 1), progress)
    rows: list[BenchRow] = []
    for model_name in models:
        if model_name in zoo.MODELS:
            proto, shape = zoo.build(model_name), zoo.input_shape(model_name)
            net = load(proto)
        else:
            import onnx
            net = load(model_name)  # first: it refuses invalid models and external data outside their folder
            proto, shape = onnx.load(model_name), None
        if shape is None:
            shape = tuple(int(d) for d in net.inputs[0].shape)
        x = random_input(net.inputs[0].dtype, shape, np.random.default_rng(0))
        bar.step(f"{model_name} on onnxruntime")
        ort_ms, reference = _onnxruntime_ms(proto.SerializeToString(), x, threads, runs, warmup)
        input_name = net.inputs[0].name
        for backend in backends:
            bar.step(f"{model_name} on {backend}")
            row = BenchRow(model_name, backend, onnxruntime_ms=ort_ms)
            try:
                sess = net.session(backend=backend, threads=threads, fallback=False)
                row.device = sess.backends[backend].info.device
                row.prepare_ms = sess.prepare_seconds * 1000.0
                memory = sess.memory_summary().get(backend) or sess.memory_summary().get("cpu")
                row.pool_mib, row.naive_mib = memory["pool_bytes"] / 2**20, memory["naive_bytes"] / 2**20
                output = sess.run({input_name: x})
                first = next(iter(output.values()))
                if reference is not None:
                    row.rel_error = float(np.linalg.norm(first - reference) / max(np.linalg.norm(reference), 1e-12))
                samples = time_runs(lambda: sess.run({input_name: x}), runs, warmup)
                row.recorded_ms, row.samples["recorded"] = statistics.fmean(samples), samples
                fallbacks = sum(1 for r in sess.report_rows() if r["fallback"])
                if fallbacks:
                    row.note = f"{fallbacks} ops on cpu"
                sess.close()
                if eager:
                    eager_sess = net.session(backend=backend, threads=threads, record=False, fallback=False)
                    samples = time_runs(lambda: eager_sess.run({input_name: x}), runs, warmup)
                    row.eager_ms, row.samples["eager"] = statistics.fmean(samples), samples
                    eager_sess.close()
            except Exception as exc:  # one failing backend must not hide the others' figures
                row.note = f"failed: {type(exc).__name__}: {exc}"[:120]
            rows.append(row)
    bar.close()
    return rows


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def format_table(rows: Sequence[BenchRow], threads: int, skipped: dict[str, str] | None = None) -> str:
    """The benchmark as a fixed-width text table, with the paper's decoupling gain column."""
    header = (f"{'model':<20} {'backend':<7} {'recorded ms':>11} {'eager ms':>9} {'rec/eager':>9} {'ORT ms':>8} "
              f"{'vs ORT':>7} {'prepare ms':>10} {'pool MiB':>9} {'naive MiB':>9} {'rel err':>8}  note")
    lines = [f"batch 1, 1 warm-up, mean of timed runs, {threads} CPU thread(s)", header, "-" * len(header)]
    for r in rows:
        gain = r.decoupling_gain
        ratio = None if (r.recorded_ms is None or not r.onnxruntime_ms) else r.recorded_ms / r.onnxruntime_ms
        lines.append(f"{r.model:<20} {r.backend:<7} {_fmt(r.recorded_ms):>11} {_fmt(r.eager_ms):>9} "
                     f"{(_fmt(gain * 100, '+.1f') + '%') if gain is not None else '-':>9} {_fmt(r.onnxruntime_ms):>8} "
                     f"{(_fmt(ratio, '.2f') + 'x') if ratio is not None else '-':>7} {_fmt(r.prepare_ms):>10} "
                     f"{_fmt(r.pool_mib):>9} {_fmt(r.naive_mib):>9} {_fmt(r.rel_error, '.1e'):>8}  {r.note}")
    devices = sorted({(r.backend, r.device) for r in rows if r.device})
    lines += [f"{b}: {d}" for b, d in devices]
    for name, reason in (skipped or {}).items():
        lines.append(f"{name}: not run ({reason})")
    return "\n".join(lines)


def rows_as_dicts(rows: Sequence[BenchRow]) -> list[dict]:
    return [dict(asdict(r), decoupling_gain=r.decoupling_gain) for r in rows]
