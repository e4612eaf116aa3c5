"""Model zoo: standard network topologies as ONNX, with seeded random weights.

Why random weights: the engine's correctness tests compare against
onnxruntime on the *same* graph, and its benchmarks measure speed, so neither
needs trained weights - but both need the real topologies (and their FLOP /
memory profiles) available offline, reproducibly, without torch.  Every
builder is deterministic (fixed per-model seed) and takes well under a
couple of seconds.

All models take a float32 tensor named ``"input"`` and produce one named
``"output"``; see :data:`MODELS` for shapes.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import Callable

import onnx

from .builder import count_parameters
from .cnn import mobilenet_v1, mobilenet_v2, resnet18, resnet50, squeezenet1_1
from .inception import inception_v3
from .transformer import transformer_encoder

__all__ = [
    "ModelSpec",
    "MODELS",
    "PAPER_MODELS",
    "names",
    "build",
    "input_shape",
    "save",
    "count_parameters",
    "mobilenet_v1",
    "squeezenet1_1",
    "resnet18",
    "mobilenet_v2",
    "resnet50",
    "inception_v3",
    "transformer_encoder",
]


@dataclass(frozen=True)
class ModelSpec:
    """Registry entry: how to build a model and what it expects as input."""

    name: str
    input_shape: tuple[int, ...]
    builder: Callable[[], onnx.ModelProto]
    description: str


_IMAGENET_224 = (1, 3, 224, 224)

#: Registry in a fixed order (cheapest / paper models first).
MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("mobilenet_v1", _IMAGENET_224, mobilenet_v1,
                  "MobileNet-v1 1.0/224: depthwise-separable convs, Conv+BN+Clip(ReLU6)"),
        ModelSpec("squeezenet1_1", _IMAGENET_224, squeezenet1_1,
                  "SqueezeNet 1.1: fire modules (Concat), ceil-mode MaxPool, no BN"),
        ModelSpec("resnet18", _IMAGENET_224, resnet18,
                  "ResNet-18: BasicBlocks, Conv+BN+Relu, residual Add"),
        ModelSpec("mobilenet_v2", _IMAGENET_224, mobilenet_v2,
                  "MobileNet-v2 1.0/224: inverted residuals, linear bottlenecks, ReLU6"),
        ModelSpec("resnet50", _IMAGENET_224, resnet50,
                  "ResNet-50 v1.5: bottleneck blocks, 25.6M parameters"),
        ModelSpec("inception_v3", (1, 3, 299, 299), inception_v3,
                  "Inception-v3 (no aux head): multi-branch Concat, 1x7/7x1 convs, AveragePool"),
        ModelSpec("transformer_encoder", (1, 128, 256), transformer_encoder,
                  "Post-LN transformer encoder block: MatMul attention, Softmax, Erf-GELU, LayerNorm"),
    )
}

#: The three networks benchmarked in the MNN paper.
PAPER_MODELS: tuple[str, ...] = ("mobilenet_v1", "squeezenet1_1", "resnet18")


def names() -> list[str]:
    """Model names in registry order."""
    return list(MODELS)


def _spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown zoo model {name!r}; known models: {', '.join(MODELS)}") from None


def build(name: str) -> onnx.ModelProto:
    """Build a fresh ModelProto for ``name`` (deterministic; KeyError if unknown)."""
    return _spec(name).builder()


def input_shape(name: str) -> tuple[int, ...]:
    """Shape of the model's single ``"input"`` tensor."""
    return _spec(name).input_shape


def save(name: str, path: str | os.PathLike[str]) -> pathlib.Path:
    """Build ``name`` and write it to ``path`` (parent directories are created)."""
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(build(name), str(out))
    return out
