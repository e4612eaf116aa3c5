"""The cuda backend's logic that needs no GPU, and device arrays on every backend.

On a machine without CuPy or a GPU the cuda backend cannot start (the parametrised op, model and
session tests skip it saying why), but what it does with a KernelWork is plain Python
(``gpumnn.backends.cuda.launch``): grids and blocks from global and work-group sizes, kernel
arguments with device pointers in place of buffers and scratch, the order of a graph capture, the
lanes that keep concurrent calls apart. Those run here against stand-ins for CuPy's objects. So
does the session's device-array path (inputs handed to the backend, host copies for CPU fallback
ops, device outputs), through a CPU backend that plays a device backend; the real backends that
take host arrays only must say why.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from conftest import require_backend
from dispatch_chain import CHAIN, CONSTANTS, SHAPES
from gpumnn.backends import REGISTRY
from gpumnn.backends.kernels.cl import planner as cl_plans
from gpumnn.backends.base import COUNTERS, TensorHandle
from gpumnn.backends.cpu.backend import CpuBackend
from gpumnn.backends.cuda.launch import (MAX_BLOCK_THREADS, CudaLaunch, DeviceBuffer, Lane, bind, capture, grid_block,
                                         kernel_args)
from gpumnn.backends.lanes import LanePool
from gpumnn.runtime.device_arrays import host_array, is_device_array
from gpumnn.errors import DeviceArrayError, InputError
from gpumnn.backends.kernels.cl.cuda_source import cuda_source


@dataclass
class _GpuTarget:
    """What the planners read of a CUDA device (cl_plans.PlannerTarget), none opened: an H100's figures."""

    kernels: str = "tiled"
    is_gpu: bool = True
    compute_units: int = 132
    max_wg: int = 1024
    tf32: bool = False
    float16_tensor_cores: bool = False

    @staticmethod
    def is_constant(handle: TensorHandle) -> bool:
        return handle.buffer.constant


class _Pointer:
    """Stands for a ``cupy.cuda.MemoryPointer``."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<ptr {self.name}>"

    __str__ = __repr__


def _planned_chain(tf32: bool = False):
    """Every op of the shared dispatch chain planned for a GPU (with ``tf32``: as for
    precision="tf32"), its tensors in a pool or constants (DeviceBuffers, as the cuda backend's
    handles are): [(op, handles by name, its KernelWork)]."""
    target = _GpuTarget(tf32=tf32)
    pool = DeviceBuffer(_Pointer("pool"), 1 << 20)
    consts = {n: DeviceBuffer(_Pointer(n), a.nbytes, constant=True) for n, a in CONSTANTS.items()}
    shapes = {**SHAPES, **{k: v.shape for k, v in CONSTANTS.items()}}
    handles = {n: TensorHandle(consts.get(n, pool), 0 if n in consts else 64 * i, tuple(s))
               for i, (n, s) in enumerate(shapes.items())}
    extra = [A_resize(), A_matmul_t(), A_gemv()]
    handles.update({"r": TensorHandle(pool, 4096, (1, 16, 12, 12)), "wt": TensorHandle(consts["m"], 0, (5, 6)),
                    "qt": TensorHandle(pool, 8192, (16, 6, 5)), "gv": TensorHandle(pool, 12288, (16, 1, 5))})
    out = []
    for op in CHAIN + extra:
        kernel = cl_plans.plan(target, op, [handles[n] for n in op.inputs], [handles[n] for n in op.outputs])
        out.append((op, handles, kernel))
    return out


def A_resize():
    from gpumnn import atomic as A
    return A.Resize(("p",), ("r",), "up", planes=16, in_hw=(6, 6), out_hw=(12, 12), scales=(2.0, 2.0), mode="linear")


def A_matmul_t():
    from gpumnn import atomic as A
    return A.MatMul(("p", "wt"), ("qt",), "fc_t", batch=16, m=6, n=5, k=6, a_batch_stride=36, b_batch_stride=0,
                    trans_b=True)


def A_gemv():
    from gpumnn import atomic as A
    return A.MatMul(("p", "wt"), ("gv",), "fc_gemv", batch=16, m=1, n=5, k=6, a_batch_stride=6, b_batch_stride=0,
                    trans_b=True, scheme="gemv")


# -- planned launches as CUDA launches -------------------------------------------------------------

@pytest.mark.parametrize("tf32", [False, True])
def test_grid_times_block_is_the_planned_global_size(tf32):
    launches = [ln for _, _, kernel in _planned_chain(tf32) for ln in kernel.prepare + kernel.work]
    assert {ln.family for ln in launches} >= {"gemm", "gemv", "elementwise", "raster", "pool", "reduce", "resize"}
    assert any(("GEMM_TF32", 1) in ln.defines for ln in launches) == tf32
    for ln in launches:
        grid, block = grid_block(ln)
        assert len(grid) == len(block) == 3
        assert tuple(g * b for g, b in zip(grid, block))[:len(ln.gsize)] == ln.gsize, ln
        assert grid[len(ln.gsize):] == block[len(ln.lsize):] == (1,) * (3 - len(ln.gsize))
        assert block[0] * block[1] * block[2] <= MAX_BLOCK_THREADS
        if ln.family == "gemm":  # the block is the kernel's reqd_work_group_size (TN/WN, TM/WM, 1)
            d = dict(ln.defines)
            assert block == (d["TN"] // d["WN"], d["TM"] // d["WM"], 1)


def test_a_launch_cuda_cannot_run_as_planned_is_refused_by_name():
    ok = cl_plans.launch("raster", "raster_fill", (), (128,), (64,))
    assert grid_block(ok) == ((2, 1, 1), (64, 1, 1))
    for bad, why in [(cl_plans.launch("raster", "raster_fill", (), (128,), None), "without a work-group size"),
                     (cl_plans.launch("raster", "raster_fill", (), (100,), (64,)), "not a multiple"),
                     (cl_plans.launch("gemm", "gemm_dense", (), (64, 64), (64,)), "differ in rank"),
                     (cl_plans.launch("gemm", "gemm_dense", (), (2048, 1, 1), (2048, 1, 1)), "exceed CUDA's limits"),
                     (cl_plans.launch("gemm", "gemm_dense", (), (16, 70000 * 16), (16, 16)), "exceed CUDA's limits")]:
        with pytest.raises(ValueError, match=why) as info:
            grid_block(bad)
        assert repr(bad.name) in str(info.value)


def test_arguments_are_device_pointers_offsets_and_scalars():
    """A tensor is its buffer's device pointer then its element offset (int32), a Scratch the
    pointer of the buffer made for it; scalars pass as planned, in order."""
    scratch_seen = 0
    for op, handles, kernel in _planned_chain():
        made = {s: DeviceBuffer(_Pointer(f"scratch{i}"), s.nbytes or s.data.nbytes) for i, s in enumerate(kernel.keep)}
        for ln in kernel.prepare + kernel.work:
            args = kernel_args(ln.args, made)
            assert len(args) == len(ln.args)
            for planned, passed in zip(ln.args, args):
                if isinstance(planned, DeviceBuffer):
                    assert passed is planned.pointer
                elif isinstance(planned, cl_plans.Scratch):
                    assert passed is made[planned].pointer
                    scratch_seen += 1
                else:
                    assert passed is planned and isinstance(passed, (np.int32, np.uint32, np.float32)), (op.source, passed)
            pointers = [i for i, a in enumerate(args) if isinstance(a, _Pointer)]
            assert pointers, f"{op.source}: {ln.name} reads no buffer"
            for i in pointers:  # the kernel signature pairs every pointer with an int element offset ...
                if not isinstance(ln.args[i], cl_plans.Scratch) or ln.name != "resize_linear":
                    assert isinstance(args[i + 1], np.int32), (op.source, ln.name, i)
        # ... whose values are the handles' offsets
        for name in op.inputs + op.outputs:
            h = handles[name]
            flat = [a for ln in kernel.work for a in kernel_args(ln.args, made)]
            assert any(p is h.buffer.pointer and int(o) >= h.offset for p, o in zip(flat, flat[1:])), (op.source, name)
    assert scratch_seen, "the resize kernel's sampling table is a Scratch"


@pytest.mark.parametrize("tf32", [False, True])
def test_every_planned_kernel_is_in_its_cuda_program(tf32):
    """The names CUDA looks up (RawModule.get_function) are extern "C" kernels of the CUDA text."""
    import re
    for _, _, kernel in _planned_chain(tf32):
        for ln in kernel.prepare + kernel.work:
            source = cuda_source(ln.family, dict(ln.defines))
            names = set(re.findall(r"__kernel\b[^\n;{]*?\bvoid\s+(\w+)", source))
            stems = re.findall(r"__kernel\b[^\n;{]*?\bvoid\s+(\w+)##", source)
            assert ln.name in names or ln.name.startswith(tuple(stems)), (ln.family, ln.name)


def test_bind_calls_the_kernel_with_grid_block_args_on_the_given_stream():
    calls = []

    def kernel(grid, block, args, stream=None):
        calls.append((grid, block, args, stream))

    scratch = cl_plans.Scratch(64)
    buf = DeviceBuffer(_Pointer("t"), 256)
    ln = cl_plans.launch("raster", "raster_copy_flat", (buf, np.int32(3), scratch, np.int32(0), np.int32(40)),
                         (64,), (64,))
    bound = bind(ln, kernel, {scratch: DeviceBuffer(_Pointer("s"), 64)})
    bound("stream-1")
    (grid, block, args, stream), = calls
    assert (grid, block, stream) == ((1, 1, 1), (64, 1, 1), "stream-1")
    assert [str(a) for a in args] == ["<ptr t>", "3", "<ptr s>", "0", "40"]


# -- graph capture ---------------------------------------------------------------------------------

class _Stream:
    """Stands for a cupy.cuda.Stream: logs capture calls and launches."""

    def __init__(self):
        self.log = []

    def begin_capture(self, mode=None):
        self.log.append(("begin", mode))

    def end_capture(self):
        self.log.append(("end",))
        return "graph"


def _launch(name, log, fail=False):
    def kernel(grid, block, args, stream=None):
        if fail:
            raise RuntimeError(f"{name} failed")
        log.append(("launch", name, stream))
    return CudaLaunch(kernel, name, (1, 1, 1), (1, 1, 1), ())


def test_capture_launches_in_order_between_begin_and_end_in_relaxed_mode():
    stream = _Stream()
    graph = capture(stream, [_launch(n, stream.log) for n in "abc"], relaxed_mode=2)
    assert graph == "graph"
    assert stream.log == [("begin", 2), ("launch", "a", stream), ("launch", "b", stream), ("launch", "c", stream),
                          ("end",)]


def test_a_failed_launch_ends_the_capture_and_no_launch_captures_nothing():
    stream = _Stream()
    with pytest.raises(RuntimeError, match="b failed"):
        capture(stream, [_launch("a", stream.log), _launch("b", stream.log, fail=True), _launch("c", stream.log)], 2)
    assert stream.log == [("begin", 2), ("launch", "a", stream), ("end",)]
    empty = _Stream()
    assert capture(empty, [], 2) is None and empty.log == []


# -- lanes -----------------------------------------------------------------------------------------

def _lanes():
    made = {"lanes": 0, "staging": []}

    def make_lane():
        made["lanes"] += 1
        return Lane(f"stream{made['lanes']}", "event")

    def make_staging(n):
        made["staging"].append(n)
        return np.zeros(n, dtype=np.uint8)

    return LanePool(make_lane, make_staging), made


def test_reserved_lanes_serve_calls_without_making_anything():
    lanes, made = _lanes()
    lanes.reserve(1000)
    lanes.reserve(400)  # a second run in flight: its lane, and staging for the larger need kept
    assert made["lanes"] == 2 and made["staging"] == [1000, 1000]  # the second lane too gets the larger staging
    before = (made["lanes"], list(made["staging"]))
    with lanes.lend() as a, lanes.lend() as b:  # two calls at once: two lanes, neither new
        assert a is not b and a.stream != b.stream
        assert lanes.staging(a, 400) is a.staging and lanes.staging(b, 400) is b.staging
    assert (made["lanes"], made["staging"]) == before


def test_a_third_concurrent_call_gets_a_new_lane_and_staging_only_grows():
    lanes, made = _lanes()
    lanes.reserve(64)
    held = threading.Event()
    release = threading.Event()

    def hold():
        with lanes.lend():
            held.set()
            release.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    with lanes.lend() as lane:
        assert made["lanes"] == 2  # the reserved one is lent: a new one
        first = lanes.staging(lane, 32)
        assert lanes.staging(lane, 16) is first  # never shrunk
        assert lanes.staging(lane, 128).nbytes == 128
    release.set()
    t.join()
    assert len(lanes.all) == 2


# -- device arrays ---------------------------------------------------------------------------------

class _DLPackOnly:
    """A tensor seen only through DLPack (no NumPy interface), on ``device``."""

    def __init__(self, array: np.ndarray, device: tuple[int, int] = (1, 0)):
        self._array = array
        self._device = device

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._device


class _CudaArrayInterface:
    __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (0, False), "version": 3}


def test_device_and_host_arrays_are_told_apart_without_a_gpu_library():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert not is_device_array(x) and not is_device_array([1.0]) and not is_device_array(np.float32(1))
    assert not is_device_array(_DLPackOnly(x))  # a CPU DLPack tensor is host memory
    assert is_device_array(_DLPackOnly(x, (2, 0)))  # kDLCUDA
    assert is_device_array(_DLPackOnly(x, (10, 0)))  # kDLROCM: a device too (the backend says whether it takes it)
    assert is_device_array(_CudaArrayInterface())
    view = host_array(_DLPackOnly(x))
    assert isinstance(view, np.ndarray) and np.shares_memory(view, x)


def _add_model():
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["y"], name="add"), helper.make_node("TopK", ["x", "k"], ["v", "i"],
                                                                                  name="topk", axis=1)],
        "add", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 3)),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, (2, 2)),
         helper.make_tensor_value_info("shape", TensorProto.INT64, (2,))],
        [numpy_helper.from_array(np.array([1, 2, 3], dtype=np.float32), "b"),
         numpy_helper.from_array(np.array([2], dtype=np.int64), "k")])
    graph.node.append(helper.make_node("Shape", ["x"], ["shape"], name="shape"))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


X = np.array([[0.5, -1.0, 2.0], [3.0, 0.0, -2.0]], dtype=np.float32)


@pytest.mark.parametrize("name", [b for b in REGISTRY if b != "cuda"])
def test_backends_of_host_arrays_refuse_device_arrays_saying_why(name):
    require_backend(name)
    sess = gpumnn.load(_add_model()).session(backend=name, fallback=False)
    try:
        reason = sess.backends[name].device_arrays_unsupported
        assert reason
        with pytest.raises(DeviceArrayError, match=f"input 'x' is a device array.*{name} backend") as info:
            sess.run({"x": _DLPackOnly(X, (2, 0))})
        assert reason in str(info.value)
        with pytest.raises(DeviceArrayError, match='outputs="device"'):
            sess.run({"x": X}, outputs="device")
        with pytest.raises(ValueError, match="outputs='gpu'"):
            sess.run({"x": X}, outputs="gpu")
        np.testing.assert_allclose(sess.run({"x": _DLPackOnly(X)})["y"], X + [1, 2, 3])  # a CPU DLPack tensor: host
    finally:
        sess.close()


class _FakeDeviceArray:
    """A "device" array: NumPy data behind a DLPack device of kDLCUDA, which NumPy cannot read."""

    def __init__(self, data: np.ndarray):
        self.data = data
        self.shape, self.dtype, self.size = data.shape, data.dtype, data.size

    def __dlpack_device__(self):
        return (2, 0)

    def min(self):
        return self.data.min()

    def max(self):
        return self.data.max()

    def astype(self, dtype, copy=True):
        return _FakeDeviceArray(self.data.astype(dtype, copy=copy))


class FakeDeviceBackend(CpuBackend):
    """The NumPy backend playing a backend that takes device arrays (what cuda does with CuPy),
    counting its device-array verbs. TopK runs on the real cpu backend beside it (a fallback op),
    which needs a host copy of its input."""

    name = "fakegpu"
    device_arrays_unsupported = None
    calls: list[str] = []

    def unsupported_reason(self, op):
        if op.kind in ("topk", "gather"):  # TopK and the slice of its values stay on the cpu
            return "the cpu computes this one here"
        return super().unsupported_reason(op)

    def device_array(self, value):
        self.calls.append("device_array")
        return value

    def write(self, handle, array):
        if isinstance(array, _FakeDeviceArray):
            self.calls.append("write_device")
            array = array.data
        super().write(handle, array)

    def read_device(self, handle):
        self.calls.append("read_device")
        return _FakeDeviceArray(self.read(handle))

    def to_device(self, array):
        self.calls.append("to_device")
        return _FakeDeviceArray(np.asarray(array))

    def to_host(self, array):
        self.calls.append("to_host")
        return array.data.copy()


def test_the_session_hands_device_arrays_to_its_backend_and_returns_device_outputs(monkeypatch):
    monkeypatch.setitem(REGISTRY, "fakegpu", ("test_cuda_backend", "FakeDeviceBackend"))
    FakeDeviceBackend.calls = []
    sess = gpumnn.load(_add_model()).session(backend="fakegpu", fallback=False)
    try:
        placed = dict(zip([op.kind for op in sess.program.ops], sess.placement.op_backends))
        assert placed.get("topk") == "cpu" and "fakegpu" in sess.placement.op_backends
        out = sess.run({"x": _FakeDeviceArray(X)}, outputs="device")
        assert all(isinstance(v, _FakeDeviceArray) for v in out.values())
        np.testing.assert_allclose(out["y"].data, X + [1, 2, 3])
        np.testing.assert_allclose(out["v"].data, -np.sort(-X, axis=1)[:, :2])
        assert out["shape"].data.tolist() == [2, 3] and out["shape"].dtype == np.int64  # a folded output, uploaded
        calls = FakeDeviceBackend.calls
        assert calls.count("device_array") == 1 and calls.count("write_device") == 1
        assert calls.count("to_host") == 1  # x for TopK on the cpu backend
        assert calls.count("read_device") == 1  # y from the device backend
        assert calls.count("to_device") == 2  # v from the cpu backend, shape folded at creation
        host = sess.run({"x": _FakeDeviceArray(X)})  # device in, host out
        assert isinstance(host["y"], np.ndarray)
        np.testing.assert_allclose(host["y"], X + [1, 2, 3])
    finally:
        sess.close()


# -- on a CUDA GPU ---------------------------------------------------------------------------------

@pytest.fixture
def cuda_session():
    require_backend("cuda")
    sess = gpumnn.load(_add_model()).session(backend="cuda", fallback=False)
    yield sess
    sess.close()


def test_cuda_takes_cupy_arrays_and_gives_device_outputs_without_allocating(cuda_session):
    import cupy

    expected = cuda_session.run({"x": X})
    before = dict(cuda_session.counters["cuda"])
    out = cuda_session.run({"x": cupy.asarray(X)}, outputs="device")
    assert all(isinstance(v, cupy.ndarray) for v in out.values())
    for name, value in expected.items():
        np.testing.assert_allclose(cupy.asnumpy(out[name]), value, rtol=1e-6)
        assert out[name].dtype == value.dtype
    after = cuda_session.counters["cuda"]
    waits = ("submits", "async_submits")  # handing the work over is all a run does
    assert {k: after[k] - before[k] for k in after if k not in waits} == {k: 0 for k in COUNTERS if k not in waits}
    strided = cupy.asarray(np.ascontiguousarray(X.T)).T  # not C-contiguous: converted on the device
    np.testing.assert_allclose(cuda_session.run({"x": strided})["y"], expected["y"])
    as_double = cupy.asarray(X, dtype=cupy.float64)
    with pytest.raises(InputError, match="dtype float64"):
        cuda_session.run({"x": as_double})


def test_cuda_takes_dlpack_tensors(cuda_session):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    x = torch.as_tensor(X, device="cuda") * 1  # made on torch's stream: the DLPack handshake orders it first
    out = cuda_session.run({"x": x})
    np.testing.assert_allclose(out["y"], X + [1, 2, 3])
