"""A model's depthwise convolutions with ``cpu_jit.depthwise_bands`` off and on, in one process.

    python bench/depthwise_bands.py /tmp/gpumnn-real-models/text_direction.onnx --rounds 5
    python bench/depthwise_bands.py mobilenet_v2 --rounds 3 --whole 50

Two sessions of the model (threads=2) are built, one with the bands off (``BANDS_MIN_ROW`` past
any row: the kernels main chose before them) and one with them on; then, round by round in turns,
each depthwise work item is timed alone (minimum of ``--calls`` calls) and inside passes over the
whole recording (median of ``--passes``), and ``--whole`` whole runs of each session and of ONNX
Runtime (2 threads) are timed. Prints per op the median over rounds beside ONNX Runtime's own
profile of the node (``bench/cpu_profile.py``'s ``onnxruntime_profile``: median of 20 runs, in
whole microseconds), and per round the whole runs' minimum and median. Nothing here asserts speed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gpumnn, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cpu_profile  # noqa: E402  (bench/, beside this file)
from gpumnn.backends.cpu import jit as cpu_jit  # noqa: E402
from gpumnn.tools.benchmark import load_model  # noqa: E402


def session(net, feed, bands: bool):
    """A threads=2 cpu session of ``net`` with the bands on or off, run once."""
    kept = cpu_jit.BANDS_MIN_ROW
    cpu_jit.BANDS_MIN_ROW = kept if bands else 1 << 30
    try:
        sess = net.session(backend="cpu", threads=2, fallback=False)
        sess.run(feed)
    finally:
        cpu_jit.BANDS_MIN_ROW = kept
    return sess


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--passes", type=int, default=30)
    parser.add_argument("--whole", type=int, default=200)
    args = parser.parse_args()
    import onnxruntime as ort

    net, model_bytes, feed = load_model(args.model)
    sessions = {"bands off": session(net, feed, False), "bands on": session(net, feed, True)}
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    reference = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    items = {name: sess.backends["cpu"].work_items(list(sess.shape_set().first_state.executions))
             for name, sess in sessions.items()}
    first = next(iter(items.values()))
    chosen = [i for i, (group, _) in enumerate(first) if getattr(group[0], "scheme", None) == "depthwise"]
    alone = {name: {i: [] for i in chosen} for name in sessions}
    inside = {name: {i: [] for i in chosen} for name in sessions}
    runs = {name: lambda sess=sess: sess.run(feed) for name, sess in sessions.items()}
    runs["ONNX Runtime"] = lambda: reference.run(None, feed)
    whole: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, sess in sessions.items():
            backend = sess.backends["cpu"]
            with backend._limiter, backend._region_threads, np.errstate(all="ignore"):
                for i in chosen:
                    best = float("inf")
                    for _ in range(args.calls):
                        start = time.perf_counter()
                        for fn in items[name][i][1]:
                            fn()
                        best = min(best, time.perf_counter() - start)
                    alone[name][i].append(best * 1e6)
                for _ in range(args.passes):
                    for i, (_, work) in enumerate(items[name]):
                        start = time.perf_counter()
                        for fn in work:
                            fn()
                        if i in inside[name]:
                            inside[name][i].append((time.perf_counter() - start) * 1e6)
        for name, run in runs.items():
            times = []
            for _ in range(args.whole):
                start = time.perf_counter()
                run()
                times.append((time.perf_counter() - start) * 1e3)
            whole[name].append((min(times), statistics.median(times)))
    profile = cpu_profile.onnxruntime_profile(args.model, 2, 20)
    theirs: dict[str, float] = {}
    names = {group[0].op.source for group, _ in first}
    for node, ours in cpu_profile.ours_of(args.model, list(profile), names).items():
        theirs[ours] = theirs.get(ours, 0.0) + profile[node] * 1e3
    print(f"{args.model}: depthwise work items, us, median over {args.rounds} rounds: alone (minimum of "
          f"{args.calls} calls) / inside passes (median of {args.passes}); ONNX Runtime's profile of the node")
    print(f"{'op':<28} {'kernel shape':<28}" + "".join(f"{name:>22}" for name in sessions) + f"{'ORT':>8}")
    sums = {name: [0.0, 0.0] for name in sessions}
    for i in chosen:
        op = first[i][0][0].op
        shape = f"{op.in_channels} ch {op.kernel[0]}x{op.kernel[1]} s{op.strides[0]} {op.in_hw[0]}x{op.in_hw[1]}"
        line = f"{op.source:<28} {shape:<28}"
        for name in sessions:
            a, b = statistics.median(alone[name][i]), statistics.median(inside[name][i])
            sums[name][0] += a
            sums[name][1] += b
            line += f"{a:11.1f} /{b:8.1f}"
        print(line + f"{theirs.get(op.source, 0.0):8.1f}")
    print(f"{'sum':<57}" + "".join(f"{a:11.1f} /{b:8.1f}" for a, b in sums.values())
          + f"{sum(theirs.get(first[i][0][0].op.source, 0.0) for i in chosen):8.1f}")
    print(f"whole runs, ms, per round: minimum (median) of {args.whole}")
    for name, rounds in whole.items():
        print(f"  {name:<14}" + "  ".join(f"{low:.3f} ({mid:.3f})" for low, mid in rounds))


if __name__ == "__main__":
    main()
