"""Items per second of batch inference on Ray Data: gpumnn's Predictor beside ONNX Runtime in the
same actors (issue 31).

A local Ray cluster (``ray.init(num_cpus=--cpus)``) maps ``--images`` random images through a zoo
model with a symbolic batch, on 1 and 2 actors (``--actors``) at each ``--batch``: each engine in
turn, ``--repeats`` times. An actor pool of ``Predictor`` (gpumnn.integrations.ray.map_batches)
is set against the same pool running ONNX Runtime's CPU provider through the same columns (one
intra-op thread per actor, as gpumnn's cpu backend gets ``--threads``). A figure is items over the
wall time of the whole job (``materialize``), actor start, model load and session preparation
included; the median of the repeats, with min-max. Nothing here asserts speed.

    .venv/bin/python bench/ray_batch.py --model resnet18 --images 256 --batch 8 32 --actors 1 2
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpumnn import zoo  # noqa: E402
from gpumnn.integrations.ray import map_batches  # noqa: E402


class OnnxRuntimePredictor:
    """ONNX Runtime in a Ray Data actor, reading and writing the columns as gpumnn's Predictor."""

    def __init__(self, model: str, threads: int = 1, input_column: str = "image", output_column: str = "output"):
        import onnxruntime as ort
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self.session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self.input, self.column, self.output = self.session.get_inputs()[0].name, input_column, output_column

    def __call__(self, batch: dict) -> dict:
        out = {k: v for k, v in batch.items() if k != self.column}
        out[self.output] = self.session.run(None, {self.input: batch[self.column]})[0]
        return out


def job(ray, ds, engine: str, model: str, backend: str, actors: int, batch: int, threads: int):
    if engine == "onnxruntime":
        return ds.map_batches(OnnxRuntimePredictor, fn_constructor_args=(model, threads), batch_size=batch,
                              batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=actors))
    return map_batches(ds, model, backend, actors=actors, batch_size=batch, input_column="image",
                       output_column="output", drop_inputs=True, threads=threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--backend", default="cpu", help="gpumnn's backend in each actor")
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="threads per actor, each engine (default 1)")
    parser.add_argument("--cpus", type=int, default=2, help="the local cluster's CPUs (ray.init(num_cpus=...))")
    parser.add_argument("--block", type=int, default=32, help="images per block of the dataset (default 32)")
    args = parser.parse_args()

    import ray
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    folder = tempfile.mkdtemp()
    model = str(zoo.save(args.model, Path(folder) / f"{args.model}.onnx", batch="N"))
    images = np.random.default_rng(0).standard_normal(zoo.input_shape(args.model, args.images)).astype(np.float32)
    # blocks of --block images: one block is one task, so a single block would keep an actor idle
    ds = ray.data.from_numpy(np.array_split(images, max(1, args.images // args.block)))
    ds = ds.rename_columns({"data": "image"}).materialize()
    engines = (f"gpumnn {args.backend}", "onnxruntime")
    print(f"{args.model}, {args.images} items, local Ray cluster of {args.cpus} CPUs, {args.threads} thread(s) per "
          f"actor; items/s over the whole job (actor start and preparation included), median of {args.repeats} "
          f"(min-max)")
    print(f"{'actors':>6} {'batch':>5} " + " ".join(f"{e + ' items/s':>26}" for e in engines) + "   gpumnn/ORT")
    for actors in args.actors:
        for batch in args.batch:
            rates: dict[str, list[float]] = {e: [] for e in engines}
            for _ in range(args.repeats):
                for engine in engines:
                    start = time.perf_counter()
                    count = job(ray, ds, engine.split()[0], model, args.backend, actors, batch, args.threads).materialize().count()
                    assert count == args.images, (engine, count)
                    rates[engine].append(args.images / (time.perf_counter() - start))
            cells = [f"{statistics.median(v):8.1f} ({min(v):.1f}-{max(v):.1f})" for v in rates.values()]
            ratio = statistics.median(a / b for a, b in zip(*rates.values()))
            print(f"{actors:>6} {batch:>5} " + " ".join(f"{c:>26}" for c in cells) + f"   {ratio:10.2f}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
