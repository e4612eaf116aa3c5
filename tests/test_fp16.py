"""``precision="fp16"`` (issue 30): weights and activations in float16 on the GPU backends, the
arithmetic in float32 inside the kernels (``gpumnn.scheduler.precision``).

Each computing op's float16 kernels against NumPy's float64 on the same float16 inputs and
weights (the one rounding left is the output's), through one-op models on every GPU backend with
float16 kernels; the zoo models against ONNX Runtime in float32 within the errors measured in
bench/RESULTS.md ("fp16 precision (issue 30)"), with the activations' pool bytes halved; the cpu,
which has no float16 kernels, runs such a session in float32 and its report says so."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import gpumnn
from gpumnn import atomic as A, zoo
from gpumnn.scheduler.expansion import is_rewrite_tensor
from gpumnn.scheduler.precision import computes_float16
from gpumnn.scheduler.schemes import forced_schemes

from conftest import onnxruntime_session, rel_l2, require_backend
from op_cases import model_proto

#: the GPU backends and the options that give them their GPU kernels (PoCL, lavapipe and llvmpipe would pick the simd
#: families, whose vector kernels are float32 only)
GPU_BACKENDS = {"opencl": {"kernels": "tiled"}, "vulkan": {"kernels": "tiled"}, "gl": {"kernels": "tiled"}, "cuda": {}}
#: relative L2 error against ONNX Runtime in float32 per zoo model: about 3x the worst measured on
#: any backend here (bench/RESULTS.md, "fp16 precision (issue 30)")
ZOO_FP16_ERROR = {"squeezenet1_1": 4e-3, "resnet18": 2e-3, "mobilenet_v2": 4e-3, "transformer_encoder": 3e-3}
#: one op's float16 result: its own rounding to float16 (2**-11 relative) and float32 sums in another
#: order than NumPy's, relative to the output's largest value
OP_TOLERANCE = 2.0 ** -10


def _fp16_session(model, backend: str, **options):
    require_backend(backend)
    sess = gpumnn.load(model).session(backend=backend, precision="fp16", **GPU_BACKENDS[backend], **options)
    if not computes_float16(sess.backends[backend]):
        pytest.skip(f"the {backend} backend has no float16 kernels here: " + " ".join(sess.shape_set().precision_lines))
    return sess


def _value_info(name: str, shape) -> object:
    return helper.make_tensor_value_info(name, T.FLOAT, list(shape))


def _rounded(rng, *shape, scale=1.0) -> np.ndarray:
    """Random float32 values that float16 holds exactly (so the reference sees what the kernels see)."""
    return (rng.standard_normal(shape) * scale).astype(np.float16).astype(np.float32)


def _one_node_cases():
    """(name, nodes, inputs {name: array}, weights {name: array}, output shape, forced conv scheme)."""
    rng = np.random.default_rng(30)
    x = _rounded(rng, 1, 8, 10, 12)
    cases = []
    conv = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    weights = {"w": _rounded(rng, 16, 8, 3, 3, scale=0.2), "b": _rounded(rng, 16)}
    for scheme in (("im2col", 0), ("winograd", 2)):
        cases.append((f"conv3x3-residual-{scheme[0]}", conv, {"x": x, "r": _rounded(rng, 1, 16, 10, 12)}, weights,
                      (1, 16, 10, 12), scheme))
    cases.append(("conv1x1", [helper.make_node("Conv", ["x", "w"], ["y"])], {"x": x},
                  {"w": _rounded(rng, 24, 8, 1, 1, scale=0.3)}, (1, 24, 10, 12), None))
    cases.append(("depthwise-relu6", [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=8, strides=[2, 2],
                                                       pads=[1, 1, 1, 1]),
                                      helper.make_node("Clip", ["c", "lo", "hi"], ["y"])],
                  {"x": x}, {"w": _rounded(rng, 8, 1, 3, 3), "b": _rounded(rng, 8),
                             "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}, (1, 8, 5, 6), None))
    cases.append(("conv-transpose", [helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2],
                                                      pads=[1, 1, 1, 1])], {"x": x},
                  {"w": _rounded(rng, 8, 4, 3, 3, scale=0.3), "b": _rounded(rng, 4)}, (1, 4, 19, 23), None))
    cases.append(("matmul-bias", [helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
                  {"a": _rounded(rng, 2, 5, 40)}, {"w": _rounded(rng, 40, 24, scale=0.3), "b": _rounded(rng, 24)},
                  (2, 5, 24), None))
    cases.append(("matmul-split-k", [helper.make_node("MatMul", ["a", "w"], ["y"])], {"a": _rounded(rng, 1, 2048)},
                  {"w": _rounded(rng, 2048, 16, scale=0.05)}, (1, 16), None))
    cases.append(("maxpool", [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                               pads=[1, 1, 1, 1])], {"x": x}, {}, (1, 8, 5, 6), None))
    cases.append(("avgpool", [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
                  {"x": x}, {}, (1, 8, 10, 12), None))
    cases.append(("global-avgpool", [helper.make_node("GlobalAveragePool", ["x"], ["y"])], {"x": x}, {}, (1, 8, 1, 1),
                  None))
    cases.append(("sigmoid-mul-broadcast", [helper.make_node("Sigmoid", ["x"], ["s"]),
                                            helper.make_node("Mul", ["s", "g"], ["y"])],
                  {"x": x}, {"g": _rounded(rng, 8, 1, 1)}, (1, 8, 10, 12), None))
    cases.append(("softmax", [helper.make_node("Softmax", ["a"], ["y"], axis=-1)], {"a": _rounded(rng, 6, 200, scale=3)},
                  {}, (6, 200), None))
    cases.append(("softmax-inner", [helper.make_node("Softmax", ["x"], ["y"], axis=1)], {"x": x}, {}, (1, 8, 10, 12),
                  None))
    cases.append(("layernorm", [helper.make_node("LayerNormalization", ["a", "g", "b"], ["y"], axis=-1)],
                  {"a": _rounded(rng, 2, 7, 256)}, {"g": _rounded(rng, 256), "b": _rounded(rng, 256)}, (2, 7, 256),
                  None))
    return cases


CASES = _one_node_cases()


@pytest.mark.parametrize("backend", list(GPU_BACKENDS))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_float16_kernels_match_numpy(backend, case):
    """Every op of the case runs on float16 storage (the report's program says so), and the result
    is NumPy's float64 on the same float16 values, rounded once."""
    name, nodes, feed, weights, out_shape, scheme = case
    graph = helper.make_graph(nodes, name, [_value_info(k, v.shape) for k, v in feed.items()],
                              [_value_info("y", out_shape)],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = model_proto(graph)
    if scheme is not None:
        with forced_schemes(conv=scheme):
            sess = _fp16_session(model, backend)
    else:
        sess = _fp16_session(model, backend)
    program, dtypes = sess.shape_set().program, sess.backends[backend].dtypes
    kept = sess.backends[backend].float32_only_schemes  # kernels with no float16 build (gemv, GLSL Winograd)
    computing = [op for op in program.ops if op.kind in A.FLOAT16_COMPUTE_OPS and not is_rewrite_tensor(op.outputs[0])
                 and not (op.kind == "unary" and op.op == "identity")]  # a Winograd rewrite's transforms stay float32
    assert computing and all((op.dtype == A.FLOAT16) == (A.FLOAT16 in dtypes.get(type(op), ())
                                                          and getattr(op, "scheme", None) not in kept.get(type(op), ()))
                             for op in computing), [(op.kind, op.dtype) for op in program.ops]
    if scheme is not None:  # the scheme forced: a Conv2D of its own, or Winograd rewritten into MatMuls
        convs = [op.scheme for op in program.ops if op.kind == "conv2d"]
        assert convs == [scheme[0]] or scheme[0] == "winograd" and not convs, convs
    got = sess.run(feed)["y"]
    ref = onnxruntime_session(model).run(None, feed)[0].astype(np.float64)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=OP_TOLERANCE, atol=OP_TOLERANCE * np.abs(ref).max())


@pytest.mark.parametrize("backend", list(GPU_BACKENDS))
@pytest.mark.parametrize("model_name", sorted(ZOO_FP16_ERROR))
def test_zoo_models_in_float16(backend, model_name):
    """Within the measured error of ONNX Runtime's float32, graph input and output float32, and the
    pools of the fp16 session take half the bytes of the fp32 session's (up to each tensor's rounding
    to the pool's alignment) where every op runs a float16 kernel on the backend (fewer bytes
    elsewhere: vulkan's Softmax and Normalize stay float32, as does a scheme without a float16 kernel)."""
    model = zoo.build(model_name)
    sess = _fp16_session(model, backend)
    x = np.random.default_rng(1).standard_normal(zoo.input_shape(model_name)).astype(np.float32)
    feed = {"input": x}
    ref = onnxruntime_session(model).run(None, feed)[0]
    got = next(iter(sess.run(feed).values()))
    assert got.dtype == np.float32
    assert rel_l2(got, ref) < ZOO_FP16_ERROR[model_name]
    fp32 = gpumnn.load(model).session(backend=backend, **GPU_BACKENDS[backend])
    summaries = [s.memory_summary()[backend] for s in (fp32, sess)]
    pools = [summary["pool_bytes"] for summary in summaries]
    if "float32 ops (no float16 kernel" not in sess.report():
        rounding = sess.backends[backend].alignment * summaries[1]["tensors"]
        assert pools[1] <= pools[0] // 2 + rounding, pools
    else:
        assert pools[1] < pools[0], pools


def test_the_cpu_runs_fp16_sessions_in_float32():
    """No float16 kernels on the cpu: the same program and outputs as fp32, and the report says why."""
    net = gpumnn.load(zoo.build("squeezenet1_1"))
    x = np.random.default_rng(2).standard_normal(zoo.input_shape("squeezenet1_1")).astype(np.float32)
    fp16, fp32 = (net.session(backend="cpu", precision=p) for p in ("fp16", "fp32"))
    assert all(op.dtype != A.FLOAT16 for op in fp16.shape_set().program.ops)
    np.testing.assert_array_equal(*(next(iter(s.run({"input": x}).values())) for s in (fp16, fp32)))
    assert "precision fp16: the cpu backend has no float16 kernels; the session runs in float32" in fp16.report()


def test_float16_kernels_are_valid_vulkan(vulkan_validation):
    """The float16 kernels (16-bit storage buffers) and their barriers are valid Vulkan, under the
    validation layer with its synchronization checks: SqueezeNet's convolutions, pools and concats."""
    model = zoo.build("squeezenet1_1")
    sess = _fp16_session(model, "vulkan")
    x = np.random.default_rng(3).standard_normal(zoo.input_shape("squeezenet1_1")).astype(np.float32)
    sess.run({"input": x})
    sess.close()
    vulkan_validation.check()


@pytest.mark.parametrize("backend", ["opencl", "vulkan"])
def test_kernels_without_a_float16_build_keep_float32(backend):
    """Winograd's one-kernel GLSL convolution and the matrix-vector kernel take float32 storage only
    (``Backend.float32_only_schemes``): under fp16 those ops stay float32 between conversions, and
    resnet18 with Winograd forced keeps its float16 error."""
    model = zoo.build("resnet18")
    with forced_schemes(conv=("winograd", 2)):
        sess = _fp16_session(model, backend)
    kept = sess.backends[backend].float32_only_schemes
    ops = sess.shape_set().program.ops
    assert any(getattr(op, "scheme", "") in kept.get(type(op), ()) for op in ops)
    assert all(op.dtype == A.FLOAT32 for op in ops if getattr(op, "scheme", "") in kept.get(type(op), ()))
    x = np.random.default_rng(3).standard_normal(zoo.input_shape("resnet18")).astype(np.float32)
    ref = onnxruntime_session(model).run(None, {"input": x})[0]
    assert rel_l2(next(iter(sess.run({"input": x}).values())), ref) < ZOO_FP16_ERROR["resnet18"]
