"""Every GPU backend against the NumPy reference, one atomic op at a time.

Each case builds one atomic op and random inputs; the op runs on the CpuBackend (the reference
semantics) and on every other available backend, recorded (``record`` + ``submit``) and eager
(``run_eager``), and the outputs must agree to a relative L2 error below 1e-4. Tensors are
placed at non-zero, aligned offsets of one pool (as the session's pool layout does) so that
offset bugs show up, and outputs start filled with the same random garbage on every backend
(a Raster without ``fill`` leaves uncovered elements as they were).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest

from gpumnn import atomic as A
from conftest import REQUIRED, require_backend
from gpumnn.backends import REGISTRY, create_backend, probe
from gpumnn.backends.cpu.backend import CpuBackend
from gpumnn.scheduler.schemes import conv_scheme

TOL = 1e-4

#: every GPU backend gpumnn knows: one that cannot start here skips, or fails where CI requires it
#: (conftest.require_backend), instead of dropping out of the list unnoticed
GPU_BACKENDS = [name for name in REGISTRY if name != "cpu"]
# OpenCL and Vulkan pick a kernel family by device type (vectorised on CPUs, tiled on GPUs):
# run both families on whatever device is here.
KERNEL_FAMILIES = ("opencl", "vulkan", "gl")
BACKEND_PARAMS = [p for name in GPU_BACKENDS
                  for p in ([f"{name}:kernels=tiled", f"{name}:kernels=simd"] if name in KERNEL_FAMILIES else [name])]


def running(names) -> list[str]:
    """Those of ``names`` that start here (a required one that cannot fails the test)."""
    started = []
    for name in names:
        if probe(name) is None:
            started.append(name)
        elif name in REQUIRED:
            require_backend(name)
    return started


@pytest.fixture(scope="module", params=BACKEND_PARAMS)
def backend(request):
    name, _, option = request.param.partition(":")
    require_backend(name)
    options = dict([option.split("=", 1)]) if option else {}
    be = create_backend(name, **options)
    yield be
    be.close()


@pytest.fixture(scope="module")
def cpu():
    return CpuBackend(threads=1)


# --------------------------------------------------------------------------------------------
# The harness
# --------------------------------------------------------------------------------------------

@dataclass
class Case:
    """One atomic op and its inputs. Integer input arrays are int32 tensors (the op's ``dtype``
    says so too); float arrays are float32. Outputs have the op's output dtype."""

    op: A.AtomicOp
    inputs: dict[str, np.ndarray]
    outputs: dict[str, tuple[int, ...]]
    constants: set[str] = field(default_factory=set)  # inputs uploaded with backend.constant()

    def input_dtype(self, name: str) -> str:
        if self.inputs[name].dtype == np.int8:  # a QuantizedMatMul's weight
            return A.INT8
        if self.inputs[name].dtype == np.uint8:  # a prequantized QuantizedMatMul's x and zero point
            return A.UINT8
        return A.INT32 if self.inputs[name].dtype.kind in "iub" else A.FLOAT32

    def output_dtype(self, name: str) -> str:
        return self.op.output_dtype()


def _prepare(be, case: Case, garbage: dict[str, np.ndarray]):
    """Lay the case's tensors into one pool at aligned non-zero offsets; write inputs."""
    align = max(1, be.alignment // 4)
    offset = align  # never start at 0
    placed = {}
    for name, arr in list(case.inputs.items()) + [(n, np.empty(s)) for n, s in case.outputs.items()]:
        if name in case.constants:
            continue
        placed[name] = (offset, tuple(arr.shape))
        offset += -(-max(int(np.prod(arr.shape)), 1) // align) * align + align  # a gap between tensors
    pool = be.allocate(4 * offset)
    dtypes = {**{n: case.input_dtype(n) for n in case.inputs}, **{n: case.output_dtype(n) for n in case.outputs}}
    handles = {name: be.tensor(pool, off, shape, dtypes[name]) for name, (off, shape) in placed.items()}
    for name in case.constants:
        handles[name] = be.constant(case.inputs[name].astype(dtypes[name]))
    for name, arr in case.inputs.items():
        if name not in case.constants:
            be.write(handles[name], arr.astype(dtypes[name]))
    for name in case.outputs:
        be.write(handles[name], garbage[name])
    ins = [handles[n] for n in case.op.inputs]
    outs = [handles[n] for n in case.op.outputs]
    return pool, handles, ins, outs


def run_case(be, case: Case, garbage: dict[str, np.ndarray], eager: bool = False) -> dict[str, np.ndarray]:
    pool, handles, ins, outs = _prepare(be, case, garbage)
    exe = be.create_execution(case.op, ins, outs)
    if eager:
        be.run_eager([exe])
    else:
        be.submit(be.record([exe]))
    result = {name: be.read(handles[name]) for name in case.outputs}
    be.release(pool)
    return result


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-12))


def check(be, cpu, case: Case, seed: int) -> None:
    rng = np.random.default_rng(seed + 1000)
    garbage = {n: (rng.integers(-99, 99, s).astype(np.int32) if case.output_dtype(n) == A.INT32
                   else rng.standard_normal(s).astype(np.float32)) for n, s in case.outputs.items()}
    ref = run_case(cpu, case, garbage)
    for n, arr in ref.items():
        assert np.all(np.isfinite(arr)), f"reference output {n} of {case.op.source} is not finite"
        assert np.linalg.norm(arr) > 0, f"reference output {n} of {case.op.source} is all zeros"
    for eager in (False, True):
        got = run_case(be, case, garbage, eager=eager)
        for n in case.outputs:
            assert got[n].shape == ref[n].shape
            assert got[n].dtype == ref[n].dtype == np.dtype(case.output_dtype(n))
            if got[n].dtype.kind in "iu":  # integer results are exact
                np.testing.assert_array_equal(got[n], ref[n], err_msg=f"{be.name} {case.op.source}: output {n}")
                continue
            err = rel_err(got[n], ref[n])
            assert err < TOL, (f"{be.name} {'eager' if eager else 'recorded'} {case.op.source}: output {n} "
                               f"relative L2 error {err:.3g}")


def _need(shape, strides) -> int:
    """Elements a strided view over ``shape`` touches (all strides >= 0)."""
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides))


# --------------------------------------------------------------------------------------------
# Cases (each a function of a seeded Generator)
# --------------------------------------------------------------------------------------------

CASES: dict[str, Callable[[np.random.Generator], Case]] = {}


def case(name):
    def deco(fn):
        CASES[name] = fn
        return fn
    return deco


_UNARY_PARAMS = {"leaky_relu": (0.1,), "clip": (-0.5, 0.7), "hard_sigmoid": (0.2, 0.5), "elu": (1.3,),
                 "affine_pow": (1.0, 0.5, 0.75), "selu": (1.67, 1.05), "celu": (0.8,), "thresholded_relu": (0.3,)}


def _unary_input(name: str, rng, n: int) -> np.ndarray:
    if name in ("log", "sqrt", "reciprocal"):
        return rng.uniform(0.1, 3.0, n)
    if name == "affine_pow":
        return rng.uniform(-1.5, 3.0, n)  # 1 + 0.5x > 0
    if name == "round":
        return np.concatenate([rng.integers(-9, 9, n // 2) / 2.0, rng.uniform(-4, 4, n - n // 2)])  # ties
    if name in ("sign", "not", "nonzero"):
        x = rng.standard_normal(n)
        x[::7] = 0.0
        return x
    if name == "round_f16":  # normal and subnormal float16 values, ties to even, the largest finite one
        return np.concatenate([rng.standard_normal(n - 20) * 100, rng.standard_normal(10) * 1e-6,
                               [65504.0, -65519.0, 65519.0, 1e-8, -1e-8, 0.0, 1.0, 2049.0, 2051.0, 1.0 + 2**-11]])
    return rng.standard_normal(n) * 2.0


for _u in A.UNARY_OPS:
    def _make(rng, _u=_u):
        n = 301
        out = A.INT32 if _u in ("not", "nonzero") else ""
        op = A.Unary(("x",), ("y",), f"unary_{_u}", op=_u, params=_UNARY_PARAMS.get(_u, ()), count=n, out_dtype=out)
        return Case(op, {"x": _unary_input(_u, rng, n)}, {"y": (n,)})
    CASES[f"unary-{_u}"] = _make

_INT_UNARY_PARAMS = {"clip": (-5.0, 7.0)}
for _u in sorted(A.INT_UNARY_OPS):
    def _make(rng, _u=_u):
        n = 301
        x = rng.integers(-40, 40, n).astype(np.int32)
        x[::5] = 0
        op = A.Unary(("x",), ("y",), f"unary_int_{_u}", op=_u, params=_INT_UNARY_PARAMS.get(_u, ()), count=n,
                     dtype=A.INT32)
        return Case(op, {"x": x}, {"y": (n,)})
    CASES[f"unary-int32-{_u}"] = _make


@case("cast-float32-to-int32")
def _(rng):  # truncation toward zero
    n = 257
    op = A.Unary(("x",), ("y",), "cast_f2i", op="identity", count=n, out_dtype=A.INT32)
    return Case(op, {"x": rng.standard_normal(n) * 50}, {"y": (n,)})


@case("cast-int32-to-float32")
def _(rng):
    n = 257
    op = A.Unary(("x",), ("y",), "cast_i2f", op="identity", count=n, dtype=A.INT32, out_dtype=A.FLOAT32)
    return Case(op, {"x": rng.integers(-2**24, 2**24, n).astype(np.int32)}, {"y": (n,)})


def _binary_inputs(opname, rng, a_n, b_n):
    a = rng.standard_normal(a_n)
    b = rng.standard_normal(b_n)
    if opname == "pow":
        a = rng.uniform(0.2, 2.0, a_n)
    if opname == "div":
        b = np.sign(b) * (np.abs(b) + 0.5)
    if opname in ("equal", "less", "less_equal", "greater", "greater_equal"):  # ties, so equal finds some
        a, b = rng.integers(-2, 3, a_n) / 2.0, rng.integers(-2, 3, b_n) / 2.0
    return a, b


for _b in [b for b in A.BINARY_OPS if b not in ("and", "or", "xor")]:
    def _make(rng, _b=_b):
        shape = (2, 3, 4, 5)
        a_strides, b_strides = (60, 20, 5, 1), (0, 1, 0, 0)  # b: per-channel broadcast
        a, b = _binary_inputs(_b, rng, _need(shape, a_strides), 3)
        op = A.Binary(("a", "b"), ("y",), f"binary_{_b}", op=_b, out_shape=shape, a_strides=a_strides,
                      b_strides=b_strides)
        return Case(op, {"a": a, "b": b}, {"y": shape})
    CASES[f"binary-{_b}-bcast"] = _make


def _int_binary_inputs(opname, rng, a_n, b_n):
    a = rng.integers(-60, 60, a_n).astype(np.int32)
    b = rng.integers(-9, 9, b_n).astype(np.int32)
    if opname in ("div", "mod", "fmod"):
        b[b == 0] = 3
    if opname == "pow":
        a, b = rng.integers(-5, 6, a_n).astype(np.int32), rng.integers(0, 4, b_n).astype(np.int32)
    if opname in ("and", "or", "xor"):
        a, b = rng.integers(0, 2, a_n).astype(np.int32), rng.integers(0, 2, b_n).astype(np.int32)
    if opname == "equal":
        b[0] = a[0]
    return a, b


for _b in sorted(A.INT_BINARY_OPS):
    def _make(rng, _b=_b):
        shape = (2, 3, 4, 5)
        a_strides, b_strides = (60, 20, 5, 1), (0, 1, 0, 0)  # b: per-channel broadcast
        a, b = _int_binary_inputs(_b, rng, _need(shape, a_strides), 3)
        op = A.Binary(("a", "b"), ("y",), f"binary_int_{_b}", op=_b, out_shape=shape, a_strides=a_strides,
                      b_strides=b_strides, dtype=A.INT32)
        return Case(op, {"a": a, "b": b}, {"y": shape})
    CASES[f"binary-int32-{_b}-bcast"] = _make


_LO = int(np.iinfo(np.int32).min)
#: the contract's integer corners: negative exponents, zero divisors, INT32_MIN
_INT_EDGES = {
    "pow": ([2, 1, -1, -1, 0, 3, -2, 7], [-1, -3, -3, -2, -2, 0, 3, 2]),
    "div": ([5, _LO, _LO, -7, 7, -7, 0, _LO], [0, -1, _LO + 1, _LO, 2, 2, -3, 1]),
    "mod": ([7, -7, 7, -7, _LO, 5, 0, 9], [3, 3, -3, -3, 7, 0, 4, -1]),
    "fmod": ([7, -7, 7, -7, _LO, 5, 0, 9], [3, 3, -3, -3, 7, 0, 4, -1]),
}
for _b, (_a_values, _b_values) in _INT_EDGES.items():
    def _make(rng, _b=_b, a=_a_values, b=_b_values):
        shape = (1, 1, 1, len(a))
        op = A.Binary(("a", "b"), ("y",), f"int_edges_{_b}", op=_b, out_shape=shape, a_strides=(0, 0, 0, 1),
                      b_strides=(0, 0, 0, 1), dtype=A.INT32)
        return Case(op, {"a": np.array(a, np.int32), "b": np.array(b, np.int32)}, {"y": shape})
    CASES[f"binary-int32-{_b}-edges"] = _make


@case("binary-int32-add-flat")
def _(rng):
    shape = (1, 2, 7, 9)
    op = A.Binary(("a", "b"), ("y",), "int_add", op="add", out_shape=shape, a_strides=(126, 63, 9, 1),
                  b_strides=(126, 63, 9, 1), dtype=A.INT32)
    return Case(op, {"a": rng.integers(-2**30, 2**30, shape).astype(np.int32),
                     "b": rng.integers(-2**30, 2**30, shape).astype(np.int32)}, {"y": shape})


@case("binary-add-flat-relu")
def _(rng):
    shape = (1, 2, 7, 9)
    op = A.Binary(("a", "b"), ("y",), "residual", op="add", out_shape=shape, a_strides=(126, 63, 9, 1),
                  b_strides=(126, 63, 9, 1), activation=("relu", ()))
    return Case(op, {"a": rng.standard_normal(shape), "b": rng.standard_normal(shape)}, {"y": shape})


@case("binary-mul-both-bcast-clip")
def _(rng):
    shape = (2, 3, 4, 5)
    # a broadcast over dim 1, b a row vector over the last dim; activation with params
    op = A.Binary(("a", "b"), ("y",), "bcast_both", op="mul", out_shape=shape, a_strides=(20, 0, 5, 1),
                  b_strides=(0, 0, 0, 1), activation=("clip", (-0.3, 0.4)))
    return Case(op, {"a": rng.standard_normal(40), "b": rng.standard_normal(5)}, {"y": shape})


@case("binary-sub-scalar-leaky")
def _(rng):
    shape = (1, 1, 6, 7)
    op = A.Binary(("a", "b"), ("y",), "scalar", op="sub", out_shape=shape, a_strides=(0, 0, 0, 0),
                  b_strides=(0, 0, 7, 1), activation=("leaky_relu", (0.2,)))
    return Case(op, {"a": rng.standard_normal(1), "b": rng.standard_normal(42)}, {"y": shape})


@case("binary-prelu-gelu")
def _(rng):
    shape = (2, 4, 3, 3)
    op = A.Binary(("a", "b"), ("y",), "prelu", op="prelu", out_shape=shape, a_strides=(36, 9, 3, 1),
                  b_strides=(0, 1, 0, 0), activation=("gelu", ()))
    return Case(op, {"a": rng.standard_normal(72), "b": rng.uniform(0, 0.5, 4)}, {"y": shape})


for _r in A.REDUCE_OPS:
    def _make(rng, _r=_r):
        op = A.Reduce(("x",), ("y",), f"reduce_{_r}", op=_r, outer=3, size=7, inner=5)
        return Case(op, {"x": rng.standard_normal(105)}, {"y": (3, 5)})
    CASES[f"reduce-{_r}"] = _make

    def _make_rows(rng, _r=_r):
        op = A.Reduce(("x",), ("y",), f"reduce_rows_{_r}", op=_r, outer=4, size=300, inner=1)
        return Case(op, {"x": rng.standard_normal(1200) + 0.3}, {"y": (4, 1)})
    CASES[f"reduce-{_r}-rows"] = _make_rows

    def _make_int(rng, _r=_r):
        op = A.Reduce(("x",), ("y",), f"reduce_int_{_r}", op=_r, outer=3, size=7, inner=5, dtype=A.INT32)
        return Case(op, {"x": rng.integers(-1000, 1000, 105).astype(np.int32)}, {"y": (3, 5)})
    CASES[f"reduce-int32-{_r}"] = _make_int

    def _make_int_rows(rng, _r=_r):  # one workgroup per row; many ties (the first extreme wins)
        op = A.Reduce(("x",), ("y",), f"reduce_int_rows_{_r}", op=_r, outer=4, size=300, inner=1, dtype=A.INT32)
        return Case(op, {"x": rng.integers(-20, 40, 1200).astype(np.int32)}, {"y": (4, 1)})  # mean ~10: not 0
    CASES[f"reduce-int32-{_r}-rows"] = _make_int_rows


for _r in ("argmax", "argmin"):
    def _make_ties(rng, _r=_r):  # few distinct values: the first index of the extreme wins
        op = A.Reduce(("x",), ("y",), f"reduce_ties_{_r}", op=_r, outer=3, size=9, inner=4, dtype=A.INT32)
        return Case(op, {"x": rng.integers(-2, 3, 108).astype(np.int32)}, {"y": (3, 4)})
    CASES[f"reduce-{_r}-int32-ties"] = _make_ties


def _matmul(rng, *, batch, m, n, k, trans_a=False, trans_b=False, shared=False, bias=None, alpha=1.0,
            beta=1.0, activation=None, const_b=False) -> Case:
    a_shape = (batch, k, m) if trans_a else (batch, m, k)
    b_shape = (1 if shared else batch,) + ((n, k) if trans_b else (k, n))
    inputs = {"a": rng.standard_normal(a_shape), "b": rng.standard_normal(b_shape) / np.sqrt(k)}
    names = ["a", "b"]
    strides = (0, 1)
    if bias is not None:
        strides = {"row": (0, 1), "col": (1, 0), "full": (n, 1)}[bias]
        inputs["bias"] = rng.standard_normal(_need((m, n), strides))
        names.append("bias")
    op = A.MatMul(tuple(names), ("y",), "matmul", batch=batch, m=m, n=n, k=k, a_batch_stride=m * k,
                  b_batch_stride=0 if shared else n * k, trans_a=trans_a, trans_b=trans_b, alpha=alpha,
                  beta=beta, has_bias=bias is not None, bias_strides=strides, activation=activation)
    return Case(op, inputs, {"y": (batch, m, n)}, {"b"} if const_b else set())


CASES["matmul-batch"] = lambda rng: _matmul(rng, batch=3, m=5, n=7, k=9)
CASES["matmul-trans-a-b"] = lambda rng: _matmul(rng, batch=2, m=6, n=5, k=11, trans_a=True, trans_b=True)
CASES["matmul-trans-b"] = lambda rng: _matmul(rng, batch=2, m=13, n=17, k=19, trans_b=True)
CASES["matmul-shared-rowbias-alpha-beta-relu"] = lambda rng: _matmul(
    rng, batch=4, m=6, n=10, k=8, shared=True, bias="row", alpha=0.5, beta=2.0, activation=("relu", ()),
    const_b=True)
CASES["matmul-shared-colbias-gelu"] = lambda rng: _matmul(
    rng, batch=3, m=7, n=9, k=12, shared=True, bias="col", activation=("gelu", ()))
CASES["matmul-tiles-fullbias"] = lambda rng: _matmul(rng, batch=1, m=70, n=130, k=100, bias="full", beta=0.5)
CASES["matmul-gemv"] = lambda rng: _matmul(rng, batch=1, m=1, n=300, k=64, trans_b=True, bias="row",
                                           const_b=True)


def _quantized_matmul(rng, *, m, n, k, bias=False, activation=None) -> Case:
    inputs = {"x": rng.standard_normal((m, k)).astype(np.float32),
              "w": rng.integers(-127, 128, (k, n)).astype(np.int8),
              "w_scale": (rng.random(n) / 100 + 1e-3).astype(np.float32)}
    if bias:
        inputs["bias"] = rng.standard_normal(n).astype(np.float32)
    op = A.QuantizedMatMul(tuple(inputs), ("y",), "quantized_matmul", m=m, n=n, k=k, has_bias=bias,
                           activation=activation)
    return Case(op, inputs, {"y": (m, n)}, {"w", "w_scale"})


def _prequantized_matmul(rng, *, m, n, k, bias=False) -> Case:
    """x already uint8 with one run-time scale and zero point (quantize_dynamic's MatMulInteger)."""
    inputs = {"x": rng.integers(0, 256, (m, k)).astype(np.uint8),
              "w": rng.integers(-128, 128, (k, n)).astype(np.int8),
              "w_scale": (rng.random(n) / 100 + 1e-3).astype(np.float32),
              "x_scale": np.array([0.037], np.float32), "x_zero": np.array([117], np.uint8)}
    if bias:
        inputs["bias"] = rng.standard_normal(n).astype(np.float32)
    op = A.QuantizedMatMul(tuple(inputs), ("y",), "quantized_matmul", dtype=A.UINT8, m=m, n=n, k=k, has_bias=bias,
                           prequantized=True)
    return Case(op, inputs, {"y": (m, n)}, {"w", "w_scale"})


def _quantized_conv2d(rng, *, c, hw, oc, k, stride=1, pad=0, groups=1, x_dtype=np.int8, out_dtype="int8") -> Case:
    """A static int8 convolution (a QDQ model's Conv on the cpu); the scheme from its geometry."""
    from gpumnn.scheduler.schemes import conv_scheme

    info = np.iinfo(x_dtype)
    inputs = {"x": rng.integers(info.min, info.max + 1, (1, c) + hw).astype(x_dtype),
              "w": rng.integers(-127, 128, (oc, c // groups, k, k)).astype(np.int8),
              "bias": rng.integers(-2000, 2000, oc).astype(np.int32),
              "multiplier": (rng.random(oc) / 2000 + 1e-4).astype(np.float32)}
    out_hw = tuple((hw[i] + 2 * pad - k) // stride + 1 for i in range(2))
    out_info = np.iinfo(out_dtype)
    op = A.QuantizedConv2D(tuple(inputs), ("y",), "quantized_conv2d", batch=1, in_channels=c, in_hw=hw, out_channels=oc,
                           out_hw=out_hw, kernel=(k, k), strides=(stride, stride), pads=(pad, pad), groups=groups,
                           x_zero_point=int(info.min) + 7, y_zero_point=int(out_info.min) + 9, out_dtype=out_dtype,
                           lo=int(out_info.min) + 9, hi=int(out_info.max), dtype=np.dtype(x_dtype).name)
    op = dataclasses.replace(op, scheme=conv_scheme(op))
    return Case(op, inputs, {"y": (1, oc) + out_hw}, {"w", "bias", "multiplier"})


CASES["quantized_conv2d-im2col"] = lambda rng: _quantized_conv2d(rng, c=18, hw=(9, 10), oc=35, k=3, stride=2, pad=1)
CASES["quantized_conv2d-gemm1x1-uint8"] = lambda rng: _quantized_conv2d(rng, c=20, hw=(5, 6), oc=9, k=1, x_dtype=np.uint8,
                                                                        out_dtype="uint8")
CASES["quantized_conv2d-depthwise"] = lambda rng: _quantized_conv2d(rng, c=12, hw=(8, 7), oc=12, k=3, pad=1, groups=12)
def _quantized_add(rng, *, count, dtype, out_dtype, relu=False) -> Case:
    """A static int8 sum (a QDQ model's residual Add); ``relu`` narrows the clamp to the output's zero point."""
    info, out_info = np.iinfo(dtype), np.iinfo(out_dtype)
    inputs = {name: rng.integers(info.min, info.max + 1, count).astype(dtype) for name in ("a", "b")}
    y_zero = int(out_info.min) + 37
    op = A.QuantizedAdd(("a", "b"), ("y",), "quantized_add", dtype=np.dtype(dtype).name, count=count,
                        a_scale=float(np.float32(0.0213)), a_zero_point=int(info.min) + 100,
                        b_scale=float(np.float32(0.0371)), b_zero_point=int(info.max) - 90,
                        y_scale=float(np.float32(0.0547)), y_zero_point=y_zero, out_dtype=out_dtype,
                        lo=y_zero if relu else int(out_info.min), hi=int(out_info.max))
    return Case(op, inputs, {"y": (count,)})


CASES["quantized_add-int8"] = lambda rng: _quantized_add(rng, count=1001, dtype=np.int8, out_dtype="int8")
CASES["quantized_add-uint8-relu"] = lambda rng: _quantized_add(rng, count=77, dtype=np.uint8, out_dtype="uint8",
                                                              relu=True)
CASES["quantized_add-int8-to-uint8-odd"] = lambda rng: _quantized_add(rng, count=5, dtype=np.int8,
                                                                      out_dtype="uint8")


def _quantized_global_average_pool(rng, *, batch, channels, hw, dtype, out_dtype, channels_last=False,
                                   relu=False) -> Case:
    """A static int8 global average pooling of 8-bit planes (NCHW, or NHWC with ``channels_last``)."""
    info, out_info = np.iinfo(dtype), np.iinfo(out_dtype)
    shape = (batch,) + hw + (channels,) if channels_last else (batch, channels) + hw
    y_zero = int(out_info.min) + 41
    op = A.QuantizedGlobalAveragePool(("x",), ("y",), "quantized_global_average_pool", dtype=np.dtype(dtype).name,
                                      batch=batch, channels=channels, pixels=hw[0] * hw[1],
                                      channels_last=channels_last, x_zero_point=int(info.min) + 90,
                                      multiplier=float(np.float32(0.0213 / (0.0119 * hw[0] * hw[1]))),
                                      y_zero_point=y_zero, out_dtype=out_dtype,
                                      lo=y_zero if relu else int(out_info.min), hi=int(out_info.max))
    return Case(op, {"x": rng.integers(info.min, info.max + 1, shape).astype(dtype)}, {"y": (batch, channels, 1, 1)})


def _quantize(rng, *, count, out_dtype, zero_point) -> Case:
    """A QuantizeLinear per tensor of float32 values in one pass: values across and past the type's range,
    and exact halves of a step (ties to even)."""
    info = np.iinfo(out_dtype)
    scale = np.float32(0.0173)
    x = (rng.standard_normal(count) * 150 * scale).astype(np.float32)
    x[::5] = ((rng.integers(-300, 300, x[::5].shape) + np.float32(0.5)) * scale).astype(np.float32)
    op = A.Quantize(("x",), ("y",), "quantize", count=count, y_scale=float(scale), y_zero_point=int(zero_point),
                    out_dtype=out_dtype, lo=int(info.min), hi=int(info.max))
    return Case(op, {"x": x}, {"y": (count,)})


CASES["quantize-int8"] = lambda rng: _quantize(rng, count=1001, out_dtype="int8", zero_point=-3)
CASES["quantize-uint8-odd"] = lambda rng: _quantize(rng, count=77, out_dtype="uint8", zero_point=131)
CASES["quantized_global_average_pool-int8"] = lambda rng: _quantized_global_average_pool(
    rng, batch=2, channels=7, hw=(5, 9), dtype=np.int8, out_dtype="int8")
CASES["quantized_global_average_pool-channels_last-uint8-relu"] = lambda rng: _quantized_global_average_pool(
    rng, batch=1, channels=13, hw=(7, 7), dtype=np.uint8, out_dtype="uint8", channels_last=True, relu=True)
CASES["quantized_matmul-prequantized"] = lambda rng: _prequantized_matmul(rng, m=11, n=37, k=29)
CASES["quantized_matmul-prequantized-bias"] = lambda rng: _prequantized_matmul(rng, m=1, n=5, k=66, bias=True)
CASES["quantized_matmul-vector"] = lambda rng: _quantized_matmul(rng, m=1, n=33, k=7)
CASES["quantized_matmul-bias-gelu"] = lambda rng: _quantized_matmul(rng, m=19, n=70, k=45, bias=True,
                                                                    activation=("gelu", ()))
CASES["quantized_matmul-bias-sigmoid"] = lambda rng: _quantized_matmul(rng, m=9, n=5, k=130, bias=True,
                                                                       activation=("sigmoid", ()))


def _conv(rng, *, n=1, c, hw, oc, k, s=(1, 1), p=(0, 0), d=(1, 1), g=1, bias=False, act=None,
          const_w=True) -> Case:
    (h, w), (kh, kw) = hw, k
    oh = (h + 2 * p[0] - d[0] * (kh - 1) - 1) // s[0] + 1
    ow = (w + 2 * p[1] - d[1] * (kw - 1) - 1) // s[1] + 1
    inputs = {"x": rng.standard_normal((n, c, h, w)),
              "w": rng.standard_normal((oc, c // g, kh, kw)) / np.sqrt(c // g * kh * kw)}
    names = ["x", "w"]
    if bias:
        inputs["bias"] = rng.standard_normal(oc)
        names.append("bias")
    op = A.Conv2D(tuple(names), ("y",), "conv", batch=n, in_channels=c, in_hw=hw, out_channels=oc,
                  out_hw=(oh, ow), kernel=k, strides=s, pads=p, dilations=d, groups=g, has_bias=bias,
                  activation=act)
    op = dataclasses.replace(op, scheme=conv_scheme(op))  # the kernel the session's scheme step picks
    return Case(op, inputs, {"y": (n, oc, oh, ow)}, {"w", "bias"} & set(names) if const_w else set())


CASES["conv-3x3-pad1-bias-relu6"] = lambda rng: _conv(rng, n=2, c=5, hw=(9, 11), oc=6, k=(3, 3), p=(1, 1),
                                                      bias=True, act=("clip", (0.0, 6.0)))
CASES["conv-3x3-stride2"] = lambda rng: _conv(rng, c=4, hw=(10, 10), oc=8, k=(3, 3), s=(2, 2), p=(1, 1))
CASES["conv-1x1-bias"] = lambda rng: _conv(rng, n=2, c=16, hw=(7, 6), oc=12, k=(1, 1), bias=True)
CASES["conv-1x1-stride2"] = lambda rng: _conv(rng, c=8, hw=(9, 9), oc=5, k=(1, 1), s=(2, 2))
CASES["conv-depthwise-bias-relu6"] = lambda rng: _conv(rng, n=2, c=8, hw=(9, 7), oc=8, k=(3, 3), p=(1, 1), g=8,
                                                       bias=True, act=("clip", (0.0, 6.0)))
CASES["conv-depthwise-stride2"] = lambda rng: _conv(rng, c=6, hw=(11, 10), oc=6, k=(3, 3), s=(2, 2), p=(1, 1), g=6)
CASES["conv-depthwise-wide"] = lambda rng: _conv(rng, c=3, hw=(6, 40), oc=3, k=(3, 3), p=(1, 1), g=3, bias=True)
CASES["conv-depthwise-wide-stride2"] = lambda rng: _conv(rng, c=2, hw=(5, 70), oc=2, k=(3, 3), s=(2, 2), p=(1, 1),
                                                         g=2, act=("relu", ()))
CASES["conv-wide-rows"] = lambda rng: _conv(rng, c=3, hw=(5, 30), oc=20, k=(3, 3), p=(1, 1), bias=True,
                                            act=("hard_swish", ()))
CASES["conv-wide-rows-stride2"] = lambda rng: _conv(rng, c=3, hw=(5, 50), oc=5, k=(3, 3), s=(2, 2), p=(1, 1))
CASES["conv-runtime-weights"] = lambda rng: _conv(rng, n=2, c=4, hw=(6, 7), oc=5, k=(3, 3), p=(1, 1), bias=True,
                                                  const_w=False)
CASES["conv-1x1-runtime-weights"] = lambda rng: _conv(rng, c=6, hw=(5, 5), oc=18, k=(1, 1), const_w=False)
CASES["conv-groups2"] = lambda rng: _conv(rng, c=6, hw=(8, 8), oc=4, k=(3, 3), p=(1, 1), g=2, bias=True)
CASES["conv-dilation2"] = lambda rng: _conv(rng, c=3, hw=(12, 12), oc=5, k=(3, 3), p=(2, 2), d=(2, 2))
CASES["conv-asymmetric"] = lambda rng: _conv(rng, c=3, hw=(9, 13), oc=4, k=(3, 5), s=(2, 1), p=(1, 2))
CASES["conv-7x1"] = lambda rng: _conv(rng, c=4, hw=(10, 8), oc=6, k=(7, 1), p=(3, 0), bias=True)
CASES["conv-1x7"] = lambda rng: _conv(rng, c=4, hw=(8, 10), oc=6, k=(1, 7), p=(0, 3), act=("relu", ()))
CASES["conv-tiles"] = lambda rng: _conv(rng, c=32, hw=(12, 14), oc=70, k=(3, 3), p=(1, 1), bias=True,
                                        act=("relu", ()))


def _deconv(rng, *, n=1, c, hw, oc, k, s=(1, 1), p=(0, 0, 0, 0), d=(1, 1), out_pad=(0, 0), g=1, bias=False,
            act=None, const_w=True) -> Case:
    (h, w), (kh, kw) = hw, k
    oh = (h - 1) * s[0] - p[0] - p[2] + d[0] * (kh - 1) + 1 + out_pad[0]
    ow = (w - 1) * s[1] - p[1] - p[3] + d[1] * (kw - 1) + 1 + out_pad[1]
    inputs = {"x": rng.standard_normal((n, c, h, w)),
              "w": rng.standard_normal((c, oc // g, kh, kw)) / np.sqrt(c // g * kh * kw)}
    names = ["x", "w"]
    if bias:
        inputs["bias"] = rng.standard_normal(oc)
        names.append("bias")
    op = A.ConvTranspose2D(tuple(names), ("y",), "deconv", batch=n, in_channels=c, in_hw=hw, out_channels=oc,
                           out_hw=(oh, ow), kernel=k, strides=s, pads=(p[0], p[1]), dilations=d, groups=g,
                           has_bias=bias, activation=act)
    return Case(op, inputs, {"y": (n, oc, oh, ow)}, {"w"} if const_w else set())


CASES["deconv-stride2-pads-bias"] = lambda rng: _deconv(rng, n=2, c=4, hw=(5, 6), oc=3, k=(3, 3), s=(2, 2),
                                                        p=(1, 1, 1, 1), out_pad=(1, 1), bias=True)
CASES["deconv-groups2-relu"] = lambda rng: _deconv(rng, c=4, hw=(4, 5), oc=6, k=(2, 3), s=(2, 1),
                                                   p=(0, 1, 0, 1), g=2, act=("relu", ()))
CASES["deconv-runtime-weights-wide"] = lambda rng: _deconv(rng, c=5, hw=(3, 9), oc=20, k=(3, 3), s=(2, 2),
                                                           p=(1, 1, 1, 1), bias=True, const_w=False)
CASES["deconv-dilation-asym"] = lambda rng: _deconv(rng, c=3, hw=(5, 4), oc=2, k=(3, 2), s=(1, 2),
                                                    p=(2, 0, 1, 0), d=(2, 1))


def _pool(rng, *, op="max", n=2, c=3, hw=(9, 9), k=(3, 3), s=(2, 2), pads=(0, 0, 0, 0), ceil=False,
          include_pad=False, dtype=None) -> Case:
    """A pooling of float32 values, or with ``dtype`` (int8, uint8: max pooling) of 8-bit ones."""
    (h, w) = hw
    def out(size, kk, ss, p0, p1):
        num = size + p0 + p1 - kk
        return (-(-num // ss) if ceil else num // ss) + 1
    oh, ow = out(h, k[0], s[0], pads[0], pads[2]), out(w, k[1], s[1], pads[1], pads[3])
    pop = A.Pool2D(("x",), ("y",), f"pool_{op}", op=op, batch=n, channels=c, in_hw=hw, out_hw=(oh, ow),
                   kernel=k, strides=s, pads=pads, count_include_pad=include_pad)
    if dtype is not None:
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max + 1, (n, c, h, w)).astype(dtype)
        return Case(dataclasses.replace(pop, dtype=np.dtype(dtype).name), {"x": x}, {"y": (n, c, oh, ow)})
    return Case(pop, {"x": rng.standard_normal((n, c, h, w))}, {"y": (n, c, oh, ow)})


CASES["pool-max-pad1"] = lambda rng: _pool(rng, pads=(1, 1, 1, 1))
CASES["pool-max-ceil"] = lambda rng: _pool(rng, hw=(8, 10), ceil=True)
CASES["pool-avg-include-pad"] = lambda rng: _pool(rng, op="avg", s=(1, 1), pads=(1, 1, 1, 1), include_pad=True)
CASES["pool-avg-exclude-pad"] = lambda rng: _pool(rng, op="avg", s=(1, 1), pads=(1, 1, 1, 1))
CASES["pool-avg-ceil-include-pad"] = lambda rng: _pool(rng, op="avg", hw=(8, 7), pads=(1, 0, 1, 0), ceil=True,
                                                       include_pad=True)
CASES["pool-avg-ceil-exclude-pad-asym"] = lambda rng: _pool(rng, op="avg", hw=(8, 7), k=(2, 3), s=(2, 2),
                                                            pads=(0, 1, 1, 0), ceil=True)
CASES["pool-global-avg"] = lambda rng: _pool(rng, op="avg", hw=(16, 16), k=(16, 16), s=(1, 1))
CASES["pool-global-max"] = lambda rng: _pool(rng, op="max", hw=(16, 16), k=(16, 16), s=(1, 1))
CASES["pool-max-int8-pad1-odd"] = lambda rng: _pool(rng, c=5, hw=(11, 9), pads=(1, 1, 1, 1), dtype=np.int8)
CASES["pool-max-uint8-ceil"] = lambda rng: _pool(rng, hw=(8, 10), ceil=True, dtype=np.uint8)
CASES["pool-global-max-int8"] = lambda rng: _pool(rng, op="max", c=3, hw=(7, 5), k=(7, 5), s=(1, 1), dtype=np.int8)
CASES["pool-global-avg-small"] = lambda rng: _pool(rng, op="avg", c=5, hw=(7, 7), k=(7, 7), s=(1, 1))


def _softmax(rng, outer, size, inner, log):
    op = A.Softmax(("x",), ("y",), "softmax", outer=outer, size=size, inner=inner, log=log)
    return Case(op, {"x": rng.standard_normal(outer * size * inner) * 3}, {"y": (outer, size, inner)})


CASES["softmax-inner"] = lambda rng: _softmax(rng, 3, 10, 4, False)
CASES["logsoftmax-inner"] = lambda rng: _softmax(rng, 3, 10, 4, True)
CASES["softmax-rows"] = lambda rng: _softmax(rng, 5, 200, 1, False)
CASES["logsoftmax-rows"] = lambda rng: _softmax(rng, 5, 200, 1, True)
CASES["softmax-short-rows"] = lambda rng: _softmax(rng, 7, 9, 1, False)


def _normalize(rng, outer, size, affine):
    names = ("x", "scale", "shift") if affine else ("x",)
    inputs = {"x": rng.standard_normal((outer, size)) * 2 + 1}
    if affine:
        inputs["scale"] = rng.standard_normal(size)
        inputs["shift"] = rng.standard_normal(size)
    op = A.Normalize(names, ("y",), "layernorm", outer=outer, size=size, eps=1e-5, has_affine=affine)
    return Case(op, inputs, {"y": (outer, size)}, {"scale", "shift"} & set(inputs))


CASES["normalize"] = lambda rng: _normalize(rng, 6, 10, False)
CASES["normalize-affine"] = lambda rng: _normalize(rng, 6, 10, True)
CASES["normalize-affine-long"] = lambda rng: _normalize(rng, 3, 300, True)
CASES["normalize-many-short"] = lambda rng: _normalize(rng, 64, 16, True)


def _resize(rng, *, mode, coord, nearest_mode="round_prefer_floor", hw=(4, 5), out=(8, 10)):
    planes = 3
    op = A.Resize(("x",), ("y",), "resize", planes=planes, in_hw=hw, out_hw=out,
                  scales=(out[0] / hw[0], out[1] / hw[1]), mode=mode, coord=coord, nearest_mode=nearest_mode)
    return Case(op, {"x": rng.standard_normal((planes,) + hw)}, {"y": (planes,) + out})


for _coord in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"):
    CASES[f"resize-linear-{_coord}-up"] = lambda rng, c=_coord: _resize(rng, mode="linear", coord=c)
    CASES[f"resize-linear-{_coord}-down"] = lambda rng, c=_coord: _resize(rng, mode="linear", coord=c,
                                                                          hw=(9, 7), out=(4, 5))
    CASES[f"resize-nearest-{_coord}"] = lambda rng, c=_coord: _resize(rng, mode="nearest", coord=c,
                                                                      hw=(5, 6), out=(7, 13))
for _nm in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
    CASES[f"resize-nearest-{_nm}"] = lambda rng, m=_nm: _resize(rng, mode="nearest", coord="asymmetric",
                                                                nearest_mode=m, hw=(4, 6), out=(10, 9))
    CASES[f"resize-nearest-{_nm}-x2"] = lambda rng, m=_nm: _resize(rng, mode="nearest", coord="half_pixel",
                                                                   nearest_mode=m)


@case("gather-negative")
def _(rng):
    idx = np.array([0, -1, 3, -5, 2, 4, -2], dtype=np.int32)
    op = A.Gather(("data", "idx"), ("y",), "gather", outer=2, axis=5, inner=3, count=len(idx))
    return Case(op, {"data": rng.standard_normal((2, 5, 3)), "idx": idx}, {"y": (2, len(idx), 3)})


@case("gather-rows")
def _(rng):
    idx = rng.integers(-50, 50, 12).astype(np.int32)
    op = A.Gather(("data", "idx"), ("y",), "embedding", outer=1, axis=50, inner=16, count=12)
    return Case(op, {"data": rng.standard_normal((50, 16)), "idx": idx}, {"y": (1, 12, 16)}, {"data"})


@case("gather-int32-data-out-of-range")
def _(rng):  # int32 data copied as words; out-of-range indices clamp
    idx = np.array([0, 9, -1, -12, 4], dtype=np.int32)
    op = A.Gather(("data", "idx"), ("y",), "gather_int", outer=3, axis=6, inner=2, count=len(idx), dtype=A.INT32)
    return Case(op, {"data": rng.integers(-2**31, 2**31 - 1, (3, 6, 2)).astype(np.int32), "idx": idx},
                {"y": (3, len(idx), 2)})


def _select(rng, dtype):
    shape = (2, 3, 4, 5)
    c = rng.integers(0, 2, 3 * 5).astype(np.int32)
    if dtype == A.INT32:
        a, b = rng.integers(-2**31, 2**31 - 1, 120).astype(np.int32), rng.integers(-9, 9, 4).astype(np.int32)
    else:
        a, b = rng.standard_normal(120), rng.standard_normal(4)
    op = A.Select(("c", "a", "b"), ("y",), f"select_{dtype}", out_shape=shape, c_strides=(0, 5, 0, 1),
                  a_strides=(60, 20, 5, 1), b_strides=(0, 0, 1, 0), dtype=dtype)
    return Case(op, {"c": c, "a": a, "b": b}, {"y": shape})


CASES["select-float32-bcast"] = lambda rng: _select(rng, A.FLOAT32)
CASES["select-int32-bcast"] = lambda rng: _select(rng, A.INT32)


def _cumsum(rng, dtype, exclusive, reverse):
    x = rng.integers(-50, 50, 4 * 9 * 3).astype(np.int32) if dtype == A.INT32 else rng.standard_normal(4 * 9 * 3)
    op = A.CumSum(("x",), ("y",), "cumsum", outer=4, size=9, inner=3, exclusive=exclusive, reverse=reverse,
                  dtype=dtype)
    return Case(op, {"x": x}, {"y": (4, 9, 3)})


for _dt in (A.FLOAT32, A.INT32):
    for _ex in (False, True):
        for _rev in (False, True):
            CASES[f"cumsum-{_dt}{'-exclusive' if _ex else ''}{'-reverse' if _rev else ''}"] = (
                lambda rng, d=_dt, e=_ex, r=_rev: _cumsum(rng, d, e, r))


def _topk(rng, dtype, largest):
    if dtype == A.INT32:
        x = rng.integers(-6, 6, 3 * 11 * 2).astype(np.int32)  # many ties: lower index first
    else:
        x = rng.standard_normal(3 * 11 * 2)
    op = A.TopK(("x",), ("y",), "topk", outer=3, size=11, inner=2, k=4, largest=largest, dtype=dtype)
    return Case(op, {"x": x}, {"y": (3, 4, 2)})


CASES["topk-float32-largest"] = lambda rng: _topk(rng, A.FLOAT32, True)
CASES["topk-int32-smallest-ties"] = lambda rng: _topk(rng, A.INT32, False)


def _scatter(rng, dtype, reduction):
    rows = np.array([4, -1, 0, 2], dtype=np.int32)  # distinct rows (ONNX leaves repeats undefined)
    if dtype == A.INT32:
        data, upd = rng.integers(-99, 99, (6, 5)).astype(np.int32), rng.integers(-99, 99, (4, 5)).astype(np.int32)
    else:
        data, upd = rng.standard_normal((6, 5)), rng.standard_normal((4, 5))
    op = A.Scatter(("data", "rows", "upd"), ("y",), "scatter", rows=6, inner=5, count=4, reduction=reduction,
                   dtype=dtype)
    return Case(op, {"data": data, "rows": rows, "upd": upd}, {"y": (6, 5)})


CASES["scatter-float32-none"] = lambda rng: _scatter(rng, A.FLOAT32, "none")
CASES["scatter-int32-none"] = lambda rng: _scatter(rng, A.INT32, "none")
CASES["scatter-float32-add"] = lambda rng: _scatter(rng, A.FLOAT32, "add")
CASES["scatter-float32-max"] = lambda rng: _scatter(rng, A.FLOAT32, "max")


@case("scatter-int32-add-repeated-clamped")
def _(rng):  # a reduction combines every update of a repeated row; 9 clamps to the last row, -5 wraps to 0
    rows = np.array([1, -5, 1, 9, 0, 1], dtype=np.int32)
    op = A.Scatter(("data", "rows", "upd"), ("y",), "scatter_add", rows=5, inner=3, count=len(rows), reduction="add",
                   dtype=A.INT32)
    return Case(op, {"data": rng.integers(-99, 99, (5, 3)).astype(np.int32), "rows": rows,
                     "upd": rng.integers(-99, 99, (len(rows), 3)).astype(np.int32)}, {"y": (5, 3)})

@case("scatter-int32-add-repeated-out-of-range")
def _(rng):  # rows 1, 1 (-5), 5 (9 clamped), 0 (-12 wrapped, then clamped), 1: repeats add up
    rows = np.array([1, -5, 9, -12, 1], dtype=np.int32)
    data, upd = rng.integers(-99, 99, (6, 5)).astype(np.int32), rng.integers(-99, 99, (5, 5)).astype(np.int32)
    op = A.Scatter(("data", "rows", "upd"), ("y",), "scatter_add", rows=6, inner=5, count=5, reduction="add",
                   dtype=A.INT32)
    return Case(op, {"data": data, "rows": rows, "upd": upd}, {"y": (6, 5)})


def _region(src, src_offset, src_strides, dst_offset, dst_strides, size):
    return A.Region(src, src_offset, tuple(src_strides), dst_offset, tuple(dst_strides), tuple(size))


@case("raster-transpose")
def _(rng):  # x [2,3,4] -> y [4,2,3]
    r = _region(0, 0, (0, 12, 4, 1), 0, (0, 3, 1, 6), (1, 2, 3, 4))
    op = A.Raster(("x",), ("y",), "transpose", out_shape=(4, 2, 3), regions=(r,))
    return Case(op, {"x": rng.standard_normal((2, 3, 4))}, {"y": (4, 2, 3)})


@case("raster-nchw-to-nhwc")
def _(rng):  # x [2,5,3,4] -> y [2,3,4,5]
    r = _region(0, 0, (60, 12, 4, 1), 0, (60, 1, 20, 5), (2, 5, 3, 4))
    op = A.Raster(("x",), ("y",), "to_nhwc", out_shape=(2, 3, 4, 5), regions=(r,))
    return Case(op, {"x": rng.standard_normal((2, 5, 3, 4))}, {"y": (2, 3, 4, 5)})


@case("raster-reflect-pad-negative-strides")
def _(rng):  # reflect-pad a row of 6 by 2 on each side: [x2 x1 | x0..x5 | x4 x3]
    regions = (
        _region(0, 0, (0, 0, 6, 1), 2, (0, 0, 10, 1), (1, 1, 3, 6)),   # interior of 3 rows
        _region(0, 2, (0, 0, 6, -1), 0, (0, 0, 10, 1), (1, 1, 3, 2)),  # left: x2, x1
        _region(0, 4, (0, 0, 6, -1), 8, (0, 0, 10, 1), (1, 1, 3, 2)),  # right: x4, x3
    )
    op = A.Raster(("x",), ("y",), "reflect_pad", out_shape=(3, 10), regions=regions)
    return Case(op, {"x": rng.standard_normal((3, 6))}, {"y": (3, 10)})


def _tile_regions(collide: bool):
    """Winograd's output raster in small: x [4 positions, 3 channels, 2 x 3 tiles] -> y [3, 4, 6],
    position (p, q) of tile (ti, tj) to y[c, 2 ti + p, 2 tj + q]. The regions interleave but never
    write one element twice; with ``collide`` positions (p, 0) and (p, 1) write the same elements,
    and the later region must win."""
    return tuple(_region(0, (2 * p + q) * 18, (0, 6, 3, 1), p * 6 + (0 if collide else q), (0, 24, 12, 2),
                         (1, 3, 2, 3)) for p in range(2) for q in range(2))


@case("raster-interleaved-tiles")
def _(rng):
    op = A.Raster(("x",), ("y",), "tiles_out", out_shape=(3, 4, 6), regions=_tile_regions(False))
    return Case(op, {"x": rng.standard_normal((4, 3, 2, 3))}, {"y": (3, 4, 6)})


@case("raster-colliding-regions-last-wins")
def _(rng):
    op = A.Raster(("x",), ("y",), "tiles_collide", out_shape=(3, 4, 6), regions=_tile_regions(True), fill=0.0)
    return Case(op, {"x": rng.standard_normal((4, 3, 2, 3))}, {"y": (3, 4, 6)})


@case("raster-broadcast-zero-strides")
def _(rng):  # x [3] -> y [2,4,3] (Expand / Tile)
    r = _region(0, 0, (0, 0, 0, 1), 0, (0, 12, 3, 1), (1, 2, 4, 3))
    op = A.Raster(("x",), ("y",), "expand", out_shape=(2, 4, 3), regions=(r,))
    return Case(op, {"x": rng.standard_normal(3)}, {"y": (2, 4, 3)})


@case("raster-concat-3-inputs")
def _(rng):  # concat along axis 1: [2,3,4] + [2,1,4] + [2,2,4] -> [2,6,4]
    regions = (
        _region(0, 0, (0, 0, 12, 1), 0, (0, 0, 24, 1), (1, 1, 2, 12)),
        _region(1, 0, (0, 0, 4, 1), 12, (0, 0, 24, 1), (1, 1, 2, 4)),
        _region(2, 0, (0, 0, 8, 1), 16, (0, 0, 24, 1), (1, 1, 2, 8)),
    )
    op = A.Raster(("a", "b", "c"), ("y",), "concat", out_shape=(2, 6, 4), regions=regions)
    return Case(op, {"a": rng.standard_normal((2, 3, 4)), "b": rng.standard_normal((2, 1, 4)),
                     "c": rng.standard_normal((2, 2, 4))}, {"y": (2, 6, 4)}, {"c"})


@case("raster-concat-contiguous")
def _(rng):  # concat along axis 0 (each region one contiguous run) of rows sliced from the inputs
    regions = (
        _region(0, 4, (0, 0, 4, 1), 0, (0, 0, 4, 1), (1, 1, 2, 4)),   # rows 1..2 of a
        _region(1, 0, (0, 0, 0, 1), 8, (0, 0, 0, 1), (1, 1, 1, 12)),  # all of b
    )
    op = A.Raster(("a", "b"), ("y",), "concat0", out_shape=(5, 4), regions=regions)
    return Case(op, {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal((3, 4))}, {"y": (5, 4)})


@case("raster-pad-fill")
def _(rng):  # constant pad of [2,3,4] by 1 in H, W with 0.5
    r = _region(0, 0, (0, 12, 4, 1), 7, (0, 30, 6, 1), (1, 2, 3, 4))
    op = A.Raster(("x",), ("y",), "pad", out_shape=(2, 5, 6), regions=(r,), fill=0.5)
    return Case(op, {"x": rng.standard_normal((2, 3, 4))}, {"y": (2, 5, 6)})


@case("raster-int32-pad-fill")
def _(rng):  # int32 words copied exactly (denormal bit patterns included), fill written as an int
    r = _region(0, 0, (0, 12, 4, 1), 7, (0, 30, 6, 1), (1, 2, 3, 4))
    op = A.Raster(("x",), ("y",), "pad_int", out_shape=(2, 5, 6), regions=(r,), fill=-7.0, dtype=A.INT32)
    return Case(op, {"x": rng.integers(-2**31, 2**31 - 1, (2, 3, 4)).astype(np.int32)}, {"y": (2, 5, 6)})


@case("raster-int32-transpose")
def _(rng):
    r = _region(0, 0, (0, 12, 4, 1), 0, (0, 3, 1, 6), (1, 2, 3, 4))
    op = A.Raster(("x",), ("y",), "transpose_int", out_shape=(4, 2, 3), regions=(r,), dtype=A.INT32)
    return Case(op, {"x": rng.integers(-2**31, 2**31 - 1, (2, 3, 4)).astype(np.int32)}, {"y": (4, 2, 3)})


@case("raster-slice-partial-no-fill")
def _(rng):  # write every other column; the rest keeps the output's prior contents
    r = _region(0, 2, (0, 0, 9, 2), 1, (0, 0, 8, 2), (1, 1, 5, 4))  # reads x[2 .. 44]: stays inside x
    op = A.Raster(("x",), ("y",), "strided_slice", out_shape=(5, 8), regions=(r,))
    return Case(op, {"x": rng.standard_normal((5, 9))}, {"y": (5, 8)})


def _recurrent_cell(rng, cell: str, acts: tuple[str, ...], directions: int = 2, clip: float = 0.0,
                    lengths: bool = False, **flags) -> Case:
    """One RecurrentCell step at B=3, H=5, reading a projection of 4 steps (layout 0) at the steps'
    offsets (the reverse direction at another step, as a bidirectional lowering does)."""
    b, h, seq = 3, 5, 4
    blocks, per = A.CELLS[cell]
    probe = A.RecurrentCell((), (), "", cell=cell, directions=directions, **flags)
    width = directions * blocks * h
    steps = (1, seq - 2)[:directions]
    activations = tuple((name, float(rng.uniform(0.3, 1.5)), float(rng.uniform(-0.5, 0.5)))
                        for d in range(directions) for name in acts[d * per:(d + 1) * per])
    inputs = {"gates": rng.standard_normal((directions, b, probe.gate_blocks * h)),
              "projection": rng.standard_normal((seq * b, width)),
              "state": rng.standard_normal((probe.state_blocks, directions, b, h))}
    extra = {"candidate": (directions, b, h), "recurrent_bias": (directions, h), "peephole": (directions, 3 * h)}
    op = A.RecurrentCell((), ("y",), f"cell_{cell}", cell=cell, directions=directions, batch=b, hidden=h,
                         x_offsets=tuple(t * b * width + d * blocks * h for d, t in enumerate(steps)),
                         x_row_stride=width, steps=steps, activations=activations, clip=clip,
                         has_lengths=lengths, **flags)
    for role in op.input_roles():
        if role in extra:
            inputs[role] = rng.standard_normal(extra[role])
    if lengths:
        inputs["lengths"] = np.array([0, 2, 4], dtype=np.int32)  # rows 0 (and 1 for the step at 2) keep
    op = dataclasses.replace(op, inputs=op.input_roles())
    return Case(op, inputs, {"y": (op.output_blocks, directions, b, h)})


_LSTM = ("sigmoid", "tanh", "tanh")
CASES["recurrent_cell-lstm-bidir"] = lambda rng: _recurrent_cell(rng, "lstm", _LSTM * 2)
CASES["recurrent_cell-lstm-peephole-clip-lengths"] = lambda rng: _recurrent_cell(
    rng, "lstm", _LSTM + ("hardsigmoid", "relu", "softsign"), clip=0.7, lengths=True, has_peephole=True)
CASES["recurrent_cell-lstm-input_forget-forward"] = lambda rng: _recurrent_cell(
    rng, "lstm", _LSTM, directions=1, input_forget=True, has_peephole=True)
CASES["recurrent_cell-gru-linear_before_reset"] = lambda rng: _recurrent_cell(
    rng, "gru", ("sigmoid", "tanh") * 2, linear_before_reset=True, has_recurrent_bias=True, lengths=True)
CASES["recurrent_cell-gru-linear_before_reset-nobias"] = lambda rng: _recurrent_cell(
    rng, "gru", ("sigmoid", "tanh", "hardsigmoid", "scaledtanh"), clip=1.5, linear_before_reset=True)
CASES["recurrent_cell-gru-candidate"] = lambda rng: _recurrent_cell(rng, "gru", ("sigmoid", "tanh") * 2, lengths=True)
CASES["recurrent_cell-gru_reset"] = lambda rng: _recurrent_cell(rng, "gru_reset", ("sigmoid", "hardsigmoid"), clip=0.9)
for _act in A.CELL_ACTIVATIONS:  # every activation, in both directions' positions, with alpha/beta
    _other = A.CELL_ACTIVATIONS[(A.CELL_ACTIVATIONS.index(_act) + 1) % len(A.CELL_ACTIVATIONS)]
    CASES[f"recurrent_cell-rnn-{_act}"] = lambda rng, a=_act, o=_other: _recurrent_cell(rng, "rnn", (a, o))


CASE_IDS = sorted(CASES)


def test_case_table_covers_every_atomic_op():
    kinds = {type(CASES[name](np.random.default_rng(0)).op) for name in CASE_IDS}
    assert kinds == set(A.ALL_OPS)


#: Cases a GPU backend's kernels do not run yet: the backend must refuse them (so sessions place
#: them on the CPU), and a case that starts to run is taken off (strict). TopK stays on the CPU by
#: design (a selection per row is serial work a GPU kernel does not pay for at these sizes).
CPU_ONLY = {name for name in CASES if name.startswith("topk-")}
_INT_AND_NEW = {name for name in CASES if any(name.startswith(p) for p in (
    "unary-int32-", "cast-", "binary-int32-", "reduce-int32-", "reduce-arg", "select-", "cumsum-", "scatter-",
    "raster-int32-", "unary-not", "unary-nonzero"))} | {f"binary-{b}-bcast" for b in A.BOOL_BINARY_OPS}

#: per backend family (one line each: the OpenCL and GLSL kernels are written separately); the GPU
#: APIs pool a QDQ model's GlobalAveragePool in float (``precision.int8_global_average_pool``)
_FLOAT_ON_GPUS = {name for name in CASES if name.startswith("quantized_global_average_pool-")}
#: and quantize in the five ops (``precision.one_pass_quantize``)
_FLOAT_ON_GPUS |= {name for name in CASES if name.startswith("quantize-")}
AWAITING_OPENCL: set[str] = set(_FLOAT_ON_GPUS)

AWAITING_GLSL: set[str] = set(_FLOAT_ON_GPUS)  # vulkan and gl

AWAITING_GPU_KERNELS = {"opencl": AWAITING_OPENCL, "vulkan": AWAITING_GLSL, "gl": AWAITING_GLSL, "cuda": _FLOAT_ON_GPUS}


@pytest.mark.parametrize("name", CASE_IDS)
def test_atomic_op(backend, cpu, name):
    seed = CASE_IDS.index(name)
    reason = backend.unsupported_reason(CASES[name](np.random.default_rng(seed)).op)
    if name in CPU_ONLY or name in AWAITING_GPU_KERNELS.get(backend.name, ()):
        if reason is not None:
            pytest.xfail(f"{backend.name} refuses it (placed on the CPU): {reason}")
        assert name not in CPU_ONLY, f"{backend.name} runs {name}: take it off CPU_ONLY"
    assert reason is None, f"{backend.name} does not support {name}: {reason}"
    check(backend, cpu, CASES[name](np.random.default_rng(seed)), seed)


#: GEMMs with too few tiles for the device: the tiled family splits their inner dimension
#: (cl_plans.k_splits) and sums the slices in a second kernel
SPLIT_K_CASES = {
    "classifier-gemv": lambda rng: _matmul(rng, batch=1, m=1, n=300, k=700, trans_b=True, bias="row",
                                           activation=("gelu", ()), const_b=True),
    "batched-fullbias-alpha": lambda rng: _matmul(rng, batch=2, m=9, n=20, k=333, bias="full", alpha=0.5, beta=2.0),
    "conv-few-pixels-stride2": lambda rng: _conv(rng, n=2, c=40, hw=(6, 6), oc=24, k=(3, 3), s=(2, 2), p=(1, 1),
                                                 bias=True, act=("relu", ())),
    "conv-1x1-few-pixels-groups": lambda rng: _conv(rng, c=256, hw=(3, 3), oc=64, k=(1, 1), g=2, bias=True),
    "deconv-deep": lambda rng: _deconv(rng, c=96, hw=(3, 3), oc=4, k=(3, 3), s=(2, 2), bias=True),
}


@pytest.mark.parametrize("name", sorted(SPLIT_K_CASES))
def test_split_k_gemms_agree(cpu, name):
    """The split-K path of the shared OpenCL C / CUDA GEMM (slices into scratch, then a sum with alpha,
    bias and activation), on a device made to look like a GPU with many compute units: tiled
    kernels, and compute units that outnumber the tiles of every case here."""
    targets = running(("opencl", "cuda"))
    if not targets:
        pytest.skip("neither opencl nor cuda is available here")
    for target in targets:
        be = create_backend(target, **({"kernels": "tiled"} if target == "opencl" else {}))
        try:
            be.compute_units = 256
            case_ = SPLIT_K_CASES[name](np.random.default_rng(7))
            pool, _, ins, outs = _prepare(be, case_, {n: np.zeros(s, np.float32) for n, s in case_.outputs.items()})
            assert "split-K" in be.create_execution(case_.op, ins, outs).scheme
            be.release(pool)
            check(be, cpu, case_, 7)
        finally:
            be.close()


#: one-row products for the matrix-vector kernels (scheme ``gemv``: gemv.cl, gemv.comp) at odd
#: sizes: K not a multiple of the lanes, both weight layouts, every bias layout, a batch of vectors
#: with a weight each and with one shared
GEMV_CASES = {
    "classifier-transposed-relu": lambda rng: _matmul(rng, batch=1, m=1, n=1000, k=513, trans_b=True, bias="row",
                                                      activation=("relu", ()), const_b=True),
    "row-major-fullbias-alpha-beta": lambda rng: _matmul(rng, batch=1, m=1, n=77, k=301, bias="full",
                                                         alpha=0.5, beta=2.0),
    "short-k": lambda rng: _matmul(rng, batch=1, m=1, n=33, k=3, trans_b=True),
    "few-columns-long-k": lambda rng: _matmul(rng, batch=1, m=1, n=10, k=3001, trans_b=True, bias="row"),
    "batched-trans-a-b-colbias-gelu": lambda rng: _matmul(rng, batch=3, m=1, n=45, k=259, trans_a=True, trans_b=True,
                                                          bias="col", activation=("gelu", ())),
    "batched-shared-weight-sigmoid": lambda rng: _matmul(rng, batch=3, m=1, n=50, k=70, shared=True, bias="row",
                                                         activation=("sigmoid", ()), const_b=True),
}

#: the GPU variant of every kernel family, where the gemv kernels are
GEMV_BACKENDS = ("opencl:kernels=tiled", "vulkan:kernels=tiled", "gl:kernels=tiled", "cuda")


@pytest.fixture(scope="module", params=GEMV_BACKENDS)
def gpu_family_backend(request):
    name, _, option = request.param.partition(":")
    require_backend(name)
    be = create_backend(name, **(dict([option.split("=", 1)]) if option else {}))
    yield be
    be.close()


@pytest.mark.parametrize("name", sorted(GEMV_CASES))
def test_gemv_products_agree(gpu_family_backend, cpu, name):
    """The matrix-vector kernels of both GPU kernel families against the reference."""
    be = gpu_family_backend
    case_ = GEMV_CASES[name](np.random.default_rng(11))
    case_ = dataclasses.replace(case_, op=dataclasses.replace(case_.op, scheme="gemv"))
    assert be.unsupported_reason(case_.op) is None
    pool, _, ins, outs = _prepare(be, case_, {n: np.zeros(s, np.float32) for n, s in case_.outputs.items()})
    assert be.create_execution(case_.op, ins, outs).scheme.startswith("gemv")
    be.release(pool)
    check(be, cpu, case_, 11)


@pytest.mark.parametrize("name", ["classifier-transposed-relu", "row-major-fullbias-alpha-beta",
                                  "batched-trans-a-b-colbias-gelu"])
def test_split_k_gemv_agrees(cpu, name):
    """The OpenCL C matrix-vector kernel split over K (slices into scratch, then gemv_split_sum with
    alpha, bias and activation), on a device made to look like a GPU with many compute units."""
    targets = running(("opencl", "cuda"))
    if not targets:
        pytest.skip("neither opencl nor cuda is available here")
    for target in targets:
        be = create_backend(target, **({"kernels": "tiled"} if target == "opencl" else {}))
        try:
            be.compute_units = 256
            case_ = GEMV_CASES[name](np.random.default_rng(5))
            case_ = dataclasses.replace(case_, op=dataclasses.replace(case_.op, scheme="gemv"))
            pool, _, ins, outs = _prepare(be, case_, {n: np.zeros(s, np.float32) for n, s in case_.outputs.items()})
            assert be.create_execution(case_.op, ins, outs).scheme.startswith("gemv/split-K")
            be.release(pool)
            check(be, cpu, case_, 5)
        finally:
            be.close()


def test_gemv_runs_where_no_gemv_kernel_is():
    """A ``gemv`` op placed on a backend without the kernel (the cpu, a CPU-device family) runs as
    the GEMM it is (``backends.base.SCHEME_FALLBACKS``)."""
    case_ = GEMV_CASES["short-k"](np.random.default_rng(0))
    op = dataclasses.replace(case_.op, scheme="gemv")
    assert CpuBackend(threads=1).unsupported_reason(op) is None
    assert CpuBackend(threads=1).unsupported_reason(dataclasses.replace(op, scheme="strassen")) is not None


def test_every_case_runs_on_the_cpu(cpu):
    """The NumPy backend is the reference and the fallback: it runs every case, int32 ones included."""
    for name in CASE_IDS:
        case_ = CASES[name](np.random.default_rng(0))
        assert cpu.unsupported_reason(case_.op) is None, name
        garbage = {n: np.zeros(s, np.dtype(case_.output_dtype(n))) for n, s in case_.outputs.items()}
        run_case(cpu, case_, garbage)


# --------------------------------------------------------------------------------------------
# Recorded runs allocate and build nothing
# --------------------------------------------------------------------------------------------

def test_recorded_run_changes_only_submits(backend):
    """conv -> residual add+relu -> raster transpose in one pool, recorded once, submitted thrice."""
    rng = np.random.default_rng(7)
    conv = _conv(rng, c=4, hw=(6, 6), oc=4, k=(3, 3), p=(1, 1), bias=True)
    add = A.Binary(("y", "x"), ("z",), "add", op="add", out_shape=(1, 4, 6, 6), a_strides=(144, 36, 6, 1),
                   b_strides=(144, 36, 6, 1), activation=("relu", ()))
    perm = A.Raster(("z",), ("t",), "transpose", out_shape=(1, 6, 6, 4),
                    regions=(_region(0, 0, (0, 36, 6, 1), 0, (0, 1, 24, 4), (1, 4, 6, 6)),))
    case_ = Case(conv.op, conv.inputs, {"y": (1, 4, 6, 6), "z": (1, 4, 6, 6), "t": (1, 6, 6, 4)},
                 conv.constants)
    garbage = {n: np.zeros(s, np.float32) for n, s in case_.outputs.items()}
    pool, handles, _, _ = _prepare(backend, case_, garbage)
    exes = [backend.create_execution(op, [handles[n] for n in op.inputs], [handles[n] for n in op.outputs])
            for op in (conv.op, add, perm)]
    recording = backend.record(exes)
    backend.submit(recording)  # warm-up (a driver may finish lazy compilation here)
    first = backend.read(handles["t"])
    before = dict(backend.counters)
    backend.submit(recording)
    backend.submit(recording)
    after = dict(backend.counters)
    assert after["submits"] == before["submits"] + 2
    assert {k: v for k, v in after.items() if k != "submits"} == {k: v for k, v in before.items() if k != "submits"}
    np.testing.assert_array_equal(backend.read(handles["t"]), first)
    backend.release(pool)


def test_programs_are_cached_in_memory(backend):
    rng = np.random.default_rng(3)
    c = _conv(rng, c=3, hw=(5, 5), oc=2, k=(3, 3), p=(1, 1))
    garbage = {"y": np.zeros(c.outputs["y"], np.float32)}
    run_case(backend, c, garbage)
    built = backend.counters["programs_built"]
    run_case(backend, c, garbage)
    run_case(backend, c, garbage, eager=True)
    assert backend.counters["programs_built"] == built


def test_opencl_programs_cached_on_disk(monkeypatch, tmp_path):
    """A second OpenCL backend (as in a new process) loads binaries instead of building."""
    require_backend("opencl")
    monkeypatch.setenv("GPUMNN_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(11)
    c = _conv(rng, c=3, hw=(5, 5), oc=4, k=(3, 3), p=(1, 1), bias=True)
    garbage = {"y": np.zeros(c.outputs["y"], np.float32)}
    first = create_backend("opencl")
    try:
        run_case(first, c, garbage)
        assert first.counters["programs_built"] >= 1
    finally:
        first.close()
    assert list(tmp_path.rglob("*.bin")), "no program binary was written to the cache"
    second = create_backend("opencl")
    try:
        run_case(second, c, garbage)
        assert second.counters["programs_built"] == 0
    finally:
        second.close()


def test_raster_cases_stay_inside_their_tensors():
    """A region reading past its source would compare uninitialised memory between backends."""
    for name in CASE_IDS:
        case = CASES[name](np.random.default_rng(0))
        if not isinstance(case.op, A.Raster):
            continue
        out_size = int(np.prod(case.op.out_shape))
        for r in case.op.regions:
            src_size = case.inputs[case.op.inputs[r.src]].size
            for offset, strides, limit in ((r.src_offset, r.src_strides, src_size), (r.dst_offset, r.dst_strides, out_size)):
                lo = offset + sum((n - 1) * s for n, s in zip(r.size, strides) if s < 0)
                hi = offset + sum((n - 1) * s for n, s in zip(r.size, strides) if s > 0)
                assert 0 <= lo and hi < limit, f"{name}: region {r} leaves its tensor"


# --------------------------------------------------------------------------------------------
# Narrow storage (float16, int8, uint8): every GPU backend bit-exact against NumPy
# --------------------------------------------------------------------------------------------
# The element-moving ops and the conversions run on tensors of every storage dtype, checked
# against NumPy directly (so these cases stand without the cpu backend). Tensors start at
# 4-byte boundaries that are not the device's binding alignment, regions start at elements that
# are not multiples of 4, and every byte of the pool outside the outputs' elements must come out
# as it went in: a packed kernel that writes whole words must keep its neighbours' bytes.

#: the GPU backends with each path of narrow storage: both kernel families, and Vulkan both with
#: its 8-/16-bit storage (lavapipe has both) and forced to hold narrow tensors packed in words
NARROW_BACKEND_PARAMS = BACKEND_PARAMS + ["vulkan:narrow_storage=packed"]
NARROW_DTYPES = (A.FLOAT16, A.INT8, A.UINT8)


@pytest.fixture(scope="module", params=NARROW_BACKEND_PARAMS)
def narrow_backend(request):
    name, _, option = request.param.partition(":")
    require_backend(name)
    be = create_backend(name, **(dict([option.split("=", 1)]) if option else {}))
    yield be
    be.close()


@dataclass
class NarrowCase:
    """An op on tensors of any storage dtype: ``inputs`` are arrays in their storage dtype,
    ``outputs`` name -> (shape, dtype), ``expect(inputs, garbage)`` the outputs NumPy gives."""

    op: A.AtomicOp
    inputs: dict[str, np.ndarray]
    outputs: dict[str, tuple[tuple[int, ...], str]]
    expect: Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], dict[str, np.ndarray]]


def _random_elements(rng, shape, dtype: str) -> np.ndarray:
    """Random bits of ``dtype`` (any float16 pattern: NaNs, infinities, subnormals; they are
    copied, never computed on)."""
    size = A.ITEMSIZE[dtype]
    return rng.integers(0, 2 ** (8 * size), shape, dtype=np.uint64).astype(f"u{size}").view(dtype)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")


def run_narrow_case(be, case: NarrowCase, seed: int, eager: bool, align: int = 4) -> None:
    """Run ``case`` with its tensors on ``align``-byte boundaries (4: off the device's binding
    alignment) and check its outputs and every other byte of the pool."""
    rng = np.random.default_rng(seed)
    names = list(case.inputs) + list(case.outputs)
    dtypes = {**{n: a.dtype.name for n, a in case.inputs.items()}, **{n: d for n, (_, d) in case.outputs.items()}}
    shapes = {**{n: a.shape for n, a in case.inputs.items()}, **{n: s for n, (s, _) in case.outputs.items()}}
    starts, at = {}, 28  # byte offsets: on words, off the binding alignment unless ``align`` says so
    for k, name in enumerate(names):
        at = -(-at // align) * align
        starts[name] = at
        at += -(-A.ITEMSIZE[dtypes[name]] * max(int(np.prod(shapes[name])), 1) // 4) * 4 + 4 * (k % 3 + 1)
    pool = be.allocate(at + 64)
    whole = be.tensor(pool, 0, (at + 64,), A.UINT8)
    before = rng.integers(0, 256, at + 64, dtype=np.uint8)
    be.write(whole, before)
    handles = {n: be.tensor(pool, starts[n] // A.ITEMSIZE[dtypes[n]], shapes[n], dtypes[n]) for n in names}
    for n in names:
        assert handles[n].nbytes == A.ITEMSIZE[dtypes[n]] * int(np.prod(shapes[n]))
    garbage = {n: _random_elements(rng, s, d) for n, (s, d) in case.outputs.items()}
    for n, a in {**case.inputs, **garbage}.items():
        be.write(handles[n], a)
    assert be.unsupported_reason(case.op) is None, be.unsupported_reason(case.op)
    exe = be.create_execution(case.op, [handles[n] for n in case.op.inputs], [handles[n] for n in case.op.outputs])
    if eager:
        be.run_eager([exe])
    else:
        be.submit(be.record([exe]))
    expected = case.expect(case.inputs, garbage)
    mode = "eager" if eager else "recorded"
    for n in case.outputs:
        got = be.read(handles[n])
        assert got.dtype == np.dtype(dtypes[n]) and got.shape == tuple(shapes[n])
        np.testing.assert_array_equal(_bits(got), _bits(expected[n].astype(dtypes[n])),
                                      err_msg=f"{be.name} {mode} {case.op.source}: output {n}")
    after = be.read(whole)
    for n, a in case.inputs.items():  # the bytes written since
        before[starts[n]:starts[n] + a.nbytes] = _bits(a).view(np.uint8).reshape(-1)
    untouched = np.ones(at + 64, bool)
    for n in case.outputs:
        untouched[starts[n]:starts[n] + handles[n].nbytes] = False
    np.testing.assert_array_equal(after[untouched], before[untouched],
                                  err_msg=f"{be.name} {mode} {case.op.source}: bytes outside the outputs changed")
    be.release(pool)


def _raster_reference(op: A.Raster, inputs: list[np.ndarray], out: np.ndarray) -> np.ndarray:
    out = out.copy().reshape(-1)
    if op.fill is not None:
        out[:] = np.array(A.fill_bits(op.fill, out.dtype.name), f"u{out.dtype.itemsize}").view(out.dtype)
    for r in op.regions:
        src = inputs[r.src].reshape(-1)
        for index in np.ndindex(*r.size):
            out[r.dst_offset + np.dot(index, r.dst_strides)] = src[r.src_offset + np.dot(index, r.src_strides)]
    return out.reshape(op.out_shape)


NARROW_CASES: dict[str, Callable[[np.random.Generator], NarrowCase]] = {}


def _raster_case(dtype: str, regions, out_shape, in_shapes, fill=None):
    def make(rng):
        inputs = {f"x{k}": _random_elements(rng, s, dtype) for k, s in enumerate(in_shapes)}
        op = A.Raster(tuple(inputs), ("y",), f"raster_{dtype}", out_shape=out_shape, regions=tuple(regions),
                      fill=fill, dtype=dtype)
        return NarrowCase(op, inputs, {"y": (out_shape, dtype)},
                          lambda ins, g: {"y": _raster_reference(op, list(ins.values()), g["y"])})
    return make


for _dt in A.STORAGE_DTYPES:
    # a contiguous run from element 3 to element 5 (odd sizes: a packed run starts and ends mid-word)
    NARROW_CASES[f"raster-{_dt}-run"] = _raster_case(_dt, [A.Region(0, 3, (0, 0, 0, 1), 5, (0, 0, 0, 1), (1, 1, 1, 37))],
                                                     (45,), [(41,)])
    # a transpose [5, 7] -> [7, 5]: a strided destination, written element by element
    NARROW_CASES[f"raster-{_dt}-transpose"] = _raster_case(
        _dt, [A.Region(0, 1, (0, 0, 1, 7), 2, (0, 0, 5, 1), (1, 1, 7, 5))], (38,), [(36,)])
    # broadcast (source stride 0) and reversal (negative stride) into rows of 9 of an 11-wide output
    NARROW_CASES[f"raster-{_dt}-broadcast-reverse"] = _raster_case(
        _dt, [A.Region(0, 12, (0, 0, 0, -1), 1, (0, 0, 11, 1), (1, 1, 3, 9))], (3, 11), [(13,)])
    # a pad: fill, then the rows of the source in the middle, and a concat of a second source
    NARROW_CASES[f"raster-{_dt}-fill-pad-concat"] = _raster_case(
        _dt, [A.Region(0, 0, (0, 0, 5, 1), 8, (0, 0, 7, 1), (1, 1, 3, 5)),
              A.Region(1, 1, (0, 0, 0, 1), 30, (0, 0, 0, 1), (1, 1, 1, 5))], (5, 7), [(3, 5), (6,)], fill=-3.0)


def _gather_case(dtype: str):
    def make(rng):
        data, idx = _random_elements(rng, (3, 5, 3), dtype), np.array([4, -1, 0, 2, -5, 9, 1], np.int32)
        op = A.Gather(("data", "idx"), ("y",), f"gather_{dtype}", outer=3, axis=5, inner=3, count=7, dtype=dtype)
        return NarrowCase(op, {"data": data, "idx": idx}, {"y": ((3, 7, 3), dtype)},
                          lambda ins, g: {"y": ins["data"][:, np.clip(np.where(idx < 0, idx + 5, idx), 0, 4), :]})
    return make


def _select_case(dtype: str):
    def make(rng):
        c = rng.integers(0, 2, (3, 5)).astype(np.int32)
        a, b = _random_elements(rng, (2, 3, 5, 3), dtype), _random_elements(rng, (3,), dtype)
        shape = (2, 3, 5, 3)
        op = A.Select(("c", "a", "b"), ("y",), f"select_{dtype}", out_shape=shape, c_strides=(0, 5, 1, 0),
                      a_strides=(45, 15, 3, 1), b_strides=(0, 0, 0, 1), dtype=dtype)
        return NarrowCase(op, {"c": c, "a": a, "b": b}, {"y": (shape, dtype)},
                          lambda ins, g: {"y": np.where(c[None, :, :, None] != 0, a, b[None, None, None, :])})
    return make


def _scatter_case(dtype: str):
    def make(rng):
        rows = np.array([4, -1, 0, 2], np.int32)  # distinct rows
        data, upd = _random_elements(rng, (7, 3), dtype), _random_elements(rng, (4, 3), dtype)

        def expect(ins, g):
            out = data.copy()
            out[np.where(rows < 0, rows + 7, rows)] = upd
            return {"y": out}
        op = A.Scatter(("data", "rows", "upd"), ("y",), f"scatter_{dtype}", rows=7, inner=3, count=4, dtype=dtype)
        return NarrowCase(op, {"data": data, "rows": rows, "upd": upd}, {"y": ((7, 3), dtype)}, expect)
    return make


for _dt in NARROW_DTYPES:
    NARROW_CASES[f"gather-{_dt}"] = _gather_case(_dt)
    NARROW_CASES[f"select-{_dt}"] = _select_case(_dt)
    NARROW_CASES[f"scatter-{_dt}-none"] = _scatter_case(_dt)


def _conversion_input(rng, src: str, dst: str) -> np.ndarray:
    """Values of ``src`` whose conversion to ``dst`` the contract defines, with the corners:
    float16 ties, overflow and subnormals; 8-bit wrap-around; truncation toward zero."""
    if src == A.FLOAT32:
        if dst == A.FLOAT16:
            corners = [65504.0, 65519.0, 65520.0, -70000.0, 1e30, 1.0 + 2**-11, 1.0 + 3 * 2**-11, 2049.0, 2051.0,
                       2.0**-24, 2.0**-25, 1.5 * 2**-25, 3 * 2**-26, 1e-9, -0.0, np.inf, -np.inf, 6.1e-5, 6.2e-5]
            return np.concatenate([corners, rng.standard_normal(80) * 300, rng.standard_normal(40) * 1e-5]).astype(np.float32)
        corners = [-0.9, 0.9, -1.5, 127.9, 128.2, -128.7, -129.3, 255.5, 256.0, -256.5, 1e9, -2e9, 70000.5]
        return np.concatenate([corners, rng.uniform(-3000, 3000, 80)]).astype(np.float32)
    if src == A.FLOAT16:
        x = rng.integers(0, 2**16, 300, dtype=np.uint32).astype(np.uint16).view(np.float16)
        if dst in (A.FLOAT32, A.FLOAT16):
            return x[~np.isnan(x)]
        return x[np.isfinite(x)]
    if src == A.INT32:
        if dst == A.FLOAT32:
            return rng.integers(-2**24, 2**24, 100).astype(np.int32)  # exact in float32
        corners = [0, -1, 127, 128, 255, 256, -128, -129, 65504, 65519, 65520, -70000, 2**31 - 1, -2**31]
        return np.concatenate([corners, rng.integers(-70000, 70000, 60), rng.integers(-2**31, 2**31, 40)]).astype(np.int32)
    return np.arange(256).astype(np.uint8).view(src)


def _convert_reference(x: np.ndarray, dst: str) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        if np.dtype(dst).kind in "iu":
            return x.astype(np.int64).astype(dst)  # truncation toward zero, then wrap-around
        return x.astype(dst)


def _conversion_case(src: str, dst: str):
    def make(rng):
        x = _conversion_input(rng, src, dst)
        op = A.Unary(("x",), ("y",), f"cast_{src}_{dst}", op="identity", count=x.size, dtype=src,
                     out_dtype="" if dst == src else dst)
        return NarrowCase(op, {"x": x}, {"y": (x.shape, dst)}, lambda ins, g: {"y": _convert_reference(x, dst)})
    return make


for _src in A.STORAGE_DTYPES:
    for _dst in A.STORAGE_DTYPES:
        if {_src, _dst} & set(NARROW_DTYPES):
            NARROW_CASES[f"convert-{_src}-to-{_dst}"] = _conversion_case(_src, _dst)

NARROW_CASE_IDS = sorted(NARROW_CASES)


@pytest.mark.parametrize("name", NARROW_CASE_IDS)
def test_narrow_storage_op(narrow_backend, name):
    for k, eager in enumerate((False, True)):
        run_narrow_case(narrow_backend, NARROW_CASES[name](np.random.default_rng(7)), seed=k, eager=eager)


def test_narrow_cases_cover_the_contract():
    """Every narrow op kind, every conversion pair with a narrow side and every raster case of every dtype."""
    kinds = {type(NARROW_CASES[n](np.random.default_rng(0)).op).__name__.lower() for n in NARROW_CASE_IDS}
    assert kinds == set(A.NARROW_OPS)
    conversions = [n for n in NARROW_CASE_IDS if n.startswith("convert-")]
    assert len(conversions) == len(A.STORAGE_DTYPES) ** 2 - 4  # all but float32/int32 among themselves


def test_narrow_arithmetic_goes_to_the_cpu(backend):
    """A backend lists the narrow dtypes only for the ops it has kernels for: arithmetic on them
    is refused (placement then runs it on the cpu, which says why), but for the float16 storage of
    precision="fp16" where the backend's kernels take it."""
    for dtype in NARROW_DTYPES:
        op = A.Binary(("a", "b"), ("y",), "add", op="add", out_shape=(1, 1, 1, 4), a_strides=(0, 0, 0, 1),
                      b_strides=(0, 0, 0, 1), dtype=dtype)
        if dtype == A.FLOAT16 and A.FLOAT16 in backend.dtypes.get(A.Binary, ()):
            assert backend.unsupported_reason(op) is None
        else:
            assert dtype in (backend.unsupported_reason(op) or "")


def test_narrow_storage_is_valid_vulkan(vulkan_validation):
    """The 8-/16-bit storage features enabled at device creation, the native and the packed
    kernels and their barriers are valid Vulkan (the validation layer, synchronization included).
    Tensors lie on the backend's alignment, as a session's pool layout puts them: a dispatch binds
    from there, and the synchronization checks take the whole bound window as accessed."""
    for narrow_storage in ("auto", "packed"):
        be = create_backend("vulkan", narrow_storage=narrow_storage)
        try:
            for k, name in enumerate(NARROW_CASE_IDS):
                run_narrow_case(be, NARROW_CASES[name](np.random.default_rng(7)), seed=k, eager=k % 2 == 1,
                                align=be.alignment)
        finally:
            be.close()
    vulkan_validation.check()
