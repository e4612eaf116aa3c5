"""How long a cache line takes to go from one of this process's CPUs to another, one way.

    python bench/core_link.py            # the first two CPUs the process may run on
    python bench/core_link.py --cpus 0 3

Two threads, each pinned to one CPU, hand a counter back and forth through one cache line; the
time per hand-over is the latency a region's threads pay when one reads what the other wrote.
On this 2-vCPU VM it was 25 ns at some times and 160 ns at others (bench/RESULTS.md, "s15"): the
hypervisor places the two vCPUs on cores that share a cache, or not. Sharing an op between the
regions' threads pays in the first state and often loses in the second, so ``real_models.py
--compare`` prints this figure beside its ratios. The spins are compiled loops (Numba, no GIL)
reading and writing the counter with acquire and release atomics.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gpumnn, not an installed one

from gpumnn.backends.cpu import jit as cpu_jit  # noqa: E402

numba = cpu_jit.numba
#: a wait gives up after this many reads (the other thread never came): the figure is then None
SPIN_LIMIT = 200_000_000

if numba is not None:
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def _load_acquire(typingctx, array, index):
        def codegen(context, builder, signature, args):
            view = context.make_array(signature.args[0])(context, builder, args[0])
            pointer = cgutils.get_item_pointer(context, builder, signature.args[0], view, [args[1]])
            return builder.load_atomic(pointer, ordering="acquire", align=8)
        return types.int64(array, types.intp), codegen

    @intrinsic
    def _store_release(typingctx, array, index, value):
        def codegen(context, builder, signature, args):
            view = context.make_array(signature.args[0])(context, builder, args[0])
            pointer = cgutils.get_item_pointer(context, builder, signature.args[0], view, [args[1]])
            builder.store_atomic(args[2], pointer, ordering="release", align=8)
            return context.get_dummy_value()
        return types.void(array, types.intp, types.int64), codegen

    @numba.njit(nogil=True)
    def _hand_over(flag, start, count, first):
        """``count`` hand-overs from ``start``: the first thread writes the odd values and waits
        for the even ones, the second the reverse. False where a wait gave up."""
        for i in range(start, start + count):
            mine, theirs = (2 * i + 1, 2 * i + 2) if first else (2 * i + 2, 2 * i + 1)
            if not first:
                spins = 0
                while _load_acquire(flag, 0) != theirs:
                    spins += 1
                    if spins > SPIN_LIMIT:
                        return False
            _store_release(flag, 0, mine)
            if first:
                spins = 0
                while _load_acquire(flag, 0) != theirs:
                    spins += 1
                    if spins > SPIN_LIMIT:
                        return False
        return True


def one_way_ns(cpus: tuple[int, int] | None = None, rounds: int = 9, count: int = 20_000) -> float | None:
    """The median over ``rounds`` of one hand-over's time between ``cpus`` (default: the first two
    the process may run on), in ns; None without Numba, with fewer than two CPUs, or where the
    other thread never answered."""
    allowed = sorted(os.sched_getaffinity(0))
    if numba is None or len(allowed) < 2:
        return None
    cpus = cpus or (allowed[0], allowed[1])
    flag = np.zeros(16, np.int64)  # the counter alone on its 128 bytes
    times: list[float] = []
    ok = [True, True]

    def second() -> None:
        os.sched_setaffinity(0, {cpus[1]})
        ok[1] = _hand_over(flag, 0, (rounds + 1) * count, False)

    _hand_over(np.zeros(16, np.int64), 0, 0, True)  # compiled before either thread starts
    helper = threading.Thread(target=second, daemon=True)
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpus[0]})
    try:
        helper.start()
        for r in range(rounds + 1):  # the first round waits for the helper to start
            t0 = time.perf_counter()
            ok[0] = _hand_over(flag, r * count, count, True)
            if not ok[0]:
                break
            if r:
                times.append((time.perf_counter() - t0) / (2 * count) * 1e9)
        helper.join(timeout=10)
    finally:
        os.sched_setaffinity(0, mask)
    return float(np.median(times)) if all(ok) and times else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", type=int, nargs=2, help="the two CPUs (default: the first two allowed)")
    args = parser.parse_args()
    ns = one_way_ns(tuple(args.cpus) if args.cpus else None)
    print("no figure: needs Numba and two CPUs" if ns is None else f"one-way cache line hand-over: {ns:.0f} ns")


if __name__ == "__main__":
    main()
