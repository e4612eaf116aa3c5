"""Per-run overhead of ``Session.run`` on the cpu backend, beside ONNX Runtime's ``run``.

A one-node model (Relu on 1x8) costs almost nothing to compute, so its run time is the
session's fixed cost: input checks, shape-set lookup, run-state lending, the backend's submit
and output assembly. Two small real models from ``bench/real_models.py`` (many small ops) show
the same cost among real work. Each repeat times ``--calls`` calls of gpumnn's ``sess.run(feed)``
and of ORT's ``sess.run(None, feed)`` in turn (alternating in one process, so noise falls on
both); the table gives the median (min-max) over repeats of the per-call mean in microseconds.
``--profile`` adds a cProfile of gpumnn's calls on the one-node model, ``--breakdown`` each piece of
its run timed alone.

    .venv/bin/python bench/run_overhead.py --repeats 9 --calls 2000
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
import timeit
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpumnn  # noqa: E402
from gpumnn.tools.benchmark import Spread  # noqa: E402
from gpumnn.tools.feeds import random_input  # noqa: E402


def relu_model() -> onnx.ModelProto:
    """One Relu on a 1x8 float input: a run with next to no work."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def models(names: list[str]) -> dict[str, tuple[onnx.ModelProto, dict[str, np.ndarray]]]:
    """Each model with a seeded feed of its inputs' declared dtypes (byte_cnn takes int64 bytes)."""
    import real_models

    built = {}
    for name in names:
        model = relu_model() if name == "relu" else real_models.MODELS[name]()
        rng = np.random.default_rng(0)
        feed = {}
        for value in model.graph.input:
            dims = [d.dim_value or 1 for d in value.type.tensor_type.shape.dim]
            dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
            feed[value.name] = random_input(dtype, dims, rng)
        built[name] = (model, feed)
    return built


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    return timeit.timeit(fn, number=calls) / calls * 1e6


def breakdown(sess: gpumnn.Session, feed: dict[str, np.ndarray], calls: int) -> None:
    """Each piece of a recorded one-step run timed alone: min over 5 repeats of ``calls`` calls, us."""
    shape_set = sess.shape_set()
    state, cpu = shape_set.first_state, sess.backends["cpu"]
    arrays, key = sess._ready_inputs(feed)
    (submit_backend, recording), = state.submits
    (_, ((_, in_handle),)), = state.writes
    (_, (_, out_handle), _), = state.reads

    def lease() -> None:
        sess._cache.release(sess._cache.acquire(key))

    def slots() -> None:
        with sess._run_slots:
            pass

    def borrow() -> None:
        shape_set._states.give_back(shape_set._states.take(shape_set._prepare_active))

    pieces = {"Session.run": lambda: sess.run(feed), "ready inputs and key": lambda: sess._ready_inputs(feed),
              "shape-set acquire and release": lease, "run slots": slots, "run-state take and give back": borrow,
              "ShapeSet._run_host": lambda: shape_set._run_host(state, arrays),
              "cpu submit": lambda: submit_backend.submit(recording),
              "cpu write": lambda: cpu.write(in_handle, arrays["x"]), "cpu read": lambda: cpu.read(out_handle)}
    for label, fn in pieces.items():
        print(f"  {label:<32} {min(timeit.repeat(fn, number=calls, repeat=5)) / calls * 1e6:7.2f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["relu", "voice_activity", "crnn"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--calls", type=int, default=2000, help="calls per repeat on relu (fewer on bigger models)")
    parser.add_argument("--profile", action="store_true", help="cProfile gpumnn's runs of the one-node model")
    parser.add_argument("--breakdown", action="store_true", help="time each piece of the one-node model's run alone")
    args = parser.parse_args()

    import onnxruntime as ort

    print(f"cpu backend, {args.threads} threads; per-call us, median (min-max) of {args.repeats} repeats, "
          "gpumnn and ORT alternating")
    print(f"{'model':<16} {'calls':>6} {'gpumnn us':>24} {'ORT us':>24} {'gpumnn/ORT':>18}")
    for name, (model, feed) in models(args.models).items():
        data = model.SerializeToString()
        sess = gpumnn.load(data).session(backend="cpu", threads=args.threads)
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
        ort_sess = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        ours = sess.run(feed)
        theirs = ort_sess.run(None, feed)
        np.testing.assert_allclose(next(iter(ours.values())), theirs[0], rtol=1e-3, atol=1e-4)
        calls = args.calls if name == "relu" else max(20, args.calls // 100)
        gpumnn_us, ort_us = [], []
        for _ in range(args.repeats):
            time.sleep(0.05)
            gpumnn_us.append(per_call_us(lambda: sess.run(feed), calls))
            time.sleep(0.05)
            ort_us.append(per_call_us(lambda: ort_sess.run(None, feed), calls))
        ratio = Spread.of([a / b for a, b in zip(gpumnn_us, ort_us)])
        print(f"{name:<16} {calls:>6} {format(Spread.of(gpumnn_us), '.1f'):>24} {format(Spread.of(ort_us), '.1f'):>24} "
              f"{format(ratio, '.2f'):>18}",
              flush=True)
        if args.breakdown and name == "relu":
            breakdown(sess, feed, args.calls)
        if args.profile and name == "relu":
            profiler = cProfile.Profile()
            profiler.runcall(lambda: [sess.run(feed) for _ in range(args.calls)])
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
            print(out.getvalue())
        sess.close()
    print(f"load average at the end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


if __name__ == "__main__":
    main()
