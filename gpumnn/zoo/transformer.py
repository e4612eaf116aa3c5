"""One BERT-style (post-LN) transformer encoder block, written out op by op.

The graph is deliberately the *unfused* form an exporter produces: separate
MatMul + Add for each projection, Reshape/Transpose to split heads, explicit
Div by sqrt(head_dim), Softmax, and GELU spelled as
``0.5 * x * (1 + Erf(x / sqrt(2)))``.  That is exactly what the engine's
attention / GELU / LayerNorm pattern matchers must recognise, and it gives
the zoo a non-convolutional, MatMul-dominated workload.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from .builder import GraphBuilder

SEQ_LEN = 128
HIDDEN = 256
HEADS = 4
HEAD_DIM = HIDDEN // HEADS
FFN = 1024
_LN_EPS = 1e-5


def _linear(g: GraphBuilder, x: str, name: str, in_features: int, out_features: int) -> str:
    """MatMul with a (in, out) weight then Add bias, as torch exports 3-D nn.Linear."""
    w = g.initializer(f"{name}.weight", g.he_normal((in_features, out_features), in_features))
    b = g.initializer(f"{name}.bias", g.small_normal((out_features,), 0.01))
    y = g.node("MatMul", [x, w], f"{name}.matmul")
    return g.node("Add", [y, b], f"{name}.add_bias")


def _layer_norm(g: GraphBuilder, x: str, name: str, output: str | None = None) -> str:
    """Opset-17 LayerNormalization over the last axis with non-trivial affine terms."""
    scale = g.initializer(f"{name}.weight", g.uniform((HIDDEN,), 0.8, 1.2))
    bias = g.initializer(f"{name}.bias", g.small_normal((HIDDEN,), 0.1))
    return g.node("LayerNormalization", [x, scale, bias], name, output=output, axis=-1, epsilon=_LN_EPS)


def _split_heads(g: GraphBuilder, x: str, name: str, perm: list[int]) -> str:
    """(1, S, H) -> (1, S, heads, d) -> transposed by ``perm``."""
    y = g.node("Reshape", [x, "attn.split_shape"], f"{name}.reshape")
    return g.node("Transpose", [y], f"{name}.transpose", perm=perm)


def _gelu_erf(g: GraphBuilder, x: str, name: str) -> str:
    """Exact GELU in the Erf form exporters emit (not the tanh approximation)."""
    y = g.node("Div", [x, g.scalar(f"{name}.sqrt2", math.sqrt(2.0))], f"{name}.div")
    y = g.node("Erf", [y], f"{name}.erf")
    y = g.node("Add", [y, g.scalar(f"{name}.one", 1.0)], f"{name}.add_one")
    y = g.node("Mul", [x, y], f"{name}.mul_x")
    return g.node("Mul", [y, g.scalar(f"{name}.half", 0.5)], f"{name}.mul_half")


def transformer_encoder() -> onnx.ModelProto:
    """Post-LN encoder block: seq 128, hidden 256, 4 heads, FFN 1024, input (1, 128, 256)."""
    g = GraphBuilder(
        "transformer_encoder",
        (1, SEQ_LEN, HIDDEN),
        seed=107,
        doc="BERT-style post-LN transformer encoder block (128x256, 4 heads, FFN 1024), random weights",
    )
    # 0 copies the batch dim from the input (ONNX Reshape), so the block runs at any batch
    g.initializer("attn.split_shape", np.array([0, SEQ_LEN, HEADS, HEAD_DIM], dtype=np.int64))
    g.initializer("attn.merge_shape", np.array([0, SEQ_LEN, HIDDEN], dtype=np.int64))
    x = g.input

    q = _split_heads(g, _linear(g, x, "attn.q", HIDDEN, HIDDEN), "attn.q", [0, 2, 1, 3])  # (1,h,S,d)
    k = _split_heads(g, _linear(g, x, "attn.k", HIDDEN, HIDDEN), "attn.k", [0, 2, 3, 1])  # (1,h,d,S)
    v = _split_heads(g, _linear(g, x, "attn.v", HIDDEN, HIDDEN), "attn.v", [0, 2, 1, 3])  # (1,h,S,d)

    scores = g.node("MatMul", [q, k], "attn.qk")  # (1,h,S,S)
    scores = g.node("Div", [scores, g.scalar("attn.scale", math.sqrt(HEAD_DIM))], "attn.scale_div")
    probs = g.node("Softmax", [scores], "attn.softmax", axis=-1)
    ctx = g.node("MatMul", [probs, v], "attn.context")  # (1,h,S,d)
    ctx = g.node("Transpose", [ctx], "attn.merge.transpose", perm=[0, 2, 1, 3])  # (1,S,h,d)
    ctx = g.node("Reshape", [ctx, "attn.merge_shape"], "attn.merge.reshape")  # (1,S,H)
    attn = _linear(g, ctx, "attn.out", HIDDEN, HIDDEN)

    h = _layer_norm(g, g.node("Add", [x, attn], "attn.residual"), "attn.layer_norm")

    f = _linear(g, h, "ffn.fc1", HIDDEN, FFN)
    f = _gelu_erf(g, f, "ffn.gelu")
    f = _linear(g, f, "ffn.fc2", FFN, HIDDEN)
    y = _layer_norm(g, g.node("Add", [h, f], "ffn.residual"), "ffn.layer_norm", output="output")
    return g.finish(y, (1, SEQ_LEN, HIDDEN))
