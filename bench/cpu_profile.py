"""Where a recorded cpu run spends its time: each execution's work timed alone, summed per kind.

    python bench/cpu_profile.py resnet18 [--threads 2] [--runs 10] [--top 15]

Runs the session once (warm-up), then times every execution's work items, ``runs`` times each
in run order, and prints the per-kind totals (atomic op type, scheme, kernel) and the slowest
ops. The sum of the per-op medians is set beside a whole recorded run, so the gap shows the
dispatch overhead between ops. Nothing here asserts speed.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gpumnn, not an installed one

from gpumnn.benchmark import load_model, time_runs  # noqa: E402


def op_kind(exe) -> str:
    op = exe.op
    name = type(op).__name__
    if name == "Conv2D":
        return f"Conv2D {exe.scheme} {op.kernel[0]}x{op.kernel[1]}" + (f" s{op.strides[0]}" if op.strides != (1, 1) else "")
    if name in ("Binary", "Unary", "Reduce", "Pool2D"):
        return f"{name} {op.op}"
    return name


def profile(model: str, threads: int, runs: int, **options) -> tuple[list[tuple[str, str, float]], float]:
    """[(kind, node, median ms)] per execution in run order, and a whole recorded run's median ms
    (``options``: the cpu backend's, e.g. regions=False)."""
    net, _, feed = load_model(model)
    sess = net.session(backend="cpu", threads=threads, fallback=False, **options)
    sess.run(feed)
    backend = sess.backends["cpu"]
    state = sess.shape_set().first_state
    whole = statistics.median(time_runs(lambda: sess.run(feed), runs))
    rows = []
    with backend._limiter, np.errstate(all="ignore"):
        for exe in state.executions:
            work = exe.work
            samples = []
            for _ in range(runs):
                start = time.perf_counter()
                for fn in work:
                    fn()
                samples.append((time.perf_counter() - start) * 1000.0)
            rows.append((op_kind(exe), exe.op.source, statistics.median(samples)))
    sess.close()
    return rows, whole


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--no-regions", action="store_true", help="the compiled loops on Python threads, not in native regions")
    args = parser.parse_args()
    rows, whole = profile(args.model, args.threads, args.runs, **({"regions": False} if args.no_regions else {}))
    total = sum(ms for _, _, ms in rows)
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    for kind, _, ms in rows:
        by_kind[kind].append(ms)
    print(f"{args.model}: {len(rows)} ops, sum of per-op medians {total:.2f} ms, whole recorded run {whole:.2f} ms")
    print(f"{'kind':<32} {'ops':>4} {'ms':>8} {'share':>6}")
    for kind, values in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        print(f"{kind:<32} {len(values):>4} {sum(values):8.2f} {sum(values) / total:6.1%}")
    print(f"\nslowest {args.top} ops:")
    for kind, node, ms in sorted(rows, key=lambda r: -r[2])[:args.top]:
        print(f"  {ms:7.3f} ms  {kind:<32} {node}")


if __name__ == "__main__":
    main()
