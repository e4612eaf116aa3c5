"""A GEMM of one block as a region (``cpu_parallel.gemm_blocks``) against the same loop on the
calling thread (``cpu_parallel.alone``): the work item ``compiled._gemm_region`` builds, each way
timed alone, alternating; per way the lowest and the median over 15 rounds of the minimum of 200
calls, in microseconds. The first two sizes are voice_activity's LSTM input projections.

    .venv/bin/python bench/one_block_gemm.py
"""
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numba  # noqa: E402
import numpy as np  # noqa: E402

from gpumnn.backends.cpu import compiled as C, parallel as P  # noqa: E402

#: (rows, depth, columns): voice_activity's two LSTM input projections, and a product past
#: REGION_MIN_MACS forced into one block
SIZES = [(9, 128, 256), (9, 64, 256), (40, 96, 512)]


def work_items(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> dict:
    """The one-block work item as a region and as a loop on the calling thread."""
    blocks, bases = [(a, b, out, 0, 0)], (a.reshape(-1), b.reshape(-1), out.reshape(-1))
    plain_loop = P.alone
    try:
        P.alone = lambda region: region  # the region itself, as before the one-block rule
        as_region = C._gemm_region(bases, blocks, None, out, regions=2)
    finally:
        P.alone = plain_loop
    return {"region": as_region, "alone": C._gemm_region(bases, blocks, None, out, regions=2)}


def main() -> None:
    numba.set_num_threads(2)
    rng = np.random.default_rng(0)
    for m, k, n in SIZES:
        a, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((m, k), (k, n)))
        out = np.empty((m, n), np.float32)
        items = work_items(a, b, out)
        for item in items.values():
            out.fill(0)
            item()
            np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-3)
        mins: dict[str, list[float]] = {name: [] for name in items}
        for _ in range(15):
            for name, item in items.items():
                mins[name].append(min(timeit.repeat(item, number=1, repeat=200)) * 1e6)
        print(f"{m}x{k}x{n}: " + ", ".join(f"{name} {min(v):.2f} (median {sorted(v)[len(v) // 2]:.2f}) us"
                                            for name, v in mins.items()), flush=True)
    print(f"load average at the end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


if __name__ == "__main__":
    main()
