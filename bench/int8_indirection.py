"""QNNPACK's indirection buffer against packed im2col, on ResNet-18's int8 convolutions that are
neither 1x1 products nor depthwise: its 3x3s and its 1x1 stride-2 shortcuts (issue 30).

    python bench/int8_indirection.py                   # one thread, process CPU time, the host's path
    python bench/int8_indirection.py --path avx512bw   # another int8 path (``int8.PATHS``) this host has
    python bench/int8_indirection.py --others          # a few narrower convolutions as well

Per case, five kernels on one thread, alternated in each round (each timed ``--runs`` times, its
median kept; the table gives the median over rounds and the spread, lowest to highest round):

- ``packed``: ``int8_conv._conv_packed`` (``INDIRECT`` off): the group's channels laid pixel-major,
  then per MR output pixels their windows packed into rows and run by every panel on the tile;
- ``planes``: only its pixel-major transpose (both kernels pay it: the input is NCHW);
- ``packing``: the transpose and the rows' packing (a copy of the zero rows and each tap's bytes), no product;
- ``tiles``: only the products and epilogues, on one block of rows packed once and hot in L1;
- ``indirect``: ``int8_conv._conv_indirect`` (what the engine runs: ``runs_indirect``): the same
  transpose, then the tile reading each pixel's window tap by tap through the indirection table made
  at execution creation.

``packed`` and ``indirect`` are checked bit for bit against the NumPy reference first.
Nothing here asserts speed.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gpumnn, not an installed one

from gpumnn import atomic as A  # noqa: E402
from gpumnn.backends.base import TensorHandle  # noqa: E402
from gpumnn.backends.cpu import int8 as cpu_int8, int8_conv  # noqa: E402
from gpumnn.backends.cpu.backend import CpuBackend  # noqa: E402
from gpumnn.scheduler.schemes import conv_scheme  # noqa: E402

numba = int8_conv.numba
MR, NR = cpu_int8.MR, cpu_int8.NR

#: (name, channels, input size, output channels, kernel, stride, pad): ResNet-18's convolutions that
#: take im2col
CASES = [
    ("resnet18 3x3 64 @56", 64, 56, 64, 3, 1, 1),
    ("resnet18 3x3 64->128 @56 s2", 64, 56, 128, 3, 2, 1),
    ("resnet18 1x1 64->128 @56 s2", 64, 56, 128, 1, 2, 0),
    ("resnet18 3x3 128 @28", 128, 28, 128, 3, 1, 1),
    ("resnet18 3x3 128->256 @28 s2", 128, 28, 256, 3, 2, 1),
    ("resnet18 1x1 128->256 @28 s2", 128, 28, 256, 1, 2, 0),
    ("resnet18 3x3 256 @14", 256, 14, 256, 3, 1, 1),
    ("resnet18 3x3 256->512 @14 s2", 256, 14, 512, 3, 2, 1),
    ("resnet18 1x1 256->512 @14 s2", 256, 14, 512, 1, 2, 0),
    ("resnet18 3x3 512 @7", 512, 7, 512, 3, 1, 1),
]
#: narrower ones (``--others``): the fewest channels the indirection kernel takes, and a 5x5
OTHERS = [
    ("3x3 16 @56", 16, 56, 16, 3, 1, 1),
    ("3x3 24 @56 s2", 24, 56, 24, 3, 2, 1),
    ("3x3 32 @28", 32, 28, 32, 3, 1, 1),
    ("5x5 48->96 @28", 48, 28, 96, 5, 1, 2),
]


def _split(x, planes, rows, hot, panels, shifts, scales, out, geometry, flip, x_zero, y_zero, lo, hi, transpose,
           pack, multiply):
    """``_conv_packed``'s parts alone (its code, in the same order): the pixel-major transpose
    (``transpose``), the rows' packing (``pack``), the products and epilogues (``multiply``, on
    ``hot``, rows packed once, for every MR pixels). Returns a byte of the packed rows, so that no
    part is left out as unused."""
    kh_, kw_, sh, sw, ph, pw, dh, dw, oh_, ow_ = geometry
    images, channels, height, width = x.shape
    groups = panels.shape[0]
    per_group = channels // groups
    out_per_group = out.shape[1] // groups
    pixels = oh_ * ow_
    zero = x_zero + flip
    row_tiles = -(-pixels // MR)
    panel_count = panels.shape[1]
    kept = 0
    for n in range(images):
        for g in range(groups):
            c_first = g * per_group
            if transpose:
                for ih in range(height):
                    _pixel_major_row(x, planes, n, c_first, ih, flip)
            group_panels = panels[g]
            for row_tile in range(row_tiles):
                row0 = row_tile * MR
                count = min(MR, pixels - row0)
                if pack:
                    local = rows.copy()
                    for r in range(count):
                        oh, ow = (row0 + r) // ow_, (row0 + r) % ow_
                        row = local[r]
                        for kh in range(kh_):
                            ih = oh * sh - ph + kh * dh
                            for kw in range(kw_):
                                iw = ow * sw - pw + kw * dw
                                k = (kh * kw_ + kw) * per_group
                                if 0 <= ih < height and 0 <= iw < width:
                                    row[k:k + per_group] = planes[ih * width + iw]
                                else:
                                    row[k:k + per_group] = zero
                    kept ^= local[row_tile % MR, row_tile % local.shape[1]]
                if multiply:
                    acc = np.empty(MR * NR, np.int32)
                    done = np.empty((NR, MR), np.uint8)
                    for p in range(panel_count):
                        _tile(hot, 0, group_panels, p, acc)
                        c0 = g * panel_count * NR + p * NR
                        first = g * out_per_group + p * NR
                        _store_tile(acc, done, shifts[c0:c0 + NR], scales[c0:c0 + NR],
                                    out[n, first:first + min(NR, out_per_group - p * NR), row0:row0 + count], y_zero,
                                    lo, hi)
    return kept


def _handle(array: np.ndarray) -> TensorHandle:
    array = np.ascontiguousarray(array)
    return TensorHandle(array.reshape(-1), 0, array.shape, array.dtype.name)


def case_op(case) -> A.QuantizedConv2D:
    """The QuantizedConv2D of one case (int8 in and out, as ResNet-18 QDQ's)."""
    name, c, size, oc, k, stride, pad = case
    out_size = (size + 2 * pad - k) // stride + 1
    op = A.QuantizedConv2D(("x", "w", "b", "m"), ("y",), name, batch=1, in_channels=c, in_hw=(size, size),
                           out_channels=oc, out_hw=(out_size, out_size), kernel=(k, k), strides=(stride, stride),
                           pads=(pad, pad), groups=1, x_zero_point=-3, y_zero_point=5, out_dtype="int8",
                           lo=-128, hi=127, dtype="int8")
    return dataclasses.replace(op, scheme=conv_scheme(op))


def kernels(backend: CpuBackend, case, path: str) -> dict:
    """A case's five timed kernels (``packed`` and ``indirect`` checked against the NumPy reference)."""
    op = case_op(case)
    rng = np.random.default_rng(0)
    c, oc = op.in_channels, op.out_channels
    x = rng.integers(-128, 128, (1, c, *op.in_hw)).astype(np.int8)
    w = rng.integers(-127, 128, (oc, c, *op.kernel)).astype(np.int8)
    bias = rng.integers(-1000, 1000, oc).astype(np.int32)
    multiplier = rng.uniform(1e-4, 1e-3, oc).astype(np.float32)
    expected = int8_conv.quantized_conv_reference(op, x, w, bias, multiplier)
    timed = {}
    for name, indirect in (("packed", False), ("indirect", True)):
        y = np.zeros((1, oc, *op.out_hw), np.int8)
        int8_conv.INDIRECT = indirect
        try:
            execution = backend.create_execution(op, [_handle(x), _handle(w), _handle(bias), _handle(multiplier)],
                                                 [TensorHandle(y.reshape(-1), 0, y.shape, "int8")])
        finally:
            int8_conv.INDIRECT = True
        if ("indirect" in execution.scheme) != indirect:
            raise AssertionError(f"{op.source}: {name} runs {execution.scheme!r}")
        for work in execution.work:
            work()
        if not np.array_equal(y, expected):
            raise AssertionError(f"{op.source}: {execution.scheme!r} differs from the NumPy reference")
        timed[name] = lambda work=execution.work: [each() for each in work]
    pairs = cpu_int8._TILES[path][1]
    flip = int8_conv.SIGN_FLIP
    panels, colsum = int8_conv.pack_conv_weight(w, 1, pairs)
    shifts, scales = int8_conv.epilogue_columns(op, panels.shape[1] * NR, colsum, bias, multiplier, flip)
    geometry = (*op.kernel, *op.strides, *op.pads, *op.dilations, *op.out_hw)
    xb, arguments = x.view(np.uint8), (flip, op.x_zero_point, op.y_zero_point, op.lo, op.hi)
    dtype = np.int16 if pairs else np.uint8
    planes = np.empty((op.in_hw[0] * op.in_hw[1], c), dtype)
    rows = np.zeros((MR, panels.shape[2] * panels.shape[4]), dtype)
    hot = rng.integers(0, 256, rows.shape).astype(dtype)
    out = np.zeros((1, oc, op.out_hw[0] * op.out_hw[1]), np.uint8)
    split = numba.njit(error_model="numpy", boundscheck=False, nogil=True)(int8_conv._specialised(_split, path))

    def part(transpose: bool, pack: bool, multiply: bool):
        def run() -> None:
            split(xb, planes, rows, hot, panels, shifts, scales, out, geometry, *arguments, transpose, pack, multiply)
        run()
        return run
    timed.update(planes=part(True, False, False), packing=part(True, True, False), tiles=part(False, False, True))
    return timed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--path", default=None, help="the int8 path (int8.PATHS; default: the host's fastest)")
    parser.add_argument("--others", action="store_true", help="narrower convolutions as well")
    args = parser.parse_args(argv)
    if args.path:
        cpu_int8.use_path(args.path)
    path = cpu_int8.current_path()
    backend = CpuBackend(threads=1)
    print(f"{cpu_int8.PATH_NAMES[path]}, 1 thread, process CPU time; ms, per kernel the median over {args.rounds} "
          f"rounds of the median of {args.runs} runs, [lowest, highest] round")
    names = ("packed", "planes", "packing", "tiles", "indirect")
    print(f"{'case':<30} " + " ".join(f"{n:>22}" for n in names) + "   indirect/packed")
    for case in CASES + (OTHERS if args.others else []):
        timed = kernels(backend, case, path)
        rounds = {name: [] for name in names}
        for _ in range(args.rounds):
            for name in names:
                samples = []
                for _ in range(args.runs):
                    start = time.process_time()
                    timed[name]()
                    samples.append(time.process_time() - start)
                rounds[name].append(statistics.median(samples) * 1000.0)
        cells = [f"{statistics.median(rounds[n]):7.3f} [{min(rounds[n]):6.3f},{max(rounds[n]):6.3f}]" for n in names]
        ratios = [i / p for i, p in zip(rounds["indirect"], rounds["packed"])]
        print(f"{case[0]:<30} " + " ".join(f"{c:>22}" for c in cells)
              + f"   {statistics.median(ratios):.3f} [{min(ratios):.3f},{max(ratios):.3f}]", flush=True)


if __name__ == "__main__":
    main()
