"""Winograd and Strassen as atomic ops: the rewrite that gives every backend the fast schemes.

The scheme step (``gpumnn.scheduler.schemes``) marks a Conv2D ``winograd`` or a MatMul
``strassen``; :func:`expand_schemes` then replaces each marked op by Raster, MatMul (batched)
ops that every backend already runs, as MNN's geometry does for its compute ops. Why a rewrite
after scheme selection rather than inside the Conv lowering: lowering is backend-neutral and
knows nothing of costs, while the decision needs the whole op and the requested backend's
scheme table; a rewrite of the atomic program keeps the decision in one place and the
expansion in geometry, and runs before placement, so the new ops are placed like any other.

Winograd F(n x n, k x k) (Eq. 6) of x [N, C, H, W] with constant weights, alpha = n + k - 1,
T = N * ceil(OH/n) * ceil(OW/n) tiles:

1. Raster: the input tiles D[i, j, c, t] (alpha x alpha per tile and channel, zero padding
   where a tile reaches past the input): one strided region per (i, j);
2. MatMul: U1 = B^T D over i (one GEMM, m = alpha), then a batched MatMul over the rows
   a of U1: V[a, b] = B^T U1[a] over j -- the separable input transform B^T X B;
3. batched MatMul over the alpha^2 positions: M[a, b] = U[a, b] V[a, b] with
   U = G W G^T computed once (float64, then float32): the Hadamard product summed over
   channels is a GEMM [OC, C] x [C, T] per position (the paper's Section 3.3.1 (2));
4. MatMul W1 = A^T M over a, then a batched MatMul Y[p] = A^T W1[p] over b, with the bias
   (a constant repeated per tile) and the activation as its epilogue;
5. Raster: tiles back to NCHW, cropped at the border: one region per (p, q).

A rectangular kernel kh x kw has a tile and alpha per axis (``winograd.conv_matrices``): B, G and
A of F(n, kh) on the rows and of F(n, kw) on the columns, F(1, 1) (the identity) along a 1-wide
kernel axis, so a 1x7 kernel is 1D Winograd along the rows of each tile.

Strassen with L levels (Eq. 9) of [m, k] x [k, n] (sizes padded to multiples of 2^L with zeros):
the 4^L sub-blocks of A (and B) are gathered by one Raster; the 7^L sums Strassen multiplies
are one small GEMM with the Kronecker power of the 7 x 4 coefficient matrix (weights: computed
once); the 7^L products are one batched MatMul; the 4^L output blocks are one GEMM with the
4 x 7 combination matrix (alpha, the constant bias and the activation in its epilogue); a
Raster puts the blocks in place.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import atomic as A
from .schemes import builds_kernel
from ..numerics.winograd import conv_matrices, transformed_weights

#: One level of Strassen over quadrants (11, 12, 21, 22): the 7 products' left and right
#: factors and how the 4 output quadrants combine them.
STRASSEN_A = np.array([[1, 0, 0, 1], [0, 0, 1, 1], [1, 0, 0, 0], [0, 0, 0, 1],
                       [1, 1, 0, 0], [-1, 0, 1, 0], [0, 1, 0, -1]], dtype=np.float64)
STRASSEN_B = np.array([[1, 0, 0, 1], [1, 0, 0, 0], [0, 1, 0, -1], [-1, 0, 1, 0],
                       [0, 0, 0, 1], [1, 1, 0, 0], [0, 0, 1, 1]], dtype=np.float64)
STRASSEN_C = np.array([[1, 0, 0, 1, -1, 0, 1], [0, 0, 1, 0, 1, 0, 0],
                       [0, 1, 0, 1, 0, 0, 0], [1, -1, 1, 0, 0, 1, 0]], dtype=np.float64)


#: what separates the op's output from the scheme in the names of the tensors a rewrite adds
_MARK = "#"


def is_rewrite_tensor(name: str) -> bool:
    """Whether ``name`` is a tensor a Winograd or Strassen rewrite added (its transforms and products)."""
    return _MARK in name and name.rsplit(_MARK, 1)[1].startswith(("winograd", "strassen"))


class _Builder:
    """Adds ops, shapes and constants to a program under names derived from one op's output."""

    def __init__(self, program: A.AtomicProgram, op: A.AtomicOp, tag: str):
        self.program, self.op, self.prefix = program, op, f"{op.outputs[0]}{_MARK}{tag}"
        self.ops: list[A.AtomicOp] = []

    def name(self, what: str) -> str:
        return f"{self.prefix}.{what}"

    def const(self, what: str, array: np.ndarray) -> str:
        name = self.name(what)
        self.program.constants[name] = np.ascontiguousarray(array, dtype=np.float32)
        return name

    def tensor(self, what: str, shape: tuple[int, ...]) -> str:
        name = self.name(what)
        self.program.shapes[name] = tuple(int(d) for d in shape)
        return name

    def raster(self, src: str, out: str, regions: list[A.Region], fill: float | None) -> None:
        self.ops.append(A.Raster((src,), (out,), self.op.source, out_shape=self.program.shapes[out],
                                 regions=tuple(regions), fill=fill))

    def matmul(self, a: str, b: str, out: str, **fields) -> None:
        bias = fields.pop("bias", None)
        inputs = (a, b) + ((bias,) if bias else ())
        self.ops.append(A.MatMul(inputs, (out,), self.op.source, has_bias=bias is not None, **fields))


def _region(src_offset: int, src_strides, dst_offset: int, dst_strides, size) -> A.Region:
    pad = A.RANK - len(size)
    return A.Region(0, int(src_offset), (0,) * pad + tuple(int(s) for s in src_strides), int(dst_offset),
                    (0,) * pad + tuple(int(s) for s in dst_strides), (1,) * pad + tuple(int(s) for s in size))


def _valid_range(count: int, step: int, shift: int, limit: int) -> tuple[int, int]:
    """[lo, hi) of t in [0, count) with 0 <= t * step + shift < limit."""
    lo = max(0, -(-(-shift) // step))
    hi = min(count, -(-(limit - shift) // step))
    return lo, max(lo, hi)


# -- Winograd --------------------------------------------------------------------------------------

def winograd_ops(program: A.AtomicProgram, op: A.Conv2D) -> list[A.AtomicOp]:
    """The atomic ops of F(n x n, k x k) for ``op`` (see the module docstring); a rectangular
    kernel's tile and alpha are per axis (``conv_matrices``: 1 along a 1-wide kernel axis)."""
    (kh, kw), (rows_m, cols_m) = op.kernel, conv_matrices(op.winograd_tile, op.kernel)
    (nh, nw), (ah, aw) = (rows_m.n, cols_m.n), (rows_m.alpha, cols_m.alpha)
    batch, c, oc = op.batch, op.in_channels, op.out_channels
    (h, w), (oh, ow), (top, left) = op.in_hw, op.out_hw, op.pads
    th, tw = -(-oh // nh), -(-ow // nw)
    t = batch * th * tw
    b = _Builder(program, op, f"winograd{op.winograd_tile}")
    x = op.inputs[0]

    tiles = b.tensor("tiles", (ah, aw, c, batch, th, tw))
    regions = []
    for i in range(ah):
        r0, r1 = _valid_range(th, nh, i - top, h)
        for j in range(aw):
            c0, c1 = _valid_range(tw, nw, j - left, w)
            if r0 >= r1 or c0 >= c1:
                continue
            src = (r0 * nh + i - top) * w + (c0 * nw + j - left)
            dst = ((i * aw + j) * c * batch * th + r0) * tw + c0
            regions.append(_region(src, (h * w, c * h * w, nh * w, nw), dst, (batch * th * tw, th * tw, tw, 1),
                                   (c, batch, r1 - r0, c1 - c0)))
    covered = sum(r.count for r in regions)
    b.raster(x, tiles, regions, None if covered == ah * aw * c * t else 0.0)

    # an axis whose alpha is 1 (a 1-wide kernel's) has the identity for B and A: its step is left out
    half = tiles
    if ah > 1:
        half = b.tensor("input_rows", (ah, aw * c * t))
        b.matmul(b.const("Bt_rows", rows_m.B.T), tiles, half, m=ah, n=aw * c * t, k=ah)
    v = half
    if aw > 1:
        v = b.tensor("input_transformed", (ah * aw, c, t))
        b.matmul(b.const("Bt_cols", cols_m.B.T), half, v, batch=ah, m=aw, n=c * t, k=aw, b_batch_stride=aw * c * t)

    u = transformed_weights(rows_m, np.asarray(program.constants[op.inputs[1]]).reshape(oc, c, kh, kw), cols_m)
    u_name = b.const("weights_transformed", u)
    prod = b.tensor("products", (ah * aw, oc, t))
    b.matmul(u_name, v, prod, batch=ah * aw, m=oc, n=t, k=c, a_batch_stride=oc * c, b_batch_stride=c * t)

    bias = None
    if op.has_bias:
        per_channel = np.asarray(program.constants[op.inputs[2]], dtype=np.float32).reshape(oc)
        bias = b.const("bias_per_tile", np.repeat(per_channel, t))
    epilogue = {"bias": bias, "bias_strides": (0, 1), "activation": op.activation}  # on the last product
    y = b.tensor("output_tiles", (nh, nw, oc, batch, th, tw))
    rows = prod
    if ah > 1:
        rows = y if aw == 1 else b.tensor("output_rows", (nh, aw * oc * t))
        b.matmul(b.const("At_rows", rows_m.A.T), prod, rows, m=nh, n=aw * oc * t, k=ah, **(epilogue if aw == 1 else {}))
    if aw > 1:
        b.matmul(b.const("At_cols", cols_m.A.T), rows, y, batch=nh, m=nw, n=oc * t, k=aw, b_batch_stride=aw * oc * t,
                 **epilogue)

    regions = []
    for p in range(nh):
        rows_p = len(range(p, oh, nh))
        for q in range(nw):
            cols_q = len(range(q, ow, nw))
            if rows_p and cols_q:
                regions.append(_region((p * nw + q) * oc * t, (batch * th * tw, th * tw, tw, 1), p * ow + q,
                                       (oh * ow, oc * oh * ow, nh * ow, nw), (oc, batch, rows_p, cols_q)))
    b.raster(y, op.outputs[0], regions, None)
    return b.ops


# -- Strassen --------------------------------------------------------------------------------------

def _kron_power(matrix: np.ndarray, levels: int) -> np.ndarray:
    out = np.ones((1, 1))
    for _ in range(levels):
        out = np.kron(out, matrix)
    return out


def _block_origins(levels: int, rows: int, cols: int) -> list[tuple[int, int]]:
    """(row, column) of each of the 4^L sub-blocks in Kronecker order (top level most significant)."""
    origins = [(0, 0)]
    for level in range(levels):
        size_r, size_c = rows >> (level + 1), cols >> (level + 1)
        origins = [(r + qr * size_r, c + qc * size_c) for r, c in origins for qr in (0, 1) for qc in (0, 1)]
    return origins


def _gather_blocks(levels: int, rows: int, cols: int, padded: tuple[int, int], transposed: bool, ld: int):
    """Regions that copy a [rows, cols] matrix (stored transposed when ``transposed``, with
    leading dimension ``ld``) into 4^L contiguous blocks of the zero-padded size, and whether
    padding (fill) is needed."""
    br, bc = padded[0] >> levels, padded[1] >> levels
    regions = []
    for index, (r0, c0) in enumerate(_block_origins(levels, *padded)):
        nr, nc = min(br, rows - r0), min(bc, cols - c0)
        if nr <= 0 or nc <= 0:
            continue
        src = c0 * ld + r0 if transposed else r0 * ld + c0
        strides = (1, ld) if transposed else (ld, 1)
        regions.append(_region(src, strides, index * br * bc, (bc, 1), (nr, nc)))
    return regions, padded != (rows, cols)


def _padded(size: int, levels: int) -> int:
    return -(-size // (1 << levels)) << levels


def _blocks_of(matrix: np.ndarray, levels: int, padded: tuple[int, int]) -> np.ndarray:
    """A constant [rows, cols] matrix as [4^L, block rows, block cols] (zero-padded), in float64."""
    full = np.zeros(padded)
    full[:matrix.shape[0], :matrix.shape[1]] = matrix
    br, bc = padded[0] >> levels, padded[1] >> levels
    return np.stack([full[r:r + br, c:c + bc] for r, c in _block_origins(levels, *padded)])


def strassen_ops(program: A.AtomicProgram, op: A.MatMul) -> list[A.AtomicOp]:
    """The atomic ops of ``op`` computed with ``op.strassen_levels`` levels of Strassen."""
    levels = op.strassen_levels
    m, n, k = op.m, op.n, op.k
    mp, np_, kp = _padded(m, levels), _padded(n, levels), _padded(k, levels)
    bm, bn, bk = mp >> levels, np_ >> levels, kp >> levels
    blocks, products = 4 ** levels, 7 ** levels
    b = _Builder(program, op, f"strassen{levels}")

    def factor(operand: str, coeffs: np.ndarray, rows: int, cols: int, padded, transposed: bool, ld: int, what: str):
        """The 7^L left (or right) factors [7^L, rows/2^L, cols/2^L] of the products."""
        br, bc = padded[0] >> levels, padded[1] >> levels
        if operand in program.constants:
            value = np.asarray(program.constants[operand], dtype=np.float64).reshape(-1)
            matrix = value[:rows * cols].reshape((cols, rows) if transposed else (rows, cols))
            sums = np.tensordot(coeffs, _blocks_of(matrix.T if transposed else matrix, levels, padded), axes=1)
            return b.const(f"{what}_sums", sums)
        gathered = b.tensor(f"{what}_blocks", (blocks, br, bc))
        regions, needs_fill = _gather_blocks(levels, rows, cols, padded, transposed, ld)
        b.raster(operand, gathered, regions, 0.0 if needs_fill else None)
        coeff_name = b.const(f"{what}_coefficients", coeffs)
        sums = b.tensor(f"{what}_sums", (products, br, bc))
        b.matmul(coeff_name, gathered, sums, m=products, n=br * bc, k=blocks)
        return sums

    left = factor(op.inputs[0], _kron_power(STRASSEN_A, levels), m, k, (mp, kp), op.trans_a,
                  m if op.trans_a else k, "a")
    right = factor(op.inputs[1], _kron_power(STRASSEN_B, levels), k, n, (kp, np_), op.trans_b,
                   k if op.trans_b else n, "b")
    prods = b.tensor("products", (products, bm, bn))
    b.matmul(left, right, prods, batch=products, m=bm, n=bn, k=bk, a_batch_stride=bm * bk, b_batch_stride=bk * bn)

    bias = None
    if op.has_bias:
        flat = np.asarray(program.constants[op.inputs[2]], dtype=np.float64).reshape(-1)
        rows_i, cols_i = np.meshgrid(np.arange(m), np.arange(n), indexing="ij")
        full = flat[rows_i * op.bias_strides[0] + cols_i * op.bias_strides[1]] * op.beta
        bias = b.const("bias_blocks", _blocks_of(full, levels, (mp, np_)))
    combine = b.const("combination", op.alpha * _kron_power(STRASSEN_C, levels))
    out_blocks = b.tensor("output_blocks", (blocks, bm, bn))
    b.matmul(combine, prods, out_blocks, m=blocks, n=bm * bn, k=products, bias=bias,
             bias_strides=(bm * bn, 1), activation=op.activation)

    regions = []
    for index, (r0, c0) in enumerate(_block_origins(levels, mp, np_)):
        nr, nc = min(bm, m - r0), min(bn, n - c0)
        if nr > 0 and nc > 0:
            regions.append(_region(index * bm * bn, (bn, 1), r0 * n + c0, (n, 1), (nr, nc)))
    b.raster(out_blocks, op.outputs[0], regions, None)
    return b.ops


# -- the rewrite -----------------------------------------------------------------------------------

def expand_schemes(program: A.AtomicProgram, backend: Any = None) -> A.AtomicProgram:
    """Replace every ``winograd`` Conv2D and ``strassen`` MatMul by its atomic ops, except the
    Winograd convolutions ``backend`` (the one the schemes were chosen for) builds as a kernel
    of its own (``scheduler.schemes.builds_kernel``)."""
    ops: list[A.AtomicOp] = []
    for op in program.ops:
        if isinstance(op, A.Conv2D) and op.scheme == "winograd" and not builds_kernel(backend, A.Conv2D, "winograd"):
            ops.extend(winograd_ops(program, op))
        elif isinstance(op, A.MatMul) and op.scheme == "strassen" and op.strassen_levels > 0:
            ops.extend(strassen_ops(program, op))
        else:
            ops.append(op)
    program.ops = ops
    return program


__all__ = ["expand_schemes", "strassen_ops", "winograd_ops", "STRASSEN_A", "STRASSEN_B", "STRASSEN_C"]
