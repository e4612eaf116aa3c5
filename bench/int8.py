"""precision="int8" against fp32 on the cpu: alternating runs in one process, medians with spread.

    python bench/int8.py [--model transformer_encoder] [--threads 2] [--rounds 7] [--runs 20] [--inputs 50]

Each round times ``runs`` runs of the fp32 session, then ``runs`` of the int8 one (alternating, so
that a busy machine slows both alike); the median per run of each round is kept, and the median of
the rounds is reported with their range. Also reports the relative error of int8 against fp32
(||int8 - fp32|| / ||fp32|| over ``inputs`` random inputs: the worst and the median) and the bytes
of the weights the products read, before and after. Nothing here asserts speed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gpumnn, not an installed one

import gpumnn  # noqa: E402
from gpumnn import atomic as A, zoo  # noqa: E402


def product_weight_bytes(session) -> int:
    """Bytes of the constants the session's matrix products read as weights."""
    program = session.program
    names = {op.inputs[i] for op in program.ops for i in
             ((1, 2) if isinstance(op, A.QuantizedMatMul) else (1,) if isinstance(op, A.MatMul) else ())
             if op.inputs[i] in program.constants}
    return sum(program.nbytes_of(n) for n in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="transformer_encoder")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--inputs", type=int, default=50)
    args = parser.parse_args()
    net = gpumnn.load(getattr(zoo, args.model)())
    info = net.inputs[0]
    shape = tuple(int(d) for d in info.shape)
    rng = np.random.default_rng(0)
    sessions = {p: net.session(backend="cpu", threads=args.threads, precision=p) for p in ("fp32", "int8")}
    errors = []
    for _ in range(args.inputs):
        feed = {info.name: rng.standard_normal(shape).astype(np.float32)}
        ref, low = (next(iter(sessions[p].run(feed).values())) for p in ("fp32", "int8"))
        errors.append(float(np.linalg.norm(low - ref) / np.linalg.norm(ref)))
    feed = {info.name: rng.standard_normal(shape).astype(np.float32)}
    medians: dict[str, list[float]] = {p: [] for p in sessions}
    for _ in range(args.rounds):
        for p, sess in sessions.items():
            times = []
            for _ in range(args.runs):
                started = time.perf_counter()
                sess.run(feed)
                times.append(time.perf_counter() - started)
            medians[p].append(statistics.median(times) * 1e3)
    print(f"{args.model}, cpu, {args.threads} threads, {args.rounds} rounds of {args.runs} runs each, alternating")
    print(f"cpu backend: {sessions['fp32'].backends['cpu'].info.device}")
    for p, ms in medians.items():
        print(f"  {p:5s} median {statistics.median(ms):7.3f} ms  (rounds {min(ms):.3f} .. {max(ms):.3f})")
    print(f"  int8 speed-up (medians): {statistics.median(medians['fp32']) / statistics.median(medians['int8']):.2f}x")
    print(f"  relative error int8 vs fp32 over {args.inputs} inputs: median {statistics.median(errors):.4f}, "
          f"worst {max(errors):.4f}")
    print(f"  product weights: fp32 {product_weight_bytes(sessions['fp32'])} bytes, "
          f"int8 {product_weight_bytes(sessions['int8'])} bytes (int8 values and float32 scales)")
    for sess in sessions.values():
        sess.close()


if __name__ == "__main__":
    main()
