"""Model zoo: standard network topologies as ONNX, with seeded random weights.

Why random weights: the engine's correctness tests compare against
onnxruntime on the *same* graph, and its benchmarks measure speed, so neither
needs trained weights - but both need the real topologies (and their FLOP /
memory profiles) available offline, reproducibly, without torch.  Every
builder is deterministic (fixed per-model seed) and takes well under a
couple of seconds.

All models take a float32 tensor named ``"input"`` and produce one named
``"output"``; see :data:`MODELS` for shapes. They are built at batch 1; ``build(name, batch=8)``
fixes another batch, ``build(name, batch="N")`` leaves it symbolic (a session then takes any
batch, preparing each size once), and :func:`with_batch` does the same to an ONNX model whose
graph does not fix its batch inside (its first input dim is the batch of every output).
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
    "with_batch",
    "with_float16",
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


def build(name: str, batch: int | str | None = None) -> onnx.ModelProto:
    """Build a fresh ModelProto for ``name`` (deterministic; KeyError if unknown), at batch 1
    or, given ``batch``, at that batch (an int) or a symbolic one (a name): :func:`with_batch`."""
    model = _spec(name).builder()
    return model if batch is None else with_batch(model, batch)


def input_shape(name: str, batch: int | None = None) -> tuple[int, ...]:
    """Shape of the model's single ``"input"`` tensor (at ``batch``, if given)."""
    shape = _spec(name).input_shape
    return shape if batch is None else (int(batch),) + shape[1:]


def with_batch(model: onnx.ModelProto, batch: int | str) -> onnx.ModelProto:
    """``model`` with the first dim of every graph input and output set to ``batch``: a size, or
    a name for a symbolic batch; intermediate shapes (``value_info``) are dropped, since they name
    the old batch. Only the declared shapes change: a graph that fixes its batch inside (a Reshape
    to a constant shape, say) still refuses another one when a session prepares it."""
    if isinstance(batch, bool) or not isinstance(batch, (int, str)) or (isinstance(batch, int) and batch < 1) or batch == "":
        raise ValueError(f"batch must be a positive int or a dim name, not {batch!r}")
    model = onnx.ModelProto.FromString(model.SerializeToString())
    initializers = {t.name for t in model.graph.initializer}
    for value in [*model.graph.input, *model.graph.output]:
        if value.name in initializers or not value.type.tensor_type.HasField("shape"):
            continue
        dims = value.type.tensor_type.shape.dim
        if not dims:
            continue
        dims[0].Clear()
        if isinstance(batch, str):
            dims[0].dim_param = batch
        else:
            dims[0].dim_value = batch
    del model.graph.value_info[:]
    return model


def with_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with float16 inputs, weights, outputs and intermediate tensors, as ONNX Runtime's
    CPU kernels run it: each float32 weight and input is float16, cast to float32 where it is read,
    and each float32 node output is rounded to float16 and back (a float16 tensor between nodes)."""
    import numpy as np
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper, shape_inference

    model = shape_inference.infer_shapes(model)
    graph = model.graph
    floats = {v.name for v in (*graph.value_info, *graph.input, *graph.output)
              if v.type.tensor_type.elem_type == T.FLOAT}
    floats |= {i.name for i in graph.initializer if i.data_type == T.FLOAT}
    nodes, renamed = [], {}
    for init in graph.initializer:
        if init.data_type == T.FLOAT:
            half = numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name + "/half")
            init.CopyFrom(half)
            nodes.append(helper.make_node("Cast", [half.name], [half.name + "/float"], to=T.FLOAT))
            renamed[half.name[:-5]] = half.name + "/float"
    for vi in graph.input:
        if vi.name in floats:
            vi.type.tensor_type.elem_type = T.FLOAT16
            nodes.append(helper.make_node("Cast", [vi.name], [vi.name + "/float"], to=T.FLOAT))
            renamed[vi.name] = vi.name + "/float"
    outputs = {o.name for o in graph.output}
    for node in graph.node:
        node.input[:] = [renamed.get(n, n) for n in node.input]
        node.output[:] = [n + "/computed" if n in outputs else n for n in node.output]
        nodes.append(node)
        for name in node.output:
            base = name[:-len("/computed")] if name.endswith("/computed") else name
            if base not in floats:
                continue
            if base in outputs:
                nodes.append(helper.make_node("Cast", [name], [base], to=T.FLOAT16))
                continue
            nodes.append(helper.make_node("Cast", [name], [name + "/half"], to=T.FLOAT16))
            nodes.append(helper.make_node("Cast", [name + "/half"], [name + "/rounded"], to=T.FLOAT))
            renamed[name] = name + "/rounded"
    for vi in graph.output:
        vi.type.tensor_type.elem_type = T.FLOAT16
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]
    onnx.checker.check_model(model)
    return model


def save(name: str, path: str | os.PathLike[str], batch: int | str | None = None) -> pathlib.Path:
    """Build ``name`` (at ``batch``: :func:`build`) and write it to ``path`` (parent directories are created)."""
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(build(name, batch), str(out))
    return out
