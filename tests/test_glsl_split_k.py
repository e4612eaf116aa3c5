"""Split-K and the tile shape of the GLSL family's tiled GEMM (issue 29, "few tiles").

matmul.comp and conv2d.comp's implicit GEMM and 1x1 kernels (through gemm_core.glsl) split K where
their tiles are fewer than the device's compute units: slices of partial sums into a scratch of the
execution's own, then split_sum.comp with the bias, residual and activation. Here lavapipe and
llvmpipe run the tiled family with their compute units set high, as a big GPU's would be (the cl
family's split-K tests fake compute_units the same way).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import gpumnn
from conftest import onnxruntime_session, rel_l2, require_backend
from gpumnn.backends import create_backend
from gpumnn.scheduler import schemes
from test_atomic_ops import Case, _conv, _matmul, _prepare, check

#: compute units of a large GPU (an H100 has 132 SMs): every case below has fewer tiles
MANY_UNITS = 256
GLSL_BACKENDS = ("vulkan", "gl")

MATMUL_CASES = {
    "odd-sizes-fullbias-alpha-beta": lambda rng: _matmul(rng, batch=2, m=9, n=20, k=333, bias="full", alpha=0.5,
                                                         beta=2.0),
    "square-tiles-trans-b-rowbias-gelu": lambda rng: _matmul(rng, batch=1, m=70, n=65, k=701, trans_b=True,
                                                             bias="row", activation=("gelu", ()), const_b=True),
    "trans-a-colbias": lambda rng: _matmul(rng, batch=3, m=17, n=50, k=259, trans_a=True, bias="col"),
    "trans-a-b-relu": lambda rng: _matmul(rng, batch=1, m=5, n=3, k=1000, trans_a=True, trans_b=True,
                                          activation=("relu", ())),
    "shared-weight-batch": lambda rng: _matmul(rng, batch=4, m=6, n=31, k=190, shared=True, bias="row",
                                               const_b=True),
}


def _with_residual(case: Case, rng) -> Case:
    """``case``'s convolution adding a residual laid out as its output (its last input)."""
    shape = case.outputs["y"]
    op = dataclasses.replace(case.op, inputs=case.op.inputs + ("r",), has_residual=True)
    return Case(op, {**case.inputs, "r": rng.standard_normal(shape)}, case.outputs, case.constants)


CONV_CASES = {
    "im2col-stride2-bias-relu": lambda rng: _conv(rng, n=2, c=40, hw=(6, 6), oc=24, k=(3, 3), s=(2, 2), p=(1, 1),
                                                  bias=True, act=("relu", ())),
    "im2col-residual-relu": lambda rng: _with_residual(_conv(rng, c=64, hw=(7, 7), oc=70, k=(3, 3), p=(1, 1),
                                                             bias=True, act=("relu", ())), rng),
    "1x1-groups-bias": lambda rng: _conv(rng, c=256, hw=(3, 3), oc=64, k=(1, 1), g=2, bias=True),
    "1x1-residual-clip": lambda rng: _with_residual(_conv(rng, n=2, c=300, hw=(5, 4), oc=33, k=(1, 1), bias=True,
                                                          act=("clip", (0.0, 6.0))), rng),
}


@pytest.fixture(scope="module")
def cpu():
    return create_backend("cpu", threads=1)


@pytest.fixture(scope="module", params=GLSL_BACKENDS)
def tiled_backend(request):
    """The GLSL backend's tiled family, looking like a GPU with MANY_UNITS compute units."""
    require_backend(request.param)
    be = create_backend(request.param, kernels="tiled")
    be.compute_units = MANY_UNITS
    yield be
    be.close()


@pytest.mark.parametrize("name", sorted(MATMUL_CASES) + sorted(CONV_CASES))
def test_split_k_agrees(tiled_backend, cpu, name):
    """Each case is split (two dispatches, the scheme says into how many slices) and agrees with the
    reference; its scratch goes with release_execution."""
    be = tiled_backend
    case_ = {**MATMUL_CASES, **CONV_CASES}[name](np.random.default_rng(3))
    assert be.unsupported_reason(case_.op) is None
    pool, _, ins, outs = _prepare(be, case_, {n: np.zeros(s, np.float32) for n, s in case_.outputs.items()})
    exe = be.create_execution(case_.op, ins, outs)
    assert "/split-K " in exe.scheme and len(exe.work) == 2, exe.scheme
    scratch = [buf for buf in exe.keep if buf.kind == "scratch"]
    assert len(scratch) == 1 and scratch[0].alive
    be.release_execution(exe)
    assert not scratch[0].alive
    be.release(pool)
    check(be, cpu, case_, 3)


def test_tiles_follow_the_compute_units(cpu):
    """With one compute unit (a CPU device) nothing is split; with many, the same product is."""
    require_backend("vulkan")
    be = create_backend("vulkan", kernels="tiled")
    try:
        case_ = MATMUL_CASES["square-tiles-trans-b-rowbias-gelu"](np.random.default_rng(0))
        pool, _, ins, outs = _prepare(be, case_, {n: np.zeros(s, np.float32) for n, s in case_.outputs.items()})
        be.compute_units = 1  # a CPU device's (a GPU reports its own)
        assert be.create_execution(case_.op, ins, outs).scheme == "gemm_tiled"
        be.compute_units = MANY_UNITS
        exe = be.create_execution(case_.op, ins, outs)
        assert exe.scheme.startswith("gemm_tiled/split-K")
        assert exe.work[0].pipeline.key[1] == tuple(sorted({"TM": 32, "TN": 32, "RM": 2, "RN": 2, "NT": 256,
                                                             "KSPLIT": 1}.items()))
        be.release_execution(exe)
        be.release(pool)
    finally:
        be.close()


@pytest.fixture
def many_units(monkeypatch):
    """Sessions' vulkan and gl backends with MANY_UNITS compute units."""
    from gpumnn.backends.gl.backend import GLBackend
    from gpumnn.backends.vulkan.backend import VulkanBackend
    for cls in (VulkanBackend, GLBackend):
        setup = cls._setup

        def many(self, *args, _setup=setup, **kwargs):
            _setup(self, *args, **kwargs)
            self.compute_units = MANY_UNITS
        monkeypatch.setattr(cls, "_setup", many)


def _scratch_buffers(sess, name):
    return [b for b in sess.backends[name]._buffers.values() if b.kind == "scratch"]


def test_resnet18_split_k_against_onnxruntime(many_units):
    """ResNet-18 on vulkan's tiled family with many compute units: its convolutions split K (two
    launches each), the run agrees with ONNX Runtime, and each split's scratch is the run state's
    own and goes with it. (One recorded run: the tiled kernels are slow on lavapipe.)"""
    require_backend("vulkan")
    from gpumnn import zoo
    model = zoo.build("resnet18")
    x = np.random.default_rng(5).standard_normal(zoo.input_shape("resnet18")).astype(np.float32)
    ref = onnxruntime_session(model).run(None, {"input": x})[0]
    with schemes.forced_schemes(conv=("im2col", 0)):  # the sliding window, where a GPU might take Winograd
        sess = gpumnn.load(model).session(backend="vulkan", kernels="tiled", fallback=False)
    with sess:
        rows = sess.report_rows()
        split = [r for r in rows if "/split-K" in r["scheme"]]
        assert len(split) >= 10 and all(r["launches"] == 2 for r in split), [r["scheme"] for r in rows]
        assert rel_l2(sess.run({"input": x})["output"], ref) < 1e-3
        scratch = _scratch_buffers(sess, "vulkan")
        assert len(scratch) == len(split)
        sess.shape_set().close()
        assert not any(b.alive for b in scratch)


def _residual_classifier(channels: int = 160):
    """A 1x1 convolution with a residual and ReLU, then a classifier product with a bias: both
    split K with many compute units (K = ``channels`` and 16 x ``channels``)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(9)
    c = channels
    weights = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("w", rng.standard_normal((c, c, 1, 1)) / np.sqrt(c)), ("b", rng.standard_normal(c)),
        ("fc", rng.standard_normal((c * 16, 40)) / np.sqrt(16 * c)), ("fcb", rng.standard_normal(40)))]
    weights.append(numpy_helper.from_array(np.array([2, -1], np.int64), "shape"))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Add", ["c", "x"], ["s"]),
             helper.make_node("Relu", ["s"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["m"]), helper.make_node("Add", ["m", "fcb"], ["y"])]
    graph = helper.make_graph(nodes, "split_k", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, c, 4, 4))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 40))], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = rng.standard_normal((2, c, 4, 4)).astype(np.float32)
    return model, x, onnxruntime_session(model).run(None, {"x": x})[0]


@pytest.mark.parametrize("name", GLSL_BACKENDS)
def test_split_k_sessions_recorded_and_eager(many_units, name):
    """Recorded runs of split GEMMs allocate nothing; eager runs (which prepare per run) leave no
    scratch behind; both agree with ONNX Runtime."""
    require_backend(name)
    model, x, ref = _residual_classifier()
    net = gpumnn.load(model)
    with net.session(backend=name, kernels="tiled", fallback=False) as sess:
        assert sum("/split-K" in r["scheme"] for r in sess.report_rows()) == 2
        assert rel_l2(sess.run({"x": x})["y"], ref) < 1e-4
        before = sess.counters[name]["buffers_allocated"]
        assert rel_l2(sess.run({"x": x})["y"], ref) < 1e-4
        assert sess.counters[name]["buffers_allocated"] == before
        assert len(_scratch_buffers(sess, name)) == 2
    with net.session(backend=name, kernels="tiled", fallback=False, record=False) as sess:
        for _ in range(3):
            assert rel_l2(sess.run({"x": x})["y"], ref) < 1e-4
            assert not _scratch_buffers(sess, name), "an eager run left its scratch behind"


def test_split_k_under_vulkan_validation(vulkan_validation, many_units):
    """The split GEMMs' scratch bindings and the barrier between a GEMM and its sum pass the Khronos
    validation layer, synchronization checks included (recorded and eager)."""
    model, x, ref = _residual_classifier()
    net = gpumnn.load(model)
    for record in (True, False):
        with net.session(backend="vulkan", kernels="tiled", record=record, fallback=False) as sess:
            if record:  # (an eager session's report names the ops' schemes: it has no executions yet)
                assert sum("/split-K" in r["scheme"] for r in sess.report_rows()) == 2
            for _ in range(2):
                assert rel_l2(sess.run({"x": x})["y"], ref) < 1e-4
    vulkan_validation.check()
