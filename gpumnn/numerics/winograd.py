"""The Winograd generator (paper Section 3.3.1, Eq. 6-8): A, B, G for any tile n and kernel k.

Winograd's minimal filtering F(n, k) computes ``n`` outputs of a ``k``-tap correlation from
``alpha = n + k - 1`` inputs with ``alpha`` multiplications: ``y = A^T [(G g) * (B^T d)]`` in 1D
and ``Y = A^T [(G W G^T) * (B^T X B)] A`` in 2D (Eq. 6). The matrices come from Toom-Cook
polynomial multiplication at ``alpha - 1`` finite points and the point at infinity, read
backwards (correlation is the transpose of polynomial multiplication):

* ``A`` (``alpha x n``): row ``t`` evaluates a degree ``n - 1`` polynomial at point ``p_t``
  (``[1, p, p^2, ...]``); the infinity row picks the leading coefficient;
* ``G`` (``alpha x k``): the same for the kernel, divided by the Lagrange denominator
  ``N_t = prod_{l != t} (p_t - p_l)``;
* ``B^T`` (``alpha x alpha``): row ``t`` holds the coefficients of ``M(x) / (x - p_t)`` and the
  infinity row those of ``M(x)`` itself, where ``M(x) = x (x - f)(x + f)(x - 2f)(x + 2f) ...``
  is the paper's Eq. 8 polynomial over the finite points.

The points are ``0, f, -f, 2f, -2f, ...`` with ``f = 1/2`` (the paper's choice: small points
keep the powers in A and G near 1, which is what limits the float32 error). Everything is
computed exactly with :class:`fractions.Fraction` and cast to float64 at the end, so the only
rounding is in the cast and in the arithmetic that uses the matrices.
"""
from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from typing import NamedTuple

import numpy as np

#: The paper's interpolation scale (Eq. 8).
F_SCALE = Fraction(1, 2)


class WinogradMatrices(NamedTuple):
    """``A`` (alpha x n), ``B`` (alpha x alpha) and ``G`` (alpha x k), float64, for F(n, k)."""

    n: int
    k: int
    A: np.ndarray
    B: np.ndarray
    G: np.ndarray

    @property
    def alpha(self) -> int:
        return self.n + self.k - 1


def interpolation_points(count: int, f: Fraction = F_SCALE) -> list[Fraction]:
    """The first ``count`` of 0, f, -f, 2f, -2f, ... (the roots of Eq. 8's polynomial)."""
    points: list[Fraction] = []
    step = 0
    while len(points) < count:
        if step == 0:
            points.append(Fraction(0))
        else:
            points.extend([step * f, -step * f])
        step += 1
    return points[:count]


def _poly_from_roots(roots: list[Fraction]) -> list[Fraction]:
    """Coefficients (increasing powers) of prod (x - r)."""
    coeffs = [Fraction(1)]
    for r in roots:
        shifted = [Fraction(0)] + coeffs  # x * p(x)
        coeffs = [shifted[i] - r * (coeffs[i] if i < len(coeffs) else 0) for i in range(len(shifted))]
    return coeffs


def exact_matrices(n: int, k: int, f: Fraction = F_SCALE) -> tuple[list[list[Fraction]], ...]:
    """(A, B, G) as exact rational matrices (lists of rows) for F(n, k)."""
    if n < 1 or k < 1:
        raise ValueError(f"F({n}, {k}): tile and kernel sizes must be at least 1")
    alpha = n + k - 1
    points = interpolation_points(alpha - 1, f)
    a = [[p ** j for j in range(n)] for p in points] + [[Fraction(int(j == n - 1)) for j in range(n)]]
    g = []
    for t, p in enumerate(points):
        denom = Fraction(1)
        for q in points[:t] + points[t + 1:]:
            denom *= p - q
        g.append([p ** j / denom for j in range(k)])
    g.append([Fraction(int(j == k - 1)) for j in range(k)])
    bt = []
    for t in range(len(points)):
        row = _poly_from_roots(points[:t] + points[t + 1:])
        bt.append(row + [Fraction(0)] * (alpha - len(row)))
    bt.append(_poly_from_roots(points))
    b = [[bt[r][c] for r in range(alpha)] for c in range(alpha)]  # B = (B^T)^T
    return a, b, g


@lru_cache(maxsize=None)
def winograd_matrices(n: int, k: int) -> WinogradMatrices:
    """A, B, G for F(n, k) in float64 (exact rationals, cast once)."""
    a, b, g = exact_matrices(n, k)
    def as_array(m) -> np.ndarray:  # read-only: the cached arrays are shared by every session and thread
        array = np.array([[float(v) for v in row] for row in m], dtype=np.float64)
        array.setflags(write=False)
        return array

    return WinogradMatrices(n, k, as_array(a), as_array(b), as_array(g))


def axis_tiles(n: int, kernel: tuple[int, int]) -> tuple[int, int]:
    """The output tile along each axis of a convolution's F(n): n along an axis whose kernel is 2
    or more wide, 1 along a 1-wide one (a 1x7 kernel's tile is 1 x n: Winograd along the rows only)."""
    return tuple(n if k > 1 else 1 for k in kernel)


def conv_matrices(n: int, kernel: tuple[int, int]) -> tuple[WinogradMatrices, WinogradMatrices]:
    """(rows', columns') matrices of a convolution's F(n) with a ``kernel`` = (kh, kw) that may be
    rectangular: F(n, k) along each axis 2 or more wide, F(1, 1) (every matrix [[1]]) along a 1-wide
    one. A square kernel's pair is F(n, k) twice, Eq. 6's ``A^T [(G W G^T) * (B^T X B)] A``; a 7x1
    one's is F(n, 7) on the columns and the identity on the rows: 1D Winograd, alpha / n
    multiplications per output instead of 7."""
    (nh, nw), (kh, kw) = axis_tiles(n, kernel), kernel
    return winograd_matrices(nh, kh), winograd_matrices(nw, kw)


def transformed_weights(mats: WinogradMatrices, weights: np.ndarray,
                        mats_w: WinogradMatrices | None = None) -> np.ndarray:
    """``U = G_h W G_w^T`` of ``[OC, C, kh, kw]`` weights, float64, as ``[alpha_h * alpha_w, OC, C]``:
    the left operands of the batched products, one per position of the transformed tile (``mats``
    along the rows, ``mats_w``, the same where None, along the columns)."""
    mats_w = mats if mats_w is None else mats_w
    oc, c = weights.shape[:2]
    return np.einsum("ai,ocij,bj->aboc", mats.G, np.asarray(weights, np.float64),
                     mats_w.G).reshape(mats.alpha * mats_w.alpha, oc, c)


def winograd_tile_2d(x: np.ndarray, w: np.ndarray, n: int, dtype=np.float64) -> np.ndarray:
    """Eq. 6 on one tile set: ``x`` [..., C, alpha, alpha], ``w`` [OC, C, k, k] -> [..., OC, n, n],
    all arithmetic in ``dtype`` (the reference the generator is checked with)."""
    k = w.shape[-1]
    m = winograd_matrices(n, k)
    a, b, g = (np.asarray(v, dtype=dtype) for v in (m.A, m.B, m.G))
    u = g @ w.astype(dtype) @ g.T                        # [OC, C, alpha, alpha]
    v = b.T @ x.astype(dtype) @ b                        # [..., C, alpha, alpha]
    mm = np.einsum("ocij,...cij->...oij", u, v)          # Hadamard product summed over channels
    return a.T @ mm @ a                                  # [..., OC, n, n]


def direct_tile_2d(x: np.ndarray, w: np.ndarray, n: int) -> np.ndarray:
    """Direct correlation of the same tiles in float64: [..., C, alpha, alpha] -> [..., OC, n, n]."""
    k = w.shape[-1]
    x, w = x.astype(np.float64), w.astype(np.float64)
    out = np.zeros(x.shape[:-3] + (w.shape[0], n, n))
    for i in range(k):
        for j in range(k):
            out += np.einsum("oc,...cpq->...opq", w[:, :, i, j], x[..., :, i:i + n, j:j + n])
    return out


def measured_error(n: int, k: int, dtype, channels: int = 16, tiles: int = 256, seed: int = 0,
                   dims: int = 2) -> tuple[float, float]:
    """(max |error| / max |reference|, relative L2 error) of F(n x n, k x k) (``dims`` 1: F(n, k),
    a 1x7 kernel's tiles) in ``dtype`` against the direct correlation in float64, on random tiles
    summed over ``channels`` (Eq. 6)."""
    rng = np.random.default_rng(seed + 100 * n + k)
    alpha = n + k - 1
    if dims == 1:
        x = rng.uniform(-1.0, 1.0, size=(tiles, channels, alpha)).astype(dtype)
        w = (rng.standard_normal((4, channels, k)) / np.sqrt(channels * k)).astype(dtype)
        m = winograd_matrices(n, k)
        a, b, g = (np.asarray(v, dtype=dtype) for v in (m.A, m.B, m.G))
        got = (np.einsum("oca,tca->toa", w @ g.T, x @ b) @ a).astype(np.float64)  # A^T [(G w) * (B^T d)]
        x, w = x.astype(np.float64), w.astype(np.float64)
        ref = np.stack([np.einsum("ocj,tcj->to", w, x[:, :, i:i + k]) for i in range(n)], axis=-1)
    else:
        x = rng.uniform(-1.0, 1.0, size=(tiles, channels, alpha, alpha)).astype(dtype)
        w = (rng.standard_normal((4, channels, k, k)) / np.sqrt(channels * k * k)).astype(dtype)
        got = winograd_tile_2d(x, w, n, dtype).astype(np.float64)
        ref = direct_tile_2d(x, w, n)
    err = np.abs(got - ref)
    return float(err.max() / np.abs(ref).max()), float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
