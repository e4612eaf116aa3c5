"""Inception-v3 with torchvision's layout (no auxiliary head).

It is in the zoo because it stresses what the straight-line CNNs do not:
wide multi-branch Concat joins, asymmetric 1x7 / 7x1 and 1x3 / 3x1 kernels
with asymmetric padding, AveragePool with count_include_pad, odd spatial
sizes (299 -> 149 -> 147 -> 73 -> 71 -> 35 -> 17 -> 8) and ~95 convolutions.
Node names follow torchvision (``Mixed_6b.branch7x7_2.conv``).
"""

from __future__ import annotations

import onnx

from .builder import GraphBuilder, IntPair

#: torchvision's BasicConv2d uses BatchNorm2d(eps=0.001).
_BN_EPS = 1e-3


def _basic(g: GraphBuilder, x: str, name: str, in_ch: int, out_ch: int, kernel: IntPair,
           stride: int = 1, pad: IntPair = 0) -> str:
    """BasicConv2d: Conv (no bias) + BatchNorm(eps=1e-3) + ReLU."""
    return g.conv_bn_act(x, name, in_ch, out_ch, kernel, stride=stride, pad=pad, act="relu", epsilon=_BN_EPS)


def _pool_branch(g: GraphBuilder, x: str, name: str, in_ch: int, out_ch: int) -> str:
    """3x3/1 average pool (pad 1, padding counted as torch's default) + 1x1 conv."""
    p = g.avg_pool(x, f"{name}.branch_pool_avg", 3, 1, pad=1, count_include_pad=True)
    return _basic(g, p, f"{name}.branch_pool", in_ch, out_ch, 1)


def _inception_a(g: GraphBuilder, x: str, name: str, in_ch: int, pool_features: int) -> tuple[str, int]:
    b1 = _basic(g, x, f"{name}.branch1x1", in_ch, 64, 1)
    b5 = _basic(g, x, f"{name}.branch5x5_1", in_ch, 48, 1)
    b5 = _basic(g, b5, f"{name}.branch5x5_2", 48, 64, 5, pad=2)
    b3 = _basic(g, x, f"{name}.branch3x3dbl_1", in_ch, 64, 1)
    b3 = _basic(g, b3, f"{name}.branch3x3dbl_2", 64, 96, 3, pad=1)
    b3 = _basic(g, b3, f"{name}.branch3x3dbl_3", 96, 96, 3, pad=1)
    bp = _pool_branch(g, x, name, in_ch, pool_features)
    return g.node("Concat", [b1, b5, b3, bp], f"{name}.concat", axis=1), 64 + 64 + 96 + pool_features


def _inception_b(g: GraphBuilder, x: str, name: str, in_ch: int) -> tuple[str, int]:
    b3 = _basic(g, x, f"{name}.branch3x3", in_ch, 384, 3, stride=2)
    bd = _basic(g, x, f"{name}.branch3x3dbl_1", in_ch, 64, 1)
    bd = _basic(g, bd, f"{name}.branch3x3dbl_2", 64, 96, 3, pad=1)
    bd = _basic(g, bd, f"{name}.branch3x3dbl_3", 96, 96, 3, stride=2)
    bp = g.max_pool(x, f"{name}.branch_pool", 3, 2)
    return g.node("Concat", [b3, bd, bp], f"{name}.concat", axis=1), 384 + 96 + in_ch


def _inception_c(g: GraphBuilder, x: str, name: str, in_ch: int, c7: int) -> tuple[str, int]:
    b1 = _basic(g, x, f"{name}.branch1x1", in_ch, 192, 1)
    b7 = _basic(g, x, f"{name}.branch7x7_1", in_ch, c7, 1)
    b7 = _basic(g, b7, f"{name}.branch7x7_2", c7, c7, (1, 7), pad=(0, 3))
    b7 = _basic(g, b7, f"{name}.branch7x7_3", c7, 192, (7, 1), pad=(3, 0))
    bd = _basic(g, x, f"{name}.branch7x7dbl_1", in_ch, c7, 1)
    bd = _basic(g, bd, f"{name}.branch7x7dbl_2", c7, c7, (7, 1), pad=(3, 0))
    bd = _basic(g, bd, f"{name}.branch7x7dbl_3", c7, c7, (1, 7), pad=(0, 3))
    bd = _basic(g, bd, f"{name}.branch7x7dbl_4", c7, c7, (7, 1), pad=(3, 0))
    bd = _basic(g, bd, f"{name}.branch7x7dbl_5", c7, 192, (1, 7), pad=(0, 3))
    bp = _pool_branch(g, x, name, in_ch, 192)
    return g.node("Concat", [b1, b7, bd, bp], f"{name}.concat", axis=1), 768


def _inception_d(g: GraphBuilder, x: str, name: str, in_ch: int) -> tuple[str, int]:
    b3 = _basic(g, x, f"{name}.branch3x3_1", in_ch, 192, 1)
    b3 = _basic(g, b3, f"{name}.branch3x3_2", 192, 320, 3, stride=2)
    b7 = _basic(g, x, f"{name}.branch7x7x3_1", in_ch, 192, 1)
    b7 = _basic(g, b7, f"{name}.branch7x7x3_2", 192, 192, (1, 7), pad=(0, 3))
    b7 = _basic(g, b7, f"{name}.branch7x7x3_3", 192, 192, (7, 1), pad=(3, 0))
    b7 = _basic(g, b7, f"{name}.branch7x7x3_4", 192, 192, 3, stride=2)
    bp = g.max_pool(x, f"{name}.branch_pool", 3, 2)
    return g.node("Concat", [b3, b7, bp], f"{name}.concat", axis=1), 320 + 192 + in_ch


def _inception_e(g: GraphBuilder, x: str, name: str, in_ch: int) -> tuple[str, int]:
    b1 = _basic(g, x, f"{name}.branch1x1", in_ch, 320, 1)
    b3 = _basic(g, x, f"{name}.branch3x3_1", in_ch, 384, 1)
    b3a = _basic(g, b3, f"{name}.branch3x3_2a", 384, 384, (1, 3), pad=(0, 1))
    b3b = _basic(g, b3, f"{name}.branch3x3_2b", 384, 384, (3, 1), pad=(1, 0))
    b3 = g.node("Concat", [b3a, b3b], f"{name}.branch3x3_concat", axis=1)
    bd = _basic(g, x, f"{name}.branch3x3dbl_1", in_ch, 448, 1)
    bd = _basic(g, bd, f"{name}.branch3x3dbl_2", 448, 384, 3, pad=1)
    bda = _basic(g, bd, f"{name}.branch3x3dbl_3a", 384, 384, (1, 3), pad=(0, 1))
    bdb = _basic(g, bd, f"{name}.branch3x3dbl_3b", 384, 384, (3, 1), pad=(1, 0))
    bd = g.node("Concat", [bda, bdb], f"{name}.branch3x3dbl_concat", axis=1)
    bp = _pool_branch(g, x, name, in_ch, 192)
    return g.node("Concat", [b1, b3, bd, bp], f"{name}.concat", axis=1), 320 + 768 + 768 + 192


def inception_v3() -> onnx.ModelProto:
    """Inception-v3 on 299x299 input, torchvision channel counts, no AuxLogits."""
    g = GraphBuilder("inception_v3", (1, 3, 299, 299), seed=106, doc="torchvision Inception-v3 (no aux), random weights")
    x = _basic(g, g.input, "Conv2d_1a_3x3", 3, 32, 3, stride=2)
    x = _basic(g, x, "Conv2d_2a_3x3", 32, 32, 3)
    x = _basic(g, x, "Conv2d_2b_3x3", 32, 64, 3, pad=1)
    x = g.max_pool(x, "maxpool1", 3, 2)
    x = _basic(g, x, "Conv2d_3b_1x1", 64, 80, 1)
    x = _basic(g, x, "Conv2d_4a_3x3", 80, 192, 3)
    x = g.max_pool(x, "maxpool2", 3, 2)
    ch = 192
    x, ch = _inception_a(g, x, "Mixed_5b", ch, 32)
    x, ch = _inception_a(g, x, "Mixed_5c", ch, 64)
    x, ch = _inception_a(g, x, "Mixed_5d", ch, 64)
    x, ch = _inception_b(g, x, "Mixed_6a", ch)
    x, ch = _inception_c(g, x, "Mixed_6b", ch, 128)
    x, ch = _inception_c(g, x, "Mixed_6c", ch, 160)
    x, ch = _inception_c(g, x, "Mixed_6d", ch, 160)
    x, ch = _inception_c(g, x, "Mixed_6e", ch, 192)
    x, ch = _inception_d(g, x, "Mixed_7a", ch)
    x, ch = _inception_e(g, x, "Mixed_7b", ch)
    x, ch = _inception_e(g, x, "Mixed_7c", ch)
    return g.finish(g.classifier_head(x, ch), (1, 1000))
