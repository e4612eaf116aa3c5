"""Static int8 global average pooling on the cpu (issue 30): a QDQ model with its DequantizeLinear ->
GlobalAveragePool -> QuantizeLinear as one QuantizedGlobalAveragePool (after) or pooled in float (before,
the decision ``precision.int8_global_average_pool`` turned off), in one process, in alternation.

    NUMBA_NUM_THREADS=1 python bench/int8_average_pool.py --models mobilenet_v2/qdq_s8 --rounds 5 --runs 30

Per model: the atomic ops and 8-bit Rasters of each program; the ops only one program has (the pooling
and what surrounds it), each timed alone (median of ``--runs`` calls, summed); a whole recorded run's
per-call minimum and median, each round's before and after in turn: medians over rounds with their
min-max. One cpu thread. Nothing here asserts speed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpumnn  # noqa: E402
from gpumnn import atomic as A  # noqa: E402
from gpumnn.runtime import shape_set  # noqa: E402
from quantized import feed_of, make_case  # noqa: E402


def _session(path: Path, feed, int8_pool: bool):
    """A one-thread cpu session prepared with the int8 pooling on or off."""
    decide = shape_set.int8_global_average_pool
    if not int8_pool:
        shape_set.int8_global_average_pool = lambda backend: False
    try:
        session = gpumnn.load(str(path)).session(backend="cpu", threads=1, fallback=False)
        session.run(feed)
    finally:
        shape_set.int8_global_average_pool = decide
    return session


def _key(exe) -> tuple[str, str, str]:
    """An op by what it is and the node it was lowered from (temp names differ between the programs)."""
    return type(exe.op).__name__, getattr(exe.op, "op", ""), exe.op.source


def _op_ms(session, keys, runs: int) -> float:
    """The sum of the per-op medians of the executions whose key is in ``keys``."""
    backend = session.backends["cpu"]
    total = 0.0
    for group, work in backend.work_items(list(session.shape_set().first_state.executions)):
        if _key(group[0]) not in keys:
            continue
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            for fn in work:
                fn()
            times.append((time.perf_counter() - start) * 1000.0)
        total += statistics.median(times)
    return total


def _run_ms(session, feed, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(feed)
        times.append((time.perf_counter() - start) * 1000.0)
    return times


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mobilenet_v2/qdq_s8", "mobilenet_v2/qdq_u8"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "gpumnn-bench-quantized")
    args = parser.parse_args()
    for name in args.models:
        case = make_case(name, args.cache)
        feed = feed_of(onnx.load(case.quantized_path))
        sessions = {label: _session(case.quantized_path, feed, label == "after") for label in ("before", "after")}
        outputs = {label: next(iter(s.run(feed).values())) for label, s in sessions.items()}
        programs = {label: s.program for label, s in sessions.items()}
        keys = {label: {_key(e) for e in s.shape_set().first_state.executions} for label, s in sessions.items()}
        print(f"{name}: outputs differ in {int(np.sum(outputs['before'] != outputs['after']))} of "
              f"{outputs['after'].size} elements, by at most {np.abs(outputs['before'] - outputs['after']).max():.4g}")
        for label, program in programs.items():
            rasters = [op for op in program.ops if isinstance(op, A.Raster) and op.dtype in (A.INT8, A.UINT8)]
            only = sorted(f"{k[0]} {k[1]} ({k[2]})".replace(" (", "(", k[1] == "")
                          for k in keys[label] - keys["after" if label == "before" else "before"])
            print(f"  {label}: {len(program.ops)} ops, {len(rasters)} 8-bit Rasters; only here: {', '.join(only)}")
        minima, medians, own = ({label: [] for label in sessions} for _ in range(3))
        for _ in range(args.rounds):
            for label, session in sessions.items():
                other = "after" if label == "before" else "before"
                own[label].append(_op_ms(session, keys[label] - keys[other], args.runs))
                times = _run_ms(session, feed, args.runs)
                minima[label].append(min(times))
                medians[label].append(statistics.median(times))
        for label in sessions:
            print(f"  {label}: the ops only here {_spread(own[label])} ms; a run: min {_spread(minima[label])} ms, "
                  f"median {_spread(medians[label])} ms")
        for session in sessions.values():
            session.close()


if __name__ == "__main__":
    main()
