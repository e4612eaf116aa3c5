"""QuantizedConv2D's implicit GEMM on a GPU API with integer dot products and with plain int32
products, alternating in one process (issue 30): per case both backends' outputs are checked
against the NumPy reference, then rounds time each in turn, so that a shared machine's load
falls on both alike.

    python bench/int8_dot.py                           # vulkan, kernels="tiled"
    python bench/int8_dot.py --backend cuda --rounds 7 --runs 20
    python bench/int8_dot.py --model squeezenet1_1/qdq_s8 --runs 3   # a whole QDQ model (bench/quantized.py's forms)

Prints per case the median ms of each path (over rounds of ``--runs`` submissions each, a round's
figure its median), the rounds' spread (min-max) and dot / plain; with ``--model``, one line for
the model's ``Session.run`` (outputs of both paths checked equal). Nothing here asserts speed.
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
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/quantized.py's model forms (--model)

from gpumnn import atomic as A  # noqa: E402
from gpumnn.backends import create_backend  # noqa: E402
from gpumnn.backends.cpu import int8_conv  # noqa: E402
from gpumnn.scheduler.schemes import conv_scheme  # noqa: E402

#: (name, channels, input size, output channels, kernel, stride, pad, x dtype)
CASES = [
    ("mobilenet 1x1 24->144 @56 u8", 24, 56, 144, 1, 1, 0, "uint8"),
    ("mobilenet 1x1 96->24 @56 i8", 96, 56, 24, 1, 1, 0, "int8"),
    ("resnet18 3x3 64 @56 u8", 64, 56, 64, 3, 1, 1, "uint8"),
    ("resnet18 3x3 256 @14 i8", 256, 14, 256, 3, 1, 1, "int8"),
    ("resnet18 3x3 512 @7 u8", 512, 7, 512, 3, 1, 1, "uint8"),
]


class Case:
    """One case made ready on one backend: its execution recorded, its output checked."""

    def __init__(self, be, case):
        name, c, size, oc, k, stride, pad, x_dtype = case
        rng = np.random.default_rng(0)
        info = np.iinfo(x_dtype)
        x = rng.integers(info.min, info.max + 1, (1, c, size, size)).astype(x_dtype)
        w = rng.integers(-127, 128, (oc, c, k, k)).astype(np.int8)
        bias = rng.integers(-1000, 1000, oc).astype(np.int32)
        multiplier = rng.uniform(1e-4, 1e-3, oc).astype(np.float32)
        out_size = (size + 2 * pad - k) // stride + 1
        op = A.QuantizedConv2D(("x", "w", "b", "m"), ("y",), name, batch=1, in_channels=c, in_hw=(size, size),
                               out_channels=oc, out_hw=(out_size, out_size), kernel=(k, k), strides=(stride, stride),
                               pads=(pad, pad), x_zero_point=int(info.min) + 131, y_zero_point=5, out_dtype="int8",
                               lo=-128, hi=127, dtype=x_dtype)
        op = dataclasses.replace(op, scheme=conv_scheme(op))
        self.be, self.macs = be, oc * c * k * k * out_size * out_size
        self.pool = be.allocate(x.nbytes + oc * out_size * out_size + 2 * be.alignment)
        xh = be.tensor(self.pool, 0, x.shape, x_dtype)
        self.yh = be.tensor(self.pool, -(-x.nbytes // be.alignment) * be.alignment, (1, oc, out_size, out_size), "int8")
        be.write(xh, x)
        exe = be.create_execution(op, [xh, be.constant(w), be.constant(bias), be.constant(multiplier)], [self.yh])
        self.scheme = exe.scheme
        self.recording = be.record([exe])
        be.submit(self.recording)
        if not np.array_equal(be.read(self.yh), int8_conv.quantized_conv_reference(op, x, w, bias, multiplier)):
            raise SystemExit(f"{name} on {be.name} ({self.scheme}): output differs from the reference")

    def round_ms(self, runs: int) -> float:
        """The median ms of ``runs`` submissions."""
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            self.be.submit(self.recording)
            times.append(time.perf_counter() - start)
        return 1e3 * statistics.median(times)


def run_model(name: str, backend: str, options: dict, rounds: int, runs: int) -> None:
    """One QDQ model's Session.run with dot products and with plain int32 products, alternating."""
    import tempfile

    import onnx

    import gpumnn
    from quantized import feed_of, make_case

    case = make_case(name, Path(tempfile.gettempdir()) / "gpumnn-quantized")
    net = gpumnn.load(str(case.quantized_path))
    sessions = {path: net.session(backend=backend, fallback=False, int8_dot=path_option, **options)
                for path, path_option in (("dot", "auto"), ("plain", "off"))}
    feed = feed_of(onnx.load(str(case.quantized_path)))
    outputs = {path: s.run(feed) for path, s in sessions.items()}
    for key in outputs["dot"]:
        if not np.array_equal(outputs["dot"][key], outputs["plain"][key]):
            raise SystemExit(f"{name}: output {key} differs between dot products and plain int32")
    rounds_ms: dict[str, list[float]] = {"dot": [], "plain": []}
    for r in range(rounds):
        for path in (("dot", "plain") if r % 2 == 0 else ("plain", "dot")):
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                sessions[path].run(feed)
                times.append(time.perf_counter() - start)
            rounds_ms[path].append(1e3 * statistics.median(times))
    med = {path: statistics.median(ms) for path, ms in rounds_ms.items()}
    cells = [f"{med[p]:8.1f} ({min(rounds_ms[p]):.1f}-{max(rounds_ms[p]):.1f})" for p in ("dot", "plain")]
    print(f"{'model':<30} {'dot ms (min-max)':>22} {'plain ms (min-max)':>22} {'dot/plain':>9}")
    print(f"{name:<30} {cells[0]:>22} {cells[1]:>22} {med['dot'] / med['plain']:9.2f}")
    for s in sessions.values():
        s.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="vulkan")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--model", help="ZOO_MODEL/FORM of bench/quantized.py: time the model's runs instead")
    args = parser.parse_args(argv)
    options = {} if args.backend == "cuda" else {"kernels": "tiled"}
    if args.model:
        run_model(args.model, args.backend, options, args.rounds, args.runs)
        return 0
    dot = create_backend(args.backend, int8_dot="auto", **options)
    plain = create_backend(args.backend, int8_dot="off", **options)
    print(f"{args.backend} on {dot.info.device}\n  dot:   {dot.int8_arithmetic}\n  plain: {plain.int8_arithmetic}")
    if not dot.int8_dot:
        print("the device has no integer dot products: nothing to compare")
        return 1
    print(f"{'case':<30} {'dot ms (min-max)':>22} {'plain ms (min-max)':>22} {'dot/plain':>9} {'dot GMAC/s':>10}")
    for case in CASES:
        ready = {"dot": Case(dot, case), "plain": Case(plain, case)}
        rounds: dict[str, list[float]] = {"dot": [], "plain": []}
        for r in range(args.rounds):
            for path in (("dot", "plain") if r % 2 == 0 else ("plain", "dot")):
                rounds[path].append(ready[path].round_ms(args.runs))
        med = {path: statistics.median(ms) for path, ms in rounds.items()}
        cells = [f"{med[p]:8.3f} ({min(rounds[p]):.3f}-{max(rounds[p]):.3f})" for p in ("dot", "plain")]
        print(f"{case[0]:<30} {cells[0]:>22} {cells[1]:>22} {med['dot'] / med['plain']:9.2f} "
              f"{ready['dot'].macs / med['dot'] / 1e6:10.2f}")
        for item in ready.values():
            item.be.release(item.pool)
    dot.close()
    plain.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
