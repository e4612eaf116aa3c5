"""Where a recorded cpu run spends its time: each execution's work timed alone, summed per kind.

    python bench/cpu_profile.py resnet18 [--threads 2] [--runs 10] [--top 15]
    python bench/cpu_profile.py inception_v3 --ort     # beside ONNX Runtime's own profile
    python bench/cpu_profile.py resnet18 --batch 8     # per item too: a batch's slow paths

Runs the session once (warm-up), then times every execution's work items, ``runs`` times each
in run order, and prints the per-kind totals (atomic op type, scheme, kernel) and the slowest
ops. The sum of the per-op medians is set beside a whole recorded run, so the gap shows the
dispatch overhead between ops. Nothing here asserts speed.

``--ort`` times each op inside whole passes instead (op after op in run order, so each finds the
caches as a run leaves them, weights from memory included), and sets each kind beside ONNX
Runtime's profile of its own runs (``SessionOptions.enable_profiling``), node by node. ONNX
Runtime names a fused node after its last part (``layer1.0.relu1`` for conv1, bn1 and relu1):
its nodes are matched to ours by name, else up the model's chain of producers; what matches no
op of ours (its fused sums, say) is listed apart.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gpumnn, not an installed one

from gpumnn.tools.benchmark import load_model, time_runs  # noqa: E402

#: what ONNX Runtime's node names and ours add to a torchvision module's name (fusion, layout)
NAME_SUFFIXES = ("_nchwc", "_relu", ".relu", ".conv", ".bn")


def op_kind(exe) -> str:
    op = exe.op
    name = type(op).__name__
    if name == "Conv2D":
        return f"Conv2D {exe.scheme} {op.kernel[0]}x{op.kernel[1]}" + (f" s{op.strides[0]}" if op.strides != (1, 1) else "")
    if name == "QuantizedConv2D":  # its kernel, as the backend runs it (direct, the turned tile, im2col ...)
        return f"{name} {exe.scheme}"
    if name in ("Binary", "Unary", "Reduce", "Pool2D"):
        return f"{name} {op.op}"
    return name


def profile(model: str, threads: int, runs: int, inside_runs: bool = False, batch: int | None = None,
            **options) -> tuple[list[tuple[str, str, float]], float]:
    """[(kind, node, median ms)] per execution in run order, and a whole recorded run's median ms
    (``options``: the cpu backend's, e.g. regions=False). Each op is timed ``runs`` times in a row,
    or, ``inside_runs``, once in each of ``runs`` passes over all ops in run order (so that it
    finds the caches as a run leaves them)."""
    net, _, feed = load_model(model, batch)
    sess = net.session(backend="cpu", threads=threads, fallback=False, **options)
    sess.run(feed)
    backend = sess.backends["cpu"]
    executions = sess.shape_set().first_state.executions
    whole = statistics.median(time_runs(lambda: sess.run(feed), runs))
    # what a recording calls: an execution's own work, or one call for several (a run of LSTM
    # steps), timed as the first one's, the others' 0
    items = backend.work_items(list(executions))
    samples: list[list[float]] = [[] for _ in items]
    order = ([(work, times) for _ in range(runs) for (_, work), times in zip(items, samples)] if inside_runs
             else [(work, times) for (_, work), times in zip(items, samples) for _ in range(runs)])
    with backend._limiter, backend._region_threads, np.errstate(all="ignore"):
        for work, times in order:
            start = time.perf_counter()
            for fn in work:
                fn()
            times.append((time.perf_counter() - start) * 1000.0)
    rows = [(op_kind(exe), exe.op.source, statistics.median(times) if k == 0 else 0.0)
            for (group, _), times in zip(items, samples) for k, exe in enumerate(group)]
    sess.close()
    return rows, whole


def plain_name(name: str) -> str:
    """A node name without the suffixes fusion and layout add (``NAME_SUFFIXES``)."""
    changed = True
    while changed:
        changed = False
        for suffix in NAME_SUFFIXES:
            if name.endswith(suffix):
                name, changed = name[:-len(suffix)], True
    return name


def onnxruntime_profile(model: str, threads: int, runs: int) -> dict[str, float]:
    """Median ms per node of ONNX Runtime's CPU provider over ``runs`` runs after one warm-up, from
    its own profiler (names without the ``_nchwc`` of its blocked layout)."""
    import onnxruntime as ort

    _, model_bytes, feed = load_model(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    sess = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    for _ in range(runs + 1):
        sess.run(None, feed)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    per_node: dict[str, list[float]] = collections.defaultdict(list)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            name = event["name"][:-len("_kernel_time")]
            per_node[name[:-len("_nchwc")] if name.endswith("_nchwc") else name].append(event["dur"] / 1000.0)
    return {name: statistics.median(times[1:] or times) for name, times in per_node.items()}


def ours_of(model: str, ort_names: list[str], ours: set[str]) -> dict[str, str]:
    """ONNX Runtime's node name -> the name of ours it stands for: the same after ``plain_name``,
    else the first of ours up its chain of producers in the model (a fused node is named after its
    last part: ``layer1.0.relu1`` for conv1, bn1 and relu1), else itself."""
    import onnx

    _, model_bytes, _ = load_model(model)
    graph = onnx.load_from_string(model_bytes).graph
    by_name = {node.name: node for node in graph.node}
    producer = {out: node for node in graph.node for out in node.output}
    plain = {plain_name(name): name for name in ours}
    found = {}
    for name in ort_names:
        node, match = by_name.get(name), plain.get(plain_name(name))
        for _ in range(4):  # a convolution, its batch norm, a sum, an activation
            if match is not None or node is None or not node.input:
                break
            node = producer.get(node.input[0])
            match = node.name if node is not None and node.name in ours else None
        found[name] = match or name
    return found


def against_onnxruntime(model: str, threads: int, runs: int) -> None:
    """Per kind: our ops inside runs beside ONNX Runtime's nodes that stand for them."""
    profile_ms = onnxruntime_profile(model, threads, runs)
    rows, _ = profile(model, threads, runs, inside_runs=True)
    ort_ms: dict[str, float] = collections.defaultdict(float)
    for name, ours in ours_of(model, list(profile_ms), {node for _, node, _ in rows}).items():
        ort_ms[ours] += profile_ms[name]
    by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for kind, node, ms in rows:
        entry = by_kind[kind]
        entry[0] += 1
        entry[1] += ms
        entry[2] += ort_ms.pop(node, 0.0)
    ours, theirs = sum(ms for _, _, ms in rows), sum(e[2] for e in by_kind.values())
    print(f"{model}: our ops inside runs {ours:.2f} ms; ONNX Runtime's nodes matched {theirs:.2f} ms, "
          f"unmatched {sum(ort_ms.values()):.2f} ms")
    print(f"{'kind':<32} {'ops':>4} {'gpumnn':>8} {'ORT':>8} {'gap':>7}")
    for kind, (count, mine, other) in sorted(by_kind.items(), key=lambda kv: kv[1][2] - kv[1][1]):
        print(f"{kind:<32} {count:>4} {mine:8.2f} {other:8.2f} {mine - other:7.2f}")
    if ort_ms:
        print("ONNX Runtime nodes matching none of ours (ms): "
              + ", ".join(f"{name} {ms:.2f}" for name, ms in sorted(ort_ms.items(), key=lambda kv: -kv[1]) if ms >= 0.01))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--no-regions", action="store_true", help="the compiled loops on Python threads, not in native regions")
    parser.add_argument("--ort", action="store_true", help="each op inside runs, beside ONNX Runtime's own profile")
    parser.add_argument("--batch", type=int, help="the model at this batch (not with --ort); ms per item beside each total")
    args = parser.parse_args()
    if args.ort:
        against_onnxruntime(args.model, args.threads, args.runs)
        return
    rows, whole = profile(args.model, args.threads, args.runs, batch=args.batch,
                          **({"regions": False} if args.no_regions else {}))
    total = sum(ms for _, _, ms in rows)
    items = args.batch or 1
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    for kind, _, ms in rows:
        by_kind[kind].append(ms)
    print(f"{args.model} at batch {items}: {len(rows)} ops, sum of per-op medians {total:.2f} ms, whole recorded run "
          f"{whole:.2f} ms ({whole / items:.2f} per item)")
    print(f"{'kind':<32} {'ops':>4} {'ms':>8} {'/item':>7} {'share':>6}")
    for kind, values in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        print(f"{kind:<32} {len(values):>4} {sum(values):8.2f} {sum(values) / items:7.2f} {sum(values) / total:6.1%}")
    print(f"\nslowest {args.top} ops:")
    for kind, node, ms in sorted(rows, key=lambda r: -r[2])[:args.top]:
        print(f"  {ms:7.3f} ms  {kind:<32} {node}")


if __name__ == "__main__":
    main()
