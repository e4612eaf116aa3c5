"""The cpu backend with its compiled loops (``jit=True``), with NumPy's kernels alone (``jit=False``)
and ONNX Runtime, timed in alternation in one process (the paper's protocol, several repeats).

    python bench/cpu_jit.py mobilenet_v2 squeezenet1_1 --threads 2 --repeats 7 --runs 5

Per model: the median ms (min-max over repeats) of each series, and per-repeat ratios (median,
min-max): compiled / NumPy (what the loops buy) and compiled / ONNX Runtime (issue 11's target).
Every output is checked against ONNX Runtime. Nothing here asserts speed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gpumnn, not an installed one

from gpumnn import zoo  # noqa: E402
from gpumnn.benchmark import Spread, add_protocol_arguments, alternate, load_model, onnxruntime_runner, rel_l2  # noqa: E402


def ratios(top: list[list[float]], bottom: list[list[float]]) -> Spread:
    """Per-repeat ratios of the repeats' means."""
    return Spread.of([statistics.fmean(a) / statistics.fmean(b) for a, b in zip(top, bottom)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(zoo.MODELS))
    parser.add_argument("--threads", type=int, default=2)
    add_protocol_arguments(parser)
    args = parser.parse_args()
    print(f"batch 1, {args.threads} threads, {args.warmup} warm-up + mean of {args.runs} runs, "
          f"{args.repeats} repeats in alternation; ms: median (min-max) over repeats")
    columns = ("numpy ms", "jit ms", "ORT ms", "jit/numpy", "jit/ORT")
    print(f"{'model':<20}" + "".join(f"{c:>22}" for c in columns) + "  err")
    for name in args.models:
        net, model_bytes, feed = load_model(name)
        ort = onnxruntime_runner(model_bytes, args.threads)
        reference = ort(feed)
        sessions = {jit: net.session(backend="cpu", threads=args.threads, jit=jit) for jit in (False, True)}
        err = max(rel_l2(next(iter(s.run(feed).values())), reference) for s in sessions.values())
        samples = alternate({"numpy": lambda: sessions[False].run(feed), "jit": lambda: sessions[True].run(feed),
                             "ort": lambda: ort(feed)}, args.repeats, args.runs, args.warmup)
        cells = [f"{Spread.of([statistics.fmean(r) for r in samples[k]]):.2f}" for k in ("numpy", "jit", "ort")]
        cells += [f"{ratios(samples['jit'], samples['numpy']):.3f}", f"{ratios(samples['jit'], samples['ort']):.2f}"]
        print(f"{name:<20}" + "".join(f"{c:>22}" for c in cells) + f"  {err:.1e}", flush=True)
        for sess in sessions.values():
            sess.close()


if __name__ == "__main__":
    main()
