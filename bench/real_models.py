"""Test models of architectures people ship, which the zoo's kernels were not tuned on (issue 32).

    python bench/real_models.py --out /tmp/real          # writes one .onnx per model there
    python bench/cpu_profile.py /tmp/real/text_direction.onnx --ort
    python bench/real_models.py --compare --repeats 7    # gpumnn / ONNX Runtime per model, alternating
    /tmp/torchvenv/bin/python bench/real_models.py --torchvision /tmp/real   # torchvision's own, exported
    python bench/real_models.py --models --onnx /tmp/real/tv_*.onnx --compare

Each model is built with ``onnx.helper`` (through the zoo's ``GraphBuilder``) node for node as its
framework exports it: torchvision's MobileNet-v3-small blocks as ``torch.onnx`` writes them
(HardSwish, HardSigmoid(alpha=1/6) and Mul for squeeze-excitation), YOLOX's SiLU as Sigmoid and
Mul, an LSTM as one ONNX LSTM node. Weights are seeded, with calibrated-looking BatchNorm
statistics (the zoo's ``batch_norm``), so a model is byte-for-byte reproducible.

- ``text_direction``: a MobileNet-v3-small text-direction classifier (depthwise-separable
  convolutions of 3x3 and 5x5, hard-swish, squeeze-excitation), input 1x3x48x192, 2 classes.
- ``crnn``: a CRNN text recogniser: a VGG-style CNN to one row of 40 columns, two bidirectional
  LSTMs of 96 units, per-column scores over 97 symbols.
- ``byte_cnn``: a 1-D convolution classifier over 1024 bytes: an embedding (Gather), 1-D
  convolutions, 1-D depthwise-separable blocks, global max pool, two classes.
- ``yolox_nano``: a small YOLOX-style detector: a CSP-ish backbone with SiLU, a neck that
  upsamples (Resize nearest x2) and concatenates, decoupled heads on three levels, input 1x3x160x160.
- ``voice_activity``: a Silero-style voice-activity model: an STFT as a strided 1-D convolution,
  magnitude, four 1-D convolutions, a two-layer LSTM over the frames, a sigmoid per frame.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gpumnn, not an installed one

from gpumnn.zoo.builder import GraphBuilder  # noqa: E402


def _make_divisible(value: float, divisor: int = 8) -> int:
    """torchvision's channel rounding (``_make_divisible``)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _act(g: GraphBuilder, x: str, name: str, kind: str) -> str:
    """ReLU, HardSwish or SiLU (Sigmoid and Mul, as YOLOX exports it)."""
    if kind == "RE":
        return g.relu(x, name)
    if kind == "HS":
        return g.node("HardSwish", [x], name)
    if kind == "SILU":
        return g.node("Mul", [x, g.node("Sigmoid", [x], f"{name}.sigmoid")], name)
    raise ValueError(kind)


def _conv_bn(g: GraphBuilder, x: str, name: str, cin: int, cout: int, kernel, stride=1, group: int = 1,
             act: str | None = None, pad=None) -> str:
    y = g.conv(x, f"{name}.conv", cin, cout, kernel, stride, pad, group)
    y = g.batch_norm(y, f"{name}.bn", cout)
    return y if act is None else _act(g, y, f"{name}.act", act)


# ------------------------------------------------------------------ MobileNet-v3-small, 48x192
#: torchvision's mobilenet_v3_small: (kernel, expanded, out, squeeze-excitation, activation, stride)
_MBV3_SMALL = (
    (3, 16, 16, True, "RE", 2), (3, 72, 24, False, "RE", 2), (3, 88, 24, False, "RE", 1),
    (5, 96, 40, True, "HS", 2), (5, 240, 40, True, "HS", 1), (5, 240, 40, True, "HS", 1),
    (5, 120, 48, True, "HS", 1), (5, 144, 48, True, "HS", 1), (5, 288, 96, True, "HS", 2),
    (5, 576, 96, True, "HS", 1), (5, 576, 96, True, "HS", 1),
)


def _squeeze_excitation(g: GraphBuilder, x: str, name: str, channels: int) -> str:
    """torchvision's SqueezeExcitation: mean -> 1x1 -> ReLU -> 1x1 -> HardSigmoid -> scale."""
    squeeze = _make_divisible(channels // 4)
    s = g.global_avg_pool(x, f"{name}.avgpool")
    s = g.relu(g.conv(s, f"{name}.fc1", channels, squeeze, 1, bias=True), f"{name}.relu")
    s = g.conv(s, f"{name}.fc2", squeeze, channels, 1, bias=True)
    s = g.node("HardSigmoid", [s], f"{name}.hardsigmoid", alpha=1.0 / 6.0, beta=0.5)
    return g.node("Mul", [x, s], f"{name}.scale")


def text_direction() -> onnx.ModelProto:
    g = GraphBuilder("text_direction", (1, 3, 48, 192), seed=3201,
                     doc="MobileNet-v3-small text-direction classifier, 48x192, seeded weights")
    x = _conv_bn(g, g.input, "features.0", 3, 16, 3, stride=2, act="HS")
    cin = 16
    for i, (k, exp, cout, se, act, stride) in enumerate(_MBV3_SMALL, start=1):
        name, y = f"features.{i}", x
        if exp != cin:
            y = _conv_bn(g, y, f"{name}.expand", cin, exp, 1, act=act)
        y = _conv_bn(g, y, f"{name}.dw", exp, exp, k, stride=stride, group=exp, act=act)
        if se:
            y = _squeeze_excitation(g, y, f"{name}.se", exp)
        y = _conv_bn(g, y, f"{name}.project", exp, cout, 1)
        x = g.node("Add", [x, y], f"{name}.add") if stride == 1 and cin == cout else y
        cin = cout
    x = _conv_bn(g, x, "features.12", cin, 576, 1, act="HS")
    x = g.flatten(g.global_avg_pool(x, "avgpool"), "flatten")
    x = g.node("HardSwish", [g.gemm(x, "classifier.0", 576, 1024)], "classifier.1")
    return g.finish(g.gemm(x, "classifier.3", 1024, 2, output="output"), (1, 2))


# ------------------------------------------------------------------ CRNN with bidirectional LSTMs
def _lstm(g: GraphBuilder, x: str, name: str, inputs: int, hidden: int, bidirectional: bool) -> str:
    """One ONNX LSTM over x [T, 1, inputs]; returns Y [T, directions, 1, hidden]. Forget-gate
    bias 1, as trained LSTMs tend to have."""
    dirs = 2 if bidirectional else 1
    scale = 1.0 / math.sqrt(hidden)
    w = g.initializer(f"{name}.W", g.uniform((dirs, 4 * hidden, inputs), -scale, scale))
    r = g.initializer(f"{name}.R", g.uniform((dirs, 4 * hidden, hidden), -scale, scale))
    bias = g.small_normal((dirs, 8 * hidden), 0.05)
    bias[:, 2 * hidden:3 * hidden] += 1.0  # ONNX gate order i, o, f, c: the forget gate's input bias
    b = g.initializer(f"{name}.B", bias)
    return g.node("LSTM", [x, w, r, b], name, hidden_size=hidden,
                  direction="bidirectional" if bidirectional else "forward")


def _sequence(g: GraphBuilder, y: str, name: str, steps: int, features: int) -> str:
    """LSTM output [T, dirs, 1, H] -> [T, 1, dirs*H], as torch's bidirectional output is."""
    y = g.node("Transpose", [y], f"{name}.transpose", perm=[0, 2, 1, 3])
    shape = g.initializer(f"{name}.shape", np.array([steps, 1, features], dtype=np.int64))
    return g.node("Reshape", [y, shape], f"{name}.reshape")


def crnn() -> onnx.ModelProto:
    g = GraphBuilder("crnn", (1, 3, 32, 160), seed=3202, doc="CRNN text recogniser, 32x160, seeded weights")
    steps, hidden, classes = 40, 96, 97
    x = _conv_bn(g, g.input, "cnn.0", 3, 32, 3, act="RE")
    x = g.max_pool(x, "cnn.pool0", 2, 2)                                    # 16x80
    x = _conv_bn(g, x, "cnn.1", 32, 64, 3, act="RE")
    x = g.max_pool(x, "cnn.pool1", 2, 2)                                    # 8x40
    x = _conv_bn(g, x, "cnn.2", 64, 128, 3, act="RE")
    x = _conv_bn(g, x, "cnn.3", 128, 128, 3, act="RE")
    x = g.node("MaxPool", [x], "cnn.pool2", kernel_shape=[2, 1], strides=[2, 1])   # 4x40
    x = _conv_bn(g, x, "cnn.4", 128, 192, 3, act="RE")
    x = g.node("MaxPool", [x], "cnn.pool3", kernel_shape=[2, 1], strides=[2, 1])   # 2x40
    x = _conv_bn(g, x, "cnn.5", 192, 192, (2, 1), pad=(0, 0), act="RE")            # 1x40
    x = g.node("Squeeze", [x, g.initializer("cnn.squeeze_axes", np.array([2], dtype=np.int64))], "cnn.squeeze")
    x = g.node("Transpose", [x], "rnn.columns", perm=[2, 0, 1])                     # [T, 1, 192]
    x = _sequence(g, _lstm(g, x, "rnn.0", 192, hidden, True), "rnn.0", steps, 2 * hidden)
    x = _sequence(g, _lstm(g, x, "rnn.1", 2 * hidden, hidden, True), "rnn.1", steps, 2 * hidden)
    w = g.initializer("fc.weight", g.he_normal((2 * hidden, classes), 2 * hidden))
    x = g.node("Add", [g.node("MatMul", [x, w], "fc.matmul"),
                       g.initializer("fc.bias", g.small_normal((classes,), 0.01))], "fc")
    return g.finish(g.node("Softmax", [x], "output", axis=2), (steps, 1, classes))


# ------------------------------------------------------------------ 1-D convolutions over bytes
def _conv1d(g: GraphBuilder, x: str, name: str, cin: int, cout: int, kernel: int, stride: int = 1,
            group: int = 1, pad: int | None = None, bias: bool = False) -> str:
    """A 1-D Conv node (3-D weights), as torch exports Conv1d."""
    pad = kernel // 2 if pad is None else pad
    inputs = [x, g.initializer(f"{name}.weight", g.he_normal((cout, cin // group, kernel), cin // group * kernel))]
    if bias:
        inputs.append(g.initializer(f"{name}.bias", g.small_normal((cout,), 0.01)))
    return g.node("Conv", inputs, name, kernel_shape=[kernel], strides=[stride], pads=[pad, pad], group=group)


def _conv1d_bn(g: GraphBuilder, x: str, name: str, cin: int, cout: int, kernel: int, stride: int = 1,
               group: int = 1, act: str | None = "RE") -> str:
    y = g.batch_norm(_conv1d(g, x, f"{name}.conv", cin, cout, kernel, stride, group), f"{name}.bn", cout)
    return y if act is None else _act(g, y, f"{name}.act", act)


def byte_cnn() -> onnx.ModelProto:
    length, embed = 1024, 16
    g = GraphBuilder("byte_cnn", (1, length), seed=3203, doc="1-D convolution classifier over bytes, seeded weights")
    table = g.initializer("embed.weight", g.small_normal((256, embed), 1.0))
    x = g.node("Gather", [table, g.input], "embed", axis=0)                        # [1, L, E]
    x = g.node("Transpose", [x], "embed.transpose", perm=[0, 2, 1])                 # [1, E, L]
    x = _conv1d_bn(g, x, "conv.0", embed, 64, 9, stride=2)                 # 512
    x = _conv1d_bn(g, x, "conv.1", 64, 96, 5)
    x = g.node("MaxPool", [x], "pool.1", kernel_shape=[2], strides=[2])            # 256
    cin = 96
    for i, (cout, stride) in enumerate(((128, 1), (128, 2), (192, 1), (192, 2), (256, 1)), start=2):
        y = _conv1d_bn(g, x, f"block.{i}.dw", cin, cin, 5, stride=stride, group=cin)
        y = _conv1d_bn(g, y, f"block.{i}.pw", cin, cout, 1)
        x = g.node("Add", [x, y], f"block.{i}.add") if stride == 1 and cin == cout else y
        cin = cout
    x = g.node("GlobalMaxPool", [x], "pool")
    x = g.flatten(x, "flatten")
    x = g.relu(g.gemm(x, "fc.0", cin, 64), "fc.relu")
    model = g.finish(g.gemm(x, "fc.1", 64, 2, output="output"), (1, 2))
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.INT64
    return model


# ------------------------------------------------------------------ YOLOX-style detector
def _csp(g: GraphBuilder, x: str, name: str, channels: int) -> str:
    """A CSP layer: two 1x1 halves, a residual 3x3 bottleneck on one, concatenated, 1x1."""
    half = channels // 2
    a = _conv_bn(g, x, f"{name}.conv1", channels, half, 1, act="SILU")
    b = _conv_bn(g, x, f"{name}.conv2", channels, half, 1, act="SILU")
    y = _conv_bn(g, a, f"{name}.m.conv1", half, half, 1, act="SILU")
    y = _conv_bn(g, y, f"{name}.m.conv2", half, half, 3, act="SILU")
    a = g.node("Add", [a, y], f"{name}.m.add")
    return _conv_bn(g, g.node("Concat", [a, b], f"{name}.cat", axis=1), f"{name}.conv3", channels, channels, 1, act="SILU")


def yolox_nano() -> onnx.ModelProto:
    classes, size = 4, 160
    g = GraphBuilder("yolox_nano", (1, 3, size, size), seed=3204, doc="YOLOX-style detector, 160x160, seeded weights")
    x = _conv_bn(g, g.input, "stem", 3, 16, 3, stride=2, act="SILU")              # 80
    x = _conv_bn(g, x, "dark2.down", 16, 32, 3, stride=2, act="SILU")              # 40
    x = _csp(g, x, "dark2.csp", 32)
    x = _conv_bn(g, x, "dark3.down", 32, 64, 3, stride=2, act="SILU")              # 20 (stride 8)
    c3 = _csp(g, x, "dark3.csp", 64)
    x = _conv_bn(g, c3, "dark4.down", 64, 128, 3, stride=2, act="SILU")            # 10 (stride 16)
    c4 = _csp(g, x, "dark4.csp", 128)
    x = _conv_bn(g, c4, "dark5.down", 128, 256, 3, stride=2, act="SILU")           # 5 (stride 32)
    c5 = _csp(g, x, "dark5.csp", 256)
    scales = g.initializer("neck.scales", np.array([1, 1, 2, 2], dtype=np.float32))

    def up(t: str, name: str) -> str:
        return g.node("Resize", [t, "", scales], name, mode="nearest")

    p5 = _conv_bn(g, c5, "neck.lateral5", 256, 128, 1, act="SILU")
    p4 = _csp(g, g.node("Concat", [up(p5, "neck.up5"), c4], "neck.cat4", axis=1), "neck.csp4", 256)
    p4 = _conv_bn(g, p4, "neck.lateral4", 256, 64, 1, act="SILU")
    p3 = _csp(g, g.node("Concat", [up(p4, "neck.up4"), c3], "neck.cat3", axis=1), "neck.csp3", 128)
    outputs = []
    for level, (feature, channels) in enumerate(((p3, 128), (p4, 64), (p5, 128))):
        name = f"head.{level}"
        stem = _conv_bn(g, feature, f"{name}.stem", channels, 64, 1, act="SILU")
        cls = _conv_bn(g, _conv_bn(g, stem, f"{name}.cls.0", 64, 64, 3, act="SILU"), f"{name}.cls.1", 64, 64, 3, act="SILU")
        reg = _conv_bn(g, _conv_bn(g, stem, f"{name}.reg.0", 64, 64, 3, act="SILU"), f"{name}.reg.1", 64, 64, 3, act="SILU")
        box = g.conv(reg, f"{name}.reg_pred", 64, 4, 1, bias=True)
        obj = g.node("Sigmoid", [g.conv(reg, f"{name}.obj_pred", 64, 1, 1, bias=True)], f"{name}.obj")
        score = g.node("Sigmoid", [g.conv(cls, f"{name}.cls_pred", 64, classes, 1, bias=True)], f"{name}.cls")
        y = g.node("Concat", [box, obj, score], f"{name}.cat", axis=1)
        shape = g.initializer(f"{name}.shape", np.array([1, 5 + classes, -1], dtype=np.int64))
        outputs.append(g.node("Reshape", [y, shape], f"{name}.flatten"))
    y = g.node("Concat", outputs, "head.cat", axis=2)
    cells = sum((size // s) ** 2 for s in (8, 16, 32))
    return g.finish(g.node("Transpose", [y], "output", perm=[0, 2, 1]), (1, cells, 5 + classes))


# ------------------------------------------------------------------ voice activity with an LSTM
def voice_activity() -> onnx.ModelProto:
    samples, window, hop = 4096, 256, 128
    bins = window // 2 + 1
    g = GraphBuilder("voice_activity", (1, samples), seed=3205, doc="Silero-style voice-activity model, seeded weights")
    x = g.node("Unsqueeze", [g.input, g.initializer("stft.axes", np.array([1], dtype=np.int64))], "stft.unsqueeze")
    # a real STFT's basis: cos and sin rows of a Hann-windowed DFT
    n, k = np.arange(window), np.arange(bins)[:, None]
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * n / window)
    basis = np.concatenate([np.cos(2 * np.pi * k * n / window), -np.sin(2 * np.pi * k * n / window)]) * hann
    x = g.node("Conv", [x, g.initializer("stft.basis", basis[:, None, :].astype(np.float32))], "stft",
               kernel_shape=[window], strides=[hop], pads=[window // 2, window // 2])   # [1, 2*bins, frames]
    frames = samples // hop + 1
    real = g.node("Slice", [x, g.initializer("stft.re0", np.array([0], dtype=np.int64)),
                            g.initializer("stft.re1", np.array([bins], dtype=np.int64)),
                            g.initializer("stft.axis", np.array([1], dtype=np.int64))], "stft.real")
    imag = g.node("Slice", [x, g.initializer("stft.im0", np.array([bins], dtype=np.int64)),
                            g.initializer("stft.im1", np.array([2 * bins], dtype=np.int64)), "stft.axis"], "stft.imag")
    power = g.node("Add", [g.node("Mul", [real, real], "stft.re2"), g.node("Mul", [imag, imag], "stft.im2")], "stft.power")
    x = g.node("Sqrt", [power], "stft.magnitude")
    x = g.node("Log", [g.node("Add", [x, g.scalar("stft.eps", 1e-3)], "stft.floor")], "stft.log")
    channels = ((bins, 128, 1), (128, 64, 2), (64, 64, 2), (64, 128, 1))
    for i, (cin, cout, stride) in enumerate(channels):
        x = g.relu(_conv1d(g, x, f"encoder.{i}", cin, cout, 3, stride=stride, bias=True), f"encoder.{i}.relu")
        frames = (frames - 1) // stride + 1
    x = g.node("Transpose", [x], "rnn.frames", perm=[2, 0, 1])                      # [T, 1, 128]
    x = g.node("Squeeze", [_lstm(g, x, "rnn.0", 128, 64, False),
                           g.initializer("rnn.axes", np.array([1], dtype=np.int64))], "rnn.0.squeeze")
    x = g.node("Squeeze", [_lstm(g, x, "rnn.1", 64, 64, False), "rnn.axes"], "rnn.1.squeeze")   # [T, 1, 64]
    x = g.relu(x, "decoder.relu")
    w = g.initializer("decoder.weight", g.he_normal((64, 1), 64))
    x = g.node("Add", [g.node("MatMul", [x, w], "decoder.matmul"), g.scalar("decoder.bias", 0.1)], "decoder")
    return g.finish(g.node("Sigmoid", [x], "output"), (frames, 1, 1))


MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "text_direction": text_direction,
    "crnn": crnn,
    "byte_cnn": byte_cnn,
    "yolox_nano": yolox_nano,
    "voice_activity": voice_activity,
}


#: torchvision models exported by ``--torchvision``: (name, its constructor's arguments, input shape);
#: each through both of ``torch.onnx``'s exporters, TorchScript's (``tv_NAME.onnx``) and the
#: torch.export-based one, the default since torch 2.9 (``tv_NAME_dynamo.onnx``: it writes a global
#: average pool as ReduceMean over the spatial axes, say)
TORCHVISION = (("mobilenet_v3_small", {"num_classes": 2}, (1, 3, 48, 192)),
               ("mobilenet_v2", {}, (1, 3, 224, 224)),
               ("efficientnet_b0", {}, (1, 3, 224, 224)),
               ("shufflenet_v2_x1_0", {}, (1, 3, 224, 224)),
               ("resnet18", {}, (1, 3, 224, 224)))


def export_torchvision(folder: str | Path) -> list[Path]:
    """``TORCHVISION``'s models, seeded, their BatchNorm statistics calibrated on random batches,
    through ``torch.onnx``'s two exporters into ``folder``: the most faithful "models we did not
    design". Needs torch, torchvision and onnxscript, which gpumnn never depends on (a separate venv
    will do)."""
    import torch
    import torchvision

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, arguments, shape in TORCHVISION:
        torch.manual_seed(0)
        model = getattr(torchvision.models, name)(**arguments)
        model.train()
        with torch.no_grad():
            for _ in range(4):
                model(torch.randn(8, *shape[1:]))
        model.eval()
        example = (torch.randn(*shape),)
        for suffix, options in (("", {"dynamo": False, "opset_version": 17}),
                                ("_dynamo", {"dynamo": True, "external_data": False})):
            paths.append(folder / f"tv_{name}{suffix}.onnx")
            torch.onnx.export(model, example, str(paths[-1]), input_names=["input"], output_names=["output"], **options)
    return paths


def save_all(folder: str | Path) -> dict[str, Path]:
    """Every model as ``folder/NAME.onnx``, checked by ONNX's checker with shape inference."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, build in MODELS.items():
        model = build()
        onnx.checker.check_model(model, full_check=True)
        paths[name] = folder / f"{name}.onnx"
        onnx.save(model, paths[name])
    return paths


def compare(paths: dict[str, Path], threads: int, repeats: int, runs: int, pause: float) -> None:
    """gpumnn's cpu backend and ONNX Runtime on each model, whole runs alternating in one process."""
    import statistics

    from gpumnn.tools.benchmark import Spread, alternate, load_model, onnxruntime_runner, rel_l2

    from core_link import one_way_ns

    def link() -> str:
        ns = one_way_ns()
        return "unknown" if ns is None else f"{ns:.0f} ns"

    print(f"{threads} threads, mean of {runs} runs, {repeats} repeats alternating; ms median (min-max); "
          "fastest: the ratio of each engine's fastest single run (the run least disturbed by other work)")
    print(f"cross-core hand-over before: {link()} (bench/core_link.py: the machine's state)")
    print(f"{'model':<16} {'gpumnn ms':>20} {'ORT ms':>20} {'gpumnn/ORT':>16} {'fastest':>8}  err")
    for name, path in paths.items():
        net, model_bytes, feed = load_model(str(path))
        ort = onnxruntime_runner(model_bytes, threads)
        sess = net.session(backend="cpu", threads=threads)
        err = rel_l2(next(iter(sess.run(feed).values())), ort(feed))
        times = alternate({"gpumnn": lambda: sess.run(feed), "ort": lambda: ort(feed)}, repeats, runs, pause=pause)
        ratio = Spread.of([statistics.fmean(a) / statistics.fmean(b) for a, b in zip(times["gpumnn"], times["ort"])])
        ours = Spread.of([statistics.fmean(t) for t in times["gpumnn"]])
        theirs = Spread.of([statistics.fmean(t) for t in times["ort"]])
        fastest = min(map(min, times["gpumnn"])) / min(map(min, times["ort"]))
        print(f"{name:<16} {ours:.3f}  {theirs:.3f}  {ratio:.2f} {fastest:8.2f}  {err:.1e}", flush=True)
        sess.close()
    print(f"cross-core hand-over after: {link()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/gpumnn-real-models")
    parser.add_argument("--compare", action="store_true")
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--onnx", nargs="*", default=[], help="more ONNX files to compare (a torch.onnx export, say)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--pause", type=float, default=0.1)
    parser.add_argument("--torchvision", metavar="FOLDER",
                        help="export torchvision's models there (TORCHVISION, both exporters) and stop")
    args = parser.parse_args()
    if args.torchvision:
        print("\n".join(map(str, export_torchvision(args.torchvision))))
        return
    paths = {name: path for name, path in save_all(args.out).items() if name in args.models}
    print("\n".join(f"{name}: {path}" for name, path in paths.items()))
    paths.update({Path(path).stem: Path(path) for path in args.onnx})
    if args.compare:
        compare(paths, args.threads, args.repeats, args.runs, args.pause)


if __name__ == "__main__":
    main()
