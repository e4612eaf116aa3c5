"""Calibration: the numbers the placement cost model uses, measured on this device.

The paper (Eq. 5, Appendix C) costs an op as ``MUL / FLOPS`` plus, on a GPU, a fixed
``t_schedule``, with FLOPS from the CPU's core frequencies or a table of mobile GPUs and
t_schedule from experience (0.05 ms for OpenCL and OpenGL, 0.01 ms for Vulkan). Those constants
are far from the devices here (a software Vulkan on two x86 cores is not a Mali), so every
backend is measured through its own kernels and verbs:

* ``kernels``: for each kernel that multiplies (``gemm``: the MatMul kernel; ``conv3x3``,
  ``conv1x1``, ``depthwise``: the convolution kernels those schemes name; ``winograd`` where the
  backend has a Winograd kernel of its own; ``gemv`` where it has a matrix-vector kernel, timed
  on one-row products with a transposed weight, as a classifier's), a fixed cost and a rate, ``[ms, MAC/s]``, fitted
  through two sizes of it: a depthwise or a small 1x1 convolution runs far below a large GEMM's
  rate, and a CPU BLAS call pays for waking its threads. Convolutions are measured with a bias
  and a ReLU, as networks run them (on a device that applies them in passes of their own, those
  passes are part of the cost), and Winograd's rate counts the multiplications of its scheme
  (:func:`.schemes.scheme_macs`), so that one rate serves every tile size;
* ``memory_gbs``: bytes per second the memory-bound ops move inside the device, per family
  (``STREAMS``): a Binary add (``elementwise``, also Raster, Cast, cheap Unary ops), a Unary erf
  (``transcendental``: where a function costs many instructions per element, as erf and its kin
  do in NumPy), a Softmax over rows (``rows``: Softmax, Normalize, Reduce) and a 3x3 max pooling
  (``pool``): on a CPU these differ by up to 20x at the same bytes;
* ``dispatch_ms``: what one more op costs inside a recording (N tiny adds recorded, minus one);
* ``submit_ms``: submitting one recorded tiny op and waiting for it (a segment's fixed cost);
* ``eager_ms``: one tiny op run eagerly (prepared work submitted and waited for per op);
* ``upload_gbs`` / ``download_gbs`` and ``transfer_ms``: host -> device and device -> host copies
  of a large tensor, and the fixed cost of one copy (a tiny tensor's write plus read).

Results are kept per backend, device and driver under the cache root (``$GPUMNN_CACHE_DIR`` or
``~/.cache/gpumnn``, folder ``calibration``) through :mod:`gpumnn.diskcache` (checked reads,
atomic writes). ``gpumnn calibrate`` measures fully; a session that chooses between backends on
a device never calibrated runs the quick variant (smaller sizes, fewer repeats: a fraction of a
second per backend once its kernels are in the program cache) and stores it, marked ``quick``.
A session that needs numbers only for its report uses what is stored, else the paper's constants
(:func:`paper_constants`), and says which (``Calibration.source``).
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import asdict, dataclass, fields, replace

import numpy as np

from .. import atomic as A
from .. import diskcache
from ..backends.base import Backend
from . import schemes

#: bump when what is measured or how changes: older entries are then measured again
VERSION = 5

#: the kernels that multiply, each with a fixed cost and a rate (see ``Calibration.kernels``)
KERNELS = ("gemm", "conv3x3", "conv1x1", "depthwise", "winograd", "gemv")
#: the kernel whose numbers price one that a calibration lacks (a backend without that kernel, or
#: a calibration from before it existed); any other missing kernel is priced as ``conv3x3``
STAND_INS = {"gemv": "gemm"}

#: the families of memory-bound ops, each with its own bandwidth (see ``Calibration.memory_gbs``)
STREAMS = ("elementwise", "transcendental", "rows", "pool")

#: sources of a calibration, as reports show them
MEASURED, QUICK, PAPER = "calibrated", "quick calibration", "not calibrated: paper constants"


@dataclass(frozen=True)
class Calibration:
    """One backend's cost-model numbers (see the module docstring), and where they come from."""

    backend: str
    device: str
    driver: str
    source: str
    kernels: dict[str, list[float]]  # kernel -> [fixed ms, MAC/s]
    memory_gbs: dict[str, float]  # stream family -> GB/s
    dispatch_ms: float
    submit_ms: float
    eager_ms: float
    upload_gbs: float
    download_gbs: float
    transfer_ms: float
    measured_at: float = 0.0
    seconds: float = 0.0  # how long measuring took

    @property
    def matmul_macs(self) -> float:
        """The GEMM kernel's rate (which backend is fastest at the heavy work)."""
        return self.kernels["gemm"][1]

    @property
    def calibrated(self) -> bool:
        return self.source != PAPER

    def describe(self) -> str:
        """One line for ``gpumnn info`` and reports."""
        if not self.calibrated:
            return (f"{PAPER} (FLOPS {self.matmul_macs / 1e9:.1f} G, t_schedule {self.dispatch_ms:g} ms, "
                    f"copies {self.upload_gbs:g} GB/s)")
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.measured_at))
        kernels = ", ".join(f"{k} {rate / 1e9:.2f} GMAC/s + {fixed * 1000:.0f} us"
                            for k, (fixed, rate) in self.kernels.items())
        streams = ", ".join(f"{k} {gbs:.2f}" for k, gbs in self.memory_gbs.items())
        return (f"{self.source} {when}: {kernels}; memory-bound ({streams}) GB/s, "
                f"dispatch {self.dispatch_ms * 1000:.0f} us (recorded) / {self.eager_ms * 1000:.0f} us (eager), submit {self.submit_ms * 1000:.0f} us, "
                f"copies up {self.upload_gbs:.2f} / down {self.download_gbs:.2f} GB/s "
                f"+ {self.transfer_ms * 1000:.0f} us")


def paper_constants(backend: Backend) -> Calibration:
    """The paper's constants (Appendix C) as the backend states them in ``info``: FLOPS (on the
    CPU the sum of the k fastest cores' max frequencies), t_schedule on a GPU, its copy
    bandwidth; no memory-bound term and no per-segment or per-copy fixed cost."""
    info = backend.info
    t_schedule = info.t_schedule_ms if info.is_gpu else 0.0
    return Calibration(backend.name, info.device, backend.driver, PAPER,
                       kernels={k: [t_schedule, info.flops] for k in KERNELS},
                       memory_gbs={s: float("inf") for s in STREAMS}, dispatch_ms=t_schedule, submit_ms=0.0, eager_ms=t_schedule,
                       upload_gbs=info.bandwidth_gbs, download_gbs=info.bandwidth_gbs, transfer_ms=0.0)


# -- the cache -------------------------------------------------------------------------------------

_memory: dict[str, Calibration] = {}
_lock = threading.Lock()
_measuring: dict[str, threading.Lock] = {}  # per device and driver: one quick calibration at a time


def _key(backend: Backend) -> str:
    info = backend.info
    text = f"v{VERSION}|{backend.name}|{info.device}|{backend.driver}"
    return f"{backend.name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def cache_path(backend: Backend):
    return diskcache.cache_dir("calibration") / f"{_key(backend)}.json"


def stored(backend: Backend) -> Calibration | None:
    """The calibration stored for this backend's device and driver, or None."""
    key = _key(backend)
    with _lock:
        if key in _memory:
            return _memory[key]
    payload = diskcache.read(cache_path(backend))
    if payload is None:
        return None
    try:
        data = json.loads(payload)
        result = Calibration(**{f.name: data[f.name] for f in fields(Calibration)})
    except (ValueError, KeyError, TypeError):
        return None
    with _lock:
        _memory[key] = result
    return result


def store(backend: Backend, calibration: Calibration) -> None:
    with _lock:
        _memory[_key(backend)] = calibration
    diskcache.write(cache_path(backend), json.dumps(asdict(calibration), indent=1).encode())


def forget(backend: Backend | None = None) -> None:
    """Drop the in-process copy (of one backend, or all): the next look-up reads the disk."""
    with _lock:
        if backend is None:
            _memory.clear()
        else:
            _memory.pop(_key(backend), None)


def calibration_for(backend: Backend, measure: bool = False) -> Calibration:
    """What the cost model uses for ``backend``: the stored calibration; else, with ``measure``,
    a quick one (measured now and stored); else the paper's constants."""
    found = stored(backend)
    if found is not None or not measure:
        return found if found is not None else paper_constants(backend)
    with _lock:
        measuring = _measuring.setdefault(_key(backend), threading.Lock())
    with measuring:  # sessions created together measure the device once, not against each other
        return stored(backend) or calibrate(backend, quick=True)


# -- measuring -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Sizes:
    gemm: int  # square GEMM side
    channels: int  # of the convolutions, on maps of ``hw`` x ``hw``
    hw: int
    elements: int  # elements of the large add and of the copies
    chain: int  # tiny ops recorded together for the per-op cost
    repeats: int


FULL = _Sizes(gemm=512, channels=64, hw=56, elements=1 << 22, chain=32, repeats=5)
QUICK_SIZES = _Sizes(gemm=192, channels=32, hw=28, elements=1 << 18, chain=8, repeats=3)
TINY = 64
#: bytes an element of the calibration's tensors, which are all float32
ELEMENT_BYTES = A.ITEMSIZE[A.FLOAT32]


class _Bench:
    """Tensors in one pool of a backend, and executions over them: the backend's own kernels."""

    def __init__(self, backend: Backend, shapes: dict[str, tuple[int, ...]], weights: dict[str, tuple[int, ...]]):
        self.backend = backend
        align = max(ELEMENT_BYTES, backend.alignment) // ELEMENT_BYTES
        self.offsets, offset = {}, 0
        for name, shape in shapes.items():
            self.offsets[name] = offset
            offset += -(-int(np.prod(shape)) // align) * align
        self.pool = backend.allocate(ELEMENT_BYTES * offset)
        self.handles = {n: backend.tensor(self.pool, self.offsets[n], s) for n, s in shapes.items()}
        rng = np.random.default_rng(0)
        for name, handle in self.handles.items():
            backend.write(handle, rng.standard_normal(handle.size).astype(np.float32))
        for name, shape in weights.items():  # uploaded as a session uploads weights (packed where it packs)
            self.handles[name] = backend.constant(rng.standard_normal(shape).astype(np.float32) * 0.1)

    def execution(self, op: A.AtomicOp):
        return self.backend.create_execution(op, [self.handles[n] for n in op.inputs],
                                             [self.handles[n] for n in op.outputs])

    def close(self) -> None:
        self.backend.release(self.pool)


def _add(n: int, a: str, b: str, out: str) -> A.Binary:
    return A.Binary(inputs=(a, b), outputs=(out,), source="calibration", op="add", out_shape=(1, 1, 1, n),
                    a_strides=(0, 0, 0, 1), b_strides=(0, 0, 0, 1))


def _conv(channels: int, hw: int, kernel: int, groups: int, scheme: str, tile: int = 0) -> A.Conv2D:
    """A same-size convolution with a bias and a ReLU (as networks run them)."""
    pad = kernel // 2
    tag = f"{scheme}{channels}x{hw}"
    return A.Conv2D(inputs=(f"i_{tag}", f"w_{tag}", f"b_{tag}"), outputs=(f"o_{tag}",), source="calibration",
                    in_channels=channels, in_hw=(hw, hw), out_channels=channels, out_hw=(hw, hw),
                    kernel=(kernel, kernel), pads=(pad, pad), groups=groups, has_bias=True,
                    activation=("relu", ()), scheme=scheme, winograd_tile=tile)


def _winograd(channels: int, hw: int) -> A.Conv2D:
    op = _conv(channels, hw, 3, 1, "winograd")
    return replace(op, winograd_tile=min(schemes.winograd_tiles(3), key=lambda n: schemes.conv_cost(op, n)))


def _gemv(side: int) -> A.MatMul:
    """A one-row product by a square transposed weight, as a classifier's."""
    return A.MatMul(inputs=(f"gv_x{side}", f"gv_w{side}"), outputs=(f"gv_y{side}",), source="calibration",
                    m=1, n=side, k=side, trans_b=True, scheme="gemv")


def _rate(amount: float, seconds: float) -> float:
    return amount / max(seconds, 1e-9)


def _own(seconds: float, submit: float) -> float:
    """A measured op's own time: less its submission, but never below a tenth of what was
    measured (on a fast device the difference of two noisy times can vanish)."""
    return max(seconds - submit, 0.1 * seconds)


def _affine(small: tuple[int, float], large: tuple[int, float]) -> list[float]:
    """[fixed ms, MAC/s] through (MACs, seconds) at two sizes. Where the fit is not to be
    trusted -- the times do not rise with the work, or the fixed part would be more than half
    the large op's time (a BLAS that stalls at one size on loaded cores, taking longer for the
    small product than for the large) -- the large op's rate alone."""
    (m0, t0), (m1, t1) = small, large
    plain = [0.0, _rate(m1, t1)]
    if t1 <= t0 or m1 <= m0:
        return plain
    rate = (m1 - m0) / (t1 - t0)
    fixed = max(0.0, t0 - m0 / rate)
    return plain if fixed > t1 / 2 else [fixed * 1e3, rate]


def _kernel_ops(sizes: _Sizes, backend: Backend) -> dict[str, tuple[A.AtomicOp, A.AtomicOp]]:
    """Per kernel the backend has, a small and a large op of it. The large 1x1 convolution has
    the many channels and small map of a network's deep layers, where most of its 1x1
    multiplications are (a GPU kernel runs them slower per multiplication than a wide map)."""
    n, c, hw = sizes.gemm, sizes.channels, sizes.hw

    def gemm(side: int) -> A.MatMul:
        return A.MatMul(inputs=(f"a{side}", f"b{side}"), outputs=(f"c{side}",), source="calibration",
                        m=side, n=side, k=side)
    ops = {"gemm": (gemm(n // 8), gemm(n)),
           "conv3x3": (_conv(c // 2, hw // 2, 3, 1, "im2col"), _conv(c, hw, 3, 1, "im2col")),
           "conv1x1": (_conv(c // 2, hw // 2, 1, 1, "gemm1x1"), _conv(4 * c, hw // 2, 1, 1, "gemm1x1")),
           "depthwise": (_conv(c // 2, hw // 2, 3, c // 2, "depthwise"), _conv(2 * c, hw, 3, 2 * c, "depthwise"))}
    if schemes.builds_kernel(backend, A.Conv2D, "winograd"):
        ops["winograd"] = (_winograd(c, hw // 2), _winograd(c, hw))
    if schemes.builds_kernel(backend, A.MatMul, "gemv"):
        ops["gemv"] = (_gemv(n), _gemv(4 * n))
    return ops


def _stream_ops(sizes: _Sizes) -> dict[str, A.AtomicOp]:
    """Per memory-bound family (``STREAMS``), one large op of it over ``sizes.elements``."""
    e, c = sizes.elements, sizes.channels
    side = int(round((e // c) ** 0.5))
    return {"elementwise": _add(e, "x", "y", "z"),
            "transcendental": A.Unary(inputs=("x",), outputs=("z",), source="calibration", op="erf", count=e),
            "rows": A.Softmax(inputs=("x",), outputs=("z",), source="calibration", outer=e // 256, size=256),
            "pool": A.Pool2D(inputs=("px",), outputs=("pz",), source="calibration", channels=c, in_hw=(side, side),
                             out_hw=((side - 1) // 2 + 1,) * 2, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))}


def calibrate(backend: Backend, quick: bool = False) -> Calibration:
    """Measure ``backend`` (see the module docstring), store the result and return it."""
    sizes = QUICK_SIZES if quick else FULL
    started = time.perf_counter()
    e = sizes.elements
    kernel_ops = _kernel_ops(sizes, backend)
    stream_ops = {k: op for k, op in _stream_ops(sizes).items() if backend.unsupported_reason(op) is None}
    shapes = {"x": (e,), "y": (e,), "z": (e,), "t0": (TINY,), "t1": (TINY,), "t2": (TINY,)}
    weights = {}
    for op in (op for pair in kernel_ops.values() for op in pair):
        if isinstance(op, A.MatMul):
            shapes.update({op.inputs[0]: (op.m, op.k), op.inputs[1]: (op.n, op.k) if op.trans_b else (op.k, op.n),
                           op.outputs[0]: (op.m, op.n)})
        else:
            shapes.update({op.inputs[0]: (1, op.in_channels, *op.in_hw),
                           op.outputs[0]: (1, op.out_channels, *op.out_hw)})
            weights[op.inputs[1]] = (op.out_channels, op.in_channels // op.groups, *op.kernel)
            weights[op.inputs[2]] = (op.out_channels,)
    pool = _stream_ops(sizes)["pool"]
    shapes.update({"px": (1, pool.channels, *pool.in_hw), "pz": (1, pool.channels, *pool.out_hw)})

    def measure(work, repeats):  # medians, as runs are timed: a shared machine's load is in both
        return backend.measure(work, repeats)

    def timed_together(ops: dict[str, A.AtomicOp], rounds: int) -> dict[str, float]:
        """Median seconds per recorded op, timed in rounds that take each op in turn: load that
        comes and goes on a shared machine then falls on all of them alike, not on one fit."""
        recordings = {k: backend.record([bench.execution(op)]) for k, op in ops.items()}
        samples: dict[str, list[float]] = {k: [] for k in ops}
        for k, rec in recordings.items():  # warm-up
            backend.submit(rec)
        for _ in range(rounds):
            for k, rec in recordings.items():
                start = time.perf_counter()
                backend.submit(rec)
                samples[k].append(time.perf_counter() - start)
        return {k: float(np.median(v)) for k, v in samples.items()}

    with backend.activate():
        bench = _Bench(backend, shapes, weights)
        try:
            tiny = [bench.execution(_add(TINY, "t0", "t1", "t2")) for _ in range(sizes.chain)]
            rec_one, rec_chain = backend.record(tiny[:1]), backend.record(tiny)
            t_one = measure(lambda: backend.submit(rec_one), sizes.repeats * 2)
            t_chain = measure(lambda: backend.submit(rec_chain), sizes.repeats * 2)
            t_eager = measure(lambda: backend.run_eager(tiny[:1]), sizes.repeats * 2)
            timed = timed_together({**{f"{k}{i}": op for k, pair in kernel_ops.items() for i, op in enumerate(pair)},
                                    **stream_ops}, 2 * sizes.repeats)
            t_kernels = {k: [(schemes.scheme_macs(op), timed[f"{k}{i}"]) for i, op in enumerate(pair)]
                         for k, pair in kernel_ops.items()}
            t_streams = {k: (ELEMENT_BYTES * sum(int(np.prod(shapes[n])) for n in (*op.inputs, *op.outputs)), timed[k])
                         for k, op in stream_ops.items()}
            host_big, host_tiny = np.ones(e, np.float32), np.ones(TINY, np.float32)
            big, small = bench.handles["x"], bench.handles["t0"]
            t_up = measure(lambda: backend.write(big, host_big), sizes.repeats)
            t_down = measure(lambda: backend.read_into(big, host_big), sizes.repeats)
            t_up0 = measure(lambda: backend.write(small, host_tiny), sizes.repeats * 2)
            t_down0 = measure(lambda: backend.read_into(small, host_tiny), sizes.repeats * 2)
        finally:
            bench.close()
    dispatch = max(0.0, (t_chain - t_one) / (sizes.chain - 1))
    submit = t_one - dispatch  # each measured op's own time excludes its segment's submission
    memory = {k: _rate(nbytes, _own(t, submit)) / 1e9 for k, (nbytes, t) in t_streams.items()}
    info = backend.info
    result = Calibration(
        backend.name, info.device, backend.driver, QUICK if quick else MEASURED,
        kernels={k: _affine(*[(macs, _own(t, submit)) for macs, t in pair]) for k, pair in t_kernels.items()},
        memory_gbs={k: memory.get(k, memory["elementwise"]) for k in STREAMS},
        dispatch_ms=dispatch * 1e3, submit_ms=max(0.0, submit) * 1e3, eager_ms=t_eager * 1e3,
        upload_gbs=_rate(ELEMENT_BYTES * e, _own(t_up, t_up0)) / 1e9, download_gbs=_rate(ELEMENT_BYTES * e, _own(t_down, t_down0)) / 1e9,
        transfer_ms=(t_up0 + t_down0) / 2 * 1e3, measured_at=time.time(), seconds=time.perf_counter() - started)
    store(backend, result)
    return result


__all__ = ["KERNELS", "STAND_INS", "STREAMS", "Calibration", "MEASURED", "PAPER", "QUICK", "cache_path", "calibrate", "calibration_for",
           "forget", "paper_constants", "store", "stored"]
