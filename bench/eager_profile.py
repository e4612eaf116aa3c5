"""Where an eager run's host time goes: Python's profiler over a few eager runs of one model on
one backend (after one untimed run), printed as the functions with the most time of their own.

    python bench/eager_profile.py resnet18 --backend cuda [--runs 3] [--top 25]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpumnn.tools.benchmark import load_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    net, _, feed = load_model(args.model)
    with net.session(backend=args.backend, record=False, fallback=False) as sess:
        sess.run(feed)
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.enable()
        for _ in range(args.runs):
            sess.run(feed)
        profiler.disable()
        ms = (time.perf_counter() - start) / args.runs * 1e3
        print(f"{args.model} on {args.backend}, eager: {ms:.1f} ms a run under the profiler ({len(sess.program.ops)} ops)")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
