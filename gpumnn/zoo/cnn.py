"""Classic image-classification CNNs, laid out like their torchvision versions.

Layer structure, channel counts and strides follow torchvision so that the
FLOP and memory profile matches the published networks (and the numbers in
the MNN paper, for MobileNet-v1 / SqueezeNet-v1.1 / ResNet-18); only the
weights are random.  Node names mirror torchvision's ``state_dict`` keys where
that is natural (``layer1.0.conv1``, ``features.3.squeeze``) so a mismatch
found by the engine's tests points at a recognisable layer.
"""

from __future__ import annotations

import onnx

from .builder import GraphBuilder

#: Damping applied to the last BatchNorm of every residual branch.  With
#: random (non-normalising) BN statistics each block otherwise adds its full
#: variance to the trunk and 16 bottlenecks blow activations up by orders of
#: magnitude; torchvision's zero_init_residual uses the same idea with 0.
RESIDUAL_GAMMA = 0.3


# ----------------------------------------------------------------- MobileNet v1
#: (output channels, depthwise stride) of the 13 depthwise-separable blocks.
_MOBILENET_V1_BLOCKS: tuple[tuple[int, int], ...] = (
    (64, 1),
    (128, 2),
    (128, 1),
    (256, 2),
    (256, 1),
    (512, 2),
    (512, 1),
    (512, 1),
    (512, 1),
    (512, 1),
    (512, 1),
    (1024, 2),
    (1024, 1),
)


def mobilenet_v1() -> onnx.ModelProto:
    """MobileNet-v1 (width 1.0, 224x224): the paper's headline model.

    ReLU6 is written as Clip(min, max) with initializer bounds so the
    Conv+BN+Clip fusion path of the engine is the one under test.
    """
    g = GraphBuilder("mobilenet_v1", (1, 3, 224, 224), seed=101, doc="MobileNet-v1 1.0/224, random weights")
    x = g.conv_bn_act(g.input, "conv0", 3, 32, 3, stride=2, act="relu6")
    in_ch = 32
    for i, (out_ch, stride) in enumerate(_MOBILENET_V1_BLOCKS, start=1):
        x = g.conv_bn_act(x, f"block{i}.dw", in_ch, in_ch, 3, stride=stride, group=in_ch, act="relu6")
        x = g.conv_bn_act(x, f"block{i}.pw", in_ch, out_ch, 1, act="relu6")
        in_ch = out_ch
    return g.finish(g.classifier_head(x, in_ch), (1, 1000))


# ----------------------------------------------------------------- SqueezeNet
def _fire(g: GraphBuilder, x: str, name: str, in_ch: int, squeeze: int, expand1: int, expand3: int) -> str:
    """Fire module: 1x1 squeeze, then parallel 1x1 / 3x3 expands joined by Concat."""
    s = g.relu(g.conv(x, f"{name}.squeeze", in_ch, squeeze, 1, bias=True), f"{name}.squeeze_relu")
    e1 = g.relu(g.conv(s, f"{name}.expand1x1", squeeze, expand1, 1, bias=True), f"{name}.expand1x1_relu")
    e3 = g.relu(g.conv(s, f"{name}.expand3x3", squeeze, expand3, 3, pad=1, bias=True), f"{name}.expand3x3_relu")
    return g.node("Concat", [e1, e3], f"{name}.concat", axis=1)


def squeezenet1_1() -> onnx.ModelProto:
    """SqueezeNet 1.1 (torchvision): biased convs, no BatchNorm, ceil-mode MaxPool.

    The classifier is a 1x1 conv to 1000 channels + ReLU + global pooling, so
    the output is non-negative; ceil_mode=1 is kept because it changes the
    spatial sizes (55 -> 27 -> 13) and engines often get it wrong.
    """
    g = GraphBuilder("squeezenet1_1", (1, 3, 224, 224), seed=102, doc="SqueezeNet 1.1, random weights")
    x = g.relu(g.conv(g.input, "features.0", 3, 64, 3, stride=2, pad=0, bias=True), "features.1")
    x = g.max_pool(x, "features.2", 3, 2, ceil_mode=True)
    x = _fire(g, x, "features.3", 64, 16, 64, 64)
    x = _fire(g, x, "features.4", 128, 16, 64, 64)
    x = g.max_pool(x, "features.5", 3, 2, ceil_mode=True)
    x = _fire(g, x, "features.6", 128, 32, 128, 128)
    x = _fire(g, x, "features.7", 256, 32, 128, 128)
    x = g.max_pool(x, "features.8", 3, 2, ceil_mode=True)
    x = _fire(g, x, "features.9", 256, 48, 192, 192)
    x = _fire(g, x, "features.10", 384, 48, 192, 192)
    x = _fire(g, x, "features.11", 384, 64, 256, 256)
    x = _fire(g, x, "features.12", 512, 64, 256, 256)
    x = g.relu(g.conv(x, "classifier.1", 512, 1000, 1, bias=True), "classifier.2")
    x = g.global_avg_pool(x, "classifier.3")
    return g.finish(g.flatten(x, "flatten", output="output"), (1, 1000))


# ----------------------------------------------------------------- ResNets
def _stem(g: GraphBuilder) -> str:
    """7x7/2 conv + BN + ReLU + 3x3/2 max pool, shared by all torchvision ResNets."""
    x = g.conv(g.input, "conv1", 3, 64, 7, stride=2, pad=3)
    x = g.relu(g.batch_norm(x, "bn1", 64), "relu")
    return g.max_pool(x, "maxpool", 3, 2, pad=1)


def _downsample(g: GraphBuilder, x: str, name: str, in_ch: int, out_ch: int, stride: int) -> str:
    y = g.conv(x, f"{name}.downsample.0", in_ch, out_ch, 1, stride=stride, pad=0)
    return g.batch_norm(y, f"{name}.downsample.1", out_ch)


def _basic_block(g: GraphBuilder, x: str, name: str, in_ch: int, out_ch: int, stride: int) -> str:
    y = g.conv(x, f"{name}.conv1", in_ch, out_ch, 3, stride=stride)
    y = g.relu(g.batch_norm(y, f"{name}.bn1", out_ch), f"{name}.relu1")
    y = g.conv(y, f"{name}.conv2", out_ch, out_ch, 3)
    y = g.batch_norm(y, f"{name}.bn2", out_ch, gamma_scale=RESIDUAL_GAMMA)
    identity = _downsample(g, x, name, in_ch, out_ch, stride) if (stride != 1 or in_ch != out_ch) else x
    return g.relu(g.node("Add", [y, identity], f"{name}.add"), f"{name}.relu2")


def _bottleneck(g: GraphBuilder, x: str, name: str, in_ch: int, width: int, stride: int) -> str:
    """torchvision v1.5 bottleneck: the stride sits on the 3x3 conv."""
    out_ch = width * 4
    y = g.conv(x, f"{name}.conv1", in_ch, width, 1, pad=0)
    y = g.relu(g.batch_norm(y, f"{name}.bn1", width), f"{name}.relu1")
    y = g.conv(y, f"{name}.conv2", width, width, 3, stride=stride)
    y = g.relu(g.batch_norm(y, f"{name}.bn2", width), f"{name}.relu2")
    y = g.conv(y, f"{name}.conv3", width, out_ch, 1, pad=0)
    y = g.batch_norm(y, f"{name}.bn3", out_ch, gamma_scale=RESIDUAL_GAMMA)
    identity = _downsample(g, x, name, in_ch, out_ch, stride) if (stride != 1 or in_ch != out_ch) else x
    return g.relu(g.node("Add", [y, identity], f"{name}.add"), f"{name}.relu3")


def _resnet(name: str, seed: int, blocks: tuple[int, int, int, int], bottleneck: bool) -> onnx.ModelProto:
    g = GraphBuilder(name, (1, 3, 224, 224), seed=seed, doc=f"torchvision {name}, random weights")
    x = _stem(g)
    in_ch = 64
    for stage, (count, width) in enumerate(zip(blocks, (64, 128, 256, 512)), start=1):
        for i in range(count):
            stride = 2 if (i == 0 and stage > 1) else 1
            block_name = f"layer{stage}.{i}"
            if bottleneck:
                x = _bottleneck(g, x, block_name, in_ch, width, stride)
                in_ch = width * 4
            else:
                x = _basic_block(g, x, block_name, in_ch, width, stride)
                in_ch = width
    return g.finish(g.classifier_head(x, in_ch), (1, 1000))


def resnet18() -> onnx.ModelProto:
    """ResNet-18: BasicBlocks [2, 2, 2, 2], 11.7M parameters."""
    return _resnet("resnet18", 103, (2, 2, 2, 2), bottleneck=False)


def resnet50() -> onnx.ModelProto:
    """ResNet-50 (v1.5): Bottlenecks [3, 4, 6, 3], 25.6M parameters."""
    return _resnet("resnet50", 105, (3, 4, 6, 3), bottleneck=True)


# ----------------------------------------------------------------- MobileNet v2
#: torchvision's inverted-residual settings: expand ratio t, channels c, repeats n, stride s.
_MOBILENET_V2_SETTINGS: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def mobilenet_v2() -> onnx.ModelProto:
    """MobileNet-v2 1.0/224: inverted residuals with linear bottlenecks.

    The projection BN has no activation and feeds a residual Add when shapes
    allow, which exercises BN folding without a following activation and the
    Conv+Add (+no act) fusion path.
    """
    g = GraphBuilder("mobilenet_v2", (1, 3, 224, 224), seed=104, doc="MobileNet-v2 1.0/224, random weights")
    x = g.conv_bn_act(g.input, "features.0", 3, 32, 3, stride=2, act="relu6")
    in_ch = 32
    index = 1
    for t, c, n, s in _MOBILENET_V2_SETTINGS:
        for i in range(n):
            stride = s if i == 0 else 1
            name = f"features.{index}"
            hidden = in_ch * t
            use_residual = stride == 1 and in_ch == c
            y = x
            if t != 1:
                y = g.conv_bn_act(y, f"{name}.expand", in_ch, hidden, 1, act="relu6")
            y = g.conv_bn_act(y, f"{name}.dw", hidden, hidden, 3, stride=stride, group=hidden, act="relu6")
            y = g.conv_bn_act(
                y, f"{name}.project", hidden, c, 1, act=None, gamma_scale=RESIDUAL_GAMMA if use_residual else 1.0
            )
            x = g.node("Add", [x, y], f"{name}.add") if use_residual else y
            in_ch = c
            index += 1
    x = g.conv_bn_act(x, f"features.{index}", in_ch, 1280, 1, act="relu6")
    return g.finish(g.classifier_head(x, 1280, fc_name="classifier"), (1, 1000))
