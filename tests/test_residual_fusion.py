"""A residual Add fused into the epilogue of the convolution that produces it (issue 29):
``out = act(conv(x) + bias + residual)`` on every backend and every convolution scheme against
ONNX Runtime (relative L2 < 1e-4), fused by ``scheduler.schemes.fuse_residuals`` wherever the
scheme is a kernel of the backend (every such kernel takes a residual: the cpu's, both OpenCL C
families', the GLSL family's on vulkan and gl) and nowhere it must not."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from conftest import onnxruntime_session, rel_l2, require_backend
from gpumnn import atomic as A, zoo
from gpumnn.backends import REGISTRY
from gpumnn.scheduler import schemes

TOLERANCE = 1e-4

#: (backend, its options): every backend, each kernel family of opencl, vulkan and gl (their CPU
#: devices here pick simd; tiled runs the GPU kernels, e.g. GLSL's implicit GEMM)
FAMILIES = ("opencl", "vulkan", "gl")
TARGETS = ([(name, {}) for name in REGISTRY if name not in FAMILIES]
           + [(name, {"kernels": kernels}) for name in FAMILIES for kernels in ("simd", "tiled")])
#: scheme -> (kernel, groups, channels in, channels out, forced scheme or None)
SCHEMES = {"im2col": (3, 1, 6, 8, ("im2col", 0)), "gemm1x1": (1, 1, 6, 8, None),
           "depthwise": (3, 8, 8, 8, None), "winograd": (3, 1, 6, 8, ("winograd", 2))}


def _block(kernel: int, groups: int, ic: int, oc: int, bias: bool, activation: str | None,
           residual_reads: int = 1, broadcast: bool = False, conv_activation: bool = False):
    """x -> Conv -> Add(r) -> activation, r = Relu(s) computed before the convolution; a second read
    of the convolution's output (residual_reads=2), an r that broadcasts, or an activation of the
    convolution's own change what may fuse."""
    rng = np.random.default_rng(kernel * 100 + groups * 10 + ic + bias)
    w = rng.standard_normal((oc, ic // groups, kernel, kernel)).astype(np.float32) * 0.3
    inits = [numpy_helper.from_array(w, "w")]
    conv_inputs = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(oc).astype(np.float32), "b"))
        conv_inputs.append("b")
    pad = kernel // 2
    nodes = [helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("Conv", conv_inputs, ["c0"], pads=[pad] * 4, group=groups)]
    conv_out = "c0"
    if conv_activation:
        nodes.append(helper.make_node("Sigmoid", ["c0"], ["c"]))
        conv_out = "c"
    nodes.append(helper.make_node("Add", [conv_out, "r"], ["sum"]))
    last = "sum"
    if activation:
        nodes.append(helper.make_node(activation, ["sum"], ["act"]))
        last = "act"
    if residual_reads == 2:
        nodes.append(helper.make_node("Mul", [conv_out, last], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    r_shape = [1, oc, 1, 1] if broadcast else [2, oc, 10, 9]
    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, ic, 10, 9]),
                         helper.make_tensor_value_info("s", TensorProto.FLOAT, r_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(model, backend: str, options: dict, forced):
    rng = np.random.default_rng(7)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    ref = onnxruntime_session(model).run(None, feeds)[0]
    with schemes.forced_schemes(conv=forced) if forced else contextlib.nullcontext():
        sess = gpumnn.load(model).session(backend=backend, fallback=False, **options)
        out = sess.run(feeds)["y"]
    return sess, rel_l2(out, ref), [r for r in sess.report_rows()]


def _program(sess) -> A.AtomicProgram:
    return sess.program


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t[0] + "".join(f"-{v}" for v in t[1].values()))
@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("activation", [None, "Relu"], ids=["noact", "relu"])
def test_fused_residual_matches_onnxruntime(target, scheme, bias, activation):
    """Every scheme on every backend: the answer within 1e-4 of ONNX Runtime, and wherever the
    scheme is one of the backend's kernels, the backend lists it as taking a residual and the add
    is fused into it (its activation too)."""
    backend, options = target
    require_backend(backend)
    kernel, groups, ic, oc, forced = SCHEMES[scheme]
    sess, err, rows = _run(_block(kernel, groups, ic, oc, bias, activation), backend, options, forced)
    assert err < TOLERANCE, f"{scheme} on {backend} {options}: relative L2 {err:.2e}"
    program = _program(sess)
    binaries = [op for op in program.ops if isinstance(op, A.Binary)]
    conv = next((op for op in program.ops if isinstance(op, A.Conv2D)), None)
    if conv is None:  # Winograd rewritten into atomic ops (the GLSL backends): the add is never fused
        assert scheme == "winograd" and len(binaries) == 1
        return
    assert conv.scheme == scheme
    assert scheme in sess.backends[backend].residual_schemes.get(A.Conv2D, ()), \
        f"{backend} {options} lists no residual for its {scheme} kernel"
    assert conv.has_residual and not binaries
    assert conv.activation == (("relu", ()) if activation else None)
    assert not [r for r in rows if r["fallback"]]


@pytest.mark.parametrize("case", ["read_twice", "broadcast", "conv_activation"])
def test_residual_is_not_fused_where_it_must_not_be(case):
    """A convolution output read by two ops, an add that broadcasts, and a convolution with an
    activation of its own keep their Binary add (and give ONNX Runtime's answer)."""
    model = _block(3, 1, 6, 8, True, "Relu", residual_reads=2 if case == "read_twice" else 1,
                   broadcast=case == "broadcast", conv_activation=case == "conv_activation")
    sess, err, _ = _run(model, "cpu", {}, ("im2col", 0))
    assert err < TOLERANCE
    program = _program(sess)
    assert not any(getattr(op, "has_residual", False) for op in program.ops)
    assert any(isinstance(op, A.Binary) and op.op == "add" for op in program.ops)


def test_resnet18_fuses_its_eight_residual_adds():
    """ResNet-18's 8 residual adds go into their convolutions: 31 ops become 23, the answer kept."""
    model = zoo.build("resnet18")
    x = np.random.default_rng(3).standard_normal(zoo.input_shape("resnet18")).astype(np.float32)
    ref = onnxruntime_session(model).run(None, {"input": x})[0]
    sess = gpumnn.load(model).session(backend="cpu")
    assert rel_l2(sess.run({"input": x})["output"], ref) < 1e-4
    program = _program(sess)
    assert len(program.ops) == 23
    assert sum(getattr(op, "has_residual", False) for op in program.ops) == 8
    assert not any(isinstance(op, A.Binary) for op in program.ops)
