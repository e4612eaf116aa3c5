"""Charts of a benchmark (``gpumnn bench --png DIR``, and the peers in bench/) with matplotlib.

Two kinds of figure, both drawn from :class:`~gpumnn.tools.benchmark.BenchRow` samples:

* ``latency_<model>.png``: per backend, one bar per timed series (gpumnn recorded and eager,
  ONNX Runtime, a peer such as ncnn), the median over repeats with a bar for the min-max spread;
  log scale where the bars span more than a factor of 20 (a CPU-emulated GPU beside NumPy).
* ``ratios.png``: per ratio (recorded/eager, recorded/ONNX Runtime, ...), per model and backend,
  the median of the per-repeat ratios with its spread, on a log scale with a line at 1.

matplotlib is optional (the ``bench`` extra): it is imported only here, only when charts are
asked for, and its absence is a :class:`ChartsUnavailable` that says how to install it.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Sequence

from .benchmark import LABELS, RATIOS, SPREAD, BenchRow, Spread, short_name


class ChartsUnavailable(ImportError):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    """Raise :class:`ChartsUnavailable` (saying what to install) unless matplotlib imports."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ChartsUnavailable("charts need matplotlib: pip install 'gpumnn[bench]' (or pip install matplotlib)"
                                f" [{exc}]") from exc


def figure(width: float, height: float):
    """A matplotlib Figure made without pyplot (no process-wide state: safe beside other threads)."""
    require_matplotlib()
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend
    return Figure(figsize=(width, height), layout="constrained")


def _bars(ax, groups: Sequence[str], series: Sequence[str], cells: dict[tuple[str, str], Spread],
          base: float = 0.0) -> None:
    """Grouped bars from ``base``: one group per entry of ``groups``, one bar per series with its spread."""
    width = 0.8 / max(len(series), 1)
    for i, name in enumerate(series):
        xs, heights, below, above = [], [], [], []
        for g, group in enumerate(groups):
            cell = cells.get((group, name))
            if cell is not None:
                xs.append(g + (i - (len(series) - 1) / 2) * width)
                heights.append(cell.median)
                below.append(cell.median - cell.low)
                above.append(cell.high - cell.median)
        if xs:
            ax.bar(xs, [h - base for h in heights], width, bottom=base, yerr=[below, above], capsize=3,
                   label=LABELS.get(name, name))
    ax.set_xticks(range(len(groups)), groups)


def _log_scale(ax, values: Sequence[float]) -> None:
    """A log y axis labelled with plain numbers (0.5, 2, 300) rather than powers of ten; the
    minor ticks are labelled too where the data span less than a decade (else they crowd)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain if max(values) / min(values) < 10 else NullFormatter())


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(name).stem if name.endswith(".onnx") else name)


def write_charts(rows: Sequence[BenchRow], directory: str | Path, series: Sequence[str],
                 ratios: Sequence[tuple[str, str]] = RATIOS, prefix: str = "") -> list[Path]:
    """Write the latency chart of each model and the ratio chart into ``directory``; the paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for model in dict.fromkeys(r.label for r in rows):
        model_rows = [r for r in rows if r.label == model and r.samples]
        if not model_rows:
            continue
        present = [s for s in series if any(r.cell(s) for r in model_rows)]
        cells = {(r.backend, s): c for r in model_rows for s in present if (c := r.cell(s)) is not None}
        fig = figure(max(6.0, 1.5 + 0.7 * len(model_rows) * max(len(present), 1)), 4)
        ax = fig.add_subplot()
        _bars(ax, [r.backend for r in model_rows], present, cells)
        values = [c.median for c in cells.values() if c.median > 0]
        if values and max(values) / min(values) > 20:
            _log_scale(ax, values)
        ax.set_ylabel("ms per run (median over repeats)")
        ax.set_title(f"{model}: latency, bars {SPREAD} over repeats")
        ax.legend(fontsize="small")
        path = out / f"{prefix}latency_{_safe(model)}.png"
        fig.savefig(path, dpi=100)
        written.append(path)
    ratio_list = [(a, b) for a, b in ratios if any(r.ratio(a, b) for r in rows)]
    if ratio_list:
        models = list(dict.fromkeys(r.label for r in rows))
        backends = list(dict.fromkeys(r.backend for r in rows))
        fig = figure(max(6.0, 2 + 0.6 * len(models) * max(len(backends), 1)), 3.2 * len(ratio_list))
        for i, (a, b) in enumerate(ratio_list, 1):
            ax = fig.add_subplot(len(ratio_list), 1, i)
            cells = {(r.label, r.backend): c for r in rows if (c := r.ratio(a, b)) is not None}
            _bars(ax, models, backends, cells, base=1.0)  # up: slower than the denominator, down: faster
            ax.axhline(1.0, color="black", linewidth=0.8)
            # log: 2x slower and 2x faster lie as far from the line at 1
            _log_scale(ax, [1.0] + [v for c in cells.values() for v in (c.low, c.high) if v > 0])
            ax.set_ylabel(f"{short_name(a)} / {short_name(b)}")
            ax.set_title(f"{LABELS.get(a, a)} / {LABELS.get(b, b)}\n(median of per-repeat ratios, bars {SPREAD})",
                         fontsize="medium")
            ax.legend(fontsize="small", title="backend")
        path = out / f"{prefix}ratios.png"
        fig.savefig(path, dpi=100)
        written.append(path)
    return written


def write_charts_and_say(rows: Sequence[BenchRow], directory: str | Path, series: Sequence[str],
                         ratios: Sequence[tuple[str, str]] = RATIOS, prefix: str = "") -> list[Path]:
    """``write_charts``, naming each file on stderr after the table already printed on stdout."""
    sys.stdout.flush()
    paths = write_charts(rows, directory, series, ratios, prefix)
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    return paths

