"""One QuantizedConv2D at a time on the cpu backend: MobileNet-v2's and ResNet-18's int8 convolution
shapes, each checked against the NumPy reference, then timed alone (issue 30).

    python bench/int8_conv.py                 # one thread, process CPU time (other jobs do not move it)
    python bench/int8_conv.py --threads 2

Prints per case the kernel (``Execution.scheme``: the op's scheme as the backend runs it), the
median ms of ``--runs`` runs and the multiply-adds per second.
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
from gpumnn.backends.cpu import int8_conv  # noqa: E402
from gpumnn.backends.cpu.backend import CpuBackend  # noqa: E402
from gpumnn.scheduler.schemes import conv_scheme  # noqa: E402

#: (name, channels, input size, output channels, kernel, stride, pad, groups)
CASES = [
    ("mobilenet conv0 3x3 s2 3->32", 3, 224, 32, 3, 2, 1, 1),
    ("mobilenet dw 32 @112", 32, 112, 32, 3, 1, 1, 32),
    ("mobilenet dw 96 @112 s2", 96, 112, 96, 3, 2, 1, 96),
    ("mobilenet dw 144 @56", 144, 56, 144, 3, 1, 1, 144),
    ("mobilenet dw 192 @28", 192, 28, 192, 3, 1, 1, 192),
    ("mobilenet dw 192 @28 s2", 192, 28, 192, 3, 2, 1, 192),
    ("mobilenet dw 384 @14", 384, 14, 384, 3, 1, 1, 384),
    ("mobilenet dw 576 @14 s2", 576, 14, 576, 3, 2, 1, 576),
    ("mobilenet dw 960 @7", 960, 7, 960, 3, 1, 1, 960),
    ("mobilenet 1x1 16->96 @112", 16, 112, 96, 1, 1, 0, 1),
    ("mobilenet 1x1 32->16 @112", 32, 112, 16, 1, 1, 0, 1),
    ("mobilenet 1x1 24->144 @56", 24, 56, 144, 1, 1, 0, 1),
    ("mobilenet 1x1 96->24 @56", 96, 56, 24, 1, 1, 0, 1),
    ("resnet18 conv1 7x7 s2", 3, 224, 64, 7, 2, 3, 1),
    ("resnet18 3x3 64 @56", 64, 56, 64, 3, 1, 1, 1),
    ("resnet18 3x3 512 @7", 512, 7, 512, 3, 1, 1, 1),
]


def _handle(array: np.ndarray) -> TensorHandle:
    array = np.ascontiguousarray(array)
    return TensorHandle(array.reshape(-1), 0, array.shape, array.dtype.name)


def measure(backend: CpuBackend, case, runs: int, clock) -> tuple[str, float, float]:
    """(the kernel the backend runs, median ms, multiply-adds per second) of one case, after checking
    its output."""
    name, c, size, oc, k, stride, pad, groups = case
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (1, c, size, size)).astype(np.int8)
    w = rng.integers(-127, 128, (oc, c // groups, k, k)).astype(np.int8)
    bias = rng.integers(-1000, 1000, oc).astype(np.int32)
    multiplier = rng.uniform(1e-4, 1e-3, oc).astype(np.float32)
    out_size = (size + 2 * pad - k) // stride + 1
    op = A.QuantizedConv2D(("x", "w", "b", "m"), ("y",), name, batch=1, in_channels=c, in_hw=(size, size),
                           out_channels=oc, out_hw=(out_size, out_size), kernel=(k, k), strides=(stride, stride),
                           pads=(pad, pad), groups=groups, x_zero_point=-3, y_zero_point=5, out_dtype="int8",
                           lo=-128, hi=127, dtype="int8")
    op = dataclasses.replace(op, scheme=conv_scheme(op))
    y = np.zeros((1, oc, out_size, out_size), np.int8)
    execution = backend.create_execution(op, [_handle(x), _handle(w), _handle(bias), _handle(multiplier)],
                                         [TensorHandle(y.reshape(-1), 0, y.shape, "int8")])

    def run() -> None:
        for work in execution.work:
            work()
    run()
    if not np.array_equal(y, int8_conv.quantized_conv_reference(op, x, w, bias, multiplier)):
        raise AssertionError(f"{name}: the kernel differs from the NumPy reference")
    times = []
    for _ in range(runs):
        start = clock()
        run()
        times.append(clock() - start)
    median = statistics.median(times)
    return execution.scheme, median * 1000.0, op.macs() / median


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args(argv)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    backend = CpuBackend(threads=args.threads)
    print(f"{args.threads} thread(s), {'process CPU time' if args.threads == 1 else 'wall clock'}, "
          f"median of {args.runs} runs")
    for case in CASES:
        scheme, ms, rate = measure(backend, case, args.runs, clock)
        print(f"{case[0]:<30} {scheme:<44} {ms:8.3f} ms  {rate / 1e9:6.1f} GMAC/s")


if __name__ == "__main__":
    main()
