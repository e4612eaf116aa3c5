"""Scheme selection: which algorithm each convolution and matrix product uses (paper Section 3.2).

The session runs :func:`select_schemes` once, after lowering and before placement; it is the
only place that decides. Every backend then builds what ``op.scheme`` names (and lists the
schemes it has in ``Backend.schemes``; ``unsupported_reason`` refuses any other), so no backend
re-derives a depthwise or pointwise test of its own.

Convolution (Eq. 2-3):

* ``depthwise`` when every group has one input and one output channel;
* ``gemm1x1`` for a 1x1, stride-1, unpadded convolution (a GEMM on the input as it lies);
* otherwise ``n_hat = argmin_n C(n)`` over ``n = 1`` and the Winograd tiles whose float32 error
  we measured acceptable (:func:`winograd_allowed`): the sliding window (``im2col``) when
  ``n_hat = 1``, else Winograd F(n_hat x n_hat, k x k) (``winograd``, tile in ``winograd_tile``).
  A rectangular kernel takes n_hat along each axis 2 or more wide and 1 along a 1-wide one
  (``winograd.axis_tiles``): Inception's 1x7 and 7x1 convolutions are 1D Winograd F(1 x n, 1 x 7).

``C(n)`` is the arithmetic cost of the whole convolution: tiles(n) times Eq. 2's cost per tile,
``2 ic a^3 + ic oc a^2 + oc n a (a + n)`` with ``a = n + k - 1`` (input transform, Hadamard
products summed over channels, output transform); with a tile and alpha per axis,
``ic ah aw (ah + aw) + ic oc ah aw + oc nh aw (ah + nw)``. Two readings of Eq. 2 are made explicit here:
the per-tile cost is multiplied by the number of tiles ``ceil(oh/n) ceil(ow/n)`` (per tile, the
smallest n always wins; counting tiles also charges the waste of partial tiles at the border, which
is what makes a small map prefer a smaller tile), and the output transform is per output
channel (the paper's last term omits ``oc``). ``C(1)`` is the sliding window's own count,
``ic oc k^2`` per output.

Matrix products: ``gemv`` for a product of one row (M = 1: a batch-1 classifier) on a backend
with a matrix-vector kernel (the GPU kernel families; :func:`gemv_fits`), else ``gemm``, or
``strassen`` (with ``strassen_levels``) while Eq. 9 says one more level of recursion saves more
multiplications than its additions cost. A backend without a ``gemv`` kernel runs such an op with
its GEMM (``backends.base.SCHEME_FALLBACKS``), so placement may move it anywhere.

Winograd and Strassen are rewritten by ``gpumnn.scheduler.expansion`` into Raster and (batched)
MatMul atomic ops, bias and activation in the last MatMul's epilogue, so every backend that runs
those gets them -- except on a backend that lists ``winograd`` among its own Conv2D kernels (the
NumPy backend: one chunked kernel, each chunk's tiles transformed while in cache), which builds
it itself where :func:`winograd_kernel_pays` (enough tiles, input channels and multiplications
saved; elsewhere its im2col wins). A GPU backend sets no gate of its own: its calibration's rates
give one (:func:`winograd_min_saving`), so its Winograd kernel is taken only where the device
runs it faster than the sliding window. A scheme the
requested backend lacks is skipped for the next candidate; when it has none, the op keeps the
best scheme and placement runs it where it is built (the CPU).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

from .. import atomic as A
from ..numerics.strides import contiguous_strides
from ..numerics.winograd import axis_tiles

#: Schemes that are rewritten into atomic ops (``gpumnn.scheduler.expansion``) instead of built by a kernel.
EXPANDED = frozenset({"winograd", "strassen"})

#: Winograd tiles are allowed while alpha = n + k - 1 stays at or below this. Measured
#: (``bench/winograd_error.py``, points 0, +-1/2, +-1, ...): float32 max |error| / max |ref| is
#: below 7e-6 for every F(n x n, k x k) with alpha <= 8 and n <= 6, and 4e-5 to 1.6e-2 beyond;
#: a 1D tile (a 1x7 or 7x1 kernel's, transformed along one axis only) stays below 7e-6 up to
#: alpha 10, and 2.6e-5 to 6.5e-4 beyond.
MAX_ALPHA = 8
MAX_ALPHA_1D = 10
MAX_TILE = 6
#: Strassen (Eq. 9): the cost of one addition in multiplications. The paper takes them as equal
#: on mobile CPUs (1.0).
STRASSEN_ADD_COST = 1.0
#: ... and stops the recursion before a sub-product drops below this many rows, columns or
#: inner products: a GEMM kernel far below it no longer runs at full speed, so the saved
#: multiplications are slower ones (measured in ``bench/schemes.py``).
STRASSEN_MIN_BLOCK = 256
#: a matrix-vector kernel takes a batch of one-row products that share one weight up to this many rows
GEMV_MAX_SHARED_ROWS = 4
#: A backend's own Winograd kernel may take a tile with fewer output tiles than its
#: ``winograd_min_tiles`` where that tile makes this many times fewer multiplications than the best
#: tile with enough of them (or the sliding window, where none has enough): a plane a few rows high,
#: whose only tiles with enough tiles are small ones that save little (:func:`winograd_kernel_pays`)
FEW_TILES_GAIN = 1.5


@dataclass(frozen=True)
class Decision:
    """What the scheme step chose for one convolution or matrix product, and why."""

    node: str
    kind: str
    scheme: str
    detail: str  # e.g. "F(4x4, 3x3)", "2 levels", "" -- and the costs compared

    def describe(self) -> str:
        return f"{self.node}: {self.kind} -> {self.scheme}{' ' + self.detail if self.detail else ''}"


# -- convolution ---------------------------------------------------------------------------------

def is_depthwise(op: A.Conv2D) -> bool:
    return op.groups > 1 and op.groups == op.in_channels == op.out_channels


def is_pointwise(op: A.Conv2D) -> bool:
    return op.kernel == (1, 1) and op.strides == (1, 1) and op.pads == (0, 0) and op.in_hw == op.out_hw


def conv_scheme(op: A.ConvGeometry) -> str:
    """The scheme from the geometry alone (no Winograd): for ops made outside a session, and every
    QuantizedConv2D."""
    if is_depthwise(op):
        return "depthwise"
    if is_pointwise(op):
        return "gemm1x1"
    return "im2col"


def winograd_allowed(n: int, k: int, dims: int = 2) -> bool:
    """Whether F(n x n, k x k) (``dims`` 1: F(n, k) along one axis) is accurate enough in float32
    to be chosen (see ``MAX_ALPHA``)."""
    return 2 <= n <= MAX_TILE and k >= 2 and n + k - 1 <= (MAX_ALPHA if dims == 2 else MAX_ALPHA_1D)


def winograd_fits(op: A.Conv2D, weights_constant: bool) -> bool:
    """Winograd's geometry: one group, unit stride and dilation, a kernel 2 or more wide along an
    axis at least (square, or rectangular: ``winograd.axis_tiles``), and weights (and bias, if any)
    known at session creation: the weights are transformed once (G W G^T) and the bias is folded
    into the output transform's epilogue."""
    return (weights_constant and op.groups == 1 and op.strides == (1, 1) and op.dilations == (1, 1)
            and max(op.kernel) >= 2)


def conv_cost(op: A.Conv2D, n: int) -> int:
    """Eq. 2 over the whole convolution: multiplications of F(n x n, k x k) (per axis: F(n, k),
    or nothing along a 1-wide kernel axis); n = 1 is the sliding window."""
    ic, oc = op.in_channels // op.groups, op.out_channels
    (oh, ow), (kh, kw) = op.out_hw, op.kernel
    if n == 1:
        return op.batch * oh * ow * ic * oc * kh * kw
    nh, nw = axis_tiles(n, op.kernel)
    ah, aw = nh + kh - 1, nw + kw - 1
    return winograd_tile_count(op, n) * (ic * ah * aw * (ah + aw) + ic * oc * ah * aw + oc * nh * aw * (ah + nw))


def scheme_macs(op: A.AtomicOp) -> int:
    """The multiplications ``op`` does with the scheme chosen for it: Eq. 2's C(n) for a
    Winograd convolution built by a backend's own kernel (its transforms included), the plain
    count otherwise. The cost model (:mod:`.cost`) and calibration price kernels by this."""
    if isinstance(op, A.Conv2D) and op.scheme == "winograd" and op.winograd_tile > 1:
        return conv_cost(op, op.winograd_tile)
    return op.macs()


def winograd_tiles(kernel: int | tuple[int, int]) -> list[int]:
    """The tile sizes n > 1 allowed for a kernel k x k (``kernel`` an int) or kh x kw: allowed
    along every axis 2 or more wide."""
    long_sides = [k for k in ((kernel, kernel) if isinstance(kernel, int) else kernel) if k > 1]
    return [n for n in range(2, MAX_TILE + 1) if all(winograd_allowed(n, k, len(long_sides)) for k in long_sides)]


def winograd_detail(n: int, kernel: tuple[int, int]) -> str:
    """``F(4x4, 3x3)``, ``F(1x2, 1x7)``: the tile and kernel, per axis."""
    (nh, nw), (kh, kw) = axis_tiles(n, kernel), kernel
    return f"F({nh}x{nw}, {kh}x{kw})"


def best_tile(op: A.Conv2D) -> tuple[int, dict[int, int]]:
    """(n_hat, {n: C(n)}): Eq. 2's argmin over n = 1 and the allowed Winograd tiles."""
    costs = {n: conv_cost(op, n) for n in [1] + winograd_tiles(op.kernel)}
    return min(costs, key=lambda n: (costs[n], n)), costs


def conv_candidates(op: A.Conv2D, weights_constant: bool) -> list[tuple[str, int, str]]:
    """(scheme, winograd tile, detail) best first; the last is always the general sliding window."""
    if is_depthwise(op):
        return [("depthwise", 0, ""), ("im2col", 0, "")]
    if is_pointwise(op):
        return [("gemm1x1", 0, ""), ("im2col", 0, "")]
    if not winograd_fits(op, weights_constant):
        return [("im2col", 0, "")]
    n_hat, costs = best_tile(op)
    compared = "C(n): " + ", ".join(f"{n}:{c:.3g}" for n, c in costs.items())
    if n_hat == 1:
        return [("im2col", 0, f"n_hat=1 ({compared})")]
    # n_hat first; the other tiles cheaper than the sliding window after it, for a backend that
    # builds n_hat's tiles too few to pay (``Backend.winograd_min_tiles``)
    cheaper = sorted((n for n in costs if 1 < n and costs[n] < costs[1]), key=lambda n: (costs[n], n))
    return [("winograd", n, f"{winograd_detail(n, op.kernel)} ({compared})") for n in cheaper] + [("im2col", 0, "")]


# -- matrix products -----------------------------------------------------------------------------

def strassen_saves(m: int, n: int, k: int, add_cost: float | None = None) -> bool:
    """Eq. 9 for one level of [m, k] x [k, n]: multiplications saved exceed the additions' cost."""
    add_cost = STRASSEN_ADD_COST if add_cost is None else add_cost
    m2, n2, k2 = m / 2, n / 2, k / 2
    return m * n * k - 7 * m2 * n2 * k2 > add_cost * (4 * m2 * k2 + 4 * n2 * k2 + 7 * m2 * n2)


def strassen_levels(m: int, n: int, k: int, add_cost: float | None = None, min_block: int | None = None) -> int:
    """Levels of Strassen recursion: go on while Eq. 9 holds and the halves stay >= ``min_block``."""
    min_block = STRASSEN_MIN_BLOCK if min_block is None else min_block
    levels = 0
    while min(m, n, k) >= 2 * min_block and strassen_saves(m, n, k, add_cost):
        m, n, k = -(-m // 2), -(-n // 2), -(-k // 2)
        levels += 1
    return levels


def strassen_fits(op: A.MatMul, constants: Mapping[str, Any]) -> bool:
    """One product (batch 1) whose bias, if any, is known at session creation."""
    return op.batch == 1 and (not op.has_bias or op.inputs[2] in constants)


def gemv_fits(op: A.MatMul) -> bool:
    """A product of one row per batch entry, which a matrix-vector kernel (``gemv``) computes: M = 1,
    and where the batch shares one weight, at most GEMV_MAX_SHARED_ROWS entries (more rows of one
    weight make a GEMM whose tiles read each weight once for all of them)."""
    return op.m == 1 and (op.b_batch_stride != 0 or op.batch <= GEMV_MAX_SHARED_ROWS)


def matmul_candidates(op: A.MatMul, constants: Mapping[str, Any]) -> list[tuple[str, int, str]]:
    if gemv_fits(op):  # a backend without the kernel goes on to the GEMM
        return [("gemv", 0, f"M = 1 ({op.batch}x{op.k}x{op.n})"), ("gemm", 0, "")]
    if strassen_fits(op, constants):
        levels = strassen_levels(op.m, op.n, op.k)
        if levels:
            return [("strassen", levels, f"{levels} level{'s' * (levels > 1)} (Eq. 9, "
                     f"{op.m}x{op.k}x{op.n})"), ("gemm", 0, "")]
    return [("gemm", 0, "")]


# -- the step ------------------------------------------------------------------------------------

#: Choices imposed by :func:`forced_schemes` (benchmarks and tests compare schemes with it).
#: A context variable, not a global: a forced choice holds in the thread (and context) that made
#: it, so sessions created meanwhile by other threads keep the cost model's choices.
_FORCED_VAR: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("gpumnn_forced_schemes", default={})


@contextlib.contextmanager
def forced_schemes(conv: tuple[str, int] | None = None, strassen: int | None = None) -> Iterator[None]:
    """Within the block, sessions use ``conv`` = (scheme, Winograd tile) for every convolution
    it fits (``("im2col", 0)``: the sliding window wherever Winograd could be chosen;
    ``("winograd", n)``) and ``strassen`` levels (0: plain GEMM) for every matrix product it
    fits, instead of the cost model's choice. For measuring the choices
    against each other (``bench/schemes.py``) and for tests; sessions never use it otherwise."""
    forced = dict(_FORCED_VAR.get())
    forced.update({k: v for k, v in (("conv", conv), ("strassen", strassen)) if v is not None})
    token = _FORCED_VAR.set(forced)
    try:
        yield
    finally:
        _FORCED_VAR.reset(token)


def _forced_conv(op: A.Conv2D, weights_constant: bool, candidates: list) -> list:
    scheme, tile = _FORCED_VAR.get()["conv"]
    if scheme == "winograd" and not (winograd_fits(op, weights_constant) and tile in winograd_tiles(op.kernel)):
        return candidates
    if scheme in ("depthwise", "gemm1x1") and conv_scheme(op) != scheme:
        return candidates
    if scheme == "im2col" and conv_scheme(op) != "im2col":  # the sliding window instead of Winograd only
        return candidates
    return [(scheme, tile, "(forced)")] + candidates


def _forced_matmul(op: A.MatMul, constants: Mapping[str, Any], candidates: list) -> list:
    levels = _FORCED_VAR.get()["strassen"]
    if levels == 0:  # no Strassen: a product of one row keeps its matrix-vector kernel
        return [c for c in candidates if c[0] == "gemv"] + [("gemm", 0, "(forced)")]
    return [("strassen", levels, f"{levels} levels (forced)")] + candidates if strassen_fits(op, constants) else candidates

def builds_kernel(backend: Any, op_type: type, scheme: str) -> bool:
    """Whether ``backend`` builds ``scheme`` with a kernel of its own (``Backend.schemes``), so a
    rewritable scheme (``EXPANDED``) is left to it rather than rewritten into atomic ops."""
    return backend is not None and scheme in backend.schemes.get(op_type, ())


def winograd_tile_count(op: A.Conv2D, n: int, per_image: bool = False) -> int:
    """Output tiles of F(n x n, k x k) (1 x n, n x 1 for a 1-wide kernel axis) over the whole
    batch, or of one image."""
    nh, nw = axis_tiles(n, op.kernel)
    return (1 if per_image else op.batch) * math.ceil(op.out_hw[0] / nh) * math.ceil(op.out_hw[1] / nw)


def winograd_kernel_cost(op: A.Conv2D, n: int, transform_tiles: tuple[int, int, int] | None) -> int:
    """Multiplications a backend's own Winograd kernel F(n) makes for ``op``: Eq. 2's ``conv_cost``
    where ``transform_tiles`` is None; else with the transforms as a kernel on fixed register
    tiles runs them (``Backend.winograd_transform_tiles`` = (square, row, mr)): each tile's
    input, per input channel, as two square x square products of depths alpha_h and alpha_w (a 1D
    tile's as one row-wide product of depth alpha), so a small alpha pays for the whole square;
    its output, per output channel, as products mr rows wide along each axis longer than 1."""
    if n == 1 or transform_tiles is None:
        return conv_cost(op, n)
    square, row, mr = transform_tiles
    ic, oc = op.in_channels // op.groups, op.out_channels
    (nh, nw), (kh, kw) = axis_tiles(n, op.kernel), op.kernel
    ah, aw = nh + kh - 1, nw + kw - 1
    inputs = row * max(ah, aw) if min(ah, aw) == 1 else square * square * (ah + aw)
    outputs = (mr * aw * ah if ah > 1 else 0) + (mr * nh * aw if aw > 1 else 0)
    return winograd_tile_count(op, n) * (ic * inputs + ic * oc * ah * aw + oc * outputs)


def winograd_min_saving(backend: Any, calibration: Any = None) -> float:
    """How many times fewer multiplications than the sliding window a backend's own Winograd
    kernel must make to be chosen: the backend's own gate (``Backend.winograd_min_saving``, set
    where it was measured, as the cpu's engines do); else, where ``calibration`` (a measured
    :class:`~gpumnn.scheduler.calibration.Calibration` of the backend) times both kernels, how
    many times slower per multiplication its Winograd kernel runs than its sliding-window 3x3,
    so that the kernel is chosen only where the device runs it faster; else 0 (any saving)."""
    own = getattr(backend, "winograd_min_saving", 0.0)  # (a backend without a Winograd kernel may lack it)
    kernels = calibration.kernels if calibration is not None and calibration.calibrated else {}
    if own or "winograd" not in kernels or "conv3x3" not in kernels or kernels["winograd"][1] <= 0:
        return own
    return kernels["conv3x3"][1] / kernels["winograd"][1]


def winograd_kernel_pays(backend: Any, op: A.Conv2D, tile: int, min_saving: float | None = None) -> bool:
    """Whether ``backend``'s own Winograd kernel F(tile) is chosen for ``op``: from
    ``Backend.winograd_min_tiles`` output tiles (of one image where ``winograd_per_image``: a
    kernel going image by image gains nothing from the batch) and ``winograd_min_channels`` input channels on,
    and where it makes at most 1 / ``min_saving`` (:func:`winograd_min_saving`; by default the
    backend's ``winograd_min_saving``) of the sliding window's multiplications,
    its transforms counted as the kernel runs them (:func:`winograd_kernel_cost`; its transforms
    and small per-position products run slower per multiplication than one big GEMM). With fewer
    tiles it is taken where its tiles times its saving still reach the gate's (``winograd_min_tiles``
    x ``min_saving``) and it saves ``FEW_TILES_GAIN`` times what the tiles that pass save
    (:func:`_few_tiles_pay`)."""
    tiles = getattr(backend, "winograd_transform_tiles", None)
    min_saving = backend.winograd_min_saving if min_saving is None else min_saving
    if op.in_channels < backend.winograd_min_channels:
        return False
    if conv_cost(op, 1) < min_saving * winograd_kernel_cost(op, tile, tiles):
        return False
    return (winograd_tile_count(op, tile, backend.winograd_per_image) >= backend.winograd_min_tiles
            or _few_tiles_pay(backend, op, tile, min_saving))


def _winograd_saving(op: A.Conv2D, tile: int, transform_tiles: tuple[int, int, int] | None) -> float:
    """How many times fewer multiplications F(tile) makes than the sliding window (1: the window)."""
    return conv_cost(op, 1) / winograd_kernel_cost(op, tile, transform_tiles) if tile > 1 else 1.0


def _few_tiles_pay(backend: Any, op: A.Conv2D, tile: int, min_saving: float) -> bool:
    """Whether F(tile), below ``winograd_min_tiles`` tiles and saving at least ``min_saving``,
    still pays: its tiles x saving reach the gate's product, and it saves ``FEW_TILES_GAIN`` times
    what the best tile passing the whole gate saves (the sliding window's 1 where none does): crnn's
    128 -> 192 at 4 x 40 has 10 tiles of F(4), saving 3.4x, where the tiles with 16 or more (F(2),
    F(3)) save at most 1.8x."""
    transform_tiles = getattr(backend, "winograd_transform_tiles", None)
    count = winograd_tile_count(op, tile, backend.winograd_per_image)
    saving = _winograd_saving(op, tile, transform_tiles)
    if count * saving < backend.winograd_min_tiles * min_saving:
        return False
    passing = [_winograd_saving(op, n, transform_tiles) for n in winograd_tiles(op.kernel)
               if winograd_tile_count(op, n, backend.winograd_per_image) >= backend.winograd_min_tiles]
    best = max([1.0] + [s for s in passing if s >= min_saving])
    return saving >= FEW_TILES_GAIN * best


def _builds(backend: Any, op: A.AtomicOp, candidate: tuple[str, int, str], forced: bool = False,
            min_saving: float | None = None) -> bool:
    """Whether ``backend`` runs ``candidate`` for ``op``: its own kernel (a Winograd kernel only
    where :func:`winograd_kernel_pays` with ``min_saving``, unless forced), or (an expanded scheme) the
    Raster and MatMul kernels the rewrite uses -- and, unless forced, the backend lets the cost
    model choose that rewrite (``Backend.cost_model_expansions``) with that tile
    (``Backend.winograd_rewrite_max_tile``)."""
    scheme, tile, _ = candidate
    if backend is None:
        return True
    if builds_kernel(backend, type(op), scheme):
        return forced or scheme != "winograd" or winograd_kernel_pays(backend, op, tile, min_saving)
    if scheme in EXPANDED:
        table = backend.kernel_table
        runs = A.Raster in table and A.MatMul in table and "gemm" in backend.schemes.get(A.MatMul, ())
        if forced:
            return runs
        largest = backend.winograd_rewrite_max_tile if scheme == "winograd" else None
        return runs and scheme in backend.cost_model_expansions and (largest is None or tile <= largest)
    return False


def _choose(op: A.AtomicOp, candidates: Sequence[tuple[str, int, str]], backend: Any,
            forced: bool = False, min_saving: float | None = None) -> tuple[str, int, str]:
    for candidate in candidates:
        if _builds(backend, op, candidate, forced, min_saving):
            return candidate
    return candidates[0]  # none here: placement runs the op where it is built


def select_schemes(program: A.AtomicProgram, backend: Any = None, calibration: Any = None) -> A.AtomicProgram:
    """Decide ``scheme`` for every Conv2D and MatMul of ``program`` (for ``backend``, the
    requested one; None: any scheme; ``calibration``: the backend's, which gates its Winograd
    kernel where the backend sets no gate: :func:`winograd_min_saving`), recording each decision
    in ``program.decisions``."""
    ops, decisions = [], []
    forced = _FORCED_VAR.get()
    min_saving = None if backend is None else winograd_min_saving(backend, calibration)
    for op in program.ops:
        if isinstance(op, A.Conv2D):
            constant = op.inputs[1] in program.constants and (not op.has_bias or op.inputs[2] in program.constants)
            candidates = conv_candidates(op, constant)
            if op.source in program.exact_integer_sources:  # an int32 accumulation: Winograd's transforms round
                candidates = [c for c in candidates if c[0] != "winograd"]
            if "conv" in forced:
                candidates = _forced_conv(op, constant, candidates)
            scheme, tile, detail = _choose(op, candidates, backend, forced="conv" in forced, min_saving=min_saving)
            op = dataclasses.replace(op, scheme=scheme, winograd_tile=tile)
            decisions.append(Decision(op.source, _conv_kind(op), scheme, detail))
        elif isinstance(op, A.QuantizedConv2D):  # one kernel per geometry: depthwise, 1x1 as a product, im2col
            op = dataclasses.replace(op, scheme=conv_scheme(op))
        elif isinstance(op, A.MatMul):
            candidates = matmul_candidates(op, program.constants)
            if "strassen" in forced:
                candidates = _forced_matmul(op, program.constants, candidates)
            scheme, levels, detail = _choose(op, candidates, backend, forced="strassen" in forced)
            op = dataclasses.replace(op, scheme=scheme, strassen_levels=levels)
            decisions.append(Decision(op.source, f"matmul {op.batch}x{op.m}x{op.k}x{op.n}", scheme, detail))
        ops.append(op)
    program.ops = ops
    program.decisions = decisions
    return fuse_residuals(program, backend)


def takes_residual(op: A.Conv2D, backend: Any) -> bool:
    """Whether the kernel ``backend`` builds for ``op``'s scheme adds a residual
    (``Backend.residual_schemes``; None: any scheme a backend builds itself, so not a rewritten one:
    a Winograd rewrite ends in a batched MatMul whose rows are not the output's)."""
    if backend is None:
        return op.scheme not in EXPANDED
    # a device profile's planning target carries the profiled backend's; a stand-in without them fuses nothing
    return op.scheme in getattr(backend, "residual_schemes", {}).get(A.Conv2D, ())


def _residual_operand(program: A.AtomicProgram, conv: A.Conv2D, add: A.AtomicOp) -> str | None:
    """The operand of ``add`` that ``conv``'s epilogue can add as its residual: ``add`` is a
    float32 Binary add of the convolution's output and another float32 run-time tensor of the
    same elements, neither broadcast; else None."""
    out = conv.outputs[0]
    if not (isinstance(add, A.Binary) and add.op == "add" and add.dtype == A.FLOAT32 and len(add.inputs) == 2):
        return None
    if list(add.inputs).count(out) != 1:  # conv(x) + conv(x) has no residual
        return None
    residual = add.inputs[1] if add.inputs[0] == out else add.inputs[0]
    size = conv.batch * conv.out_channels * conv.out_hw[0] * conv.out_hw[1]
    shape = tuple(add.out_shape)
    dense = contiguous_strides(shape)
    same = all(d == 1 or (a == c and b == c) for d, a, b, c in zip(shape, add.a_strides, add.b_strides, dense))
    if not same or math.prod(shape) != size or residual in program.constants or residual not in program.shapes:
        return None
    if math.prod(program.shapes[residual]) != size or program.storage_dtype_of(residual) != A.FLOAT32:
        return None
    if program.storage_of(residual) == program.storage_of(out):
        return None
    return residual


def fuse_residuals(program: A.AtomicProgram, backend: Any = None) -> A.AtomicProgram:
    """Fuse each residual add into the Conv2D that produces one of its operands (issue 29: a
    ResNet block ends in its last convolution's kernel): where the convolution has no activation
    of its own, its output is no graph output, has no views and is read only by one float32
    Binary add of a same-shape tensor (no broadcasting), and ``backend``'s kernel for the chosen
    scheme takes a residual (:func:`takes_residual`). The fused convolution takes the add's
    place in the program (so a residual computed after the convolution is ready), its output
    and its activation; the convolution's own output tensor is gone."""
    reads: dict[str, list[int]] = {}
    for index, op in enumerate(program.ops):
        for name in op.inputs:
            reads.setdefault(name, []).append(index)
    viewed = set(program.aliases) | set(program.aliases.values())
    outputs = set(program.outputs)
    fused: dict[int, A.AtomicOp] = {}
    removed: set[int] = set()
    for index, conv in enumerate(program.ops):
        if not (isinstance(conv, A.Conv2D) and conv.dtype == A.FLOAT32 and conv.activation is None
                and not conv.has_residual and takes_residual(conv, backend)):
            continue
        out = conv.outputs[0]
        readers = reads.get(out, [])
        if out in outputs or out in viewed or len(readers) != 1 or readers[0] in fused:
            continue
        add = program.ops[readers[0]]
        residual = _residual_operand(program, conv, add)
        if residual is None:
            continue
        fused[readers[0]] = dataclasses.replace(conv, inputs=tuple(conv.inputs) + (residual,), outputs=tuple(add.outputs),
                                                has_residual=True, activation=add.activation)
        removed.add(index)
        program.shapes.pop(out, None)
        program.dtypes.pop(out, None)
    if fused:
        program.ops = [fused.get(i, op) for i, op in enumerate(program.ops) if i not in removed]
    return program


def _conv_kind(op: A.Conv2D) -> str:
    kh, kw = op.kernel
    return (f"conv {kh}x{kw} {op.in_channels}->{op.out_channels} {op.in_hw[0]}x{op.in_hw[1]}"
            + (f" stride {op.strides[0]}" if op.strides != (1, 1) else "") + (f" groups {op.groups}" if op.groups > 1 else ""))
