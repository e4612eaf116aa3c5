"""Float64 and float32 error of the Winograd generator's F(n x n, k x k), n in 2..6, k in 2..7.

Each entry is the maximum absolute error over random tiles (16 channels summed, as in Eq. 6)
divided by the largest reference value, against the direct correlation in float64; the
relative L2 error follows in parentheses. ``gpumnn.scheduler.schemes`` allows the tiles whose
float32 error stays small (``alpha = n + k - 1 <= MAX_ALPHA``, ``MAX_ALPHA_1D`` for the 1D tiles
of a 1xk or kx1 kernel; marked ``*``).

    python bench/winograd_error.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpumnn.scheduler.schemes import winograd_allowed  # noqa: E402
from gpumnn.numerics.winograd import measured_error  # noqa: E402


def main() -> None:
    ks = range(2, 8)
    for dtype in (np.float64, np.float32):
        print(f"\n{np.dtype(dtype).name}: max |error| / max |reference|  (relative L2)")
        print("n \\ k | " + " | ".join(f"{k:^19}" for k in ks))
        print("--- | " + " | ".join("---" for _ in ks))
        for n in range(2, 7):
            cells = []
            for k in ks:
                worst, l2 = measured_error(n, k, dtype)
                mark = "*" if winograd_allowed(n, k) else " "
                cells.append(f"{worst:.1e} ({l2:.1e}){mark}")
            print(f"{n} | " + " | ".join(cells))
    print("\nfloat32, 1D tiles F(n, k) (a 1xk or kx1 kernel's): max |error| / max |reference|  (relative L2)")
    print("n \\ k | " + " | ".join(f"{k:^19}" for k in ks))
    print("--- | " + " | ".join("---" for _ in ks))
    for n in range(2, 7):
        cells = []
        for k in ks:
            worst, l2 = measured_error(n, k, np.float32, dims=1)
            cells.append(f"{worst:.1e} ({l2:.1e}){'*' if winograd_allowed(n, k, dims=1) else ' '}")
        print(f"{n} | " + " | ".join(cells))
    print("\n* allowed by the scheme selection (float32 max relative error <= 1e-5)")


if __name__ == "__main__":
    main()
