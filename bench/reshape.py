"""What a change of input shape costs a session, beside a run (issue 12, MNN's resizeSession).

A zoo model whose input's height and width are made symbolic (a CNN ending in global pooling
takes any size) is run, per backend, at a base size and then:

* run        -- a run at shapes the session has prepared (median over ``--runs``),
* cold       -- the first run at shapes it has never seen: prepare them (lowering, schemes,
                placement, pool layout, pools, executions, recordings; weights already on the
                device and compiled programs are reused) and run; ``prepare`` is the preparation alone,
  ``programs built`` counts kernels compiled for it (not found in memory or the disk cache),
* cached     -- a run right after switching to shapes prepared earlier (the cache's hit),
* new session -- what a shape change cost before: a fresh session for the new shapes (backends
                started, weights uploaded, programs from the disk cache), and its first run.

Each figure is the median of ``--repeats`` samples (min-max in brackets): a cold sample uses a
size not seen before, so every one prepares; the machine is noisy, so read medians.

    .venv/bin/python bench/reshape.py --model squeezenet1_1 --backend cpu,opencl --repeats 5
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpumnn  # noqa: E402
from gpumnn import zoo  # noqa: E402


def symbolic_hw(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its first input's height and width symbolic (and outputs' shapes unstated)."""
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "H", "W"
    for value in list(model.graph.output):
        value.type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
    return model


def ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0


def cell(samples: list[float]) -> str:
    return f"{statistics.median(samples):8.1f} [{min(samples):.1f}-{max(samples):.1f}]"


def bench_backend(net: gpumnn.Net, backend: str, base: tuple[int, ...], repeats: int, runs: int) -> list[str]:
    rng = np.random.default_rng(0)
    name = net.inputs[0].name

    def feed(side: int) -> dict:
        return {name: rng.standard_normal(base[:2] + (side, side)).astype(np.float32)}

    side = base[2]
    base_feed = feed(side)
    samples: dict[str, list[float]] = {"run": [], "cold": [], "prepare": [], "built": [], "cached": [],
                                       "new session": []}
    with net.session(backend=backend, fallback=False, shape_cache=repeats + 2) as sess:
        sess.run(base_feed)  # prepared and warmed at the base size
        for _ in range(runs):
            start = time.perf_counter()
            sess.run(base_feed)
            samples["run"].append(ms(start))
        for k in range(repeats):
            other = feed(side + 8 * (k + 1))  # never seen: this run prepares
            built = sum(c["programs_built"] for c in sess.counters.values())
            start = time.perf_counter()
            sess.run(other)
            samples["cold"].append(ms(start))
            samples["built"].append(sum(c["programs_built"] for c in sess.counters.values()) - built)
            samples["prepare"].append(sess.shape_set().prepare_seconds * 1000.0)
            sess.run(base_feed)  # back to the base size (kept)
            start = time.perf_counter()
            sess.run(other)  # and to the other again: a cache hit
            samples["cached"].append(ms(start))
            sess.run(base_feed)
        stats = sess.stats
    for k in range(repeats):
        other = feed(side + 8 * (k + 1))
        start = time.perf_counter()
        with net.session(backend=backend, fallback=False, input_shapes={name: other[name].shape}) as fresh:
            fresh.run(other)
        samples["new session"].append(ms(start))
    if (stats["prepares"], stats["cache_hits"]) != (1 + repeats, runs + 3 * repeats):
        raise SystemExit(f"{backend}: unexpected cache counters {stats}")
    return [cell(v) for v in samples.values()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="squeezenet1_1", choices=zoo.names())
    parser.add_argument("--backend", default="all")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    backends = gpumnn.available_backends() if args.backend == "all" else args.backend.split(",")
    net = gpumnn.load(symbolic_hw(zoo.build(args.model)))
    base = zoo.input_shape(args.model)
    print(f"{args.model} with symbolic H, W; base {list(base)}, other sizes +8, +16, ... per repeat; "
          f"ms, median of {args.repeats} (min-max)")
    columns = ("run", "cold shape change", "of which prepare", "programs built", "cached shape change",
               "new session + run")
    print(f"{'backend':<8} " + " ".join(f"{c:>24}" for c in columns))
    for backend in backends:
        cells = bench_backend(net, backend, base, args.repeats, args.runs)
        print(f"{backend:<8} " + " ".join(f"{c:>24}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
