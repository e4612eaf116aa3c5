"""The cpu backend with its compiled loops in native regions (``jit=True``, the default), the
compiled loops on its Python threads (``regions=False``), NumPy's kernels alone (``jit=False``) and
ONNX Runtime, timed in alternation in one process (the paper's protocol, several repeats).

    python bench/cpu_jit.py mobilenet_v2 squeezenet1_1 --threads 2 --repeats 7 --runs 5
    python bench/cpu_jit.py mobilenet_v2 --only jit     # one series alone in this process

Per model: the median ms (min-max over repeats) of each series, and per-repeat ratios (median,
min-max): regions / NumPy, regions / Python threads (what each step buys) and regions / ONNX
Runtime (issue 11's target). Every output is checked against ONNX Runtime. Nothing here asserts
speed.

Alternation has a cost of its own on 2 cores: ONNX Runtime's threads spin ~50 ms after its run,
and the regions' threads a few ms after theirs, so each series runs beside the other's spinning
thread. ``--only`` times one series with no other engine in the process (run it once per series,
in turn), to show that cost; ``--pause`` (the protocol's, default 0.1 s) sleeps before each series'
turn instead.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gpumnn, not an installed one

from gpumnn import zoo  # noqa: E402
from gpumnn.tools.benchmark import Spread, add_protocol_arguments, alternate, load_model, onnxruntime_runner, rel_l2  # noqa: E402


def ratios(top: list[list[float]], bottom: list[list[float]]) -> Spread:
    """Per-repeat ratios of the repeats' means."""
    return Spread.of([statistics.fmean(a) / statistics.fmean(b) for a, b in zip(top, bottom)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(zoo.MODELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", choices=("numpy", "threads", "jit", "ort"),
                        help="time this series alone (no other engine in the process)")
    add_protocol_arguments(parser)
    args = parser.parse_args()
    print(f"batch 1, {args.threads} threads, {args.warmup} warm-up + mean of {args.runs} runs, "
          f"{args.repeats} repeats in alternation; ms: median (min-max) over repeats")
    series = (args.only,) if args.only else ("numpy", "threads", "jit", "ort")
    columns = [f"{k} ms" for k in series]
    if not args.only:
        columns += ["jit/numpy", "jit/threads", "jit/ORT"]
    print(f"{'model':<20}" + "".join(f"{c:>22}" for c in columns) + "  err")
    options = {"numpy": {"jit": False}, "threads": {"jit": True, "regions": False}, "jit": {}}
    for name in args.models:
        net, model_bytes, feed = load_model(name)
        ort = onnxruntime_runner(model_bytes, args.threads) if "ort" in series or not args.only else None
        reference = (ort or onnxruntime_runner(model_bytes, args.threads))(feed)
        sessions = {k: net.session(backend="cpu", threads=args.threads, **options[k]) for k in series if k != "ort"}
        err = max((rel_l2(next(iter(s.run(feed).values())), reference) for s in sessions.values()), default=0.0)
        runners = {k: (lambda s=s: s.run(feed)) for k, s in sessions.items()}
        if "ort" in series:
            runners["ort"] = lambda: ort(feed)
        samples = alternate(runners, args.repeats, args.runs, args.warmup, pause=args.pause)
        cells = [f"{Spread.of([statistics.fmean(r) for r in samples[k]]):.2f}" for k in series]
        if not args.only:
            cells += [f"{ratios(samples['jit'], samples[k]):.3f}" for k in ("numpy", "threads")]
            cells.append(f"{ratios(samples['jit'], samples['ort']):.2f}")
        print(f"{name:<20}" + "".join(f"{c:>22}" for c in cells) + f"  {err:.1e}", flush=True)
        for sess in sessions.values():
            sess.close()

if __name__ == "__main__":
    main()
