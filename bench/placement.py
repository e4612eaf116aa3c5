"""Each single backend beside ``backend="auto"``, recorded, with the cost model's estimate.

For every model: one recorded session per available backend and one with ``backend="auto"``;
rounds alternate between the sessions (``--repeats`` rounds of ``--runs`` runs each), and the
median wall time per run is printed beside the session's estimated total, with auto's placement.
``--calibrate`` measures every backend fully before each model, so that estimates and times share
the machine's load (otherwise the stored calibration is used, or a quick one is made).
The spread is the range of the per-round medians. ``--split HUB REGEX=BACKEND`` adds a session on
HUB with the nodes whose names match REGEX pinned to BACKEND (e.g. one branch of every fire
module on another backend, overlapped by ``submit_async``).

    .venv/bin/python bench/placement.py squeezenet1_1 mobilenet_v1 --runs 3 --repeats 3
    .venv/bin/python bench/placement.py squeezenet1_1 --split cpu 'expand1x1'=opencl
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpumnn  # noqa: E402
from gpumnn import zoo  # noqa: E402
from gpumnn.backends import create_backend  # noqa: E402
from gpumnn.scheduler.calibration import calibrate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["squeezenet1_1", "mobilenet_v1"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--split", nargs=2, metavar=("HUB", "REGEX=BACKEND"))
    parser.add_argument("--calibrate", action="store_true", help="calibrate every backend fully before each model")
    args = parser.parse_args()
    backends = gpumnn.available_backends()
    print(f"{'model':<14} {'session':<8} {'measured ms':>12} {'spread':>13} {'estimated ms':>13} {'est/meas':>9}  placement")
    for name in args.models:
        if args.calibrate:  # just before this model's sessions: a shared machine's load drifts within minutes
            _calibrate_all(backends)
        net = gpumnn.load(zoo.build(name))
        x = np.random.default_rng(0).standard_normal(zoo.input_shape(name)).astype(np.float32)
        sessions = {b: net.session(backend=b) for b in [*backends, "auto"]}
        if args.split:
            hub, (pattern, target) = args.split[0], args.split[1].split("=")
            nodes = {n.name for n in net.graph.nodes if re.search(pattern, n.name)}
            sessions["split"] = net.session(backend=hub, placement={n: target for n in nodes})
        times: dict[str, list[float]] = {b: [] for b in sessions}
        for sess in sessions.values():
            sess.run({"input": x})  # warm-up
        for _ in range(args.repeats):
            for b, sess in sessions.items():
                start = time.perf_counter()
                for _ in range(args.runs):
                    sess.run({"input": x})
                times[b].append((time.perf_counter() - start) / args.runs * 1e3)
        for b, sess in sessions.items():
            measured = statistics.median(times[b])
            est = sess.placement.estimate.total_ms
            where = ", ".join(f"{k} {v}" for k, v in Counter(sess.placement.op_backends).items())
            spread = f"{min(times[b]):.1f}-{max(times[b]):.1f}"
            print(f"{name:<14} {b:<8} {measured:>12.2f} {spread:>13} {est:>13.2f} {est / measured:>9.2f}  {where}"
                  + (f"; {sess.placement.sync.overlaps} overlapped" if sess.placement.sync else ""))
        singles = {b: statistics.median(times[b]) for b in backends}
        best = min(singles, key=singles.get)
        ratios = [a / s for a, s in zip(times["auto"], times[best])]  # paired: taken in the same round
        same = [b for b in backends if sessions[b].placement.op_backends == sessions["auto"].placement.op_backends]
        print(f"{name:<14} auto / best single ({best}), per round: median {statistics.median(ratios):.3f} "
              f"({min(ratios):.2f}-{max(ratios):.2f})"
              + (f"; auto placed every op as {same[0]} does" if same else ""))
        for sess in sessions.values():
            sess.close()


def _calibrate_all(backends: list[str]) -> None:
    for name in backends:
        backend = create_backend(name)
        try:
            print(f"  {name}: {calibrate(backend).describe()}")
        finally:
            backend.close()


if __name__ == "__main__":
    main()
