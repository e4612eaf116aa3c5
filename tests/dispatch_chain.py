"""The workload the GLSL backends' own tests share: a small chain of atomic ops
(conv -> add+relu -> concat -> pool -> in-place sigmoid -> matmul -> softmax) laid into one pool,
its NumPy-backend reference, the check that replaying a recording creates nothing, and the
kernel variants that must compile for OpenGL too.
"""
from __future__ import annotations

import math

import numpy as np

from conftest import rel_l2
from gpumnn import atomic as A
from gpumnn.backends.base import COUNTERS
from gpumnn.backends.cpu.backend import CpuBackend

ZERO = {name: 0 for name in COUNTERS if name != "submits"}  # every counter but submits stays put

CHAIN = [
    A.Conv2D(("x", "w", "b"), ("y",), "conv", batch=1, in_channels=8, in_hw=(12, 12), out_channels=8, out_hw=(12, 12),
             kernel=(3, 3), pads=(1, 1), has_bias=True, activation=("relu", ())),
    A.Binary(("y", "x"), ("z",), "add", op="add", out_shape=(1, 8, 12, 12), a_strides=(1152, 144, 12, 1),
             b_strides=(1152, 144, 12, 1), activation=("relu", ())),
    A.Raster(("z", "y"), ("c",), "concat", out_shape=(1, 16, 12, 12), regions=(
        A.Region(0, 0, (0, 0, 0, 1), 0, (0, 0, 0, 1), (1, 1, 1, 1152)),
        A.Region(1, 0, (0, 0, 0, 1), 1152, (0, 0, 0, 1), (1, 1, 1, 1152)))),
    A.Pool2D(("c",), ("p",), "pool", op="max", batch=1, channels=16, in_hw=(12, 12), out_hw=(6, 6), kernel=(2, 2),
             strides=(2, 2)),
    A.Unary(("p",), ("p",), "sigmoid", op="sigmoid", count=576),
    A.MatMul(("p", "m"), ("q",), "fc", batch=16, m=6, n=5, k=6, a_batch_stride=36, b_batch_stride=0),
    A.Softmax(("q",), ("s",), "softmax", outer=16 * 6, size=5, inner=1),
]
SHAPES = {"x": (1, 8, 12, 12), "y": (1, 8, 12, 12), "z": (1, 8, 12, 12), "c": (1, 16, 12, 12), "p": (1, 16, 6, 6),
          "q": (16, 6, 5), "s": (16, 6, 5)}
_rng = np.random.default_rng(7)
CONSTANTS = {"w": _rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2,
             "b": _rng.standard_normal(8).astype(np.float32), "m": _rng.standard_normal((6, 5)).astype(np.float32)}
X = _rng.standard_normal(SHAPES["x"]).astype(np.float32)


def build(be):
    align = be.alignment // 4
    offset, offsets = align, {}
    for name, shape in SHAPES.items():
        offsets[name] = offset
        offset += -(-math.prod(shape) // align) * align
    pool = be.allocate(4 * offset)
    handles = {n: be.tensor(pool, offsets[n], s) for n, s in SHAPES.items()}
    handles.update({n: be.constant(a) for n, a in CONSTANTS.items()})
    executions = [be.create_execution(op, [handles[i] for i in op.inputs], [handles[o] for o in op.outputs])
                  for op in CHAIN]
    return pool, handles, executions


def cpu_reference() -> np.ndarray:
    """The chain's output on the NumPy backend."""
    cpu = CpuBackend(threads=1)
    _, handles, executions = build(cpu)
    cpu.write(handles["x"], X)
    cpu.submit(cpu.record(executions))
    return cpu.read(handles["s"])


def check_recorded_replay(be, handles, executions, reference):
    """Record the chain, check it against ``reference``, replay it twice and check that only
    ``submits`` moved and the answer did not change. Returns (recording, first result)."""
    recording = be.record(executions)
    assert recording.dispatches == len(CHAIN) + 1  # the concat is two region copies
    assert recording.barriers < recording.dispatches  # the two concat copies share one
    be.write(handles["x"], X)
    be.submit(recording)
    first = be.read(handles["s"])
    assert rel_l2(first, reference) < 1e-4
    before = dict(be.counters)
    be.write(handles["x"], 2 * X)
    be.submit(recording)
    be.write(handles["x"], X)
    be.submit(recording)
    after = dict(be.counters)
    assert {k: after[k] - before[k] for k in after} == dict(ZERO, submits=2)
    np.testing.assert_array_equal(be.read(handles["s"]), first)
    return recording, first



def check_eager_with_fresh_pools(be, reference) -> None:
    """The session's eager mode: a fresh pool and fresh executions every run. The second run
    must build no program again (programs are cached by variant) and still be right."""
    pool, handles, executions = build(be)
    be.write(handles["x"], X)
    be.run_eager(executions)
    built = be.counters["programs_built"]
    be.release(pool)
    pool, handles, executions = build(be)
    be.write(handles["x"], X)
    be.run_eager(executions)
    assert be.counters["programs_built"] == built
    assert rel_l2(be.read(handles["s"]), reference) < 1e-4

GL_VARIANTS = [
    ("raster", {"NDIM": 3}), ("unary", {"OP": 7}), ("binary", {"OP": 4, "ACT": 3, "NDIM": 2}), ("reduce", {"OP": 1, "WG_PER_ROW": 1, "WG": 64}),
    ("matmul", {"HAS_BIAS": 1, "NT": 256}), ("matmul", {"REGBLOCK": 1, "RM": 4, "RN": 8, "WG": 16, "B_VEC4": 1}),
    ("conv2d", {"NT": 256}), ("conv2d", {"DIRECT_RB": 1, "RM": 8, "RN": 7, "KW": 3, "SW": 1, "DW": 1, "WG": 16}),
    ("conv2d", {"DIRECT_RB": 1, "RM": 32, "RN": 8, "KW": 1, "SW": 1, "DW": 1, "WG": 8, "X_VEC4": 1, "ACT": 3}),
    ("conv2d", {"DEPTHWISE": 1, "RN": 4, "KW": 3, "SW": 2, "DW": 1}), ("conv_transpose2d", {"HAS_BIAS": 1}),
    ("pool2d", {"COUNT_PAD": 1}), ("softmax", {"LOG": 1, "WG_PER_ROW": 1, "WG": 64}), ("normalize", {"AFFINE": 1}),
    ("resize", {}), ("gather", {}), ("gemv", {"KL": 32, "NL": 8, "WG": 256, "KFAST": 1, "HAS_BIAS": 1, "ACT": 1}),
    ("gemv", {"KL": 8, "NL": 32, "WG": 256, "KFAST": 0}), ("gemv", {"KL": 256, "NL": 1, "WG": 256, "KFAST": 1}),
    ("matmul", {"TM": 32, "TN": 32, "RM": 2, "RN": 2, "NT": 256, "KSPLIT": 1}),
    ("conv2d", {"NT": 256, "POINTWISE": 1, "KSPLIT": 1}), ("split_sum", {"HAS_BIAS": 1, "HAS_RESIDUAL": 1, "ACT": 3}),
]
