"""precision="fp16" against fp32 on the GPU backends: error, bytes and alternating run times.

    python bench/fp16.py [MODEL ...] [--backends opencl,vulkan,gl,cuda] [--rounds 5] [--runs 10] [--inputs 5]
                         [--json FILE]

Per model and backend: the relative L2 error of the fp16 session's output against ONNX Runtime's
float32 (the worst and the median over ``inputs`` random inputs; the fp32 session's beside it), the
bytes of the weights (the constants the ops read) and of the backend's pool in each precision,
how many ops read float16 storage (the conversions out of float16 among them) of all the ops, and the median per run of ``runs`` recorded runs of fp32 and
fp16 taking turns over ``rounds`` rounds (the median of the rounds, with their range). opencl uses
the tiled (GPU) kernels, since only those take float16. Nothing here asserts speed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gpumnn, not an installed one

import gpumnn  # noqa: E402
from gpumnn import atomic as A, zoo  # noqa: E402
from gpumnn.backends import probe  # noqa: E402

#: the options that give each backend its GPU kernels (PoCL, lavapipe, llvmpipe would pick the float32-only simd ones)
OPTIONS = {"opencl": {"kernels": "tiled"}, "vulkan": {"kernels": "tiled"}, "gl": {"kernels": "tiled"}}


def weight_bytes(session) -> int:
    program = session.program
    return sum(program.nbytes_of(n) for n in {n for op in program.ops for n in op.inputs if n in program.constants})


def rel_l2(got, ref) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


def timed(call, rounds: int, runs: int) -> dict[str, list[float]]:
    """name -> the median ms per run of each round, the calls taking turns within a round."""
    out: dict[str, list[float]] = {name: [] for name in call}
    for _ in range(rounds):
        for name, run in call.items():
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                run()
                times.append((time.perf_counter() - t) * 1e3)
            out[name].append(statistics.median(times))
    return out


def measure(model_name: str, backend: str, args) -> dict:
    import onnxruntime as ort
    model = zoo.build(model_name)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    net = gpumnn.load(model)
    sessions = {p: net.session(backend=backend, precision=p, **OPTIONS.get(backend, {})) for p in ("fp32", "fp16")}
    rng = np.random.default_rng(0)
    errors: dict[str, list[float]] = {p: [] for p in sessions}
    feeds = [{"input": rng.standard_normal(zoo.input_shape(model_name)).astype(np.float32)} for _ in range(args.inputs)]
    for feed in feeds:
        ref = reference.run(None, feed)[0]
        for p, s in sessions.items():
            errors[p].append(rel_l2(next(iter(s.run(feed).values())), ref))
    times = timed({p: (lambda s=s: s.run(feeds[0])) for p, s in sessions.items()}, args.rounds, args.runs)
    row = {"model": model_name, "backend": backend}
    for p, s in sessions.items():
        row[p] = {"error_worst": max(errors[p]), "error_median": statistics.median(errors[p]),
                  "weight_bytes": weight_bytes(s), "pool_bytes": s.memory_summary()[backend]["pool_bytes"],
                  "float16_ops": sum(op.dtype == A.FLOAT16 for op in s.program.ops), "ops": len(s.program.ops),
                  "ms_median": statistics.median(times[p]), "ms_range": [min(times[p]), max(times[p])]}
    row["notes"] = sessions["fp16"].shape_set().precision_lines
    for s in sessions.values():
        s.close()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["squeezenet1_1", "resnet18", "mobilenet_v2", "transformer_encoder"])
    parser.add_argument("--backends", default="opencl,vulkan,gl,cuda")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--inputs", type=int, default=5)
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args()
    rows = []
    print(f"{'model':<20} {'backend':<7} {'err fp16 (worst/med)':>22} {'err fp32':>9} {'weights MiB':>14} "
          f"{'pool MiB':>12} {'f16 ops':>8} {'fp32 ms':>9} {'fp16 ms':>9} {'speedup':>7}")
    for backend in args.backends.split(","):
        reason = probe(backend)
        if reason is not None:
            print(f"{backend}: skipped ({reason})")
            continue
        for m in args.models:
            row = measure(m, backend, args)
            rows.append(row)
            a, b = row["fp32"], row["fp16"]
            print(f"{m:<20} {backend:<7} {b['error_worst']:>11.2e}/{b['error_median']:.2e} {a['error_worst']:>9.1e} "
                  f"{a['weight_bytes'] / 2**20:>6.2f}->{b['weight_bytes'] / 2**20:<6.2f} "
                  f"{a['pool_bytes'] / 2**20:>5.2f}->{b['pool_bytes'] / 2**20:<5.2f} {b['float16_ops']:>3}/{b['ops']:<4} "
                  f"{a['ms_median']:>9.2f} {b['ms_median']:>9.2f} {a['ms_median'] / b['ms_median']:>6.2f}x", flush=True)
            for line in row["notes"][1:]:
                print("   ", line)
            if args.json:  # after every row: a run cut short keeps what it measured
                Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
