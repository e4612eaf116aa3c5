"""A tiny graph-construction helper shared by every zoo model.

The zoo builds ONNX graphs by hand (no torch, no downloads) so that the
engine can be tested and benchmarked on realistic topologies anywhere.  The
:class:`GraphBuilder` keeps that hand-written code short and uniform:

* every node gets a unique, human-meaningful name (``"layer1.0.conv1"``), and
  its output tensor is named after the node, so an engine's error message or a
  profiler line can be traced straight back to the layer that produced it;
* weights come from one seeded ``numpy`` generator per model, so a model is
  byte-for-byte reproducible across runs and machines;
* initialisation is chosen to keep activations in a sane range (He scale for
  convs and linears, randomised BatchNorm statistics) *without* being trivial,
  so that BN folding and activation fusion in the engine are really exercised.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: Opset the zoo targets: LayerNormalization is a standard op from 17 on.
OPSET = 17
#: IR version 8 is the newest that every onnxruntime >= 1.14 accepts.
IR_VERSION = 8

IntPair = int | tuple[int, int]


def _pair(value: IntPair) -> tuple[int, int]:
    """Normalise an ``int`` or ``(h, w)`` pair, as torch's ``_pair`` does."""
    if isinstance(value, int):
        return value, value
    return int(value[0]), int(value[1])


class GraphBuilder:
    """Accumulates nodes and initializers and turns them into a ModelProto.

    The single graph input is always called ``"input"``; :meth:`finish`
    checks that the last node wrote ``"output"``, which is the name every zoo
    model exposes so callers never need to look it up.
    """

    def __init__(self, graph_name: str, input_shape: Sequence[int], seed: int, doc: str = "") -> None:
        self.graph_name = graph_name
        self.input_shape = tuple(int(d) for d in input_shape)
        self.doc = doc
        self.rng = np.random.default_rng(seed)
        self.input = "input"
        self._nodes: list[onnx.NodeProto] = []
        self._initializers: list[onnx.TensorProto] = []
        self._node_names: set[str] = set()
        # Tensor namespace: graph input, initializers and node outputs.
        self._tensor_names: set[str] = {self.input}

    # ------------------------------------------------------------------ basics
    def _claim_tensor(self, name: str) -> None:
        if name in self._tensor_names:
            raise ValueError(f"duplicate tensor name {name!r} in {self.graph_name}")
        self._tensor_names.add(name)

    def initializer(self, name: str, array: np.ndarray) -> str:
        """Register a constant tensor and return its name."""
        self._claim_tensor(name)
        self._initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def scalar(self, name: str, value: float) -> str:
        """A 0-d float32 initializer (for Div/Mul/Add constants and Clip bounds)."""
        return self.initializer(name, np.array(value, dtype=np.float32))

    def node(
        self,
        op_type: str,
        inputs: Sequence[str],
        name: str,
        *,
        output: str | None = None,
        **attrs: object,
    ) -> str:
        """Append one node; its output tensor is named after the node unless given."""
        if name in self._node_names:
            raise ValueError(f"duplicate node name {name!r} in {self.graph_name}")
        out = name if output is None else output
        self._claim_tensor(out)
        self._node_names.add(name)
        self._nodes.append(helper.make_node(op_type, list(inputs), [out], name=name, **attrs))
        return out

    # --------------------------------------------------------------- weights
    def he_normal(self, shape: Sequence[int], fan_in: int) -> np.ndarray:
        """He/Kaiming normal weights: std = sqrt(2 / fan_in) keeps the second
        moment of ReLU activations roughly constant from layer to layer."""
        std = math.sqrt(2.0 / fan_in)
        return self.rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(std)

    def small_normal(self, shape: Sequence[int], std: float = 0.1) -> np.ndarray:
        """Small non-zero values (biases, BN beta/mean) so nothing is trivially zero."""
        return self.rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(std)

    def uniform(self, shape: Sequence[int], low: float, high: float) -> np.ndarray:
        return self.rng.uniform(low, high, size=tuple(shape)).astype(np.float32)

    # ------------------------------------------------------------- layers
    def conv(
        self,
        x: str,
        name: str,
        in_ch: int,
        out_ch: int,
        kernel: IntPair,
        stride: IntPair = 1,
        pad: IntPair | None = None,
        group: int = 1,
        bias: bool = False,
        output: str | None = None,
    ) -> str:
        """Conv with OIHW weights; ``pad`` defaults to 'same' for odd kernels at stride 1."""
        kh, kw = _pair(kernel)
        sh, sw = _pair(stride)
        ph, pw = (kh // 2, kw // 2) if pad is None else _pair(pad)
        if in_ch % group or out_ch % group:
            raise ValueError(f"{name}: channels {in_ch}->{out_ch} not divisible by group {group}")
        fan_in = (in_ch // group) * kh * kw
        inputs = [x, self.initializer(f"{name}.weight", self.he_normal((out_ch, in_ch // group, kh, kw), fan_in))]
        if bias:
            inputs.append(self.initializer(f"{name}.bias", self.small_normal((out_ch,), 0.01)))
        return self.node(
            "Conv",
            inputs,
            name,
            output=output,
            kernel_shape=[kh, kw],
            strides=[sh, sw],
            pads=[ph, pw, ph, pw],
            dilations=[1, 1],
            group=group,
        )

    def batch_norm(
        self,
        x: str,
        name: str,
        channels: int,
        epsilon: float = 1e-5,
        gamma_scale: float = 1.0,
        output: str | None = None,
    ) -> str:
        """Inference-mode BatchNormalization with deliberately non-identity stats.

        mean ~ N(0, 0.1), var ~ U(0.5, 1.5), gamma ~ U(0.5, 1.5), beta ~ N(0, 0.1):
        folding into the preceding conv then changes every weight and bias, so
        a wrong fold shows up as a numeric mismatch rather than passing by luck.
        ``gamma_scale`` damps the last BN of a residual branch so activations
        stay bounded through deep stacks of additive blocks.
        """
        gamma = self.uniform((channels,), 0.5, 1.5) * np.float32(gamma_scale)
        beta = self.small_normal((channels,), 0.1)
        mean = self.small_normal((channels,), 0.1)
        var = self.uniform((channels,), 0.5, 1.5)
        inputs = [
            x,
            self.initializer(f"{name}.weight", gamma),
            self.initializer(f"{name}.bias", beta),
            self.initializer(f"{name}.running_mean", mean),
            self.initializer(f"{name}.running_var", var),
        ]
        return self.node("BatchNormalization", inputs, name, output=output, epsilon=float(epsilon))

    def relu(self, x: str, name: str, output: str | None = None) -> str:
        return self.node("Relu", [x], name, output=output)

    def relu6(self, x: str, name: str, output: str | None = None) -> str:
        """ReLU6 as opset-11+ Clip whose bounds are initializer *inputs*, the way
        torch exports it (and the form an engine must recognise to fuse it)."""
        if "relu6.min" not in self._tensor_names:
            self.scalar("relu6.min", 0.0)
            self.scalar("relu6.max", 6.0)
        return self.node("Clip", [x, "relu6.min", "relu6.max"], name, output=output)

    def activation(self, x: str, name: str, kind: str | None) -> str:
        if kind is None:
            return x
        if kind == "relu":
            return self.relu(x, name)
        if kind == "relu6":
            return self.relu6(x, name)
        raise ValueError(f"unknown activation {kind!r}")

    def conv_bn_act(
        self,
        x: str,
        prefix: str,
        in_ch: int,
        out_ch: int,
        kernel: IntPair,
        stride: IntPair = 1,
        pad: IntPair | None = None,
        group: int = 1,
        act: str | None = "relu",
        epsilon: float = 1e-5,
        gamma_scale: float = 1.0,
    ) -> str:
        """Conv (no bias) -> BatchNormalization -> activation, named
        ``prefix.conv`` / ``prefix.bn`` / ``prefix.<act>``: the canonical
        pattern the engine's BN-fold and activation-fusion passes look for."""
        y = self.conv(x, f"{prefix}.conv", in_ch, out_ch, kernel, stride, pad, group)
        y = self.batch_norm(y, f"{prefix}.bn", out_ch, epsilon=epsilon, gamma_scale=gamma_scale)
        return self.activation(y, f"{prefix}.{act}", act)

    def max_pool(self, x: str, name: str, kernel: int, stride: int, pad: int = 0, ceil_mode: bool = False) -> str:
        return self.node(
            "MaxPool",
            [x],
            name,
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad] * 4,
            ceil_mode=int(ceil_mode),
        )

    def avg_pool(self, x: str, name: str, kernel: int, stride: int, pad: int = 0, count_include_pad: bool = True) -> str:
        return self.node(
            "AveragePool",
            [x],
            name,
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad] * 4,
            count_include_pad=int(count_include_pad),
        )

    def global_avg_pool(self, x: str, name: str = "avgpool") -> str:
        return self.node("GlobalAveragePool", [x], name)

    def flatten(self, x: str, name: str = "flatten", output: str | None = None) -> str:
        return self.node("Flatten", [x], name, output=output, axis=1)

    def gemm(self, x: str, name: str, in_features: int, out_features: int, output: str | None = None) -> str:
        """Fully connected layer exported the torch way: Gemm with W of shape
        (out, in) and transB=1."""
        w = self.initializer(f"{name}.weight", self.he_normal((out_features, in_features), in_features))
        b = self.initializer(f"{name}.bias", self.small_normal((out_features,), 0.01))
        return self.node("Gemm", [x, w, b], name, output=output, alpha=1.0, beta=1.0, transB=1)

    def classifier_head(self, x: str, in_features: int, num_classes: int = 1000, fc_name: str = "fc") -> str:
        """GlobalAveragePool -> Flatten -> Gemm, writing the graph output."""
        y = self.global_avg_pool(x, "avgpool")
        y = self.flatten(y, "flatten")
        return self.gemm(y, fc_name, in_features, num_classes, output="output")

    # ----------------------------------------------------------------- finish
    def finish(self, output: str, output_shape: Sequence[int]) -> onnx.ModelProto:
        """Assemble the ModelProto (opset 17, IR 8) with fully typed I/O."""
        if output != "output":
            raise ValueError(f"{self.graph_name}: final tensor must be named 'output', got {output!r}")
        graph = helper.make_graph(
            self._nodes,
            self.graph_name,
            [helper.make_tensor_value_info(self.input, TensorProto.FLOAT, list(self.input_shape))],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, [int(d) for d in output_shape])],
            initializer=self._initializers,
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="gpumnn.zoo",
            producer_version="1",
            ir_version=IR_VERSION,
        )
        model.doc_string = self.doc
        return model


def count_parameters(model: onnx.ModelProto) -> int:
    """Number of float elements stored in initializers (weights, biases, BN
    statistics); integer shape constants are not parameters."""
    total = 0
    for init in model.graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            total += int(np.prod(init.dims, dtype=np.int64))
    return total
