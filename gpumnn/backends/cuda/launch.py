"""The plans of :mod:`.cl_plans` as CUDA launches, and the CUDA-graph capture of a run: the parts
of the ``cuda`` backend that need no GPU, kept apart from CuPy so that they are tested on any
machine (``tests/test_cuda_backend.py``, with stand-ins for CuPy's stream and kernel objects).

A planned :class:`~.cl_plans.Launch` counts OpenCL work-items; CUDA launches ``gsize[i] //
lsize[i]`` blocks of ``lsize`` threads along x, y, z (the prelude's ``get_global_id`` is
``blockIdx * blockDim + threadIdx``, so both APIs index the same elements). A kernel argument
that is a tensor's buffer (a :class:`DeviceBuffer`) or a kernel's :class:`~.cl_plans.Scratch`
becomes the device pointer the kernel indexes from, followed by the launch's element offset;
scalars stay NumPy scalars, which CuPy passes by value with their own width.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..kernels.cl.planner import Launch, Scratch
from ..waits import DeviceWatch

#: CUDA's limits on one launch (every GPU since compute capability 3.0): threads per block, and
#: blocks along x, y and z
MAX_BLOCK_THREADS = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)


@dataclass(eq=False)
class DeviceBuffer:
    """One device allocation (the session's pool, a constant, a scratch buffer): ``pointer`` is
    what kernels and copies take (a ``cupy.cuda.MemoryPointer``, which also keeps the memory
    alive), ``nbytes`` its size. ``constant``: made by ``constant()`` and never written by a
    kernel, so plans may pack it once (``cl_plans.PlannerTarget.is_constant``)."""

    pointer: Any
    nbytes: int
    constant: bool = False


@dataclass
class CudaLaunch:
    """A planned launch made ready: the kernel (a ``cupy.RawKernel``, or anything called as
    ``kernel(grid, block, args, stream=...)``), its grid and block, and its arguments with
    device pointers in place of buffers."""

    kernel: Any
    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple

    def __call__(self, stream: Any) -> None:
        self.kernel(self.grid, self.block, self.args, stream=stream)


def grid_block(launch: Launch) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block) of a planned launch: ``lsize`` threads per block, ``gsize // lsize`` blocks
    per dimension, padded to three dimensions with 1. A launch CUDA cannot run as planned is a
    ValueError naming the kernel: no work-group size (the planners always give one for the GPU
    family), a global size that is not a multiple of it (OpenCL refuses that too), or sizes past
    CUDA's limits."""
    where = f"kernel {launch.name!r} of program {launch.family!r}"
    if launch.lsize is None:
        raise ValueError(f"{where}: planned without a work-group size, which a CUDA launch needs")
    if len(launch.lsize) != len(launch.gsize) or not 1 <= len(launch.gsize) <= 3:
        raise ValueError(f"{where}: global size {launch.gsize} and work-group {launch.lsize} differ in rank")
    if any(s <= 0 or g % s for g, s in zip(launch.gsize, launch.lsize)):
        raise ValueError(f"{where}: global size {launch.gsize} is not a multiple of the work-group {launch.lsize}")
    pad = (1,) * (3 - len(launch.gsize))
    block = tuple(launch.lsize) + pad
    grid = tuple(g // s for g, s in zip(launch.gsize, launch.lsize)) + pad
    threads = block[0] * block[1] * block[2]
    if threads > MAX_BLOCK_THREADS or any(g > m for g, m in zip(grid, MAX_GRID)):
        raise ValueError(f"{where}: {grid} blocks of {block} threads exceed CUDA's limits "
                         f"({MAX_BLOCK_THREADS} threads a block, {MAX_GRID} blocks)")
    return grid, block  # type: ignore[return-value]


def kernel_args(args: Sequence[Any], scratch: Mapping[Scratch, DeviceBuffer]) -> tuple:
    """A launch's arguments as a CUDA kernel takes them: a :class:`DeviceBuffer` (a tensor's
    buffer) or a :class:`~.cl_plans.Scratch` (replaced by the buffer made for it) becomes its
    device pointer; the element offsets and scalars after it are passed as planned."""
    out = []
    for arg in args:
        if isinstance(arg, Scratch):
            arg = scratch[arg]
        out.append(arg.pointer if isinstance(arg, DeviceBuffer) else arg)
    return tuple(out)


def bind(launch: Launch, kernel: Any, scratch: Mapping[Scratch, DeviceBuffer]) -> CudaLaunch:
    """A planned launch with its kernel looked up and its arguments made CUDA's."""
    grid, block = grid_block(launch)
    return CudaLaunch(kernel, launch.name, grid, block, kernel_args(launch.args, scratch))


@dataclass
class Recording:
    """What ``record`` returns: the CUDA graph of the executions' launches (None when they have
    none), and the executions, which keep every buffer and kernel the graph uses alive."""

    graph: Any
    launches: int
    executions: list[Any] = field(default_factory=list)
    ops: str = ""  # what it runs (``describe_ops``), named by a timeout


def capture(stream: Any, launches: Sequence[CudaLaunch], relaxed_mode: int) -> Any:
    """The CUDA graph of ``launches`` in order, captured on ``stream`` (a ``cupy.cuda.Stream``,
    never the legacy default stream, which cannot capture) and instantiated; None for no launch.

    Relaxed capture mode, because other threads may allocate or copy while this one captures
    (another run state being prepared, a run in flight): in the default "global" mode CUDA
    refuses their unsafe calls during the capture. A launch that fails ends the capture before
    the error goes on, so the stream stays usable."""
    if not launches:
        return None
    stream.begin_capture(mode=relaxed_mode)
    try:
        for launch in launches:
            launch(stream)
    except BaseException:
        try:
            stream.end_capture()  # the half-captured graph is dropped
        except Exception:
            pass
        raise
    return stream.end_capture()


@dataclass
class Lane:
    """What one write, read, record or run in flight has to itself, so that several threads use
    the device at once: a stream (non-blocking, so it never waits on the legacy default stream
    and a capture on it never involves another thread's work), an event (to order it after the
    caller's current stream for device arrays), and pinned host staging, grown on demand. Lent
    from a :class:`~gpumnn.backends.lanes.LanePool`."""

    stream: Any
    event: Any
    staging: Any = None  # a numpy uint8 view of pinned host memory (which it keeps alive)
    timing: Any = None  # (start, end) timing events, made by the first measure_recording on the lane


def wait_lane(watch: DeviceWatch, lane: Lane, timeout: float, ops: str,
              keep: Callable[[], Any] | None = None, event: Any = None) -> None:
    """Wait for what the lane's stream was given so far, bounded by ``timeout`` (not
    ``stream.synchronize``, which has none): an event recorded on the stream now (``event``:
    one already recorded after the work) is polled (``event.done``) through ``watch``, which
    marks the device lost and raises DeviceLostError naming ``ops`` past the timeout."""
    if event is None:
        event = lane.event
        event.record(lane.stream)
    watch.wait(lambda: event.done, timeout, ops, keep)


__all__ = ["CudaLaunch", "DeviceBuffer", "Lane", "MAX_BLOCK_THREADS", "MAX_GRID", "Recording", "bind",
           "capture", "grid_block", "kernel_args", "wait_lane"]
