"""A recurrent model's ops on the cpu backend with and without issue 32's fifth pass, in one process.

"before" switches the three changes off (a run of LSTM steps as one call, ``cpu_recurrent.lstm_runs``;
constant transposed weights relaid [K, N], ``engines.RELAID_MAX_ROWS``; the Raster loop,
``engines.RASTER_LOOP_MIN_REGIONS``), "after" is the tree as it is. Each item a recording calls
is timed alone, the fastest of ``--calls`` calls, summed per kind; the two sessions take turns for
``--rounds`` rounds. With ``NUMBA_NUM_THREADS=1`` the clock is the calling thread's CPU time (the
regions run on it), else wall time.

    python bench/cpu_recurrent_ops.py /tmp/real/crnn.onnx --rounds 3
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gpumnn, not an installed one

import gpumnn  # noqa: E402
from gpumnn.backends.cpu import backend as cpu_backend, engines  # noqa: E402

LSTM_STEPS = "LSTM steps (products and cells)"


def session_items(model: str, threads: int, after: bool):
    """(backend, what a recording of the model calls) with the pass on (``after``) or off."""
    saved = engines.RELAID_MAX_ROWS, engines.RASTER_LOOP_MIN_REGIONS, cpu_backend.lstm_runs
    if not after:
        engines.RELAID_MAX_ROWS, engines.RASTER_LOOP_MIN_REGIONS = -1, sys.maxsize
        cpu_backend.lstm_runs = lambda *args: []
    try:
        sess = gpumnn.load(model).session(backend="cpu", threads=threads)
        backend = sess.backends["cpu"]
        return sess, backend, backend.work_items(list(sess.shape_set().first_state.executions))
    finally:
        engines.RELAID_MAX_ROWS, engines.RASTER_LOOP_MIN_REGIONS, cpu_backend.lstm_runs = saved


def kind(group, following) -> str:
    """What ``group`` (executions of one item) is counted as; ``following``: the next item's group."""
    op = group[0].op
    name = type(op).__name__
    if len(group) > 1 or name == "RecurrentCell":
        return LSTM_STEPS
    if name == "MatMul":
        gates = following[0].inputs[0] if following and type(following[0].op).__name__ == "RecurrentCell" else None
        out = group[0].outputs[0]
        if gates is not None and gates.buffer is out.buffer and gates.offset == out.offset:
            return LSTM_STEPS  # a step's recurrent product: the next cell's gates
        return f"MatMul {op.batch * op.m}x{op.k}x{op.n}"
    if name == "Raster":
        return f"Raster ({len(op.regions)} regions)"
    return "other ops"


def timed(backend, items, calls: int, clock) -> dict[str, float]:
    per_kind: dict[str, float] = collections.defaultdict(float)
    with backend._limiter, backend._region_threads, np.errstate(all="ignore"):
        for index, (group, work) in enumerate(items):
            best = float("inf")
            for _ in range(calls):
                start = clock()
                for fn in work:
                    fn()
                best = min(best, clock() - start)
            per_kind[kind(group, items[index + 1][0] if index + 1 < len(items) else None)] += best * 1e6
    per_kind["every op"] = sum(per_kind.values())
    return per_kind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    one = os.environ.get("NUMBA_NUM_THREADS") == "1"
    clock = time.thread_time if one else time.perf_counter
    sessions = [session_items(args.model, args.threads, after) for after in (False, True)]
    rows: dict[str, tuple[list[float], list[float]]] = collections.defaultdict(lambda: ([], []))
    for _ in range(args.rounds):
        for side, (_, backend, items) in enumerate(sessions):
            for key, value in timed(backend, items, args.calls, clock).items():
                rows[key][side].append(value)
    print(f"{args.model}: {'one region thread, thread CPU time' if one else f'{args.threads} threads, wall'}; "
          f"fastest of {args.calls} calls per item, us, rounds alternating")
    for key, (before, after) in sorted(rows.items()):
        print(f"  {key:34s} before {', '.join(f'{v:.1f}' for v in before):26s} after {', '.join(f'{v:.1f}' for v in after)}")


if __name__ == "__main__":
    main()
