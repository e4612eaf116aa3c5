"""Requantization of static int8 convolutions: the contract's float epilogue against fixed-point
ones, on MobileNet-v2's and ResNet-18's QDQ convolutions (issue 30).

Every QuantizedConv2D of the model's cpu session is captured with the input it reads in one run on
a seeded standard-normal image, and its int32 sums are made in NumPy
(``int8_conv.quantized_conv_sums``). Three epilogues then turn the same sums into 8-bit outputs:

- ``float``: the contract's, ``clip(rint(float32(acc) * multiplier) + zero)`` (ONNX Runtime's);
- ``gemmlowp``: TFLite's reference fixed point, the multiplier as a Q31 integer and a right shift,
  a rounding doubling high multiply, then a rounding shift (two roundings);
- ``single``: the Q31 product in int64 shifted once, rounding half away from zero (QNNPACK's
  precise requantization).

Accuracy: each against the exact result, ``sum * multiplier`` in float64 rounded half to even
(ONNX Runtime's unfused path up to its float32 sums): how many outputs differ and by how many steps.
Speed: each epilogue as a compiled loop over the op's sums [OC, pixels] into its 8-bit outputs, the
engine's own ``int8_conv._requantized`` for ``float``, on each op's first CHUNK sums (in L1, as a
kernel's sums are in registers, each with its channel's parameters) repeated to the op's output count; one thread, process CPU time, the
three in turn for ``--rounds`` rounds of ``--runs`` passes over the model's ops, the median of the
rounds and their range; beside the model's whole run on one thread in the same alternation.

    python bench/requantize.py [--models mobilenet_v2 resnet18] [--rounds 7] [--runs 20]

The epilogues compile for this host's vector unit; ``NUMBA_CPU_NAME=haswell`` with an AVX2 feature list
in ``NUMBA_CPU_FEATURES`` (and a separate ``NUMBA_CACHE_DIR``) compiles the loops as an AVX2 host would.

Nothing here asserts speed.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gpumnn, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numba  # noqa: E402
import onnx  # noqa: E402

import gpumnn  # noqa: E402
from gpumnn.backends.cpu import int8_conv  # noqa: E402
from gpumnn.backends.cpu.reference import typed  # noqa: E402
from quantized import feed_of, make_case  # noqa: E402

EPILOGUES = ("float", "gemmlowp", "single")
#: the sums one timed pass reads (in L1, as the kernels' sums are in registers), repeated to each op's outputs
CHUNK = 4096


def q31(multiplier: float) -> tuple[int, int]:
    """(Q31 integer, right shift) with ``multiplier = integer * 2**-(31 + shift)``, as TFLite's
    QuantizeMultiplier makes them from a multiplier below one."""
    fraction, exponent = np.frexp(np.float64(multiplier))
    integer = int(np.round(fraction * (1 << 31)))
    if integer == 1 << 31:
        integer, exponent = integer // 2, exponent + 1
    return integer, -int(exponent)


_float = numba.njit(inline="always")(int8_conv._requantized)


@numba.njit(inline="always")
def _gemmlowp(acc, integer, shift, zero, lo, hi):
    product = np.int64(acc) * np.int64(integer)
    nudged = product + (np.int64(1 << 30) if product >= 0 else np.int64(1 - (1 << 30)))
    high = nudged >> 31 if nudged >= 0 else -((-nudged) >> 31)  # C's division by 2**31: toward zero
    mask = (np.int64(1) << shift) - 1
    threshold = (mask >> 1) + (1 if high < 0 else 0)
    value = (high >> shift) + (1 if (high & mask) > threshold else 0) + zero
    return np.int32(min(max(value, lo), hi))


@numba.njit(inline="always")
def _single(acc, integer, shift, zero, lo, hi):
    total = 31 + shift
    product = np.int64(acc) * np.int64(integer)
    value = ((product + (np.int64(1) << (total - 1)) + (product >> 63)) >> total) + zero
    return np.int32(min(max(value, lo), hi))


@numba.njit(cache=True)
def float_loop(acc, multiplier, integer, shift, zero, lo, hi, out, repeat=1):
    for _ in range(repeat):
        for i in range(acc.size):
            out[i] = _float(acc[i], multiplier[i], zero, lo, hi)


@numba.njit(cache=True)
def gemmlowp_loop(acc, multiplier, integer, shift, zero, lo, hi, out, repeat=1):
    for _ in range(repeat):
        for i in range(acc.size):
            out[i] = _gemmlowp(acc[i], integer[i], shift[i], zero, lo, hi)


@numba.njit(cache=True)
def single_loop(acc, multiplier, integer, shift, zero, lo, hi, out, repeat=1):
    for _ in range(repeat):
        for i in range(acc.size):
            out[i] = _single(acc[i], integer[i], shift[i], zero, lo, hi)


LOOPS = {"float": float_loop, "gemmlowp": gemmlowp_loop, "single": single_loop}


@dataclasses.dataclass
class Captured:
    """One QuantizedConv2D as a run met it: its op, constants and the input it read."""
    op: object
    weight: np.ndarray
    bias: np.ndarray
    multiplier: np.ndarray
    x: np.ndarray | None = None


def capture(model_path: Path) -> tuple[list[Captured], object, dict]:
    """The model's QuantizedConv2Ds with their inputs from one run, and the one-thread session."""
    captured: list[Captured] = []
    original = int8_conv.make_quantized_conv2d

    def capturing(op, ins, outs, engine, made_once):
        work = original(op, ins, outs, engine, made_once)
        constants = [typed(h)[h.offset:h.offset + h.size].copy() for h in ins[1:4]]
        record = Captured(op, constants[0].reshape(op.out_channels, op.in_channels // op.groups, *op.kernel),
                          *constants[1:])
        captured.append(record)
        handle = ins[0]
        shape = ((op.batch, *op.in_hw, op.in_channels) if op.channels_last
                 else (op.batch, op.in_channels, *op.in_hw))

        def first(fn=work.work[0]):
            if record.x is None:
                record.x = typed(handle)[handle.offset:handle.offset + handle.size].reshape(shape).copy()
            fn()
        return dataclasses.replace(work, work=(first, *work.work[1:]))

    int8_conv.make_quantized_conv2d = capturing
    try:
        session = gpumnn.load(str(model_path)).session(backend="cpu", threads=1)
        feed = feed_of(onnx.load(str(model_path)))
        session.run(feed)
    finally:
        int8_conv.make_quantized_conv2d = original
    return captured, session, feed


def epilogue_inputs(record: Captured) -> dict:
    """The op's int32 sums (one image, flat, channel-major) and every epilogue's parameters per sum."""
    op, x = record.op, record.x
    if op.channels_last:
        x = x.transpose(0, 3, 1, 2)
    acc = int8_conv.quantized_conv_sums(op, np.ascontiguousarray(x), record.weight, record.bias)
    acc = acc.transpose(1, 0, 2).reshape(op.out_channels, -1)
    multiplier = np.broadcast_to(record.multiplier, (op.out_channels,)).astype(np.float32)
    pairs = [q31(m) for m in multiplier]
    per_sum = np.ones((1, acc.shape[1]), np.int64)
    return dict(acc=acc.astype(np.int32).reshape(-1), multiplier=(multiplier[:, None] * per_sum).astype(np.float32).reshape(-1),
                integer=(np.array([q for q, _ in pairs], np.int64)[:, None] * per_sum).reshape(-1),
                shift=(np.array([s for _, s in pairs], np.int64)[:, None] * per_sum).reshape(-1),
                zero=op.y_zero_point, lo=op.lo, hi=op.hi, out=np.empty(acc.size, np.int32))


def accuracy(inputs: list[dict]) -> dict[str, tuple[int, int, int]]:
    """Per epilogue: (outputs off the exact rounding, the largest difference in steps, outputs)."""
    counts = {name: [0, 0, 0] for name in EPILOGUES}
    for args in inputs:
        exact = np.rint(args["acc"].astype(np.float64) * args["multiplier"].astype(np.float64))
        exact = np.clip(exact + args["zero"], args["lo"], args["hi"])
        for name in EPILOGUES:
            LOOPS[name](**args)
            diff = np.abs(args["out"] - exact)
            counts[name][0] += int(np.count_nonzero(diff))
            counts[name][1] = max(counts[name][1], int(diff.max()))
            counts[name][2] += diff.size
    return {name: tuple(c) for name, c in counts.items()}


def in_cache(args: dict) -> dict:
    """The op's epilogue on its first CHUNK sums, into bytes as the kernels store, repeated to the op's
    output count: the epilogue's arithmetic without its memory traffic (a kernel's sums are in registers)."""
    size = min(CHUNK, args["acc"].size)
    chunk = {key: args[key][:size].copy() for key in ("acc", "multiplier", "integer", "shift")}
    return dict(args, **chunk, out=np.empty(size, np.uint8), repeat=max(1, round(args["acc"].size / size)))


def timings(inputs: list[dict], session, feed, rounds: int, runs: int) -> dict[str, list[float]]:
    """ms per pass over the model's epilogues in cache per round (and the whole run's ms), alternating."""
    chunks = [in_cache(args) for args in inputs]
    series = {name: [] for name in (*EPILOGUES, "whole run")}
    for args in chunks:  # compile and warm
        for name in EPILOGUES:
            LOOPS[name](**args)
    session.run(feed)
    for _ in range(rounds):
        for name in series:
            start = time.process_time()
            for _ in range(runs):
                if name == "whole run":
                    session.run(feed)
                else:
                    loop = LOOPS[name]
                    for args in chunks:
                        loop(**args)
            series[name].append((time.process_time() - start) / runs * 1e3)
    return series


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mobilenet_v2", "resnet18"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "gpumnn-bench-quantized")
    args = parser.parse_args(argv)
    for name in args.models:
        case = make_case(f"{name}/qdq_s8_folded", args.cache)
        captured, session, feed = capture(case.quantized_path)
        inputs = [epilogue_inputs(record) for record in captured]
        outputs = sum(a["acc"].size for a in inputs)
        print(f"{name}/qdq_s8_folded: {len(captured)} QuantizedConv2D, {outputs} outputs a run")
        for epilogue, (off, steps, total) in accuracy(inputs).items():
            print(f"  {epilogue:9s} off the exact rounding: {off} of {total} outputs ({off / total:.2e}), "
                  f"at most {steps} step(s)")
        series = timings(inputs, session, feed, args.rounds, args.runs)
        whole = statistics.median(series["whole run"])
        for label, values in series.items():
            median = statistics.median(values)
            share = ("" if label == "whole run"
                     else f"  {median / whole:6.1%} of the whole run, {median * 1e6 / outputs:.3f} ns an output")
            print(f"  {label:9s} {median:7.3f} ms  (rounds {min(values):.3f} .. {max(values):.3f}){share}")


if __name__ == "__main__":
    main()
