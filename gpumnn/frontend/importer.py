"""ONNX -> gpumnn IR.

The importer (with its helpers onnx_check.py, onnx_opsets.py and external_data.py) is the only
code of the engine that reads protobufs; onnx_backend.py, the ONNX backend-test adapter, builds
them for ``run_node``. It refuses a model the ONNX checker refuses (onnx_check.py) and external data outside
the model's folder (external_data.py), turns attributes into plain Python values, initializers
and Constant nodes into NumPy constants, and rejects what we cannot run with an error that names
the problem (file, node, op type, reason).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import ModelError, UnsupportedOpError
from .external_data import check_locations, load_external_data, refuse_unresolvable
from ..ir import Graph, Node, ValueInfo, subgraphs
from .checker import check_model
from ..geometry.registry import supported_ops
from .opsets import check_newer_ops, check_opset_range, default_opset, upgrade, walk_nodes


def _attribute_value(attr: onnx.AttributeProto, opset: int) -> Any:
    kind = attr.type
    A = onnx.AttributeProto
    if kind == A.FLOAT:
        return float(attr.f)
    if kind == A.INT:
        return int(attr.i)
    if kind == A.STRING:
        return attr.s.decode("utf-8", "replace")
    if kind == A.TENSOR:
        return numpy_helper.to_array(attr.t)
    if kind == A.FLOATS:
        return [float(v) for v in attr.floats]
    if kind == A.INTS:
        return [int(v) for v in attr.ints]
    if kind == A.STRINGS:
        return [s.decode("utf-8", "replace") for s in attr.strings]
    if kind == A.GRAPH:  # If's branches, Loop's and Scan's body: an IR graph of their own
        return _graph(attr.g, opset, subgraph=True)
    return None


#: 4-bit types a graph input or output may have: each value held in the 8-bit dtype of its sign
#: (NumPy has no 4-bit dtype), with its range
FOUR_BIT_TYPES: dict[str, tuple[np.dtype, tuple[int, int]]] = {
    "int4": (np.dtype(np.int8), (-8, 7)), "uint4": (np.dtype(np.uint8), (0, 15))}


def _value_info(info: onnx.ValueInfoProto) -> ValueInfo:
    dtype = np.dtype(np.float32)
    shape = None
    if info.type.HasField("tensor_type"):
        tensor_type = info.type.tensor_type
        try:  # as ONNX Runtime: a declared tensor type names a known element type
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"graph value {info.name!r} has element type {tensor_type.elem_type}, "
                             "which is no ONNX tensor type") from exc
        if tensor_type.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                          for d in tensor_type.shape.dim)
    if dtype.name in FOUR_BIT_TYPES:
        held, value_range = FOUR_BIT_TYPES[dtype.name]
        return ValueInfo(info.name, shape, held, dtype.name, value_range)
    return ValueInfo(info.name, shape, dtype)


def _parse(source: str | os.PathLike | bytes | onnx.ModelProto) -> tuple[onnx.ModelProto, Path | None]:
    """The ModelProto and the folder its external data may come from (None for bytes or a proto)."""
    if isinstance(source, onnx.ModelProto):
        return source, None
    path = None
    try:
        if isinstance(source, (bytes, bytearray)):
            data = bytes(source)
        else:
            path = Path(source)
            if not path.exists():
                raise ModelError(f"model file {str(path)!r} does not exist")
            data = path.read_bytes()
        return onnx.load_from_string(data), path
    except ModelError:
        raise
    except Exception as exc:  # protobuf DecodeError and friends
        name = "<bytes>" if isinstance(source, (bytes, bytearray)) else str(source)
        raise ModelError(f"{name} is not a valid ONNX model: {type(exc).__name__}: {exc}") from exc


def _read_model(source: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    """Parse the model, check it with the ONNX checker and read its external data (from its folder only)."""
    model, path = _parse(source)
    _check_opset(model)
    model = upgrade(model)  # read -> convert -> check -> import; external weights stay out of the converter
    if path is None:
        what = "the model bytes" if isinstance(source, (bytes, bytearray)) else f"model {model.graph.name!r}"
        refuse_unresolvable(model, what)
        check_model(model)
    else:
        check_locations(model, path.parent)
        check_model(model)  # before reading external data: the checker needs no weights
        load_external_data(model, path.parent)
    return model


def _check_opset(model: onnx.ModelProto) -> None:
    """gpumnn's own limits, checked before the ONNX checker so that their message comes first."""
    graph_proto = model.graph
    if not graph_proto.output:
        raise ModelError("the ONNX model's graph declares no outputs")
    opset = default_opset(model)
    if opset is None:
        raise ModelError("the ONNX model imports no default-domain opset")
    check_opset_range(opset)
    for index, proto in enumerate(walk_nodes(graph_proto)):
        if proto.domain not in ("", "ai.onnx") and proto.op_type not in supported_ops(proto.domain):
            known = supported_ops(proto.domain)
            raise UnsupportedOpError(proto.op_type, proto.name or f"{proto.op_type}_{index}",
                                     f"op {proto.op_type!r} of domain {proto.domain!r} is not supported (of that "
                                     f"domain gpumnn runs {', '.join(known)})" if known else
                                     f"custom domain {proto.domain!r} is not supported")
    check_newer_ops(model)


def import_onnx(source: str | os.PathLike | bytes | onnx.ModelProto) -> Graph:
    """Parse an ONNX model into a :class:`Graph`; raises ModelError if it is not usable."""
    model = _read_model(source)
    graph = _graph(model.graph, default_opset(model), subgraph=False)
    _check_topology(graph)
    return graph


def _graph(graph_proto: onnx.GraphProto, opset: int, subgraph: bool) -> Graph:
    """One graph, the model's or a subgraph (whose inputs are its formal parameters, kept even
    where a constant of the same name exists, and whose nodes may read outer tensors by name)."""
    initializers: dict[str, np.ndarray] = {}
    for tensor in graph_proto.initializer:
        try:
            initializers[tensor.name] = numpy_helper.to_array(tensor)
        except Exception as exc:
            raise ModelError(f"initializer {tensor.name!r} cannot be read: {exc}") from exc

    nodes: list[Node] = []
    used_names: set[str] = set()
    for index, proto in enumerate(graph_proto.node):
        name = proto.name or f"{proto.op_type}_{index}"
        while name in used_names:
            name = f"{name}_{index}"
        used_names.add(name)
        attrs = {a.name: _attribute_value(a, opset) for a in proto.attribute}
        if proto.op_type == "Constant":  # constants become initializers right away
            initializers[proto.output[0]] = _constant_value(attrs, name)
            continue
        nodes.append(Node(proto.op_type, name, list(proto.input), list(proto.output), attrs,
                          "" if proto.domain == "ai.onnx" else proto.domain))

    inputs = [_value_info(v) for v in graph_proto.input if subgraph or v.name not in initializers]
    outputs = [_value_info(v) for v in graph_proto.output]
    _type_four_bit_inputs(nodes, inputs)
    return Graph(nodes, inputs, outputs, initializers, opset, graph_proto.name or "graph")


def _type_four_bit_inputs(nodes: list[Node], inputs: list[ValueInfo]) -> None:
    """Keep the 4-bit type of a graph input held in a wider dtype (int4 in int8) where a node takes
    its output type from it: a CastLike to it becomes a Cast to the type, and a QuantizeLinear with
    it as zero point names the type as its ``output_dtype`` (which ONNX requires to agree)."""
    declared = {v.name: int(getattr(onnx.TensorProto, v.declared.upper())) for v in inputs if v.declared}
    for index, node in enumerate(nodes):
        if len(node.inputs) < 2 or not declared:
            continue
        if node.op_type == "CastLike" and node.inputs[1] in declared:
            attrs = {k: v for k, v in node.attrs.items() if k == "saturate"} | {"to": declared[node.inputs[1]]}
            nodes[index] = Node("Cast", node.name, node.inputs[:1], node.outputs, attrs, node.domain)
        elif node.op_type == "QuantizeLinear" and len(node.inputs) > 2 and node.inputs[2] in declared:
            node.attrs["output_dtype"] = declared[node.inputs[2]]


def _constant_value(attrs: dict[str, Any], node: str) -> np.ndarray:
    if "value" in attrs:
        return np.asarray(attrs["value"])
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32),
                       ("value_int", np.int64), ("value_ints", np.int64)):
        if key in attrs:
            return np.asarray(attrs[key], dtype=dtype)
    raise UnsupportedOpError("Constant", node, f"attribute(s) {sorted(attrs)} not supported")


def _check_topology(graph: Graph, outer: frozenset[str] = frozenset()) -> None:
    """Every node input must be produced earlier (ONNX requires topological order); a subgraph
    may also read what its enclosing graphs know at its node."""
    known = set(outer) | set(graph.initializers) | set(graph.input_names) | {""}
    for node in graph.nodes:
        for name in node.inputs:
            if name not in known:
                raise ModelError(f"node {node.name!r} ({node.op_type}) reads {name!r}, which no earlier node "
                                 "produces and which is neither a graph input nor an initializer")
        for sub in subgraphs(node):
            _check_topology(sub, frozenset(known))
        known.update(node.outputs)
    for out in graph.output_names:
        if out not in known:
            raise ModelError(f"graph output {out!r} is produced by no node")
