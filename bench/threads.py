"""Throughput of one session called from several threads, beside the same work done serially.

For each backend: one session, ``--threads`` workers each running ``--runs`` inferences on one
input; the session with ``max_concurrent_runs=1`` (a lock: runs take turns) and with the
backend's safe bound (runs overlap where the API allows) are timed in alternation, ``--repeats``
times, and the median wall time per run is printed with its spread. Every result is checked
against the first serial one (the runs must agree, not only be fast).

    .venv/bin/python bench/threads.py --model squeezenet1_1 --threads 4 --runs 5
"""
from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpumnn  # noqa: E402
from gpumnn import zoo  # noqa: E402
from gpumnn.tools.benchmark import Spread, alternate  # noqa: E402


def threaded_runs(sess: gpumnn.Session, feed: dict, threads: int, runs: int, expect: np.ndarray) -> Callable[[], None]:
    """A function that runs ``threads`` workers x ``runs`` runs on ``sess`` and checks every output
    (timed whole by :func:`gpumnn.tools.benchmark.time_runs`; starting the threads is ~0.1 ms of it)."""

    def run_all() -> None:
        errors: list[float] = []

        def worker() -> None:
            for _ in range(runs):
                out = next(iter(sess.run(feed).values()))
                errors.append(float(np.abs(out - expect).max()))

        workers = [threading.Thread(target=worker) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if len(errors) < threads * runs or max(errors) > 1e-3 * max(1.0, float(np.abs(expect).max())):
            raise SystemExit(f"{sess.backend}: a concurrent run failed or disagreed with the serial one")

    return run_all


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="squeezenet1_1", choices=zoo.names())
    parser.add_argument("--backend", default="all")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    backends = gpumnn.available_backends() if args.backend == "all" else args.backend.split(",")
    net = gpumnn.load(zoo.build(args.model))
    name = net.inputs[0].name
    feed = {name: np.random.default_rng(0).standard_normal(zoo.input_shape(args.model)).astype(np.float32)}
    print(f"{args.model}: {args.threads} threads x {args.runs} runs, median of {args.repeats} repeats "
          f"(ms per run, wall clock; min-max in parentheses)")
    print(f"{'backend':<8} {'bound':>5} {'default':>7} {'serial (lock)':>22} {'overlapping':>22} {'states':>6}")
    for backend in backends:
        serial = net.session(backend=backend, max_concurrent_runs=1, fallback=False)
        shared = net.session(backend=backend, fallback=False, max_concurrent_runs=args.threads)  # up to the bound
        expect = next(iter(serial.run(feed).values()))
        shared.run(feed)
        samples = alternate({"serial": threaded_runs(serial, feed, args.threads, args.runs, expect),
                             "overlap": threaded_runs(shared, feed, args.threads, args.runs, expect)},
                            args.repeats, runs=1, warmup=0)
        per_run = args.threads * args.runs
        cells = [f"{Spread.of([ms / per_run for (ms,) in repeats]):.2f}" for repeats in samples.values()]
        default = shared.backends[backend].default_concurrent_runs
        print(f"{backend:<8} {shared.max_concurrent_runs:>5} {default:>7} {cells[0]:>22} {cells[1]:>22} "
              f"{shared.run_states:>6}")
        serial.close()
        shared.close()


if __name__ == "__main__":
    main()
