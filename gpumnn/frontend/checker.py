"""The ONNX checker at load time: models ONNX Runtime refuses are refused here too, by name.

Without this, a model that breaks the ONNX spec could still run and give an answer (a ``Flatten``
with ``axis=-99`` did). Rather than repeat the spec's rules by hand, :func:`check_model` runs the
``onnx`` package's own checker with strict, type-checked shape inference
(``onnx.checker.check_model(..., full_check=True)``) and turns its failure into a
:class:`ModelError` that names the node (name and op type) and the checker's reason.

What the checker is given, and why:

* Weights stay out of it. The checker works on a serialised model, and serialising (and the
  checker's own parse of) 100 MB of weights cost several times the rest of a load. So the
  checker sees a *weightless view*: initializers of more than ``INLINE_ELEMENTS`` elements, and
  those stored as external data, are declared as graph inputs of the same type and shape
  instead of being carried along (a large initializer that is also a declared graph input stays,
  to be checked against its declaration). Shape inference needs only their type and shape; the
  small tensors it reads values from (Reshape shapes, Slice starts, ...) stay inline. What the
  view leaves unchecked -- a weight's byte count against its shape -- ``onnx_import`` finds when
  it reads the weight. The view is small whatever the model's size, so models over protobuf's
  2 GiB limit (weights in external data) are checked too; only a model holding over 2 GiB
  elsewhere (weights in Constant nodes) is loaded unchecked, with a warning.
* The checker wants every graph input and output declared with an element type and a shape;
  ONNX Runtime (and most hand-built test models) leave output types to inference. When a
  declaration is missing, the check runs on ``onnx.shape_inference.infer_shapes(strict_mode=True,
  check_type=True, data_prop=True)``'s result, which completes the outputs it can infer; the
  outputs it cannot (a shape known only at run time) are left out of that checked copy, and the
  nodes producing them are still checked.
"""
from __future__ import annotations

import re
import warnings

import numpy as np
import onnx
from google.protobuf.message import Message
from onnx import checker, external_data_helper, helper, shape_inference

from ..errors import ModelError

#: initializers up to this many elements stay in the checked view (shape inference reads their values)
INLINE_ELEMENTS = 4096
#: protobuf's limit on one serialised message, and so on what the checker can take
PROTOBUF_LIMIT = 2**31 - 1

# Where the checker's messages name a node: "(op_type:Add, node name: add1)" from inference
# ("(op_type:Add)" for an unnamed node), "Name: add1 OpType: Add" from the node checks,
# "Node(add1)" from the input-count check.
_NODE_PATTERNS = (
    re.compile(r"op_type:\s*(?P<op>[\w.]+)(?:,\s*node name:\s*(?P<name>[^)\n]*))?\)"),
    re.compile(r"name:\s*(?P<name>\S*)\s+OpType:\s*(?P<op>[\w.]+)", re.IGNORECASE),
    re.compile(r"Node\((?P<name>[^)\n]*)\)"),
)
_QUOTED = re.compile(r"'([^'\n]+)'")


def check_model(model: onnx.ModelProto) -> None:
    """Run the ONNX checker with full, strict shape inference; raise ModelError naming the node."""
    view = weightless_view(model)
    try:
        serialized = view.SerializeToString()
    except Exception:  # protobuf refuses to encode a message over 2 GiB
        serialized = None
    if serialized is None or len(serialized) > PROTOBUF_LIMIT:
        warnings.warn(f"the ONNX model {model.graph.name!r} holds more than 2 GiB outside its initializers "
                      "(e.g. in Constant nodes), which the ONNX checker cannot take; it was loaded unchecked",
                      RuntimeWarning, stacklevel=5)
        return
    try:
        if _declarations_complete(view.graph):
            checker.check_model(serialized, full_check=True)
        else:
            checker.check_model(_completed(serialized), full_check=True)
    except (checker.ValidationError, shape_inference.InferenceError) as exc:
        raise checker_error(model, str(exc)) from None
    except (ValueError, UnicodeDecodeError) as exc:  # e.g. "Invalid tensor data type 999", a non-UTF-8 name
        raise ModelError(f"invalid ONNX model: {type(exc).__name__}: {exc}") from exc


def weightless_view(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its large and external initializers declared as graph inputs (see above)."""
    return split_weights(model)[0]


def split_weights(model: onnx.ModelProto, keep_declared: bool = True
                  ) -> tuple[onnx.ModelProto, list[onnx.TensorProto], set[str]]:
    """(weightless view, the initializers moved out of it, names of the graph inputs it added for them).

    ``keep_declared`` keeps large initializers that are also declared graph inputs in the view (the
    checker checks them against their declaration); the version converter (onnx_opsets.upgrade) is
    given a view without them, since IR<4 exporters declare every weight as a graph input.
    :func:`restore_weights` puts the moved tensors back into a model derived from the view.
    """
    graph = model.graph
    declared = {i.name for i in graph.input}
    moved = [t for t in graph.initializer if external_data_helper.uses_external_data(t)
             or ((not keep_declared or t.name not in declared) and int(np.prod(t.dims)) > INLINE_ELEMENTS)]
    if not moved:
        return model, [], set()
    moved_names = {t.name for t in moved}
    view = onnx.ModelProto()
    _copy_fields(model, view, skip="graph")
    _copy_fields(graph, view.graph, skip="initializer")
    view.graph.initializer.extend(t for t in graph.initializer if t.name not in moved_names)
    added = [t for t in moved if t.name not in declared]
    view.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in added)
    return view, moved, {t.name for t in added}


def restore_weights(model: onnx.ModelProto, moved: list[onnx.TensorProto], added: set[str]) -> onnx.ModelProto:
    """Undo :func:`split_weights` on ``model`` (the view or one derived from it), in place."""
    if not moved:
        return model
    graph = model.graph
    for index in reversed(range(len(graph.input))):
        if graph.input[index].name in added:
            del graph.input[index]
    graph.initializer.extend(moved)
    return model


def _copy_fields(source: Message, target: Message, skip: str) -> None:
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        if isinstance(value, Message):
            getattr(target, field.name).CopyFrom(value)
        elif hasattr(value, "extend"):  # a repeated field
            getattr(target, field.name).extend(value)
        else:
            setattr(target, field.name, value)


def _declarations_complete(graph: onnx.GraphProto) -> bool:
    """Whether every graph input and output has the element type and shape the checker requires."""
    for info in list(graph.input) + list(graph.output):
        kind = info.type.WhichOneof("value")
        if kind is None:
            return False
        if kind == "tensor_type":
            tensor = info.type.tensor_type
            if not tensor.elem_type or not tensor.HasField("shape"):
                return False
    return True


def _completed(serialized: bytes) -> onnx.ModelProto:
    """The checked view with the missing output declarations strict shape inference filled in."""
    inferred = shape_inference.infer_shapes(serialized, check_type=True, strict_mode=True, data_prop=True)
    graph = inferred.graph
    undeclared = [o for o in graph.output
                  if o.type.WhichOneof("value") is None
                  or (o.type.HasField("tensor_type") and not o.type.tensor_type.HasField("shape"))]
    for output in undeclared:  # shape known only at run time: check its producer, not the declaration
        graph.output.remove(output)
    return inferred


def checker_error(model: onnx.ModelProto, message: str) -> ModelError:
    """A ModelError for the checker's ``message``, naming the node(s) it is about where it can."""
    reason = _tidy(message)
    nodes = _named_nodes(model.graph, message)
    if not nodes:
        return ModelError(f"invalid ONNX model (refused by the ONNX checker): {reason}")
    where = ", ".join(f"node {name!r} ({op})" for name, op in nodes)
    return ModelError(f"invalid ONNX model at {where}: {reason}")


def _tidy(message: str) -> str:
    text = message.split("==> Context:")[0]
    text = re.sub(r"\[(ShapeInferenceError|TypeInferenceError)\]\s*", "", text)
    text = text.replace("Inference error(s): ", "")
    text = re.sub(r"\(op_type:[^)]*\):\s*", "", text)  # the node is named in front of the reason
    return " ".join(text.split())


def _display_name(graph: onnx.GraphProto, index: int) -> str:
    """The node's name as gpumnn reports it (onnx_import names unnamed nodes OpType_index)."""
    proto = graph.node[index]
    return proto.name or f"{proto.op_type}_{index}"


def _named_nodes(graph: onnx.GraphProto, message: str) -> list[tuple[str, str]]:
    """(name, op type) of the nodes the message is about: named in it, else producing a value it quotes."""
    found: list[tuple[str, str]] = []
    for pattern in _NODE_PATTERNS:
        for match in pattern.finditer(message):
            name = (match.group("name") or "").strip()
            op = match.groupdict().get("op")
            if name:
                candidates = [i for i, n in enumerate(graph.node) if n.name == name and op in (None, n.op_type)][:1]
            else:  # an unnamed node: named (OpType_index) only where one unnamed node has this op type
                candidates = [i for i, n in enumerate(graph.node) if not n.name and op == n.op_type]
            if len(candidates) == 1:
                found.append((_display_name(graph, candidates[0]), graph.node[candidates[0]].op_type))
        if found:
            return list(dict.fromkeys(found))
    quoted = set(_QUOTED.findall(message))
    for i, node in enumerate(graph.node):
        if quoted & set(node.output):
            found.append((_display_name(graph, i), node.op_type))
    return list(dict.fromkeys(found))


__all__ = ["INLINE_ELEMENTS", "PROTOBUF_LIMIT", "check_model", "checker_error", "restore_weights",
           "split_weights", "weightless_view"]
