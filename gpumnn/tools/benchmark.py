"""Latency measurement after the paper's protocol (Section 4.1), with ONNX Runtime beside us.

One figure is the paper's: batch 1, one warm-up run, then the mean of ``runs`` timed runs
(:func:`time_runs`, the one timing helper; the scripts in bench/ use it too). Machine noise (other
processes, clock changes) moves figures taken a minute apart by more than the differences worth
reporting, so the things compared are timed *in alternation* (:func:`alternate`): each repeat takes
one figure of gpumnn recorded, gpumnn eager and ONNX Runtime one after another, ``repeats`` times.
A table cell is the median of a series' per-repeat figures with their min-max spread, and a ratio
is the median of the per-repeat ratios (each from two figures taken seconds apart), not the ratio
of two medians. The raw samples (every run of every repeat) stay in the rows for JSON. Nothing
here asserts speed: it prints tables (and JSON, and charts: :mod:`gpumnn.tools.charts`).

Beyond the paper, ``batch`` runs a model at a batch other than 1 (a zoo model built at it, an ONNX
file's first input dim set to it: :func:`load_model`), and the table then adds throughput, items
per second of each series (``batch`` over a repeat's mean run time), beside ONNX Runtime's at the
same batch.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from .. import zoo
from ..backends import probe
from .feeds import random_input
from ..net import Net, load

Clock = Callable[[], float]

#: Series a gpumnn bench row times, in the order of each repeat; peers (bench/) add their own.
SERIES = ("recorded", "eager", "onnxruntime")
#: (numerator, denominator) series of the ratio columns, in table order.
RATIOS = (("recorded", "eager"), ("recorded", "onnxruntime"))
#: Short names for headers; a series not named here is shown as its key.
SHORT = {"onnxruntime": "ORT"}
#: Names for chart legends.
LABELS = {"recorded": "gpumnn recorded", "eager": "gpumnn eager", "onnxruntime": "ONNX Runtime"}
SPREAD = "min-max"


@dataclass(frozen=True)
class Spread:
    """The median of some figures and their range."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def __format__(self, spec: str) -> str:
        spec = spec or ".1f"
        return f"{self.median:{spec}} ({self.low:{spec}}-{self.high:{spec}})"


#: Seconds of sleep before each series' turn in :func:`alternate`: ONNX Runtime's threads spin a
#: while after a run, and on 2 cores they took the core the next series needed (measured:
#: bench/RESULTS.md)
PAUSE = 0.1


def add_protocol_arguments(parser: "argparse.ArgumentParser") -> None:
    """The paper's protocol as command-line options, one spelling for ``gpumnn bench`` and the
    peers in ``bench/``: ``--runs`` timed runs after ``--warmup``, taken ``--repeats`` times in
    alternation with the other series, ``--pause`` seconds before each series' turn."""
    parser.add_argument("--runs", type=int, default=10, help="timed runs per figure, after --warmup (default 10)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="figures per series, taken in alternation with the others; cells are their median (default 5)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--pause", type=float, default=PAUSE,
                        help=f"seconds of sleep before each series' turn, so that the engine before it has stopped "
                             f"spinning (default {PAUSE})")


def time_runs(fn: Callable[[], object], runs: int = 10, warmup: int = 1, clock: Clock = time.perf_counter) -> list[float]:
    """Milliseconds of ``runs`` calls after ``warmup`` untimed calls (paper: 1 warm-up, 10 runs)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        start = clock()
        fn()
        samples.append((clock() - start) * 1000.0)
    return samples


def alternate(fns: Mapping[str, Callable[[], object]], repeats: int, runs: int = 10, warmup: int = 1,
              clock: Clock = time.perf_counter, on_repeat: Callable[[int], None] | None = None,
              pause: float = 0.0) -> dict[str, list[list[float]]]:
    """Raw samples ``{name: [one list of run times per repeat]}``: each of ``repeats`` repeats times
    every function in ``fns`` (in order) by :func:`time_runs`, so noise falls on all of them alike.
    ``pause`` seconds before each turn let the previous engine's threads stop spinning (see
    ``PAUSE``)."""
    samples: dict[str, list[list[float]]] = {name: [] for name in fns}
    for repeat in range(repeats):
        if on_repeat is not None:
            on_repeat(repeat)
        for name, fn in fns.items():
            if pause:
                time.sleep(pause)
            samples[name].append(time_runs(fn, runs, warmup, clock))
    return samples


def rel_l2(y: np.ndarray, reference: np.ndarray) -> float:
    """Relative L2 error of ``y`` against ``reference`` (inf when the element counts differ)."""
    y, ref = np.asarray(y, np.float64).reshape(-1), np.asarray(reference, np.float64).reshape(-1)
    if y.shape != ref.shape:
        return float("inf")
    return float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-30))


@dataclass
class BenchRow:
    """One model on one backend at one batch: raw samples per series, and what the session says
    about itself."""

    model: str
    backend: str
    batch: int = 1
    device: str = ""
    prepare_ms: float | None = None
    pool_mib: float | None = None
    naive_mib: float | None = None
    rel_errors: dict[str, float] = field(default_factory=dict)  # series -> relative L2 vs ONNX Runtime
    note: str = ""
    samples: dict[str, list[list[float]]] = field(default_factory=dict)  # series -> repeats -> runs (ms)

    def repeat_means(self, series: str) -> list[float]:
        """The paper's figure (mean of the timed runs) of each repeat."""
        return [statistics.fmean(runs) for runs in self.samples.get(series, []) if runs]

    def cell(self, series: str) -> Spread | None:
        means = self.repeat_means(series)
        return Spread.of(means) if means else None

    def throughput(self, series: str) -> Spread | None:
        """Items per second of each repeat (``batch`` over its mean run time): median and range."""
        rates = [self.batch * 1000.0 / m for m in self.repeat_means(series) if m > 0]
        return Spread.of(rates) if rates else None

    @property
    def label(self) -> str:
        """The model, and its batch where that is not 1 (chart groups and titles)."""
        return self.model if self.batch == 1 else f"{self.model} x{self.batch}"

    def ratio(self, numerator: str, denominator: str) -> Spread | None:
        """Median (and range) of the per-repeat ratios ``numerator / denominator``."""
        pairs = [(a, b) for a, b in zip(self.repeat_means(numerator), self.repeat_means(denominator)) if b > 0]
        return Spread.of([a / b for a, b in pairs]) if pairs else None

    def median_ms(self, series: str) -> float | None:
        cell = self.cell(series)
        return None if cell is None else cell.median

    @property
    def recorded_ms(self) -> float | None:
        return self.median_ms("recorded")

    @property
    def eager_ms(self) -> float | None:
        return self.median_ms("eager")

    @property
    def onnxruntime_ms(self) -> float | None:
        return self.median_ms("onnxruntime")

    @property
    def decoupling_gain(self) -> float | None:
        """Time saved by recording, as the paper's Table 2 reports it (negative = faster):
        the median of the per-repeat ``(recorded - eager) / eager``."""
        ratio = self.ratio("recorded", "eager")
        return None if ratio is None else ratio.median - 1.0

    @property
    def vs_onnxruntime(self) -> float | None:
        ratio = self.ratio("recorded", "onnxruntime")
        return None if ratio is None else ratio.median


def load_model(name: str, batch: int | None = None) -> tuple[Net, bytes, dict[str, np.ndarray]]:
    """A zoo model (or ONNX path): the loaded net, the ONNX bytes and one seeded random feed, at
    ``batch`` where given: a zoo model is built at it; an ONNX file whose first input has a
    symbolic first dim is fed at it, and one that fixes another gets that dim set to it
    (:func:`gpumnn.zoo.with_batch`; a graph that fixes its batch inside then fails to prepare)."""
    if name in zoo.MODELS:
        proto, shape = zoo.build(name, batch), zoo.input_shape(name, batch)
        net = load(proto)
    else:
        import onnx
        net = load(name)  # first: it refuses invalid models and external data outside their folder
        proto, shape = onnx.load(name), None
        dims = tuple(net.inputs[0].shape or ())
        if batch is not None and dims and dims[0] != batch:
            if isinstance(dims[0], int) and dims[0] > 0:
                proto = zoo.with_batch(proto, batch)
                net = load(proto)
            shape = (batch,) + dims[1:]
    if shape is None:
        shape = tuple(net.inputs[0].shape)
    if not all(isinstance(d, int) and d > 0 for d in shape):
        from ..errors import InputError
        raise InputError(f"{name}: input {net.inputs[0].name!r} has the symbolic shape {list(shape)}; the bench "
                         f"gives only a batch")
    x = random_input(net.inputs[0].dtype, tuple(int(d) for d in shape), np.random.default_rng(0))
    return net, proto.SerializeToString(), {net.inputs[0].name: x}


def onnxruntime_runner(model_bytes: bytes, threads: int) -> Callable[[dict], np.ndarray] | None:
    """A function feed -> first output on ONNX Runtime's CPU provider at ``threads`` intra-op
    threads; None where onnxruntime is not installed."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    sess = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    return lambda feed: sess.run(None, feed)[0]


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
    from ..backends import REGISTRY
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
              warmup: int = 1, repeats: int = 5, eager: bool = True, progress: bool = True,
              clock: Clock = time.perf_counter, pause: float = PAUSE,
              batches: Sequence[int | None] = (None,)) -> list[BenchRow]:
    """Time each zoo model (or ONNX path) at each batch (None: the model's own) on each backend,
    recorded and eager, in alternation with ONNX Runtime (see the module docstring)."""
    threads = threads or os.cpu_count() or 1
    models = list(models)
    bar = Progress(len(models) * len(batches) * len(backends) * repeats, progress)
    rows: list[BenchRow] = []
    for model_name, batch in ((m, b) for m in models for b in batches):
        net, model_bytes, feed = load_model(model_name, batch)
        ort = onnxruntime_runner(model_bytes, threads)
        reference = ort(feed) if ort else None
        label = model_name if batch is None else f"{model_name} x{batch}"
        for backend in backends:
            row, sessions = BenchRow(model_name, backend, batch or 1), []
            try:
                sess = net.session(backend=backend, threads=threads, fallback=False)
                sessions.append(sess)
                row.device = sess.backends[backend].info.device
                row.prepare_ms = sess.prepare_seconds * 1000.0
                memory = sess.memory_summary().get(backend) or sess.memory_summary().get("cpu")
                row.pool_mib, row.naive_mib = memory["pool_bytes"] / 2**20, memory["naive_bytes"] / 2**20
                if reference is not None:
                    row.rel_errors["recorded"] = rel_l2(next(iter(sess.run(feed).values())), reference)
                fallbacks = sum(1 for r in sess.report_rows() if r["fallback"])
                if fallbacks:
                    row.note = f"{fallbacks} ops on cpu"
                fns: dict[str, Callable[[], object]] = {"recorded": lambda: sess.run(feed)}
                if eager:
                    eager_sess = net.session(backend=backend, threads=threads, record=False, fallback=False)
                    sessions.append(eager_sess)
                    fns["eager"] = lambda: eager_sess.run(feed)
                if ort is not None:
                    fns["onnxruntime"] = lambda: ort(feed)
                row.samples = alternate(fns, repeats, runs, warmup, clock,
                                        lambda r: bar.step(f"{label} on {backend}, repeat {r + 1}"), pause)
            except Exception as exc:  # one failing backend must not hide the others' figures
                row.note = f"failed: {type(exc).__name__}: {exc}"[:120]
            finally:
                for s in sessions:
                    s.close()
            rows.append(row)
    bar.close()
    return rows


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def short_name(series: str) -> str:
    return SHORT.get(series, series)


def protocol_line(threads: int, runs: int, warmup: int, repeats: int, series: Sequence[str] = SERIES,
                  pause: float = 0.0, batches: Sequence[int] = (1,)) -> str:
    names = ", ".join(LABELS.get(s, s) for s in series)
    rest = f", {pause:g} s apart" if pause else ""
    sizes = "/".join(str(b) for b in sorted(batches))
    rate = f"; items/s: batch / a repeat's mean, median over repeats ({SPREAD})" if list(batches) != [1] else ""
    return (f"batch {sizes}, {threads} CPU thread(s); each repeat times {names} in turn{rest} ({warmup} warm-up, then "
            f"the mean of {runs} runs); ms cells: median over {repeats} repeats ({SPREAD}); ratios: median of "
            f"per-repeat ratios ({SPREAD}){rate}")


def format_table(rows: Sequence[BenchRow], threads: int, skipped: dict[str, str] | None = None, *, runs: int = 10,
                 warmup: int = 1, repeats: int = 5, series: Sequence[str] = SERIES,
                 ratios: Sequence[tuple[str, str]] = RATIOS, extras: bool = True, pause: float = 0.0) -> str:
    """The benchmark as a text table: one medians-and-spread cell per series, the ratio columns
    (``recorded/eager`` is the paper's decoupling gain), then the session's own figures; where a
    row's batch is not 1, a batch column and each series' items per second after the ratios."""
    timed = [s for s in series if any(r.samples.get(s) for r in rows)]
    if timed:  # a series no row timed (--no-eager) gets no columns
        series, ratios = timed, [(a, b) for a, b in ratios if a in timed and b in timed]
    error_series = [s for s in series if any(s in r.rel_errors for r in rows)]
    batches = list(dict.fromkeys(r.batch for r in rows)) or [1]
    batched = batches != [1]
    columns: list[tuple[str, Callable[[BenchRow], str]]] = [("model", lambda r: r.model), ("backend", lambda r: r.backend)]
    if batched:
        columns.append(("batch", lambda r: str(r.batch)))
    columns += [(f"{short_name(s)} ms", lambda r, s=s: _fmt(r.cell(s), ".1f")) for s in series]
    columns += [(f"{short_name(a)}/{short_name(b)}", lambda r, a=a, b=b: _fmt(r.ratio(a, b), ".2f")) for a, b in ratios]
    if batched:
        columns += [(f"{short_name(s)} items/s", lambda r, s=s: _fmt(r.throughput(s), ".0f")) for s in series]
    if extras:
        columns += [("prepare ms", lambda r: _fmt(r.prepare_ms)), ("pool MiB", lambda r: _fmt(r.pool_mib)),
                    ("naive MiB", lambda r: _fmt(r.naive_mib))]
    columns += [(f"{short_name(s)} err", lambda r, s=s: _fmt(r.rel_errors.get(s), ".1e")) for s in error_series]
    cells = [[fn(r) for _, fn in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _) in enumerate(columns)]

    def line(values: Sequence[str], note: str = "") -> str:
        text = "  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths)))
        return f"{text}  {note}".rstrip()

    header = line([h for h, _ in columns], "note")
    lines = [protocol_line(threads, runs, warmup, repeats, series, pause, batches), header, "-" * len(header)]
    lines += [line(c, r.note) for c, r in zip(cells, rows)]
    devices = sorted({(r.backend, r.device) for r in rows if r.device})
    lines += [f"{b}: {d}" for b, d in devices]
    for name, reason in (skipped or {}).items():
        lines.append(f"{name}: not run ({reason})")
    return "\n".join(lines)


def rows_as_dicts(rows: Sequence[BenchRow], series: Sequence[str] = SERIES,
                  ratios: Sequence[tuple[str, str]] = RATIOS) -> list[dict]:
    """JSON-ready rows: the raw samples, and per series and ratio the median, low and high."""
    out = []
    for r in rows:
        cells = {s: asdict(c) for s in series if (c := r.cell(s)) is not None}
        ratio_cells = {f"{a}/{b}": asdict(c) for a, b in ratios if (c := r.ratio(a, b)) is not None}
        rates = {s: asdict(c) for s in series if (c := r.throughput(s)) is not None}
        out.append(dict(asdict(r), recorded_ms=r.recorded_ms, eager_ms=r.eager_ms, onnxruntime_ms=r.onnxruntime_ms,
                        decoupling_gain=r.decoupling_gain, vs_onnxruntime=r.vs_onnxruntime, cells=cells,
                        ratios=ratio_cells, items_per_second=rates))
    return out
