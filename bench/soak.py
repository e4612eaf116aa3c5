"""Soak: many cycles of session create -> run -> close per backend, watching memory.

A leak that costs a few kilobytes per session is invisible in one benchmark and fatal in a
service that opens a session per request. This script repeats the whole life of a session
(pre-inference, one run, close) ``--cycles`` times per backend on one loaded model and prints
the resident memory of the process (VmRSS from /proc/self/status) at the start, after a warm-up
(the first cycles fill caches that are meant to stay: compiled programs, driver JIT state,
allocator arenas) and at the end, with the growth per 100 cycles after the warm-up. Where the
API reports device memory in use (Vulkan's VK_EXT_memory_budget, GL_NVX_gpu_memory_info /
GL_ATI_meminfo) the backend's ``memory_limits().used`` is printed beside it.

    python bench/soak.py                               # every backend, mobilenet_v2, 1000 cycles
    python bench/soak.py --backend vulkan --cycles 200 --model tiny
    python bench/soak.py --model mobilenet_v2 --size 64        # the same layers, 12x fewer pixels
    python bench/soak.py --json

``--model`` takes a zoo name or ``tiny`` (a small convolutional net built here, for speed).
tests/test_leaks.py runs a short version of the same loop (:func:`soak`) on every backend.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpumnn  # noqa: E402
from gpumnn import zoo  # noqa: E402
from gpumnn.backends import create_backend  # noqa: E402
from gpumnn.backends.limits import release_freed_memory  # noqa: E402
from gpumnn.zoo.builder import GraphBuilder  # noqa: E402

MIB = 2 ** 20


def rss_bytes() -> int:
    """Resident set size of this process (VmRSS), in bytes."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def tiny_model():
    """A small CNN (conv-bn-relu, depthwise, residual add, pooling, Gemm) that builds in
    milliseconds and runs every backend's main kernel families, for quick soaks."""
    g = GraphBuilder("tiny", (1, 3, 32, 32), seed=7, doc="soak model")
    x = g.conv_bn_act(g.input, "stem", 3, 16, 3, stride=2, act="relu6")
    y = g.conv_bn_act(x, "dw", 16, 16, 3, group=16, act="relu")
    y = g.conv_bn_act(y, "pw", 16, 16, 1, act=None)
    x = g.node("Add", [x, y], "add")
    x = g.max_pool(x, "pool", 2, 2)
    return g.finish(g.classifier_head(x, 16, num_classes=10), (1, 10))


def load_model(name: str, size: int | None = None) -> tuple[gpumnn.Net, dict[str, np.ndarray]]:
    """The loaded net and one fixed random input for it; ``size`` makes an image model's input
    ``size`` x ``size`` pixels (faster cycles, the same layers and kernels)."""
    if name == "tiny":
        model, shape = tiny_model(), (1, 3, 32, 32)
    else:
        model, shape = zoo.build(name), zoo.input_shape(name)
    if size is not None:
        if len(shape) != 4:
            raise SystemExit(f"--size needs an image model (NCHW input); {name} takes {shape}")
        dims = model.graph.input[0].type.tensor_type.shape.dim
        dims[2].dim_value = dims[3].dim_value = size
        shape = (*shape[:2], size, size)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    return gpumnn.load(model), {"input": x}


def device_used(backend: str) -> int | None:
    """Device memory in use as the API reports it (None where it reports nothing)."""
    be = create_backend(backend)
    try:
        return be.memory_limits().used
    finally:
        be.close()


@dataclass
class SoakResult:
    backend: str
    model: str
    cycles: int
    warmup: int
    rss_start: int
    rss_warm: int
    rss_end: int
    seconds: float
    device_warm: int | None = None
    device_end: int | None = None
    samples: list[tuple[int, int]] = field(default_factory=list)  # (cycle, rss) every --every cycles

    @property
    def growth(self) -> int:
        """RSS growth after the warm-up, bytes."""
        return self.rss_end - self.rss_warm

    @property
    def growth_per_100(self) -> float:
        return self.growth * 100 / max(self.cycles, 1)

    def line(self) -> str:
        dev = ("n/a" if self.device_warm is None else
               f"{self.device_warm / MIB:.1f} -> {self.device_end / MIB:.1f} MiB")
        return (f"{self.backend:<7} {self.model:<14} {self.warmup:>4}+{self.cycles:<5} RSS start "
                f"{self.rss_start / MIB:7.1f} MiB, warm {self.rss_warm / MIB:7.1f}, end {self.rss_end / MIB:7.1f}"
                f"  growth {self.growth / MIB:+6.2f} MiB ({self.growth_per_100 / MIB:+.3f} MiB/100 cycles)"
                f"  device {dev}  {self.seconds:.0f} s")


def soak(net: gpumnn.Net, inputs: dict[str, np.ndarray], backend: str, cycles: int, warmup: int,
         model: str = "?", every: int = 0, progress: Callable[[str], None] | None = None) -> SoakResult:
    """``warmup`` then ``cycles`` cycles of session create -> run -> close on ``backend``."""

    def cycle() -> None:
        with net.session(backend=backend, fallback=False) as sess:
            sess.run(inputs)

    def settled_rss() -> int:
        gc.collect()
        release_freed_memory()  # what the collection freed, as a session's close does: count held memory only
        return rss_bytes()

    started = time.perf_counter()
    rss_start = settled_rss()
    for _ in range(warmup):
        cycle()
    rss_warm = settled_rss()
    device_warm = device_used(backend)
    result = SoakResult(backend, model, cycles, warmup, rss_start, rss_warm, rss_warm, 0.0, device_warm)
    for i in range(1, cycles + 1):
        cycle()
        if every and i % every == 0:
            result.samples.append((i, settled_rss()))
            if progress:
                progress(f"  {backend}: {i} cycles, RSS {result.samples[-1][1] / MIB:.1f} MiB "
                         f"({time.perf_counter() - started:.0f} s)")
    result.rss_end = settled_rss()
    result.device_end = device_used(backend) if device_warm is not None else None
    result.seconds = time.perf_counter() - started
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", help="backend(s) to soak (repeat or comma list; "
                        "default: every available one)")
    parser.add_argument("--model", default="mobilenet_v2", help="zoo model name or 'tiny' (default mobilenet_v2)")
    parser.add_argument("--size", type=int, help="input height and width for image models (default: the model's)")
    parser.add_argument("--cycles", type=int, default=1000, help="measured cycles after the warm-up (default 1000)")
    parser.add_argument("--warmup", type=int, default=20, help="warm-up cycles (default 20)")
    parser.add_argument("--every", type=int, default=100, help="print RSS every N cycles (0: never)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per backend")
    args = parser.parse_args(argv)
    backends = ([b for arg in args.backend for b in arg.split(",") if b] if args.backend
                else gpumnn.available_backends())
    net, inputs = load_model(args.model, args.size)
    model = args.model if args.size is None else f"{args.model}@{args.size}"
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if args.every else None
    for backend in backends:
        result = soak(net, inputs, backend, args.cycles, args.warmup, model, args.every, log)
        if args.json:
            print(json.dumps({**asdict(result), "growth": result.growth,
                              "growth_per_100": result.growth_per_100}), flush=True)
        else:
            print(result.line(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
