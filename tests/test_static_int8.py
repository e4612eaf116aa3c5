"""Static int8 (issue 30): QuantizedConv2D, the int8 convolution that QDQ models' Conv, Gemm and MatMul
and QLinearConv become on the cpu, against NumPy (the op's integer arithmetic exactly, and ONNX
Runtime's unfused float arithmetic within one quantization step), and QDQ zoo models made by
``quantize_static`` on every backend, in int8 on each."""
from __future__ import annotations

import dataclasses
import logging

import numpy as np
import onnx
import pytest

import gpumnn
from gpumnn import zoo
from gpumnn import atomic as A
from gpumnn.backends.base import TensorHandle
from gpumnn.backends.cpu import int8_conv
from gpumnn.backends.cpu.backend import CpuBackend
from gpumnn.scheduler.schemes import conv_scheme

# (name, channels, in_hw, out_channels, kernel, stride, pad, dilation, groups, batch)
GEOMETRIES = [
    ("3x3", 20, (9, 11), 40, 3, 1, 1, 1, 1, 1),
    ("3x3 stride 2", 24, (12, 9), 33, 3, 2, 1, 1, 1, 2),
    ("7x7 few channels", 3, (20, 20), 16, 7, 2, 3, 1, 1, 1),
    ("3x3 few channels stride 2", 3, (19, 18), 20, 3, 2, 1, 1, 1, 1),  # the direct kernel's
    ("1x1", 40, (6, 7), 24, 1, 1, 0, 1, 1, 1),
    ("1x1 widening", 12, (8, 9), 40, 1, 1, 0, 1, 1, 2),
    ("1x1 widening, channels past whole words", 13, (7, 9), 29, 1, 1, 0, 1, 1, 1),  # the turned tile's odd lanes
    ("1x1 narrowing on a large plane", 24, (96, 90), 8, 1, 1, 0, 1, 1, 1),  # the turned tile's too
    ("1x1 stride 2", 16, (9, 9), 8, 1, 2, 0, 1, 1, 1),
    ("dilated", 17, (10, 10), 12, 3, 1, 2, 2, 1, 1),
    ("grouped", 32, (8, 8), 48, 3, 1, 1, 1, 4, 1),
    ("depthwise", 24, (13, 13), 24, 3, 1, 1, 1, 24, 2),
    ("depthwise stride 2", 16, (15, 14), 16, 3, 2, 1, 1, 16, 1),
    ("depthwise 5x5", 8, (11, 11), 8, 5, 1, 2, 1, 8, 1),
    ("depthwise dilated stride 2", 8, (17, 16), 8, 3, 2, 2, 2, 8, 1),
    ("depthwise 5x5 stride 3", 6, (16, 17), 6, 5, 3, 1, 1, 6, 1),
    ("depthwise int32 sums", 4, (24, 25), 4, 23, 1, 11, 1, 4, 1),  # 529 taps: past float32's exact sums
    # the channels-last depthwise kernel's (output planes of at most CHANNELS_LAST_PIXELS): several
    # blocks of channels, the last one partial; a stride, dilation; int32 sums
    ("depthwise small plane", 130, (7, 7), 130, 3, 1, 1, 1, 130, 2),
    ("depthwise small plane stride 2 dilated", 67, (13, 12), 67, 3, 2, 2, 2, 67, 1),
    ("depthwise small plane int32 sums", 3, (6, 7), 3, 23, 1, 11, 1, 3, 1),
    ("depthwise dilated", 12, (10, 11), 12, 3, 1, 2, 2, 12, 1),  # the flat kernel's, as "depthwise" and "5x5"
    ("rows of a product", 70, (1, 1), 37, 1, 1, 0, 1, 1, 5),
    ("3x3 few channels dilated", 3, (13, 12), 8, 3, 1, 2, 2, 1, 1),  # the direct kernel's (the stem's undilated)
]

# the stem kernel's (``int8_conv.runs_stem``): windows of one and two words a row, stride 1 to 3, more
# output channels than a panel, output rows past a whole number of bands, a batch, one channel
STEMS = [
    ("stem 3x3 stride 2", 3, (19, 18), 20, 3, 2, 1, 1, 1, 1),
    ("stem 3x3 stride 1, two panels", 3, (9, 11), 40, 3, 1, 1, 1, 1, 2),
    ("stem 7x7 stride 2", 3, (20, 21), 16, 7, 2, 3, 1, 1, 1),
    ("stem 5x5 stride 3, grey", 1, (17, 16), 8, 5, 3, 2, 1, 1, 1),
    ("stem 2x2 stride 2, no padding", 4, (10, 14), 32, 2, 2, 0, 1, 1, 1),
]


def _case(geometry, x_dtype: str, out_dtype: str, seed: int = 0):
    """(op, x, weight, bias, multiplier, the float parameters) of one random QuantizedConv2D."""
    name, c, hw, oc, k, s, p, d, groups, batch = geometry
    rng = np.random.default_rng(seed)
    info, out_info = np.iinfo(x_dtype), np.iinfo(out_dtype)
    x = rng.integers(info.min, info.max + 1, (batch, c) + hw).astype(x_dtype)
    w = rng.integers(-127, 128, (oc, c // groups, k, k)).astype(np.int8)
    x_scale, y_scale = np.float32(0.02), np.float32(0.05 * np.sqrt(c // groups * k * k))
    w_scale = rng.uniform(0.002, 0.01, oc).astype(np.float32)
    bias = rng.integers(-3000, 3000, oc).astype(np.int32)
    x_zero, y_zero = int(rng.integers(info.min, info.max // 2)), int(rng.integers(out_info.min, out_info.max // 2))
    lo, hi = (max(int(out_info.min), y_zero), int(out_info.max)) if seed % 2 else (int(out_info.min), int(out_info.max))
    out_hw = tuple((hw[i] + 2 * p - d * (k - 1) - 1) // s + 1 for i in range(2))
    op = A.QuantizedConv2D(("x", "w", "b", "m"), ("y",), "q", batch=batch, in_channels=c, in_hw=hw, out_channels=oc,
                           out_hw=out_hw, kernel=(k, k), strides=(s, s), pads=(p, p), dilations=(d, d), groups=groups,
                           x_zero_point=x_zero, y_zero_point=y_zero, out_dtype=out_dtype, lo=lo, hi=hi, dtype=x_dtype)
    op = dataclasses.replace(op, scheme=conv_scheme(op))
    multiplier = (x_scale * w_scale / y_scale).astype(np.float32)
    return op, x, w, bias, multiplier, (x_scale, w_scale, y_scale)


def _handle(array: np.ndarray) -> TensorHandle:
    array = np.ascontiguousarray(array)
    return TensorHandle(array.reshape(-1), 0, array.shape, array.dtype.name)


def _run_kernel(backend: CpuBackend, op, x, w, bias, multiplier) -> np.ndarray:
    out = np.zeros((op.batch, op.out_channels) + op.out_hw, op.out_dtype)
    exe = backend.create_execution(op, [_handle(x), _handle(w), _handle(bias), _handle(multiplier)],
                                   [TensorHandle(out.reshape(-1), 0, out.shape, op.out_dtype)])
    for work in exe.work:
        work()
    return out


def _unfused(op, x, w, bias, scales) -> np.ndarray:
    """ONNX Runtime's unfused path in float64: DequantizeLinear, a float convolution with the
    dequantized bias, QuantizeLinear, the clamp."""
    x_scale, w_scale, y_scale = (np.float64(s) for s in scales)
    xf = (x.astype(np.float64) - op.x_zero_point) * x_scale
    n, c, (h, wd), oc, (oh, ow) = op.batch, op.in_channels, op.in_hw, op.out_channels, op.out_hw
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = op.kernel, op.strides, op.pads, op.dilations
    padded = np.zeros((n, c, h + 2 * ph + kh * dh, wd + 2 * pw + kw * dw))
    padded[:, :, ph:ph + h, pw:pw + wd] = xf
    wf = w.astype(np.float64) * w_scale.astype(np.float64).reshape(-1, 1, 1, 1)
    per_group, out_per_group = c // op.groups, oc // op.groups
    y = np.zeros((n, oc, oh, ow))
    for g in range(op.groups):
        for i in range(kh):
            for j in range(kw):
                window = padded[:, g * per_group:(g + 1) * per_group, i * dh:i * dh + (oh - 1) * sh + 1:sh,
                                j * dw:j * dw + (ow - 1) * sw + 1:sw]
                y[:, g * out_per_group:(g + 1) * out_per_group] += np.einsum(
                    "nchw,oc->nohw", window, wf[g * out_per_group:(g + 1) * out_per_group, :, i, j])
    y += (bias * x_scale * w_scale.astype(np.float64)).reshape(1, oc, 1, 1)
    return np.clip(np.rint(y / y_scale) + op.y_zero_point, op.lo, op.hi)


@pytest.fixture(scope="module")
def compiled_cpu():
    return CpuBackend(threads=2)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=[g[0] for g in GEOMETRIES])
@pytest.mark.parametrize("types", [("int8", "int8"), ("uint8", "uint8"), ("uint8", "int8")], ids="-".join)
def test_quantized_conv_kernel_is_the_contract_exactly(compiled_cpu, geometry, types):
    """The compiled kernel (this host's tile path) and the NumPy backend give the reference's bits,
    and the reference is within one step of the unfused float arithmetic."""
    for seed in (0, 1):
        op, x, w, bias, multiplier, scales = _case(geometry, *types, seed=seed)
        reference = int8_conv.quantized_conv_reference(op, x, w, bias, multiplier)
        got = _run_kernel(compiled_cpu, op, x, w, bias, multiplier)
        np.testing.assert_array_equal(got, reference)
        if geometry[0] in ("3x3", "depthwise"):
            np.testing.assert_array_equal(_run_kernel(CpuBackend(threads=1, jit=False), op, x, w, bias, multiplier),
                                          reference)
        assert np.abs(reference.astype(np.int64) - _unfused(op, x, w, bias, scales)).max() <= 1


DEPTHWISE = [g for g in GEOMETRIES if g[-2] == g[1] > 1] + [
    # the channels-last kernel's blocks: channels in blocks of 48 (96 = 2 x 48), one partial block of
    # 64 (70 channels), whole input rows widened in one loop (one block, stride 1) on a large plane
    ("depthwise blocks of 48", 96, (9, 10), 96, 3, 2, 1, 1, 96, 1),
    ("depthwise partial block", 70, (8, 9), 70, 3, 1, 1, 1, 70, 2),
    ("depthwise wide rows", 32, (30, 29), 32, 3, 1, 1, 1, 32, 1),
    # more items (image, block, band of rows) than tasks: a task's scratch rows that held one band's
    # input are padding in its next band's
    ("depthwise many images", 8, (20, 9), 8, 3, 1, 1, 1, 8, 45),
    # the fused kernel (channels in whole vectors of NHWC_LANES): a 7x7 window, dilation at stride 2,
    # 192 channels; every pixel's window past the row's ends (a plane 2 wide); windows wholly in the
    # padding (pad 2 of a 3x3); stride 3 with rows of several images in one task
    ("depthwise vector 7x7", 16, (12, 11), 16, 7, 1, 3, 1, 16, 1),
    ("depthwise vector dilated stride 2", 32, (17, 16), 32, 3, 2, 2, 2, 32, 1),
    ("depthwise vector blocks of 64", 192, (9, 8), 192, 3, 1, 1, 1, 192, 2),
    ("depthwise fused narrow", 16, (3, 2), 16, 3, 1, 1, 1, 16, 2),
    ("depthwise fused wide padding", 16, (6, 5), 16, 3, 1, 2, 1, 16, 1),
    ("depthwise fused stride 3 images", 32, (16, 17), 32, 5, 3, 1, 1, 32, 3),
]


def _run_channels_last(backend: CpuBackend, op, x, w, bias, multiplier) -> np.ndarray:
    """``op`` as a ``channels_last`` one on x laid [N, H, W, C]; its output back as NCHW."""
    op = dataclasses.replace(op, channels_last=True)
    out = np.zeros((op.batch,) + op.out_hw + (op.out_channels,), op.out_dtype)
    exe = backend.create_execution(op, [_handle(x.transpose(0, 2, 3, 1)), _handle(w), _handle(bias),
                                        _handle(multiplier)],
                                   [TensorHandle(out.reshape(-1), 0, out.shape, op.out_dtype)])
    assert "nhwc" in exe.scheme or not backend.jit, exe.scheme
    assert ("fused" in exe.scheme) == (backend.jit and int8_conv.runs_nhwc_fused(op)), exe.scheme
    sliding = int8_conv.NHWC_SLIDING and op.strides[1] < op.kernel[1] and op.dilations[1] == 1
    assert ("sliding" in exe.scheme) == ("fused" in exe.scheme and sliding), exe.scheme
    for work in exe.work:
        work()
    return out.transpose(0, 3, 1, 2)


@pytest.mark.parametrize("geometry", DEPTHWISE, ids=[g[0] for g in DEPTHWISE])
@pytest.mark.parametrize("types", [("int8", "int8"), ("uint8", "uint8"), ("uint8", "int8")], ids="-".join)
@pytest.mark.parametrize("blocks", ["default", "windows", "short", "loops"])
def test_channels_last_depthwise_is_the_contract_exactly(compiled_cpu, geometry, types, blocks, monkeypatch):
    """A ``channels_last`` depthwise QuantizedConv2D (x and out NHWC) gives the reference's bits, compiled
    and on the NumPy backend; "default": the fused kernel where the channels are whole vectors
    (``runs_nhwc_fused``; at dilation 1 keeping a window's columns from pixel to pixel), else
    the vector loops; "windows": the fused kernel reading each pixel's whole window everywhere; "loops": the vector loops over the taps' length of sums
    everywhere; "short": those loops in blocks of 16 channels (partial ones past them) over a few pixels,
    so that an output row takes several of them."""
    if blocks == "short":
        monkeypatch.setattr(int8_conv, "NHWC_FUSED", False)
        monkeypatch.setattr(int8_conv, "NHWC_WHOLE", 8)
        monkeypatch.setattr(int8_conv, "CHANNEL_BLOCK", 16)
        monkeypatch.setattr(int8_conv, "NHWC_CHUNK", 40)
    if blocks == "windows":
        monkeypatch.setattr(int8_conv, "NHWC_SLIDING", False)
    if blocks == "loops":
        monkeypatch.setattr(int8_conv, "NHWC_FUSED", False)
    for seed in (0, 1):
        op, x, w, bias, multiplier, _ = _case(geometry, *types, seed=seed)
        if seed == 0 and blocks == "default":  # fused exactly where the channels are whole vectors
            expected = (op.out_channels % int8_conv.NHWC_LANES == 0
                        and int8_conv.direct_sum_dtype(op) == np.float32)
            assert int8_conv.runs_nhwc_fused(dataclasses.replace(op, channels_last=True)) == expected
        reference = int8_conv.quantized_conv_reference(op, x, w, bias, multiplier)
        np.testing.assert_array_equal(_run_channels_last(compiled_cpu, op, x, w, bias, multiplier), reference)
        if seed == 0:
            np.testing.assert_array_equal(
                _run_channels_last(CpuBackend(threads=1, jit=False), op, x, w, bias, multiplier), reference)


def test_depthwise_kernels_by_geometry(compiled_cpu):
    """Depthwise convolutions with output planes of at most CHANNELS_LAST_PIXELS take the
    channels-last kernel, larger ones at stride 1 with rows as wide as the input's the flat kernel,
    the others the direct kernel (the cases above check each one's bits)."""
    for geometry in GEOMETRIES:
        if geometry[-2] == geometry[1] > 1:  # depthwise
            op, x, w, bias, multiplier, _ = _case(geometry, "int8", "int8")
            out = np.zeros((op.batch, op.out_channels) + op.out_hw, np.int8)
            exe = compiled_cpu.create_execution(op, [_handle(x), _handle(w), _handle(bias), _handle(multiplier)],
                                                [TensorHandle(out.reshape(-1), 0, out.shape, "int8")])
            _, c, hw, _, k, stride, pad, dilation, _, _ = geometry
            if op.out_hw[0] * op.out_hw[1] <= int8_conv.CHANNELS_LAST_PIXELS:
                kind = "channels-last"
            elif stride == 1 and 2 * pad == (k - 1) * dilation:
                kind = "flat"
            else:
                kind = "direct"
            assert kind in exe.scheme, (geometry[0], exe.scheme)


def _run_stem(backend: CpuBackend, op, x, w, bias, multiplier) -> np.ndarray:
    """``op`` as an ``out_channels_last`` one (x NCHW, out NHWC); its output back as NCHW."""
    op = dataclasses.replace(op, out_channels_last=True)
    out = np.zeros((op.batch,) + op.out_hw + (op.out_channels,), op.out_dtype)
    exe = backend.create_execution(op, [_handle(x), _handle(w), _handle(bias), _handle(multiplier)],
                                   [TensorHandle(out.reshape(-1), 0, out.shape, op.out_dtype)])
    assert "stem nhwc" in exe.scheme or not backend.jit, exe.scheme
    for work in exe.work:
        work()
    return out.transpose(0, 3, 1, 2)


@pytest.mark.parametrize("path", ["vnni512", "avx512bw", "avx2", "portable"])
@pytest.mark.parametrize("geometry", STEMS, ids=[g[0] for g in STEMS])
def test_stem_kernel_is_the_contract_exactly(geometry, path):
    """A convolution over a few input channels on the stem kernel (packed rows of the tile's words),
    writing NCHW planes or, ``out_channels_last``, NHWC rows, on each tile path this host runs, gives
    the reference's bits (and so does the NumPy backend for the NHWC output)."""
    from gpumnn.backends.cpu import int8 as cpu_int8

    if path not in cpu_int8.host_paths():
        pytest.skip(f"this host runs {', '.join(cpu_int8.host_paths())}")
    previous = cpu_int8.use_path(path)
    try:
        backend = CpuBackend(threads=2)
        for seed, types in enumerate([("int8", "int8"), ("uint8", "uint8"), ("uint8", "int8")]):
            op, x, w, bias, multiplier, _ = _case(geometry, *types, seed=seed)
            assert int8_conv.runs_stem(op)
            reference = int8_conv.quantized_conv_reference(op, x, w, bias, multiplier)
            out = np.zeros((op.batch, op.out_channels) + op.out_hw, op.out_dtype)
            exe = backend.create_execution(op, [_handle(x), _handle(w), _handle(bias), _handle(multiplier)],
                                           [TensorHandle(out.reshape(-1), 0, out.shape, op.out_dtype)])
            assert "stem" in exe.scheme and "nhwc" not in exe.scheme, exe.scheme
            for work in exe.work:
                work()
            np.testing.assert_array_equal(out, reference)
            np.testing.assert_array_equal(_run_stem(backend, op, x, w, bias, multiplier), reference)
            if seed == 0 and path == "portable":
                np.testing.assert_array_equal(_run_stem(CpuBackend(threads=1, jit=False), op, x, w, bias, multiplier),
                                              reference)
    finally:
        cpu_int8.use_path(previous)


def test_convolutions_over_few_channels_by_geometry():
    """Undilated windows over few input channels take the stem kernel up to STEM_DEPTH elements a packed
    row; dilated ones the direct kernel, deeper ones im2col."""
    kinds = {"3x3 few channels stride 2": "stem", "7x7 few channels": "stem", "3x3 few channels dilated": "direct"}
    for geometry in (g for g in GEOMETRIES if g[0] in kinds):
        op, *_ = _case(geometry, "int8", "int8")
        assert int8_conv.runs_stem(op) == (kinds[geometry[0]] == "stem"), geometry[0]
        assert int8_conv.runs_direct(op) or kinds[geometry[0]] == "stem", geometry[0]
    op, *_ = _case(("deep", 6, (12, 12), 8, 7, 1, 3, 1, 1, 1), "int8", "int8")  # 6 * 7 * 8 = 336 elements a row
    assert not int8_conv.runs_stem(op)


# -- QDQ zoo models ------------------------------------------------------------------------------------

SIZE = 64  # the zoo models at 64 x 64: every layer, a quarter of the pixels of 224 x 224 and less


def _at_size(model: onnx.ModelProto, size: int) -> onnx.ModelProto:
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_value = dims[3].dim_value = size
    del model.graph.value_info[:]
    return model


@pytest.fixture(scope="module")
def qdq_models(tmp_path_factory):
    """zoo name -> a QDQ model of it (BatchNormalization folded first, as ONNX Runtime's
    pre-processing does; int8 activations, per-channel int8 weights; 2 random calibration inputs)."""
    pytest.importorskip("onnxruntime")
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice on pre-processing
    folder = tmp_path_factory.mktemp("qdq")

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(4)
            self.batches = iter([{"input": rng.standard_normal((1, 3, SIZE, SIZE)).astype(np.float32)}
                                 for _ in range(2)])

        def get_next(self):
            return next(self.batches, None)

    models = {}
    for name in ("squeezenet1_1", "resnet18", "mobilenet_v2"):
        source, folded, target = (folder / f"{name}.{kind}.onnx" for kind in ("float", "folded", "qdq"))
        onnx.save(_at_size(zoo.build(name), SIZE), source)
        quant_pre_process(str(source), str(folded), skip_symbolic_shape=True)
        quantize_static(str(folded), str(target), Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=True)
        models[name] = target
    return models


#: the largest difference from ONNX Runtime's unfused path, in steps of the output: one flipped
#: step in a hidden layer grows through the layers after it, in ONNX Runtime's own fused path
#: (3 to 7 steps from its unfused one on these models) as in gpumnn's float and int8 paths
MAX_STEPS = {"squeezenet1_1": 2, "resnet18": 3, "mobilenet_v2": 8}
#: lavapipe and llvmpipe run the two smaller models only (resnet18's float path there is unchanged by issue 30)
SLOW_BACKENDS = ("vulkan", "gl")
SLOW_BACKEND_MODELS = ("squeezenet1_1", "mobilenet_v2")


@pytest.mark.parametrize("name", list(MAX_STEPS))
def test_qdq_zoo_model_runs_int8_on_every_backend(backend, qdq_models, name):
    """Every backend runs every Conv and Gemm as QuantizedConv2D, every residual Add as QuantizedAdd,
    every MaxPool on the int8 values (the cpu its GlobalAveragePool too) and the classifier's Flatten
    as a view of them on its own device (the GPU APIs' kernels: quantized_conv.cl,
    quantized_add.cl, pool.cl, quantized_conv2d.comp, quantized_add.comp, max_pool_bytes.comp), in
    agreement with ONNX Runtime's unfused path."""
    import onnxruntime as ort

    if backend in SLOW_BACKENDS and name not in SLOW_BACKEND_MODELS:
        pytest.skip("resnet18 runs on the cpu and opencl only here, to keep the suite short")
    path = qdq_models[name]
    model = onnx.load(path)
    x = np.random.default_rng(1).standard_normal((1, 3, SIZE, SIZE)).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    ref = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    session = gpumnn.load(str(path)).session(backend=backend, fallback=False)
    try:
        got = session.run({"input": x})[model.graph.output[0].name]
        program, placement = session.program, session.shape_set().placement
    finally:
        session.close()
    products = sum(n.op_type in ("Conv", "Gemm") for n in model.graph.node)
    int8_ops = [op for op in program.ops if isinstance(op, A.QuantizedConv2D)]
    assert len(int8_ops) == products
    sums = [op for op in program.ops if isinstance(op, A.QuantizedAdd)]
    assert len(sums) == sum(n.op_type == "Add" for n in model.graph.node)
    max_pools = [op for op in program.ops if isinstance(op, A.Pool2D) and op.op == "max"]
    assert len(max_pools) == sum(n.op_type == "MaxPool" for n in model.graph.node)
    assert all(op.dtype == A.INT8 for op in max_pools)
    assert not [op for op in program.ops if isinstance(op, (A.Conv2D, A.MatMul))]
    assert set(placement.op_backends) == {backend}
    # the cpu keeps the 8-bit activations channels-last between its int8 ops, the GPU APIs NCHW
    channels_last = [op for op in int8_ops if op.channels_last]
    assert channels_last == ([op for op in int8_ops if op.groups > 1] if backend == "cpu" else [])
    # the cpu pools on the 8-bit values (reading them channels-last after a channels-last producer), the
    # GPU APIs in float
    average_pools = [op for op in program.ops if isinstance(op, A.QuantizedGlobalAveragePool)]
    global_averages = sum(n.op_type == "GlobalAveragePool" for n in model.graph.node)
    assert len(average_pools) == (global_averages if backend == "cpu" else 0)
    # the stem writes channels-last activations where its readers take them (MobileNet-v2's depthwise
    # convolution on the cpu), NCHW where an NCHW op reads them (ResNet-18's max pooling) and on the GPU APIs
    stems = [op for op in int8_ops if op.out_channels_last]
    assert [op.source for op in stems] == (["features.0.conv"] if backend == "cpu" and name == "mobilenet_v2" else [])
    if backend == "cpu" and name == "mobilenet_v2":  # no 8-bit transpose left
        assert not [op for op in program.ops if isinstance(op, A.Raster) and op.dtype == A.INT8]
        assert [op.channels_last for op in average_pools] == [True]
    # the classifier's input (DequantizeLinear -> Flatten -> QuantizeLinear of one scale) is a view of
    # the 8-bit tensor: nothing left of its DequantizeLinear or QuantizeLinear
    producer = {out: n for n in model.graph.node for out in n.output}
    around_flatten = {producer[n.input[0]].name for n in model.graph.node if n.op_type == "Flatten"}
    around_flatten |= {r.name for n in model.graph.node if n.op_type == "Flatten"
                       for r in model.graph.node if n.output[0] in r.input}
    assert around_flatten and not [op for op in program.ops if op.source in around_flatten]
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    last = next(n for n in model.graph.node if n.output[0] == model.graph.output[0].name)
    step = float(constants[last.input[1]])
    assert np.abs(got - ref).max() <= MAX_STEPS[name] * step * 1.001


@pytest.mark.parametrize("path", ["vnni512", "avx512bw", "avx2", "portable"])
def test_every_tile_path_gives_the_contract(path):
    """Each product path this host runs (the turned tile of widening 1x1 convolutions included) gives the
    reference's bits; ``GPUMNN_INT8_PATH`` picks the same ones on another host."""
    from gpumnn.backends.cpu import int8 as cpu_int8

    if path not in cpu_int8.host_paths():
        pytest.skip(f"this host runs {', '.join(cpu_int8.host_paths())}")
    previous = cpu_int8.use_path(path)
    try:
        backend = CpuBackend(threads=1)
        names = ("3x3", "3x3 few channels stride 2", "1x1", "1x1 widening", "1x1 widening, channels past whole words",
                 "rows of a product")
        for geometry in (g for g in GEOMETRIES if g[0] in names):
            op, x, w, bias, multiplier, _ = _case(geometry, "int8", "uint8", seed=3)
            np.testing.assert_array_equal(_run_kernel(backend, op, x, w, bias, multiplier),
                                          int8_conv.quantized_conv_reference(op, x, w, bias, multiplier))
    finally:
        cpu_int8.use_path(previous)


# -- residual sums: QuantizedAdd ---------------------------------------------------------------------

def _sum_model(qtype: int, *, after: str = "", shapes=((1, 5, 7, 9), (1, 5, 7, 9)), read_twice: bool = False,
               qlinear: bool = False) -> onnx.ModelProto:
    """Two float inputs quantized (their own scales and zero points), dequantized, added, ``after``
    (Relu, Clip or nothing), quantized and dequantized: the residual sum ``quantize_static`` writes
    (or ONNX Runtime's QLinearAdd with ``qlinear``). ``read_twice``: the sum is also a graph output."""
    from onnx import TensorProto, helper

    dtype = onnx.helper.tensor_dtype_to_np_dtype(qtype)
    info = np.iinfo(dtype)
    inits = [onnx.numpy_helper.from_array(np.array(v, np.float32), n)
             for n, v in (("sa", 0.0213), ("sb", 0.0371), ("sy", 0.0547), ("lo", -0.4), ("hi", 2.5))]
    inits += [onnx.numpy_helper.from_array(np.array(v, dtype), n)
              for n, v in (("za", info.min + 100), ("zb", info.max - 90), ("zy", info.min + 37))]
    nodes = [helper.make_node("QuantizeLinear", ["a", "sa", "za"], ["aq"]),
             helper.make_node("QuantizeLinear", ["b", "sb", "zb"], ["bq"])]
    if qlinear:
        nodes.append(helper.make_node("QLinearAdd", ["aq", "sa", "za", "bq", "sb", "zb", "sy", "zy"], ["yq"],
                                      name="sum", domain="com.microsoft"))
    else:
        nodes += [helper.make_node("DequantizeLinear", ["aq", "sa", "za"], ["af"]),
                  helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bf"]),
                  helper.make_node("Add", ["af", "bf"], ["sum"], name="sum")]
        last = "sum"
        if after == "Relu":
            nodes.append(helper.make_node("Relu", ["sum"], ["act"], name="act"))
            last = "act"
        elif after == "Clip":
            nodes.append(helper.make_node("Clip", ["sum", "lo", "hi"], ["act"], name="act"))
            last = "act"
        nodes.append(helper.make_node("QuantizeLinear", [last, "sy", "zy"], ["yq"]))
    nodes.append(helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if read_twice:
        outputs.append(helper.make_tensor_value_info("sum", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "sum", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                                             for n, s in zip("ab", shapes)], outputs, inits)
    imports = [helper.make_opsetid("", 21)] + ([helper.make_opsetid("com.microsoft", 1)] if qlinear else [])
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def _sum_feeds(shapes) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {name: (rng.standard_normal(shape) * 2.5).astype(np.float32) for name, shape in zip("ab", shapes)}


def _run_sum(model: onnx.ModelProto, backend: str, shapes):
    """(gpumnn's output y, ONNX Runtime's unfused y, the program's ops)."""
    import onnxruntime as ort

    feeds = _sum_feeds(shapes)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        ["y"], feeds)[0]
    with gpumnn.load(model).session(backend=backend, fallback=False) as session:
        got = session.run(feeds)["y"]
        ops = list(session.program.ops)
    return got, ref, ops


@pytest.mark.parametrize("after", ["", "Relu", "Clip"])
@pytest.mark.parametrize("qtype", [onnx.TensorProto.INT8, onnx.TensorProto.UINT8], ids=["int8", "uint8"])
def test_qdq_sum_is_one_quantized_add(backend, qtype, after):
    """DequantizeLinear, DequantizeLinear -> Add -> [Relu | Clip] -> QuantizeLinear is one QuantizedAdd on
    the 8-bit values (odd sizes; the clamp of a Relu or Clip folded), on every backend's own kernel, and
    gives ONNX Runtime's unfused path's values (the float path's arithmetic: the same bits on these)."""
    pytest.importorskip("onnxruntime")
    shapes = ((1, 5, 7, 9), (1, 5, 7, 9))
    got, ref, ops = _run_sum(_sum_model(qtype, after=after), backend, shapes)
    adds = [op for op in ops if isinstance(op, A.QuantizedAdd)]
    assert len(adds) == 1 and adds[0].count == 5 * 7 * 9
    assert not [op for op in ops if isinstance(op, A.Binary) and op.source == "sum"]
    assert not [op for op in ops if isinstance(op, A.Unary) and op.op in ("relu", "clip") and op.source == "act"]
    if after:
        assert adds[0].lo > np.iinfo(onnx.helper.tensor_dtype_to_np_dtype(qtype)).min
    np.testing.assert_array_equal(got, ref)


def test_qlinear_add_is_one_quantized_add(backend):
    """ONNX Runtime's QLinearAdd (com.microsoft) is one QuantizedAdd too, within one step of its kernel."""
    pytest.importorskip("onnxruntime")
    shapes = ((1, 3, 11, 13), (1, 3, 11, 13))
    got, ref, ops = _run_sum(_sum_model(onnx.TensorProto.UINT8, shapes=shapes, qlinear=True), backend, shapes)
    assert len([op for op in ops if isinstance(op, A.QuantizedAdd)]) == 1
    assert not [op for op in ops if isinstance(op, A.Binary) and op.source == "sum"]
    assert np.abs(got - ref).max() <= 0.0547 * 1.001


@pytest.mark.parametrize("form", ["broadcast", "sum read twice"])
def test_qdq_sum_stays_float_where_it_is_not_the_pattern(form):
    """A broadcast sum, or one whose float values another node (here the graph) reads, is lowered in
    float as before, and still agrees with ONNX Runtime's unfused path."""
    pytest.importorskip("onnxruntime")
    shapes = ((1, 5, 7, 9), (1, 5, 1, 9)) if form == "broadcast" else ((1, 5, 7, 9), (1, 5, 7, 9))
    model = _sum_model(onnx.TensorProto.INT8, shapes=shapes, read_twice=form == "sum read twice")
    got, ref, ops = _run_sum(model, "cpu", shapes)
    assert not [op for op in ops if isinstance(op, A.QuantizedAdd)]
    np.testing.assert_array_equal(got, ref)


# -- max pooling on the 8-bit values -------------------------------------------------------------------

def _pool_model(qtype: int, op_type: str, out_scale: float = 0.0213) -> onnx.ModelProto:
    """A float input quantized, dequantized, max-pooled (3x3, stride 2, pads 1, or global), quantized by
    ``out_scale`` (the input's: the pattern that runs on the 8-bit values) and dequantized."""
    from onnx import TensorProto, helper

    dtype = onnx.helper.tensor_dtype_to_np_dtype(qtype)
    zero = np.iinfo(dtype).min + 77
    inits = [onnx.numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("s", 0.0213), ("so", out_scale))]
    inits.append(onnx.numpy_helper.from_array(np.array(zero, dtype), "z"))
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]) if op_type == "MaxPool" else {}
    nodes = [helper.make_node("QuantizeLinear", ["a", "s", "z"], ["aq"]),
             helper.make_node("DequantizeLinear", ["aq", "s", "z"], ["af"]),
             helper.make_node(op_type, ["af"], ["pooled"], name="pool", **attrs),
             helper.make_node("QuantizeLinear", ["pooled", "so", "z"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "so", "z"], ["y"])]
    graph = helper.make_graph(nodes, "pool", [helper.make_tensor_value_info("a", TensorProto.FLOAT, (1, 6, 13, 11))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("op_type", ["MaxPool", "GlobalMaxPool"])
@pytest.mark.parametrize("qtype", [onnx.TensorProto.INT8, onnx.TensorProto.UINT8], ids=["int8", "uint8"])
def test_qdq_max_pool_runs_on_the_8bit_values(backend, qtype, op_type):
    """DequantizeLinear -> MaxPool -> QuantizeLinear of one scale and zero point is one max Pool2D on the
    8-bit tensor, on every backend's own kernel, with ONNX Runtime's unfused path's values exactly."""
    pytest.importorskip("onnxruntime")
    shapes = ((1, 6, 13, 11),)
    got, ref, ops = _run_sum(_pool_model(qtype, op_type), backend, shapes)
    pools = [op for op in ops if isinstance(op, A.Pool2D)]
    assert len(pools) == 1 and pools[0].dtype == onnx.helper.tensor_dtype_to_np_dtype(qtype).name
    np.testing.assert_array_equal(got, ref)


def test_qdq_max_pool_requantized_by_another_scale_stays_float():
    """Requantized by another scale the pooling is not a copy of 8-bit values: it runs in float."""
    pytest.importorskip("onnxruntime")
    got, ref, ops = _run_sum(_pool_model(onnx.TensorProto.INT8, "MaxPool", out_scale=0.05), "cpu", ((1, 6, 13, 11),))
    assert [op.dtype for op in ops if isinstance(op, A.Pool2D)] == [A.FLOAT32]
    np.testing.assert_array_equal(got, ref)


# -- Flatten and Reshape on the 8-bit values -----------------------------------------------------------

def _view_model(qtype: int, op_type: str, out_scale: float = 0.0213) -> onnx.ModelProto:
    """A float input quantized, dequantized, flattened (or reshaped to [1, -1, 5]), quantized by
    ``out_scale`` (the input's: the pattern that is a view of the 8-bit tensor, as ``quantize_static``
    writes it before a classifier) and dequantized."""
    from onnx import TensorProto, helper

    dtype = onnx.helper.tensor_dtype_to_np_dtype(qtype)
    zero = np.iinfo(dtype).min + 77
    inits = [onnx.numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("s", 0.0213), ("so", out_scale))]
    inits += [onnx.numpy_helper.from_array(np.array(zero, dtype), "z"),
              onnx.numpy_helper.from_array(np.array([1, -1, 5], np.int64), "shape")]
    viewed = (helper.make_node("Flatten", ["af"], ["viewed"], name="view", axis=1) if op_type == "Flatten"
              else helper.make_node("Reshape", ["af", "shape"], ["viewed"], name="view"))
    nodes = [helper.make_node("QuantizeLinear", ["a", "s", "z"], ["aq"], name="quantize"),
             helper.make_node("DequantizeLinear", ["aq", "s", "z"], ["af"], name="dequantize"),
             viewed,
             helper.make_node("QuantizeLinear", ["viewed", "so", "z"], ["yq"], name="requantize"),
             helper.make_node("DequantizeLinear", ["yq", "so", "z"], ["y"], name="output")]
    graph = helper.make_graph(nodes, "view", [helper.make_tensor_value_info("a", TensorProto.FLOAT, (1, 6, 4, 5))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("op_type", ["Flatten", "Reshape"])
@pytest.mark.parametrize("qtype", [onnx.TensorProto.INT8, onnx.TensorProto.UINT8], ids=["int8", "uint8"])
def test_qdq_flatten_is_a_view_of_the_8bit_values(backend, qtype, op_type):
    """DequantizeLinear -> Flatten / Reshape -> QuantizeLinear of one scale and zero point is a view of
    the 8-bit tensor on every backend: no op is left of the DequantizeLinear, the view or the
    QuantizeLinear, and the values are ONNX Runtime's unfused path's exactly."""
    pytest.importorskip("onnxruntime")
    got, ref, ops = _run_sum(_view_model(qtype, op_type), backend, ((1, 6, 4, 5),))
    assert not [op for op in ops if op.source in ("dequantize", "view", "requantize")]
    assert got.shape == ((1, 120) if op_type == "Flatten" else (1, 24, 5))
    np.testing.assert_array_equal(got, ref)


def test_qdq_flatten_requantized_by_another_scale_stays_float():
    """Requantized by another scale the view is not a copy of 8-bit values: it runs in float, with
    ONNX Runtime's unfused path's values."""
    pytest.importorskip("onnxruntime")
    got, ref, ops = _run_sum(_view_model(onnx.TensorProto.INT8, "Flatten", out_scale=0.05), "cpu", ((1, 6, 4, 5),))
    assert [op for op in ops if op.source == "requantize"]
    np.testing.assert_array_equal(got, ref)


#: byte max poolings (in_hw, kernel, strides, pads, out_hw): ResNet's 3x3 stride 2, odd sizes,
#: asymmetric windows and padding, windows that tile the input
BYTE_POOLS = [((112, 112), (3, 3), (2, 2), (1, 1, 1, 1), (56, 56)), ((9, 11), (2, 3), (1, 2), (0, 1, 1, 1), (9, 6)),
              ((8, 10), (3, 3), (2, 2), (0, 0, 1, 1), (4, 5)), ((7, 7), (2, 2), (2, 2), (0, 0, 0, 0), (3, 3))]


@pytest.mark.parametrize("geometry", BYTE_POOLS, ids=[f"{g[0][0]}x{g[0][1]}-k{g[1][0]}{g[1][1]}" for g in BYTE_POOLS])
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_compiled_byte_max_pool_is_numpys(geometry, dtype):
    """The cpu's compiled max pooling of 8-bit planes (one thread and plane spans on two) gives
    NumPy's separable passes' bytes."""
    hw, kernel, strides, pads, out_hw = geometry
    info = np.iinfo(dtype)
    x = np.random.default_rng(3).integers(info.min, info.max + 1, (2, 40) + hw).astype(dtype)
    op = A.Pool2D(("x",), ("y",), "pool", op="max", batch=2, channels=40, in_hw=hw, out_hw=out_hw, kernel=kernel,
                  strides=strides, pads=pads, dtype=dtype)

    def run(backend):
        out = np.zeros((2, 40) + out_hw, dtype)
        exe = backend.create_execution(op, [_handle(x)], [TensorHandle(out.reshape(-1), 0, out.shape, dtype)])
        for work in exe.work:
            work()
        return out, exe.scheme
    reference, _ = run(CpuBackend(threads=1, jit=False))
    for threads in (1, 2):
        got, scheme = run(CpuBackend(threads=threads))
        assert scheme == "bytes compiled"
        np.testing.assert_array_equal(got, reference)


# -- global average pooling on the 8-bit values ----------------------------------------------------------

#: the input's and output's scales of the pooling models: another scale out, as quantize_static writes
AVERAGE_SCALES = (0.0213, 0.0119)


def _average_pool_model(qtype: int, shape, *, after: str = "", depthwise: bool = False) -> onnx.ModelProto:
    """A float input quantized and dequantized, (``depthwise``: a QDQ depthwise 3x3 convolution first,
    requantized), globally average-pooled, ``after`` (Relu or nothing), quantized by another scale and
    zero point, dequantized: the pattern ``quantize_static`` writes before a classifier."""
    from onnx import TensorProto, helper

    dtype = onnx.helper.tensor_dtype_to_np_dtype(qtype)
    info = np.iinfo(dtype)
    channels = shape[1]
    inits = [onnx.numpy_helper.from_array(np.array(v, np.float32), n)
             for n, v in (("s", AVERAGE_SCALES[0]), ("so", AVERAGE_SCALES[1]), ("sc", 0.0371), ("ws", 0.0157))]
    inits += [onnx.numpy_helper.from_array(np.array(v, dtype), n)
              for n, v in (("z", info.min + 90), ("zo", info.min + 41), ("zc", info.min + 120))]
    nodes = [helper.make_node("QuantizeLinear", ["a", "s", "z"], ["aq"]),
             helper.make_node("DequantizeLinear", ["aq", "s", "z"], ["af"])]
    pooled_input = "af"
    if depthwise:
        weight = np.random.default_rng(8).integers(-127, 128, (channels, 1, 3, 3)).astype(np.int8)
        inits += [onnx.numpy_helper.from_array(weight, "wq"), onnx.numpy_helper.from_array(np.array(0, np.int8), "wz")]
        nodes += [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wf"]),
                  helper.make_node("Conv", ["af", "wf"], ["conv"], name="depthwise", group=channels,
                                   kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                  helper.make_node("QuantizeLinear", ["conv", "sc", "zc"], ["cq"]),
                  helper.make_node("DequantizeLinear", ["cq", "sc", "zc"], ["cf"])]
        pooled_input = "cf"
    nodes.append(helper.make_node("GlobalAveragePool", [pooled_input], ["pooled"], name="pool"))
    last = "pooled"
    if after == "Relu":
        nodes.append(helper.make_node("Relu", ["pooled"], ["act"], name="act"))
        last = "act"
    nodes += [helper.make_node("QuantizeLinear", [last, "so", "zo"], ["yq"]),
              helper.make_node("DequantizeLinear", ["yq", "so", "zo"], ["y"])]
    graph = helper.make_graph(nodes, "average", [helper.make_tensor_value_info("a", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("after", ["", "Relu"])
@pytest.mark.parametrize("qtype", [onnx.TensorProto.INT8, onnx.TensorProto.UINT8], ids=["int8", "uint8"])
def test_qdq_global_average_pool_on_the_8bit_values(backend, qtype, after):
    """DequantizeLinear -> GlobalAveragePool -> [Relu] -> QuantizeLinear is one QuantizedGlobalAveragePool
    on the cpu (NCHW input: no int8 op wrote it channels-last; odd channels, a batch of two) and pools in
    float on the GPU APIs (``precision.int8_global_average_pool``); within one step of ONNX Runtime's
    unfused path on each."""
    pytest.importorskip("onnxruntime")
    shape = (2, 7, 9, 5)
    got, ref, ops = _run_sum(_average_pool_model(qtype, shape, after=after), backend, (shape,))
    pools = [op for op in ops if isinstance(op, A.QuantizedGlobalAveragePool)]
    if backend == "cpu":
        assert len(pools) == 1 and not pools[0].channels_last and pools[0].pixels == 45
        assert not [op for op in ops if isinstance(op, A.Pool2D)]
        assert not [op for op in ops if isinstance(op, A.Unary) and op.op == "relu"]
    else:
        assert not pools and len([op for op in ops if isinstance(op, A.Pool2D)]) == 1
    assert np.abs(got - ref).max() <= AVERAGE_SCALES[1] * 1.001
    assert np.mean(got == ref) > 0.9  # one step apart only where the float path's mean lies by a tie


@pytest.mark.parametrize("qtype", [onnx.TensorProto.INT8, onnx.TensorProto.UINT8], ids=["int8", "uint8"])
def test_qdq_global_average_pool_reads_the_channels_last_producer(qtype):
    """After a channels-last int8 depthwise convolution the cpu's pooling reads its NHWC tensor: no 8-bit
    transpose is left, and the result is within one step of ONNX Runtime's unfused path."""
    pytest.importorskip("onnxruntime")
    shape = (1, 13, 7, 7)
    got, ref, ops = _run_sum(_average_pool_model(qtype, shape, depthwise=True), "cpu", (shape,))
    pools = [op for op in ops if isinstance(op, A.QuantizedGlobalAveragePool)]
    assert len(pools) == 1 and pools[0].channels_last
    assert [op.channels_last for op in ops if isinstance(op, A.QuantizedConv2D)] == [True]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(qtype).name
    eight_bit_rasters = [op for op in ops if isinstance(op, A.Raster) and op.dtype == dtype]
    assert len(eight_bit_rasters) == 1  # the NCHW input's transpose into the convolution, none after it
    assert np.abs(got - ref).max() <= AVERAGE_SCALES[1] * 1.001


@pytest.mark.parametrize("qtype", [onnx.TensorProto.INT8, onnx.TensorProto.UINT8], ids=["int8", "uint8"])
def test_qlinear_global_average_pool_is_one_op(backend, qtype):
    """ONNX Runtime's QLinearGlobalAveragePool (com.microsoft, NCHW) is one QuantizedGlobalAveragePool on the
    cpu and pools in float on the GPU APIs, within one step of its kernel on each."""
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    dtype = onnx.helper.tensor_dtype_to_np_dtype(qtype)
    info = np.iinfo(dtype)
    shape = (2, 11, 6, 7)
    inits = [onnx.numpy_helper.from_array(np.array(v, np.float32), n)
             for n, v in (("s", AVERAGE_SCALES[0]), ("so", AVERAGE_SCALES[1]))]
    inits += [onnx.numpy_helper.from_array(np.array(v, dtype), n) for n, v in (("z", info.min + 90),
                                                                             ("zo", info.min + 41))]
    nodes = [helper.make_node("QuantizeLinear", ["a", "s", "z"], ["aq"]),
             helper.make_node("QLinearGlobalAveragePool", ["aq", "s", "z", "so", "zo"], ["yq"], name="pool",
                              domain="com.microsoft", channels_last=0),
             helper.make_node("DequantizeLinear", ["yq", "so", "zo"], ["y"])]
    graph = helper.make_graph(nodes, "qlinear_average", [helper.make_tensor_value_info("a", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    got, ref, ops = _run_sum(model, backend, (shape,))
    pools = [op for op in ops if isinstance(op, A.QuantizedGlobalAveragePool)]
    assert len(pools) == (1 if backend == "cpu" else 0)
    assert np.abs(got - ref).max() <= AVERAGE_SCALES[1] * 1.001


#: (batch, channels, height, width) of the pooling kernels: odd channels, MobileNet's last plane, a
#: plane whose sums pass 16 bits
AVERAGE_POOLS = [(2, 7, 9, 5), (1, 1280, 7, 7), (1, 3, 56, 57)]


@pytest.mark.parametrize("shape", AVERAGE_POOLS, ids=["x".join(map(str, s)) for s in AVERAGE_POOLS])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_compiled_global_average_pool_is_the_contract(shape, channels_last, dtype):
    """The cpu's compiled global average pooling (rows of channels-last pixels, or NCHW planes) gives
    NumPy's contract's bytes, and those are the exact mean's requantization within one step (the
    contract's float32 product rounds only near a tie)."""
    from gpumnn.backends.cpu.int8_elementwise import quantized_global_average_pool_reference

    n, c, h, w = shape
    info = np.iinfo(dtype)
    nchw = np.random.default_rng(6).integers(info.min, info.max + 1, shape).astype(dtype)
    x = nchw.transpose(0, 2, 3, 1) if channels_last else nchw
    x_zero, y_zero, (x_scale, y_scale) = int(info.min) + 90, int(info.min) + 41, AVERAGE_SCALES
    op = A.QuantizedGlobalAveragePool(("x",), ("y",), "pool", dtype=dtype, batch=n, channels=c, pixels=h * w,
                                      channels_last=channels_last, x_zero_point=x_zero,
                                      multiplier=float(np.float32(x_scale / (y_scale * h * w))),
                                      y_zero_point=y_zero, out_dtype=dtype, lo=int(info.min), hi=int(info.max))

    def run(backend):
        out = np.zeros((n, c, 1, 1), dtype)
        exe = backend.create_execution(op, [_handle(x)], [TensorHandle(out.reshape(-1), 0, out.shape, dtype)])
        for work in exe.work:
            work()
        return out, exe.scheme
    reference, _ = run(CpuBackend(threads=1, jit=False))
    np.testing.assert_array_equal(reference.reshape(n, c), quantized_global_average_pool_reference(op, x))
    got, scheme = run(CpuBackend(threads=1))
    assert scheme == "int8 compiled"
    np.testing.assert_array_equal(got, reference)
    exact = (nchw.astype(np.float64) - x_zero).mean(axis=(2, 3)) * x_scale / y_scale
    expected = np.clip(np.rint(exact) + y_zero, info.min, info.max)
    assert np.abs(reference.reshape(n, c).astype(np.int32) - expected).max() <= 1
    assert np.mean(reference.reshape(n, c) == expected) > 0.99


# -- QuantizeLinear of float32 values in one pass --------------------------------------------------------

def _quantize_model(qtype: int, shape, zero_point: int | None, scale: float = 0.0173) -> onnx.ModelProto:
    """One QuantizeLinear (per tensor) of a float input, its 8-bit output the graph's."""
    from onnx import TensorProto, helper

    inits = [onnx.numpy_helper.from_array(np.array(scale, np.float32), "s")]
    inputs = ["x", "s"]
    if zero_point is not None:
        inits.append(onnx.numpy_helper.from_array(np.array(zero_point, onnx.helper.tensor_dtype_to_np_dtype(qtype)),
                                                  "z"))
        inputs.append("z")
    attrs = {} if zero_point is not None else {"output_dtype": qtype}
    graph = helper.make_graph([helper.make_node("QuantizeLinear", inputs, ["y"], name="q", **attrs)], "quantize",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", qtype, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _quantize_feed(shape, scale: float) -> np.ndarray:
    """Values across and past the 8-bit range, and exact halves of a step (ties round to even)."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(shape) * 150 * scale).astype(np.float32).reshape(-1)
    x[::7] = ((rng.integers(-300, 300, x[::7].shape) + np.float32(0.5)) * np.float32(scale)).astype(np.float32)
    x[1::97] = 1e30
    x[2::97] = -1e30
    return x.reshape(shape)


@pytest.mark.parametrize("zero_point", [None, "given"])
@pytest.mark.parametrize("qtype", [onnx.TensorProto.INT8, onnx.TensorProto.UINT8], ids=["int8", "uint8"])
@pytest.mark.parametrize("shape", [(1, 3, 130, 131), (5, 7, 3)], ids=["image", "odd"])
def test_quantize_linear_is_onnx_runtimes(backend, qtype, zero_point, shape):
    """A QuantizeLinear per tensor of float32 values gives ONNX Runtime's QuantizeLinear's bits on every
    backend (ties to even, saturation): one Quantize op where the backend has its kernel
    (``precision.one_pass_quantize``: the cpu, the image's size cut into spans on its threads), else the
    five float ops and the conversion."""
    ort = pytest.importorskip("onnxruntime")
    dtype = onnx.helper.tensor_dtype_to_np_dtype(qtype)
    zp = None if zero_point is None else int(np.iinfo(dtype).min + 77)
    model = _quantize_model(qtype, shape, zp)
    x = _quantize_feed(shape, 0.0173)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    with gpumnn.load(model).session(backend=backend, fallback=False) as session:
        got = session.run({"x": x})["y"]
        ops = list(session.program.ops)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, ref)
    if backend == "cpu":
        assert [type(op) for op in ops] == [A.Quantize], ops
    else:
        assert not [op for op in ops if isinstance(op, A.Quantize)]
        assert "div" in [op.op for op in ops if isinstance(op, A.Binary)]


@pytest.mark.parametrize("qtype", [onnx.TensorProto.INT8, onnx.TensorProto.UINT8], ids=["int8", "uint8"])
def test_compiled_quantize_is_numpys(qtype):
    """The compiled pass and the NumPy passes (``jit=False``) give the same bits."""
    from gpumnn.backends.cpu.int8_elementwise import quantize_reference

    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(qtype))
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    x = _quantize_feed((70001,), 0.031)
    op = A.Quantize(("x",), ("y",), "q", count=x.size, y_scale=0.031, y_zero_point=int(lo + 9), out_dtype=dtype.name,
                    lo=int(lo), hi=int(hi))
    expected = quantize_reference(op, x)
    for backend in (CpuBackend(threads=2), CpuBackend(threads=1, jit=False)):
        out = np.zeros(x.size, dtype)
        exe = backend.create_execution(op, [_handle(x)], [TensorHandle(out, 0, out.shape, dtype.name)])
        for work in exe.work:
            work()
        np.testing.assert_array_equal(out, expected)


# -- the stem's layout ------------------------------------------------------------------------------------

def _stem_model(reader: str) -> onnx.ModelProto:
    """x quantized (int8), a 3x3 stride-2 QDQ convolution of its 3 channels to 16 with a Relu, quantized,
    then read (dequantized) by ``reader``: "depthwise" (a QDQ 3x3 depthwise convolution), "pointwise"
    (a QDQ 1x1), "max pool" (a QDQ MaxPool), or "depthwise and max pool" (both)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(4)
    inits, nodes = [], []

    def const(name, value):
        inits.append(onnx.numpy_helper.from_array(np.asarray(value), name))
        return name

    def qdq(tensor, scale, zero, name):
        s, z = const(f"{name}_s", np.float32(scale)), const(f"{name}_z", np.int8(zero))
        nodes.append(helper.make_node("QuantizeLinear", [tensor, s, z], [f"{name}_q"], name=f"{name}_Q"))
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", s, z], [f"{name}_dq"], name=f"{name}_DQ"))
        return f"{name}_dq"

    def conv(x, name, oc, c, k, stride, groups, x_scale):
        w = rng.integers(-127, 128, (oc, c // groups, k, k)).astype(np.int8)
        w_scale = rng.uniform(0.002, 0.01, oc).astype(np.float32)
        nodes.append(helper.make_node("DequantizeLinear", [const(f"{name}_w", w), const(f"{name}_ws", w_scale),
                                                           const(f"{name}_wz", np.zeros(oc, np.int8))],
                                      [f"{name}_wf"], axis=0))
        bias = (rng.integers(-500, 500, oc) * x_scale * w_scale).astype(np.float32)
        nodes.append(helper.make_node("Conv", [x, f"{name}_wf", const(f"{name}_b", bias)], [f"{name}_y"], name=name,
                                      strides=[stride, stride], pads=[k // 2] * 4, group=groups))
        return f"{name}_y"

    x = qdq("x", 0.031, 3, "input")
    stem = conv(x, "stem", 16, 3, 3, 2, 1, 0.031)
    nodes.append(helper.make_node("Relu", [stem], ["stem_relu"], name="stem_relu"))
    y = qdq("stem_relu", 0.047, -128, "stem_out")
    outputs = []
    if "depthwise" in reader or reader == "pointwise":
        k, groups = (3, 16) if "depthwise" in reader else (1, 1)
        outputs.append(qdq(conv(y, "second", 16, 16, k, 1, groups, 0.047), 0.06, 5, "second_out"))
    if "max pool" in reader:
        nodes.append(helper.make_node("MaxPool", [y], ["pooled"], name="pool", kernel_shape=[3, 3], strides=[2, 2],
                                      pads=[1, 1, 1, 1]))
        outputs.append(qdq("pooled", 0.047, -128, "pool_out"))
    graph = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 33, 30))],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("reader", ["depthwise", "pointwise", "max pool", "depthwise and max pool"])
def test_stem_writes_channels_last_for_channels_last_readers(backend, reader):
    """On the cpu, a QDQ convolution over 3 input channels whose output only channels-last int8 convolutions
    read (depthwise, 1x1) writes it channels-last (``out_channels_last``), so that no 8-bit transpose is
    left; where an NCHW op reads it too (max pooling), and on the GPU APIs, it writes NCHW planes. Every
    output within one step of ONNX Runtime's unfused path."""
    ort = pytest.importorskip("onnxruntime")
    model = _stem_model(reader)
    x = np.random.default_rng(2).standard_normal((1, 3, 33, 30)).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    names = [o.name for o in model.graph.output]
    refs = ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(names, {"x": x})
    with gpumnn.load(model).session(backend=backend, fallback=False) as session:
        got = session.run({"x": x})
        ops = list(session.program.ops)
    stems = [op for op in ops if isinstance(op, A.QuantizedConv2D) and op.source == "stem"]
    assert len(stems) == 1
    channels_last = backend == "cpu" and "max pool" not in reader
    assert stems[0].out_channels_last == channels_last
    transposes = [op for op in ops if isinstance(op, A.Raster) and op.dtype == A.INT8 and op.source == "stem"]
    assert not transposes  # NCHW planes read as they are, or NHWC ones by channels-last readers
    for name, ref, scale in zip(names, refs, [0.06 if n.startswith("second") else 0.047 for n in names]):
        assert np.abs(got[name] - ref).max() <= scale * 1.001, name


# im2col's convolutions (neither 1x1 products nor depthwise nor over few channels): the indirection
# kernel's (``int8_conv.runs_indirect``) and, with channels per pixel past whole words or too few, the
# packed rows': pixels past a whole number of tiles, several panels, a batch, strides, dilation, groups
# of 16 and more channels, windows wholly in the padding, a 1x1 at stride 2
IM2COL = [g for g in GEOMETRIES if g[0] in ("3x3", "3x3 stride 2", "1x1 stride 2")] + [
    ("dilated", 20, (10, 10), 70, 3, 1, 2, 2, 1, 1),
    ("dilated, channels past whole words", 17, (10, 10), 12, 3, 1, 2, 2, 1, 1),
    ("groups of 16", 32, (7, 6), 48, 3, 1, 1, 1, 2, 2),
    ("5x5 padding past the plane", 36, (3, 2), 24, 5, 1, 3, 1, 1, 1),
    ("wide, few pixels", 256, (3, 3), 64, 3, 2, 1, 1, 1, 3),
]


@pytest.mark.parametrize("path", ["vnni512", "avx512bw", "avx2", "portable"])
@pytest.mark.parametrize("indirect", [True, False], ids=["indirect", "packed"])
def test_im2col_kernels_are_the_contract_exactly(path, indirect, monkeypatch):
    """The indirection kernel (the tile reading each window tap by tap through the table) and the
    packed rows give the reference's bits on each path this host runs, int8 and uint8 in; the engine
    runs the indirection kernel exactly where ``runs_indirect`` says."""
    from gpumnn.backends.cpu import int8 as cpu_int8

    if path not in cpu_int8.host_paths():
        pytest.skip(f"this host runs {', '.join(cpu_int8.host_paths())}")
    monkeypatch.setattr(int8_conv, "INDIRECT", indirect)
    previous = cpu_int8.use_path(path)
    try:
        pairs = cpu_int8._TILES[path][1]
        for threads in (1, 2):
            backend = CpuBackend(threads=threads)
            for geometry in IM2COL:
                for seed, types in enumerate((("int8", "int8"), ("uint8", "uint8"))):
                    op, x, w, bias, multiplier, _ = _case(geometry, *types, seed=seed + 2 * threads)
                    out = np.zeros((op.batch, op.out_channels) + op.out_hw, op.out_dtype)
                    exe = backend.create_execution(op, [_handle(x), _handle(w), _handle(bias), _handle(multiplier)],
                                                   [TensorHandle(out.reshape(-1), 0, out.shape, op.out_dtype)])
                    assert ("indirect" in exe.scheme) == int8_conv.runs_indirect(op, pairs), (geometry[0], exe.scheme)
                    assert ("indirect" in exe.scheme) == (indirect and geometry[1] // geometry[8] % 4 == 0
                                                          and geometry[1] // geometry[8] >= 16), exe.scheme
                    for work in exe.work:
                        work()
                    np.testing.assert_array_equal(out, int8_conv.quantized_conv_reference(op, x, w, bias, multiplier),
                                                  err_msg=f"{geometry[0]} {types} {exe.scheme}")
    finally:
        cpu_int8.use_path(previous)


def test_indirection_table_points_each_tap_at_its_row():
    """The table's offsets: each output pixel's tap at its input pixel's row of the planes, padding and
    the pixels past the last tile at the zero row (the planes' last)."""
    op, *_ = _case(("3x3 stride 2", 24, (5, 4), 8, 3, 2, 1, 1, 1, 1), "int8", "int8")
    table = int8_conv.indirection_table(op, 2)  # int16 planes: 48 bytes a row
    oh, ow = op.out_hw
    assert table.shape == (-(-oh * ow // int8_conv.MR), 9, int8_conv.MR)
    zero_row = 5 * 4 * 48
    for p in range(table.shape[0] * int8_conv.MR):
        for tap in range(9):
            ih, iw = p // ow * 2 - 1 + tap // 3, p % ow * 2 - 1 + tap % 3
            inside = p < oh * ow and 0 <= ih < 5 and 0 <= iw < 4
            assert table[p // int8_conv.MR, tap, p % int8_conv.MR] == ((ih * 4 + iw) * 48 if inside else zero_row)
