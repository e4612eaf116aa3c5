"""Single-op ONNX models with random inputs: the cases every backend is checked on.

Each case builds a one-node (or few-node) ONNX model with onnx.helper, so ONNX Runtime can be
the reference. Inputs are drawn from a generator seeded by the case id (fresh, non-constant
data, reproducible when a case fails).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

def model_proto(graph: onnx.GraphProto, opset: int = 17) -> onnx.ModelProto:
    """A model of ``graph`` at ``opset`` (default domain) with the lowest IR version that opset allows,
    and at least 8 (from IR 4 on, initializers need not be graph inputs).

    ``helper.make_model`` stamps the installed onnx package's IR version, which an older ONNX Runtime
    refuses ("Unsupported model IR version: 14, max supported IR version: 13", seen with onnx 1.23 and
    onnxruntime 1.30 on the GPU machine); the reference must load every test model.
    """
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=max(8, helper.find_min_ir_version_for(opsets)))



@dataclass
class OpCase:
    id: str
    op_type: str
    inputs: dict[str, tuple[int, ...]]  # run-time inputs and their shapes
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    node_inputs: list[str] | None = None  # names in node order ("" for an absent optional input)
    attrs: dict = field(default_factory=dict)
    outputs: int = 1
    opset: int = 17
    low: float = -2.0
    high: float = 2.0
    int_inputs: dict[str, int] = field(default_factory=dict)  # int64 run-time inputs: name -> exclusive max

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(zlib.crc32(self.id.encode()))

    def feeds(self) -> dict[str, np.ndarray]:
        rng = self.rng()
        feeds = {}
        for name, shape in self.inputs.items():
            if name in self.int_inputs:
                feeds[name] = rng.integers(-self.int_inputs[name], self.int_inputs[name], size=shape).astype(np.int64)
            else:
                feeds[name] = rng.uniform(self.low, self.high, size=shape).astype(np.float32)
        return feeds

    def model(self) -> onnx.ModelProto:
        names = self.node_inputs if self.node_inputs is not None else list(self.inputs) + list(self.consts)
        outs = [f"y{i}" for i in range(self.outputs)]
        node = helper.make_node(self.op_type, names, outs, name=f"{self.op_type.lower()}_node", **self.attrs)
        graph = helper.make_graph(
            [node], self.id,
            [helper.make_tensor_value_info(n, TensorProto.INT64 if n in self.int_inputs else TensorProto.FLOAT, s)
             for n, s in self.inputs.items()],
            [helper.make_empty_tensor_value_info(o) for o in outs],
            [numpy_helper.from_array(np.asarray(v), n) for n, v in self.consts.items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=8)


def one_conv_model(channels: int, size: int, name: str) -> onnx.ModelProto:
    """A model of one 3x3 convolution ``name`` (constant weights 0.01, no bias) over
    [1, channels, size, size]: the tests that plant or provoke a slow or hung submission."""
    w = numpy_helper.from_array(np.full((channels, channels, 3, 3), 0.01, np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name=name)],
                              "one_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    return model_proto(graph, opset=13)


def run_script(script: str):
    """``script`` run by a fresh interpreter in the repository (a device left hung or lost, or the
    process's exit, stays out of the test process); the completed process, its output captured."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=240,
                          cwd=root)


def _w(*shape, seed=0, scale=0.5) -> np.ndarray:
    return (np.random.default_rng(seed + sum(shape)).standard_normal(shape) * scale).astype(np.float32)


def _i64(*values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


X4 = (2, 3, 7, 9)


def _cases() -> list[OpCase]:
    c: list[OpCase] = []
    # -- elementwise unary
    for op in ("Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Neg", "Abs", "Floor", "Ceil", "HardSwish", "Softplus", "Sign"):
        c.append(OpCase(f"{op}", op, {"x": X4}))
    c.append(OpCase("Log", "Log", {"x": X4}, low=0.1, high=3.0))
    c.append(OpCase("Softplus-tail", "Softplus", {"x": X4}, low=-14.0, high=-8.0))  # log(1 + tiny) without log1p
    c.append(OpCase("Tanh-near-zero", "Tanh", {"x": X4}, low=-1e-4, high=1e-4))  # 1 - exp(-2|x|) cancels
    c.append(OpCase("Sqrt", "Sqrt", {"x": X4}, low=0.0, high=3.0))
    c.append(OpCase("Reciprocal", "Reciprocal", {"x": X4}, low=0.5, high=3.0))
    c.append(OpCase("LeakyRelu", "LeakyRelu", {"x": X4}, attrs={"alpha": 0.1}))
    c.append(OpCase("HardSigmoid", "HardSigmoid", {"x": X4}, attrs={"alpha": 0.3, "beta": 0.4}))
    c.append(OpCase("Elu", "Elu", {"x": X4}, attrs={"alpha": 0.7}))
    c.append(OpCase("Gelu", "Gelu", {"x": X4}, opset=20))
    c.append(OpCase("Gelu-tanh", "Gelu", {"x": X4}, attrs={"approximate": "tanh"}, opset=20))
    c.append(OpCase("Clip", "Clip", {"x": X4}, {"lo": np.float32(-0.5), "hi": np.float32(0.8)}))
    c.append(OpCase("Clip-min-only", "Clip", {"x": X4}, {"lo": np.float32(0.1)}, node_inputs=["x", "lo"]))
    # -- binary with broadcasting
    for op in ("Add", "Sub", "Mul", "Div", "Max", "Min"):
        c.append(OpCase(f"{op}-broadcast", op, {"a": (2, 3, 4, 5), "b": (3, 1, 5)}, low=0.5 if op == "Div" else -2.0))
    c.append(OpCase("Add-same", "Add", {"a": (4, 6), "b": (4, 6)}))
    c.append(OpCase("Mul-scalar-const", "Mul", {"a": (2, 3, 4)}, {"s": np.float32(1.7)}))
    c.append(OpCase("Sub-const-first", "Sub", {"b": (3, 4, 5)}, {"a": _w(4, 1)}, node_inputs=["a", "b"]))
    c.append(OpCase("Pow", "Pow", {"a": (3, 4), "b": (3, 4)}, low=0.5, high=2.0))
    c.append(OpCase("Pow-square", "Pow", {"a": (3, 4, 5)}, {"e": np.float32(2.0)}))
    c.append(OpCase("Max-variadic", "Max", {"a": (3, 4), "b": (4,), "c": (3, 1)}))
    c.append(OpCase("Min-variadic", "Min", {"a": (3, 4), "b": (3, 4), "c": (1, 4)}))
    c.append(OpCase("Sum-variadic", "Sum", {"a": (2, 5), "b": (2, 5), "c": (5,)}))
    c.append(OpCase("PRelu", "PRelu", {"x": X4}, {"slope": _w(3, 1, 1)}))
    c.append(OpCase("Add-6d-broadcast", "Add", {"a": (2, 1, 3, 1, 2, 4), "b": (3, 5, 1, 4)}))
    # -- convolution
    c.append(OpCase("Conv-3x3-pad1", "Conv", {"x": (1, 4, 9, 11)}, {"w": _w(8, 4, 3, 3), "b": _w(8)}, attrs={"pads": [1, 1, 1, 1]}))
    c.append(OpCase("Conv-stride2-asym", "Conv", {"x": (2, 3, 10, 13)}, {"w": _w(5, 3, 3, 3)},
                    attrs={"strides": [2, 2], "pads": [0, 1, 2, 1]}))
    c.append(OpCase("Conv-1x1", "Conv", {"x": (1, 16, 6, 6)}, {"w": _w(8, 16, 1, 1), "b": _w(8)}))
    c.append(OpCase("Conv-1x1-stride2", "Conv", {"x": (1, 16, 7, 7)}, {"w": _w(8, 16, 1, 1)}, attrs={"strides": [2, 2]}))
    c.append(OpCase("Conv-depthwise", "Conv", {"x": (1, 6, 8, 8)}, {"w": _w(6, 1, 3, 3), "b": _w(6)},
                    attrs={"group": 6, "pads": [1, 1, 1, 1], "strides": [2, 2]}))
    c.append(OpCase("Conv-groups2", "Conv", {"x": (1, 4, 6, 6)}, {"w": _w(6, 2, 3, 3)}, attrs={"group": 2}))
    c.append(OpCase("Conv-dilation2", "Conv", {"x": (1, 3, 11, 11)}, {"w": _w(4, 3, 3, 3)},
                    attrs={"dilations": [2, 2], "pads": [2, 2, 2, 2]}))
    c.append(OpCase("Conv-1x7", "Conv", {"x": (1, 4, 9, 9)}, {"w": _w(4, 4, 1, 7)}, attrs={"pads": [0, 3, 0, 3]}))
    c.append(OpCase("Conv-7x1", "Conv", {"x": (1, 4, 9, 9)}, {"w": _w(4, 4, 7, 1)}, attrs={"pads": [3, 0, 3, 0]}))
    c.append(OpCase("Conv-same-upper", "Conv", {"x": (1, 2, 8, 7)}, {"w": _w(3, 2, 4, 4)},
                    attrs={"auto_pad": "SAME_UPPER", "strides": [2, 2]}))
    c.append(OpCase("Conv-1d", "Conv", {"x": (2, 3, 15)}, {"w": _w(4, 3, 5)}, attrs={"pads": [2, 1], "strides": [2]}))
    c.append(OpCase("ConvTranspose-stride2", "ConvTranspose", {"x": (1, 4, 5, 6)}, {"w": _w(4, 3, 3, 3), "b": _w(3)},
                    attrs={"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}))
    c.append(OpCase("Conv-depthwise-runtime-weight", "Conv", {"x": (1, 4, 6, 6), "w": (4, 1, 3, 3)},
                    attrs={"group": 4, "pads": [1, 1, 1, 1]}))  # weights written at run time, after creation
    c.append(OpCase("ConvTranspose-1d", "ConvTranspose", {"x": (1, 4, 7)}, {"w": _w(4, 3, 3), "b": _w(3)},
                    attrs={"strides": [2], "pads": [1, 0], "output_padding": [1]}))
    c.append(OpCase("ConvTranspose-runtime-weight", "ConvTranspose", {"x": (1, 3, 4, 4), "w": (3, 2, 3, 3)},
                    attrs={"strides": [2, 2]}))
    c.append(OpCase("ConvTranspose-groups", "ConvTranspose", {"x": (1, 4, 4, 4)}, {"w": _w(4, 2, 2, 2)},
                    attrs={"strides": [2, 2], "group": 2}))
    # -- matrix products
    c.append(OpCase("Gemm-transB-bias", "Gemm", {"a": (3, 10)}, {"b": _w(7, 10), "c": _w(7)},
                    attrs={"transB": 1, "alpha": 0.7, "beta": 1.3}))
    c.append(OpCase("Gemm-transA-matrix-bias", "Gemm", {"a": (10, 3), "b": (10, 7)}, {"c": _w(3, 1)}, attrs={"transA": 1}))
    c.append(OpCase("Gemm-runtime-bias-beta", "Gemm", {"a": (4, 6), "b": (5, 6), "c": (1, 5)},
                    attrs={"transB": 1, "alpha": 0.25, "beta": 0.35}))  # beta != 1 on a run-time C
    c.append(OpCase("MatMul-2d", "MatMul", {"a": (5, 12), "b": (12, 7)}))
    c.append(OpCase("MatMul-batched", "MatMul", {"a": (2, 3, 5, 8), "b": (2, 3, 8, 4)}))
    c.append(OpCase("MatMul-shared-weight", "MatMul", {"a": (2, 6, 8)}, {"b": _w(8, 5)}))
    c.append(OpCase("MatMul-broadcast-batch", "MatMul", {"a": (2, 1, 4, 6), "b": (3, 6, 5)}))
    c.append(OpCase("MatMul-vector", "MatMul", {"a": (6,), "b": (2, 6, 3)}))
    # -- pooling
    c.append(OpCase("MaxPool-3x3s2p1", "MaxPool", {"x": (1, 3, 11, 11)}, attrs={"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}))
    c.append(OpCase("MaxPool-ceil", "MaxPool", {"x": (1, 2, 10, 10)}, attrs={"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}))
    c.append(OpCase("MaxPool-2x3-asym", "MaxPool", {"x": (1, 3, 9, 10)},
                    attrs={"kernel_shape": [2, 3], "strides": [1, 2], "pads": [0, 1, 1, 0], "ceil_mode": 1}))
    c.append(OpCase("MaxPool-1x3", "MaxPool", {"x": (1, 2, 6, 9)}, attrs={"kernel_shape": [1, 3], "pads": [0, 1, 0, 1]}))
    c.append(OpCase("AveragePool-pad-exclude", "AveragePool", {"x": (1, 3, 8, 9)}, attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}))
    c.append(OpCase("AveragePool-pad-include", "AveragePool", {"x": (1, 3, 8, 9)},
                    attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}))
    c.append(OpCase("AveragePool-ceil", "AveragePool", {"x": (1, 2, 9, 9)}, attrs={"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}))
    c.append(OpCase("GlobalAveragePool", "GlobalAveragePool", {"x": X4}))
    c.append(OpCase("GlobalMaxPool", "GlobalMaxPool", {"x": X4}))
    # -- normalisation, softmax, reductions
    c.append(OpCase("BatchNormalization", "BatchNormalization", {"x": X4},
                    {"g": _w(3), "b": _w(3), "m": _w(3), "v": np.abs(_w(3)) + 0.5}))
    c.append(OpCase("LayerNormalization", "LayerNormalization", {"x": (2, 5, 16)}, {"g": _w(16), "b": _w(16)}, attrs={"epsilon": 1e-5}))
    c.append(OpCase("LayerNormalization-axis1", "LayerNormalization", {"x": (2, 3, 4)}, {"g": _w(3, 4)}, attrs={"axis": 1}))
    c.append(OpCase("BatchNormalization-runtime-params", "BatchNormalization",
                    {"x": X4, "g": (3,), "b": (3,), "m": (3,), "v": (3,)}, low=0.1, high=2.0))
    c.append(OpCase("BatchNormalization-training", "BatchNormalization", {"x": (2, 3, 4, 5)},
                    {"g": _w(3), "b": _w(3), "m": _w(3), "v": np.abs(_w(3)) + 0.5},
                    attrs={"training_mode": 1, "momentum": 0.8, "epsilon": 1e-3}, outputs=3, opset=15))
    c.append(OpCase("LayerNormalization-mean-invstd", "LayerNormalization", {"x": (2, 3, 4, 5)}, {"g": _w(4, 5), "b": _w(4, 5)},
                    attrs={"axis": -2, "epsilon": 1e-3}, outputs=3))
    c.append(OpCase("InstanceNormalization", "InstanceNormalization", {"x": X4}, {"g": _w(3), "b": _w(3)}))
    c.append(OpCase("InstanceNormalization-runtime-scale", "InstanceNormalization", {"x": X4, "g": (3,), "b": (3,)}))
    c.append(OpCase("Softmax-last", "Softmax", {"x": (2, 3, 10)}))
    c.append(OpCase("Softmax-axis1", "Softmax", {"x": (2, 5, 3, 4)}, attrs={"axis": 1}))
    c.append(OpCase("Softmax-opset11", "Softmax", {"x": (2, 3, 4)}, attrs={"axis": 1}, opset=11))
    c.append(OpCase("LogSoftmax", "LogSoftmax", {"x": (3, 9)}))
    for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"):
        if op == "ReduceSum":
            c.append(OpCase(f"{op}-axes02", op, {"x": (3, 4, 5, 2)}, {"axes": _i64(0, 2)}, attrs={"keepdims": 1}))
        else:
            c.append(OpCase(f"{op}-axes02", op, {"x": (3, 4, 5, 2)}, attrs={"axes": [0, 2], "keepdims": 1}))
    c.append(OpCase("ReduceMean-last-nokeep", "ReduceMean", {"x": (2, 3, 8)}, attrs={"axes": [-1], "keepdims": 0}))
    c.append(OpCase("ReduceSum-all", "ReduceSum", {"x": (2, 3, 4)}, attrs={"keepdims": 0}))
    c.append(OpCase("ReduceMax-opset18", "ReduceMax", {"x": (2, 3, 4)}, {"axes": _i64(1)}, opset=18))
    c.append(OpCase("LRN", "LRN", {"x": (1, 7, 5, 5)}, attrs={"size": 5, "alpha": 1e-2, "beta": 0.75, "bias": 1.5}))
    # -- data reorder
    c.append(OpCase("Concat-axis1", "Concat", {"a": (1, 2, 4, 5), "b": (1, 3, 4, 5), "c": (1, 1, 4, 5)}, attrs={"axis": 1}))
    c.append(OpCase("Concat-last-const", "Concat", {"a": (2, 3, 4)}, {"k": _w(2, 3, 2)}, attrs={"axis": -1}))
    c.append(OpCase("Split-equal", "Split", {"x": (2, 6, 3)}, attrs={"axis": 1}, outputs=3))
    c.append(OpCase("Split-sizes", "Split", {"x": (5, 4)}, {"s": _i64(2, 3)}, outputs=2))
    c.append(OpCase("Slice-steps", "Slice", {"x": (4, 10, 6)}, {"st": _i64(1, 8), "en": _i64(4, 1), "ax": _i64(0, 1), "sp": _i64(1, -2)}))
    c.append(OpCase("Slice-clamp", "Slice", {"x": (3, 7)}, {"st": _i64(-5), "en": _i64(2**62), "ax": _i64(1)}))
    c.append(OpCase("Reshape", "Reshape", {"x": (2, 3, 4)}, {"s": _i64(4, 0, -1)}))
    c.append(OpCase("Flatten", "Flatten", {"x": X4}, attrs={"axis": 2}))
    c.append(OpCase("Transpose", "Transpose", {"x": (2, 3, 4, 5)}, attrs={"perm": [0, 2, 3, 1]}))
    c.append(OpCase("Transpose-default", "Transpose", {"x": (3, 4, 5)}))
    c.append(OpCase("Squeeze", "Squeeze", {"x": (2, 1, 3, 1)}, {"ax": _i64(1, 3)}))
    c.append(OpCase("Unsqueeze", "Unsqueeze", {"x": (2, 3)}, {"ax": _i64(0, 3)}))
    c.append(OpCase("Pad-constant", "Pad", {"x": (1, 2, 4, 5)}, {"p": _i64(0, 0, 1, 2, 0, 1, 2, 0), "v": np.float32(0.5)}))
    c.append(OpCase("Pad-reflect", "Pad", {"x": (1, 2, 4, 5)}, {"p": _i64(0, 0, 2, 1, 0, 0, 1, 3)}, attrs={"mode": "reflect"}))
    c.append(OpCase("Pad-edge", "Pad", {"x": (2, 5)}, {"p": _i64(1, 2, 2, 1)}, attrs={"mode": "edge"}))
    c.append(OpCase("Pad-negative", "Pad", {"x": (3, 6)}, {"p": _i64(0, -1, 1, -2)}))
    c.append(OpCase("Expand", "Expand", {"x": (3, 1)}, {"s": _i64(2, 3, 4)}))
    c.append(OpCase("Tile", "Tile", {"x": (2, 3)}, {"r": _i64(2, 3)}))
    c.append(OpCase("DepthToSpace-DCR", "DepthToSpace", {"x": (1, 8, 2, 3)}, attrs={"blocksize": 2}))
    c.append(OpCase("DepthToSpace-CRD", "DepthToSpace", {"x": (1, 8, 2, 3)}, attrs={"blocksize": 2, "mode": "CRD"}))
    c.append(OpCase("SpaceToDepth", "SpaceToDepth", {"x": (1, 2, 4, 6)}, attrs={"blocksize": 2}))
    c.append(OpCase("Gather-const-indices", "Gather", {"x": (5, 4, 3)}, {"i": np.array([[0, 3], [-1, 2]], dtype=np.int64)}, attrs={"axis": 1}))
    c.append(OpCase("Gather-runtime-indices", "Gather", {"i": (3, 2)}, {"x": _w(7, 5)}, node_inputs=["x", "i"], int_inputs={"i": 7}))
    c.append(OpCase("Resize-nearest-2x", "Resize", {"x": (1, 2, 3, 4)}, {"roi": np.zeros(0, np.float32), "sc": np.array([1, 1, 2, 2], np.float32)},
                    attrs={"mode": "nearest"}))
    c.append(OpCase("Resize-nearest-asym-floor", "Resize", {"x": (1, 2, 5, 4)}, {"roi": np.zeros(0, np.float32), "sc": np.array([1, 1, 1.6, 2.5], np.float32)},
                    attrs={"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}))
    c.append(OpCase("Resize-linear-half-pixel", "Resize", {"x": (1, 2, 4, 5)}, {"roi": np.zeros(0, np.float32), "sc": np.array([1, 1, 2, 1.5], np.float32)},
                    attrs={"mode": "linear"}))
    c.append(OpCase("Resize-linear-align-corners-sizes", "Resize", {"x": (1, 3, 4, 4)},
                    {"roi": np.zeros(0, np.float32), "sc": np.zeros(0, np.float32), "sz": _i64(1, 3, 7, 9)},
                    attrs={"mode": "linear", "coordinate_transformation_mode": "align_corners"}))
    c.append(OpCase("Resize-linear-pytorch", "Resize", {"x": (1, 1, 5, 5)}, {"roi": np.zeros(0, np.float32), "sc": np.array([1, 1, 0.6, 0.6], np.float32)},
                    attrs={"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}))
    # modes beyond 2 taps (cubic, antialias, crops) run as two MatMuls with host-built weights
    no_roi = np.zeros(0, np.float32)
    c.append(OpCase("Resize-cubic-half-pixel", "Resize", {"x": (1, 2, 5, 6)}, {"roi": no_roi, "sc": np.array([1, 1, 1.6, 2.5], np.float32)},
                    attrs={"mode": "cubic"}))
    c.append(OpCase("Resize-cubic-align-corners-exclude-outside", "Resize", {"x": (1, 2, 6, 5)},
                    {"roi": no_roi, "sc": np.zeros(0, np.float32), "sz": _i64(1, 2, 4, 9)},
                    attrs={"mode": "cubic", "coordinate_transformation_mode": "align_corners", "cubic_coeff_a": -0.5,
                           "exclude_outside": 1}))
    c.append(OpCase("Resize-cubic-asymmetric-down", "Resize", {"x": (2, 1, 8, 7)}, {"roi": no_roi, "sc": np.array([1, 1, 0.5, 0.75], np.float32)},
                    attrs={"mode": "cubic", "coordinate_transformation_mode": "asymmetric"}))
    c.append(OpCase("Resize-linear-antialias", "Resize", {"x": (1, 2, 12, 10)}, {"roi": no_roi, "sc": np.array([1, 1, 0.5, 0.4], np.float32)},
                    attrs={"mode": "linear", "antialias": 1}, opset=18))
    c.append(OpCase("Resize-cubic-antialias", "Resize", {"x": (1, 2, 12, 10)},
                    {"roi": no_roi, "sc": np.zeros(0, np.float32), "sz": _i64(1, 2, 5, 7)},
                    attrs={"mode": "cubic", "antialias": 1}, opset=18))
    c.append(OpCase("Resize-tf-crop-and-resize", "Resize", {"x": (1, 2, 6, 7)},
                    {"roi": np.array([0, 0, 0.2, -0.1, 1, 1, 0.9, 1.2], np.float32), "sc": np.zeros(0, np.float32), "sz": _i64(1, 2, 5, 8)},
                    attrs={"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 3.0}))
    c.append(OpCase("Resize-nearest-axes-keep-aspect", "Resize", {"x": (1, 2, 4, 6)}, {"roi": no_roi, "sc": np.zeros(0, np.float32), "sz": _i64(9, 7)},
                    attrs={"mode": "nearest", "axes": [3, 2], "keep_aspect_ratio_policy": "not_larger"}, opset=18))
    # -- the same ops in older and newer opsets (attributes that became inputs, and back)
    c.append(OpCase("Squeeze-opset11", "Squeeze", {"x": (2, 1, 3)}, attrs={"axes": [1]}, opset=11))
    c.append(OpCase("Unsqueeze-opset11", "Unsqueeze", {"x": (2, 3)}, attrs={"axes": [-1, 0]}, opset=11))
    c.append(OpCase("Split-opset11-attr", "Split", {"x": (2, 7)}, attrs={"axis": 1, "split": [3, 4]}, outputs=2, opset=11))
    c.append(OpCase("Split-opset18-num-outputs", "Split", {"x": (2, 7)}, attrs={"axis": 1, "num_outputs": 3}, outputs=3, opset=18))
    c.append(OpCase("ReduceSum-opset11-attr", "ReduceSum", {"x": (2, 3, 4)}, attrs={"axes": [1]}, opset=11))
    c.append(OpCase("Resize-opset11-nearest", "Resize", {"x": (1, 2, 3, 3)},
                    {"roi": np.zeros(0, np.float32), "sc": np.array([1, 1, 2, 3], np.float32)}, attrs={"mode": "nearest"}, opset=11))
    c.append(OpCase("Relu-opset21", "Relu", {"x": X4}, opset=21))
    c.append(OpCase("Cast-to-float", "Cast", {"x": (3, 4)}, attrs={"to": TensorProto.FLOAT}))
    c.append(OpCase("Identity", "Identity", {"x": (3, 4)}))
    return c


def _composite_cases() -> list[tuple[str, Callable[[], onnx.ModelProto], dict[str, tuple[int, ...]]]]:
    """Small graphs that exercise folding, fusion and Raster-fusion paths between ops."""

    def shape_chain() -> onnx.ModelProto:
        # Shape -> Gather -> Concat -> Reshape: folded at session creation; Transpose after Reshape fuses
        nodes = [
            helper.make_node("Shape", ["x"], ["s"], name="shape"),
            helper.make_node("Gather", ["s", "zero"], ["n"], name="gather_batch", axis=0),
            helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"], name="unsq"),
            helper.make_node("Concat", ["n1", "rest"], ["newshape"], name="concat_shape", axis=0),
            helper.make_node("Reshape", ["x", "newshape"], ["r"], name="reshape"),
            helper.make_node("Transpose", ["r"], ["t"], name="transpose", perm=[0, 2, 1, 3]),
            helper.make_node("Slice", ["t", "st", "en", "ax"], ["sl"], name="slice"),
            helper.make_node("Relu", ["sl"], ["y"], name="relu"),
        ]
        inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(_i64(0), "ax0"),
                 numpy_helper.from_array(_i64(4, 6, 5), "rest"), numpy_helper.from_array(_i64(1), "st"),
                 numpy_helper.from_array(_i64(5), "en"), numpy_helper.from_array(_i64(2), "ax")]
        graph = helper.make_graph(nodes, "shape_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 4, 30))],
                                  [helper.make_empty_tensor_value_info("y")], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    def conv_bn_relu_add() -> onnx.ModelProto:
        nodes = [
            helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["bn"], name="bn"),
            helper.make_node("Relu", ["bn"], ["r"], name="relu"),
            helper.make_node("Add", ["r", "x"], ["a"], name="residual"),
            helper.make_node("Clip", ["a", "lo", "hi"], ["y"], name="relu6"),
        ]
        inits = [numpy_helper.from_array(v, n) for n, v in {
            "w": _w(4, 4, 3, 3), "g": _w(4) + 1, "b": _w(4), "m": _w(4), "v": np.abs(_w(4)) + 0.5,
            "lo": np.float32(0.0), "hi": np.float32(6.0)}.items()]
        graph = helper.make_graph(nodes, "conv_bn_relu_add", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 4, 6, 6))],
                                  [helper.make_empty_tensor_value_info("y")], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    def two_outputs_and_view() -> onnx.ModelProto:
        nodes = [
            helper.make_node("Sigmoid", ["x"], ["s"], name="sigmoid"),
            helper.make_node("Flatten", ["x"], ["y0"], name="flatten_input", axis=1),
            helper.make_node("MatMul", ["s", "w"], ["mm"], name="matmul"),
            helper.make_node("Add", ["mm", "bias"], ["y1"], name="bias_add"),
        ]
        inits = [numpy_helper.from_array(_w(5, 3), "w"), numpy_helper.from_array(_w(3), "bias")]
        graph = helper.make_graph(nodes, "two_outputs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 4, 5))],
                                  [helper.make_empty_tensor_value_info("y0"), helper.make_empty_tensor_value_info("y1")], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    def clip_computed_bounds() -> onnx.ModelProto:
        # Clip whose bounds are run-time scalars (computed from an input): max, then min
        nodes = [
            helper.make_node("ReduceMin", ["b"], ["lo"], name="lower", keepdims=0),
            helper.make_node("ReduceMax", ["b"], ["hi"], name="upper", keepdims=0),
            helper.make_node("Clip", ["x", "lo", "hi"], ["y0"], name="clip_both"),
            helper.make_node("Clip", ["x", "", "lo"], ["y1"], name="clip_max_only"),
        ]
        graph = helper.make_graph(nodes, "clip_bounds", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3, 4)),
                                                         helper.make_tensor_value_info("b", TensorProto.FLOAT, (5,))],
                                  [helper.make_empty_tensor_value_info("y0"), helper.make_empty_tensor_value_info("y1")])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    return [("clip-with-run-time-bounds", clip_computed_bounds, {"x": (2, 3, 4), "b": (5,)}),
            ("shape-chain-fold-and-raster-fusion", shape_chain, {"x": (2, 4, 30)}),
            ("conv-bn-relu-residual-clip", conv_bn_relu_add, {"x": (1, 4, 6, 6)}),
            ("two-outputs-view-and-matmul-bias", two_outputs_and_view, {"x": (2, 4, 5)})]


OP_CASES = _cases()
COMPOSITE_CASES = _composite_cases()
