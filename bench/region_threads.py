"""How many fresh processes run the cpu backend's parallel regions on one thread only.

Each of ``--processes`` children starts the regions' threading layer as the cpu backend does
(``cpu_parallel.available()``), optionally runs a model's session at 2 threads, then enters
``--regions`` short regions (8 blocks of ``--spin`` square roots each) and counts the regions in
which a thread other than the caller took a block, and the CPU time of each of the process's
other threads over the model's runs. It also reads /proc/stat over the same window: the cores
other processes kept busy ("foreign"). A region whose second thread never comes while the other
core is free is the fault looked for; one whose second thread comes late because another
process holds that core is the machine's load, not a fault.

    .venv/bin/python bench/region_threads.py --processes 20 --model /tmp/gpumnn-real-models/text_direction.onnx
    .venv/bin/python bench/region_threads.py --watch 60
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: A region counts as shared where another thread took at least one of its blocks; a process
#: counts as two-threaded where at least this fraction of its regions were shared
SHARED = 0.5
#: Foreign load (cores other processes kept busy) at or above which a lone thread is the load's doing
LOADED = 0.5


def _cpu_by_thread() -> dict[int, int]:
    """Nanoseconds each of this process's threads has run (schedstat)."""
    times = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                times[int(tid)] = int(f.read().split()[0])
        except OSError:  # the thread ended meanwhile
            pass
    return times


def _machine_ticks() -> tuple[int, int, int]:
    """(busy ticks over all cores, all ticks, cores) from /proc/stat."""
    busy = total = cores = 0
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                fields = list(map(int, line.split()[1:]))
                total += sum(fields)
                busy += sum(fields) - fields[3] - fields[4]
                cores += 1
    return busy, total, cores


class ForeignLoad:
    """Context: the cores that processes other than this one kept busy while it was entered."""

    def __enter__(self):
        self._machine, self._own = _machine_ticks(), sum(os.times()[:2])
        return self

    def __exit__(self, *exc):
        busy, total, cores = _machine_ticks()
        ticks = os.sysconf("SC_CLK_TCK")
        own = (sum(os.times()[:2]) - self._own) * ticks
        span = (total - self._machine[1]) / cores
        self.cores = max(0.0, (busy - self._machine[0] - own) / span) if span else 0.0


def _probe_region():
    """A region of ``owner.shape[0]`` blocks of ``spin`` square roots, each writing the region
    thread index (0: the caller) that ran it into ``owner``."""
    import numba
    import numpy as np

    @numba.njit(parallel=True, nogil=True)
    def blocks(owner, spin):
        for i in numba.prange(owner.shape[0]):
            s = 0.0
            for k in range(spin):
                s += np.sqrt(k + s * 1e-9)
            owner[i] = numba.get_thread_id() + (0 if s >= 0 else 1)

    owner = np.zeros(8, np.int64)
    blocks(owner, 1)
    return blocks, owner


def _start_layer() -> None:
    """Starts the regions' layer as the cpu backend does, or stops with why it cannot."""
    from gpumnn.backends.cpu import parallel as cpu_parallel

    ok, why = cpu_parallel.available()
    if not ok:
        raise SystemExit(why)


def watch(args: argparse.Namespace) -> None:
    """One process entering regions for ``args.watch`` seconds: a line a second with the share of
    regions another thread joined and the foreign load, to see whether a lone thread follows the
    load or outlives it."""
    _start_layer()
    blocks, owner = _probe_region()
    print(f"{'second':>6} {'regions':>7} {'shared':>6} {'foreign':>7}", flush=True)
    for second in range(args.watch):
        count = shared = 0
        with ForeignLoad() as load:
            end = time.perf_counter() + 1.0
            while time.perf_counter() < end:
                blocks(owner, args.spin)
                count += 1
                shared += bool(owner.any())
        print(f"{second:>6} {count:>7} {shared / count:>6.2f} {load.cores:>7.2f}", flush=True)


def child(args: argparse.Namespace) -> dict:
    """One process's figures (see the module's docstring)."""
    from gpumnn.backends.cpu import parallel as cpu_parallel

    _start_layer()
    blocks, owner = _probe_region()
    result: dict = {"layer": cpu_parallel.available_layer()}
    if args.model:
        from gpumnn.tools.benchmark import load_model
        net, _, feed = load_model(args.model)
        session = net.session(backend="cpu", threads=2)
        for _ in range(5):
            session.run(feed)
        main = os.getpid()
        before = _cpu_by_thread()
        with ForeignLoad() as load:
            start = time.perf_counter()
            for _ in range(args.runs):
                session.run(feed)
            wall = time.perf_counter() - start
        after = _cpu_by_thread()
        others = sorted(((after[t] - before.get(t, 0)) / 1e6 for t in after if t != main), reverse=True)
        result["model"] = {"ms_per_run": 1e3 * wall / args.runs, "main_ms": (after[main] - before[main]) / 1e6,
                           "busiest_other_ms": others[0] if others else 0.0, "foreign": load.cores}
    with ForeignLoad() as load:
        shared = 0
        start = time.perf_counter()
        for _ in range(args.regions):
            blocks(owner, args.spin)
            shared += bool(owner.any())
        wall = time.perf_counter() - start
    result["regions"] = {"shared": shared / args.regions, "us_per_region": 1e6 * wall / args.regions,
                         "foreign": load.cores}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=20)
    parser.add_argument("--model", help="an ONNX file whose cpu session at 2 threads each process runs first")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--regions", type=int, default=2000)
    parser.add_argument("--spin", type=int, default=2000, help="square roots a block (2000: about 16 us)")
    parser.add_argument("--watch", type=int, metavar="SECONDS", help="one process: a line a second instead")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.watch:
        watch(args)
        return
    if args.child:
        print(json.dumps(child(args)))
        return
    command = [sys.executable, __file__, "--child", "--runs", str(args.runs), "--regions", str(args.regions),
               "--spin", str(args.spin)] + (["--model", args.model] if args.model else [])
    counts = {"two threads": 0, "one thread, other core busy": 0, "one thread, other core free": 0}
    print(f"{'process':>7} {'regions shared':>14} {'us/region':>9} {'foreign':>7}"
          + (f" {'ms/run':>7} {'main ms':>8} {'other ms':>8} {'foreign':>7}" if args.model else ""))
    for index in range(args.processes):
        out = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, NUMBA_NUM_THREADS="2"))
        try:
            result = json.loads(out.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            print(f"{index:>7} failed: {out.stderr.strip()[-300:]}")
            continue
        regions = result["regions"]
        line = f"{index:>7} {regions['shared']:>14.2f} {regions['us_per_region']:>9.1f} {regions['foreign']:>7.2f}"
        if "model" in result:
            m = result["model"]
            line += f" {m['ms_per_run']:>7.3f} {m['main_ms']:>8.1f} {m['busiest_other_ms']:>8.1f} {m['foreign']:>7.2f}"
        print(line, flush=True)
        if regions["shared"] >= SHARED:
            counts["two threads"] += 1
        elif regions["foreign"] >= LOADED:
            counts["one thread, other core busy"] += 1
        else:
            counts["one thread, other core free"] += 1
    print("; ".join(f"{key}: {value}" for key, value in counts.items()), f"(of {args.processes}; a process is "
          f"two-threaded where another thread took a block of at least {SHARED:.0%} of its regions)")


if __name__ == "__main__":
    main()
