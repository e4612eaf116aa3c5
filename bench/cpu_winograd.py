"""The cpu Winograd kernel against im2col, op by op: where ``cpu.WINOGRAD_PAYS`` comes from.

    python bench/cpu_winograd.py resnet18 [--threads 1] [--runs 9]

Makes the model's session twice in one process, once with im2col forced (so each Winograd
convolution runs im2col) and once as the scheme step chooses, then times each Winograd
convolution's work in both sessions in alternation (median of ``runs``). Nothing here asserts speed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gpumnn, not an installed one

from gpumnn.tools.benchmark import load_model  # noqa: E402
from gpumnn.scheduler.schemes import forced_schemes, winograd_detail  # noqa: E402


def _ms(work) -> float:
    start = time.perf_counter()
    for fn in work:
        fn()
    return (time.perf_counter() - start) * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    net, _, feed = load_model(args.model)
    with forced_schemes(conv=("im2col", 0)):
        plain = net.session(backend="cpu", threads=args.threads, fallback=False)
    wino = net.session(backend="cpu", threads=args.threads, fallback=False)
    plain.run(feed), wino.run(feed)
    totals = [0.0, 0.0]
    with wino.backends["cpu"]._limiter, np.errstate(all="ignore"):
        for a, b in zip(plain.shape_set().first_state.executions, wino.shape_set().first_state.executions):
            if b.scheme != "winograd":
                continue
            runs = [(_ms(a.work), _ms(b.work)) for _ in range(args.runs)]
            im2col, winograd = (statistics.median(r[i] for r in runs) for i in (0, 1))
            totals[0] += im2col
            totals[1] += winograd
            op = b.op
            print(f"{op.source:<28} {op.in_channels}->{op.out_channels} {op.out_hw[0]}x{op.out_hw[1]} "
                  f"{winograd_detail(op.winograd_tile, op.kernel)}: im2col {im2col:.3f} ms, winograd {winograd:.3f} ms, "
                  f"{im2col / winograd:.2f}x")
    print(f"total: im2col {totals[0]:.2f} ms, winograd {totals[1]:.2f} ms")
    plain.close(), wino.close()


if __name__ == "__main__":
    main()
