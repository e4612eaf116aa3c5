"""A seeded corpus of mutated ONNX models, for the fuzz test (tests/test_fuzz.py).

Case ``index`` of seed ``seed`` is a pure function of the two numbers: the base model is picked
by the index, the mutation kind cycles through :data:`MUTATIONS` (so a few hundred cases cover
every kind on every base model), and the mutation's details come from a ``random.Random``
seeded by (seed, index). A failure found by the fuzz test is therefore rerun alone with

    python tests/fuzz_corpus.py --case N --backend B [--seed S]

which prints the mutation, what ONNX Runtime does with the model and what gpumnn does, with the
traceback of anything that is not a gpumnn error.

The base models are small (tens of microseconds of compute) so that the time goes into what is
fuzzed: parsing, import, lowering, session creation and run-time input checks.
"""
from __future__ import annotations

import argparse
import functools
import random
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20240607
OPSET = 17
#: larger declared inputs are not fed (the case only checks that load/session refuse them)
MAX_FEED_ELEMENTS = 1 << 20
HUGE_DIMS = (1 << 31, 1 << 40, 1 << 62, 3_000_000_007)
NEGATIVE_DIMS = (-1, -2, -7, -(1 << 40))

# -- base models ---------------------------------------------------------------------------------


def _w(rng: np.random.Generator, *shape: int, scale: float = 0.5) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _model(nodes, name, inputs, outputs, inits) -> onnx.ModelProto:
    """A checked model whose outputs are left to shape inference (as ONNX Runtime allows), so that
    mutations which change an output's shape still leave a valid model."""
    graph = helper.make_graph(nodes, name,
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_empty_tensor_value_info(n) for n, _ in outputs],
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, check_type=True)
    onnx.checker.check_model(inferred, full_check=True)
    assert [[d.dim_value for d in o.type.tensor_type.shape.dim] for o in inferred.graph.output] == \
        [list(s) for _, s in outputs], f"{name}: outputs are not the intended shapes"
    return model


def convnet() -> onnx.ModelProto:
    """Conv + BatchNorm + Relu + MaxPool + grouped Conv + LeakyRelu + GlobalAveragePool + Gemm."""
    r = np.random.default_rng(1)
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], "conv1", pads=[1, 1, 1, 1], strides=[1, 1], kernel_shape=[3, 3]),
        n("BatchNormalization", ["c1", "gamma", "beta", "mean", "var"], ["bn"], "bn1", epsilon=1e-5),
        n("Relu", ["bn"], ["r1"], "relu1"),
        n("MaxPool", ["r1"], ["p1"], "pool1", kernel_shape=[2, 2], strides=[2, 2]),
        n("Conv", ["p1", "w2"], ["c2"], "conv2", pads=[1, 1, 1, 1], group=2),
        n("LeakyRelu", ["c2"], ["r2"], "lrelu2", alpha=0.1),
        n("GlobalAveragePool", ["r2"], ["g"], "gap"),
        n("Flatten", ["g"], ["f"], "flatten", axis=1),
        n("Gemm", ["f", "wfc", "bfc"], ["y"], "fc", transB=1),
    ]
    inits = {"w1": _w(r, 4, 3, 3, 3), "b1": _w(r, 4), "gamma": 1 + _w(r, 4, scale=0.1), "beta": _w(r, 4),
             "mean": _w(r, 4), "var": np.abs(_w(r, 4)) + 0.5, "w2": _w(r, 6, 2, 3, 3), "wfc": _w(r, 5, 6),
             "bfc": _w(r, 5)}
    return _model(nodes, "convnet", [("x", [1, 3, 8, 8])], [("y", [1, 5])], inits)


def mlp() -> onnx.ModelProto:
    """Gemm + Tanh + MatMul + Add + Sigmoid*x (swish) + Softmax."""
    r = np.random.default_rng(2)
    n = helper.make_node
    nodes = [
        n("Gemm", ["x", "w1", "b1"], ["h1"], "gemm1", alpha=1.0, beta=1.0),
        n("Tanh", ["h1"], ["t1"], "tanh1"),
        n("MatMul", ["t1", "w2"], ["m2"], "matmul2"),
        n("Add", ["m2", "b2"], ["a2"], "add2"),
        n("Sigmoid", ["a2"], ["s2"], "sigmoid2"),
        n("Mul", ["a2", "s2"], ["sw"], "swish"),
        n("Softmax", ["sw"], ["y"], "softmax", axis=-1),
    ]
    inits = {"w1": _w(r, 6, 8), "b1": _w(r, 8), "w2": _w(r, 8, 4), "b2": _w(r, 4)}
    return _model(nodes, "mlp", [("x", [2, 6])], [("y", [2, 4])], inits)


def reshape_graph() -> onnx.ModelProto:
    """Reshape + Transpose + Concat + Slice + Unsqueeze/Squeeze + Tile + Flatten + Gather; two outputs."""
    r = np.random.default_rng(3)
    n = helper.make_node
    i64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    nodes = [
        n("Reshape", ["x", "shape"], ["r"], "reshape"),
        n("Transpose", ["r"], ["t"], "transpose", perm=[0, 3, 1, 2]),
        n("Concat", ["t", "c"], ["cat"], "concat", axis=1),
        n("Slice", ["cat", "starts", "ends", "axes", "steps"], ["s"], "slice"),
        n("Unsqueeze", ["s", "uaxes"], ["u"], "unsqueeze"),
        n("Squeeze", ["u", "uaxes"], ["q"], "squeeze"),
        n("Tile", ["q", "repeats"], ["e"], "tile"),
        n("Flatten", ["e"], ["y"], "flatten", axis=2),
        n("Gather", ["cat", "idx"], ["z"], "gather", axis=1),
    ]
    inits = {"shape": i64(1, 2, 2, 6), "c": _w(r, 1, 2, 2, 2), "starts": i64(1), "ends": i64(7), "axes": i64(1),
             "steps": i64(2), "uaxes": i64(0), "repeats": i64(1, 1, 1, 2), "idx": i64(0, 5)}
    return _model(nodes, "reshape_graph", [("x", [1, 4, 6])], [("y", [3, 8]), ("z", [1, 2, 2, 2])], inits)


def resize_pool() -> onnx.ModelProto:
    """Resize (nearest, linear) + AveragePool + Clip + Pad + Softmax + ReduceMean + Sub; two outputs."""
    n = helper.make_node
    nodes = [
        n("Resize", ["x", "", "scales"], ["up"], "resize_nearest", mode="nearest"),
        n("AveragePool", ["up"], ["p"], "avgpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        n("Clip", ["p", "lo", "hi"], ["c"], "clip"),
        n("Pad", ["c", "pads"], ["pd"], "pad", mode="constant"),
        n("Softmax", ["pd"], ["s"], "softmax", axis=1),
        n("ReduceMean", ["s"], ["m"], "reducemean", axes=[2, 3], keepdims=1),
        n("Sub", ["s", "m"], ["y"], "sub"),
        n("Resize", ["x", "", "", "sizes"], ["z"], "resize_linear", mode="linear"),
    ]
    inits = {"scales": np.array([1, 1, 2, 2], np.float32), "lo": np.array(-0.5, np.float32),
             "hi": np.array(0.5, np.float32), "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
             "sizes": np.array([1, 2, 6, 6], np.int64)}
    return _model(nodes, "resize_pool", [("x", [1, 2, 4, 4])], [("y", [1, 2, 6, 6]), ("z", [1, 2, 6, 6])], inits)


BASE_MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "convnet": convnet, "mlp": mlp, "reshape": reshape_graph, "resize_pool": resize_pool}


# -- mutations -----------------------------------------------------------------------------------
# Each takes a fresh copy of a base model and a seeded random.Random, and returns the mutated
# model (a ModelProto, or bytes for the byte-level ones) and a one-line description.

Mutated = tuple["onnx.ModelProto | bytes", str]


def _pick_node(m: onnx.ModelProto, rnd: random.Random, with_attrs: bool = False) -> onnx.NodeProto:
    nodes = [n for n in m.graph.node if n.attribute or not with_attrs]
    return rnd.choice(nodes or list(m.graph.node))


def flip_bytes(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    data = bytearray(m.SerializeToString())
    flips = []
    for _ in range(rnd.randint(1, 6)):
        at, mask = rnd.randrange(len(data)), rnd.randint(1, 255)
        data[at] ^= mask
        flips.append(f"{at}^{mask:#04x}")
    return bytes(data), f"flip bytes {', '.join(flips)} of {len(data)}"


def truncate_bytes(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    data = m.SerializeToString()
    keep = rnd.randrange(len(data))
    return data[:keep], f"truncate to {keep} of {len(data)} bytes"


INT_VALUES = (-99, -2, -1, 0, 1, 2, 3, 7, 1 << 31, 1 << 40)
FLOAT_VALUES = (-1.0, 0.0, 2.5, 1e30, float("nan"), float("inf"), float("-inf"))
STRING_VALUES = ("", "bogus", "cubic", "SAME_UPPER", "SAME_LOWER", "VALID", "reflect", "edge", "CRD", "tanh")


def bad_attribute_value(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    node = _pick_node(m, rnd, with_attrs=True)
    if not node.attribute:
        return bad_attribute_added(m, rnd)
    attr = rnd.choice(list(node.attribute))
    A = onnx.AttributeProto
    if attr.type == A.INT:
        attr.i = rnd.choice(INT_VALUES)
        new = attr.i
    elif attr.type == A.FLOAT:
        attr.f = rnd.choice(FLOAT_VALUES)
        new = attr.f
    elif attr.type == A.STRING:
        attr.s = rnd.choice(STRING_VALUES).encode()
        new = attr.s.decode()
    elif attr.type == A.INTS:
        values = list(attr.ints)
        how = rnd.choice(("element", "shorter", "longer", "empty"))
        if how == "element" and values:
            values[rnd.randrange(len(values))] = rnd.choice(INT_VALUES)
        elif how == "shorter":
            values = values[:-1]
        elif how == "longer":
            values = values + [rnd.choice(INT_VALUES)]
        else:
            values = []
        del attr.ints[:]
        attr.ints.extend(values)
        new = values
    else:
        attr.type = A.INT
        attr.i = -1
        new = -1
    return m, f"node {node.name!r} ({node.op_type}): attribute {attr.name} = {new!r}"


def _replace_attribute(node: onnx.NodeProto, name: str, value: object = None) -> None:
    """Drop ``node``'s attribute ``name`` and, unless ``value`` is None, add it back with ``value``."""
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept + ([helper.make_attribute(name, value)] if value is not None else []))


def bad_attribute_type(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    node = _pick_node(m, rnd, with_attrs=True)
    if not node.attribute:
        return bad_attribute_added(m, rnd)
    attr = rnd.choice(list(node.attribute))
    choice = rnd.choice(("int", "float", "string", "ints", "floats"))
    value = {"int": 3, "float": 1.5, "string": "3", "ints": [3, 3], "floats": [1.5, -1.0]}[choice]
    _replace_attribute(node, attr.name, value)
    return m, f"node {node.name!r} ({node.op_type}): attribute {attr.name} retyped to {choice} {value!r}"


EXTRA_ATTRIBUTES = (
    ("axis", -99), ("axis", 5), ("axis", -1), ("group", 0), ("group", 3), ("group", -1), ("auto_pad", "SAME_UPPER"),
    ("auto_pad", "VALID"), ("auto_pad", "bogus"), ("transA", 1), ("transB", 1), ("dilations", [2, 2]),
    ("dilations", [0, 0]), ("strides", [0, 0]), ("strides", [-1, 2]), ("strides", [3, 3]), ("ceil_mode", 1),
    ("count_include_pad", 1), ("keepdims", 0), ("allowzero", 1), ("perm", [0, 0, 1, 2]), ("perm", [3, 2, 1, 0]),
    ("perm", [0, 9, 1]), ("kernel_shape", [0, 0]), ("kernel_shape", [99, 99]), ("kernel_shape", [-3, 3]),
    ("pads", [-2, -2, -2, -2]), ("pads", [1, 1]), ("pads", [100, 0, 0, 100]), ("epsilon", -1.0),
    ("alpha", float("nan")), ("beta", 0.0), ("mode", "cubic"), ("mode", "reflect"), ("split", [1, 1]),
    ("num_outputs", 0), ("blocksize", 0), ("to", 7), ("to", 8), ("start", 5), ("end", -9), ("size", 0),
    ("unknown_attribute", 1),
)


def bad_attribute_added(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    node = _pick_node(m, rnd)
    name, value = rnd.choice(EXTRA_ATTRIBUTES)
    _replace_attribute(node, name, value)
    return m, f"node {node.name!r} ({node.op_type}): attribute {name} set to {value!r}"


def attribute_dropped(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    node = _pick_node(m, rnd, with_attrs=True)
    if not node.attribute:
        return bad_attribute_added(m, rnd)
    attr = rnd.choice(list(node.attribute))
    _replace_attribute(node, attr.name)
    return m, f"node {node.name!r} ({node.op_type}): attribute {attr.name} removed"


def _dims(info: onnx.ValueInfoProto):
    return info.type.tensor_type.shape.dim


def wrong_input_dims(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    info = rnd.choice(list(m.graph.input))
    dims = _dims(info)
    how = rnd.choice(("change", "change", "drop", "add", "symbolic", "no_shape"))
    if how == "no_shape":
        info.type.tensor_type.ClearField("shape")
        return m, f"graph input {info.name!r}: shape removed"
    if how == "drop" and len(dims) > 1:
        del dims[rnd.randrange(len(dims))]
    elif how == "add":
        dims.add().dim_value = rnd.choice((1, 2, 3))
    elif how == "symbolic":
        dims[rnd.randrange(len(dims))].dim_param = "batch"
    else:
        d = dims[rnd.randrange(len(dims))]
        d.dim_value = rnd.choice((0, 1, 2, d.dim_value + 1, d.dim_value * 2 + 1))
    return m, f"graph input {info.name!r}: dims ({how}) -> {[d.dim_param or d.dim_value for d in dims]}"


def wrong_initializer_dims(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    inits = list(m.graph.initializer)
    tensor = rnd.choice(inits)
    array = numpy_helper.to_array(tensor)
    shape = list(array.shape)
    how = rnd.choice(("grow", "shrink", "add_dim", "drop_dim", "inconsistent"))
    if how == "inconsistent":  # declared dims that disagree with the stored data
        tensor.dims.append(rnd.choice((2, 3)))
        return m, f"initializer {tensor.name!r}: dims {list(tensor.dims)} disagree with its {array.size} values"
    if how in ("grow", "shrink") and shape:
        i = rnd.randrange(len(shape))
        shape[i] = shape[i] + 1 if how == "grow" else max(0, shape[i] - 1)
    elif how == "add_dim":
        shape.insert(rnd.randrange(len(shape) + 1), rnd.choice((1, 2)))
    elif shape:
        shape.pop(rnd.randrange(len(shape)))
    rs = np.random.default_rng(rnd.randrange(1 << 30))
    if array.dtype.kind == "f":
        data = rs.standard_normal(shape).astype(array.dtype)
    else:
        data = rs.integers(-1, 4, size=shape).astype(array.dtype)
    tensor.CopyFrom(numpy_helper.from_array(data, tensor.name))
    return m, f"initializer {tensor.name!r}: shape {list(array.shape)} -> {shape} ({how})"


def drop_initializer(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    inits = m.graph.initializer
    i = rnd.randrange(len(inits))
    name = inits[i].name
    del inits[i]
    return m, f"initializer {name!r} removed"


RETYPES = (TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.INT32, TensorProto.INT8,
           TensorProto.UINT8, TensorProto.BOOL, TensorProto.FLOAT, TensorProto.STRING)


def retype_initializer(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    tensor = rnd.choice(list(m.graph.initializer))
    array = numpy_helper.to_array(tensor)
    target = rnd.choice(RETYPES)
    if target == TensorProto.STRING:
        new = numpy_helper.from_array(np.array([str(v) for v in array.reshape(-1)], dtype=object).reshape(array.shape),
                                      tensor.name)
    else:
        new = numpy_helper.from_array(array.astype(helper.tensor_dtype_to_np_dtype(target)), tensor.name)
    tensor.CopyFrom(new)
    return m, f"initializer {tensor.name!r}: {array.dtype} -> {TensorProto.DataType.Name(target)}"


def delete_node(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    nodes = m.graph.node
    i = rnd.randrange(len(nodes))
    node = nodes[i]
    name, op, source, out = node.name, node.op_type, node.input[0], node.output[0]
    del nodes[i]
    if rnd.random() < 0.5:  # bypass: readers of the deleted node now read its first input
        for other in nodes:
            for k, v in enumerate(other.input):
                if v == out:
                    other.input[k] = source
        for o in m.graph.output:
            if o.name == out:
                o.name = source
        return m, f"node {name!r} ({op}) deleted, its readers rewired to {source!r}"
    return m, f"node {name!r} ({op}) deleted"


def make_cycle(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    nodes = m.graph.node
    late = rnd.randrange(len(nodes))
    early = rnd.randrange(late + 1)
    k = rnd.randrange(len(nodes[early].input))
    nodes[early].input[k] = nodes[late].output[0]
    return m, (f"node {nodes[early].name!r} input {k} reads {nodes[late].output[0]!r} "
               f"of {'itself' if early == late else repr(nodes[late].name)} (a cycle)")


def rename_input(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    info = rnd.choice(list(m.graph.input))
    old = info.name
    how = rnd.choice(("declaration", "everywhere", "initializer_name", "duplicate", "empty"))
    if how == "declaration":
        info.name = "renamed"
    elif how == "everywhere":
        info.name = "renamed"
        for node in m.graph.node:
            for k, v in enumerate(node.input):
                if v == old:
                    node.input[k] = "renamed"
    elif how == "initializer_name":
        info.name = rnd.choice(list(m.graph.initializer)).name
    elif how == "duplicate":
        m.graph.input.add().CopyFrom(info)
    else:
        info.name = ""
    return m, f"graph input {old!r} renamed ({how}) to {info.name!r}"


def rename_node_io(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    node = _pick_node(m, rnd)
    how = rnd.choice(("missing_input", "empty_input", "extra_input", "drop_input", "output_clash", "no_output"))
    if how == "missing_input":
        node.input[rnd.randrange(len(node.input))] = "nowhere"
    elif how == "empty_input":
        node.input[rnd.randrange(len(node.input))] = ""
    elif how == "extra_input":
        node.input.append(rnd.choice([i.name for i in m.graph.initializer]))
    elif how == "drop_input":
        del node.input[-1]
    elif how == "output_clash":  # two producers of one tensor
        node.output[0] = rnd.choice(list(m.graph.node)).output[0] if rnd.random() < 0.5 else m.graph.input[0].name
    else:
        del node.output[:]
    return m, f"node {node.name!r} ({node.op_type}): {how} -> inputs {list(node.input)} outputs {list(node.output)}"


def _shape_like_initializers(m: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in m.graph.initializer if t.data_type == TensorProto.INT64 and len(t.dims) == 1]


def _extreme_dim(m: onnx.ModelProto, rnd: random.Random, choices: Sequence[int], p_initializer: float,
                 label: str) -> Mutated:
    """One dim of a shape-like initializer (with probability ``p_initializer``) or of a graph
    input set to one of ``choices``."""
    shape_like = _shape_like_initializers(m)
    if shape_like and rnd.random() < p_initializer:
        tensor = rnd.choice(shape_like)
        values = numpy_helper.to_array(tensor).copy()
        values[rnd.randrange(values.size)] = rnd.choice(choices)
        tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
        return m, f"initializer {tensor.name!r} = {values.tolist()} ({label})"
    info = rnd.choice(list(m.graph.input))
    dims = _dims(info)
    dims[rnd.randrange(len(dims))].dim_value = rnd.choice(choices)
    return m, f"graph input {info.name!r}: dims -> {[d.dim_value for d in dims]} ({label})"


def huge_dims(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    return _extreme_dim(m, rnd, HUGE_DIMS, 0.4, "huge")


def negative_dims(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    return _extreme_dim(m, rnd, NEGATIVE_DIMS, 0.5, "negative")


OP_SWAPS = {
    "Conv": ("ConvTranspose", "MaxPool", "MatMul"), "Relu": ("Sigmoid", "Softmax", "Identity", "Flatten"),
    "MaxPool": ("AveragePool", "GlobalMaxPool", "Conv"), "Gemm": ("MatMul", "Add", "Conv"),
    "MatMul": ("Gemm", "Mul", "Concat"), "Add": ("Mul", "Sub", "Div", "Sum", "Concat", "MatMul"),
    "Softmax": ("LogSoftmax", "Flatten", "ReduceMax"), "Reshape": ("Expand", "Tile", "Squeeze", "Concat"),
    "Transpose": ("Identity", "Softmax", "Flatten"), "Concat": ("Sum", "Add", "Max"),
    "Slice": ("Pad", "Reshape", "Expand"), "Resize": ("Pad", "Reshape", "Upsample"),
    "AveragePool": ("MaxPool", "LRN", "GlobalAveragePool"), "Pad": ("Tile", "Slice", "Reshape"),
    "ReduceMean": ("ReduceSum", "ReduceMax", "ReduceMin"), "Gather": ("Split", "Tile", "Unsqueeze"),
}


def swap_op(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    node = _pick_node(m, rnd)
    old = node.op_type
    node.op_type = rnd.choice(OP_SWAPS.get(old, ("Relu", "Abs", "NoSuchOp")) + ("NoSuchOp",))
    return m, f"node {node.name!r}: op {old} -> {node.op_type}"


def change_opset(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    version = rnd.choice((1, 7, 10, 11, 12, 13, 18, 21, 22, 99))
    m.opset_import[0].version = version
    return m, f"opset {OPSET} -> {version}"


INPUT_TYPES = (TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.UINT8, TensorProto.BOOL,
               TensorProto.STRING, 0, 999)


def retype_input(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    info = rnd.choice(list(m.graph.input) + list(m.graph.output))
    info.type.tensor_type.elem_type = rnd.choice(INPUT_TYPES)
    return m, f"graph value {info.name!r}: elem_type -> {info.type.tensor_type.elem_type}"


def mangle_outputs(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    outs = m.graph.output
    how = rnd.choice(("none", "unknown", "duplicate", "input", "initializer", "intermediate"))
    if how == "none":
        del outs[:]
    elif how == "unknown":
        outs[0].name = "nobody_makes_this"
    elif how == "duplicate":
        outs.add().CopyFrom(outs[0])
    elif how == "input":
        outs[0].name = m.graph.input[0].name
    elif how == "initializer":
        outs[0].name = m.graph.initializer[0].name
    else:
        outs[0].name = rnd.choice(list(m.graph.node)[:-1]).output[0]
    return m, f"graph outputs ({how}) -> {[o.name for o in outs]}"


def shuffle_nodes(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    nodes = list(m.graph.node)
    order = list(range(len(nodes)))
    rnd.shuffle(order)
    del m.graph.node[:]
    m.graph.node.extend(nodes[i] for i in order)
    return m, f"nodes reordered {order}"


def duplicate_node(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    node = _pick_node(m, rnd)
    m.graph.node.append(node)
    return m, f"node {node.name!r} ({node.op_type}) appended a second time"


def two_mutations(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    first, second = rnd.sample(STRUCTURAL, 2)
    m, d1 = first(m, rnd)
    m, d2 = second(m, rnd)
    return m, f"{d1}; then {d2}"


#: attribute values an exporter could well write: most keep the model valid, so the answer is
#: compared with ONNX Runtime's (auto_pad drops explicit pads, as the ONNX spec requires)
PLAUSIBLE_ATTRIBUTES = {
    "Conv": [("strides", [2, 2]), ("strides", [1, 2]), ("pads", [0, 0, 0, 0]), ("pads", [2, 1, 0, 1]),
             ("dilations", [2, 2]), ("dilations", [1, 2]), ("auto_pad", "SAME_UPPER"), ("auto_pad", "SAME_LOWER"),
             ("auto_pad", "VALID")],
    "MaxPool": [("ceil_mode", 1), ("pads", [1, 1, 1, 1]), ("pads", [1, 0, 0, 1]), ("strides", [1, 1]),
                ("strides", [3, 1]), ("kernel_shape", [3, 3]), ("kernel_shape", [2, 3]), ("auto_pad", "SAME_UPPER"),
                ("auto_pad", "VALID"), ("dilations", [2, 2]), ("storage_order", 1)],
    "AveragePool": [("count_include_pad", 1), ("ceil_mode", 1), ("strides", [1, 1]), ("kernel_shape", [2, 2]),
                    ("kernel_shape", [1, 3]), ("pads", [0, 0, 0, 0]), ("pads", [1, 0, 0, 1]),
                    ("auto_pad", "SAME_LOWER"), ("auto_pad", "VALID")],
    "Softmax": [("axis", 0), ("axis", 1), ("axis", -2), ("axis", 2), ("axis", 3)],
    "Flatten": [("axis", 0), ("axis", 2), ("axis", -1), ("axis", 3), ("axis", -3)],
    "Gemm": [("alpha", 0.5), ("beta", 2.0), ("beta", 0.0), ("transA", 1), ("transB", 0)],
    "LeakyRelu": [("alpha", -0.3), ("alpha", 2.0), ("alpha", 0.0)],
    "Transpose": [("perm", [0, 1, 2, 3]), ("perm", [3, 2, 1, 0]), ("perm", [0, 2, 3, 1]), ("perm", [1, 0, 3, 2])],
    "Concat": [("axis", -3), ("axis", 0), ("axis", 3), ("axis", -4)],
    "Gather": [("axis", 0), ("axis", 2), ("axis", -1), ("axis", -3), ("axis", 3)],
    "ReduceMean": [("keepdims", 0), ("axes", [1]), ("axes", [-1]), ("axes", [0, 1, 2, 3]), ("axes", [1, 3]),
                   ("axes", [3, 1])],
    "Resize": [("coordinate_transformation_mode", "asymmetric"), ("coordinate_transformation_mode", "align_corners"),
               ("coordinate_transformation_mode", "pytorch_half_pixel"), ("nearest_mode", "floor"),
               ("nearest_mode", "ceil"), ("nearest_mode", "round_prefer_ceil"), ("mode", "linear"),
               ("mode", "nearest"), ("exclude_outside", 1), ("cubic_coeff_a", -0.5)],
    "Pad": [("mode", "reflect"), ("mode", "edge")],
    "BatchNormalization": [("epsilon", 1e-2), ("momentum", 0.5)],
    "Reshape": [("allowzero", 1)],
}


def plausible_attribute(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    node = rnd.choice([n for n in m.graph.node if n.op_type in PLAUSIBLE_ATTRIBUTES])
    name, value = rnd.choice(PLAUSIBLE_ATTRIBUTES[node.op_type])
    kept = [a for a in node.attribute if a.name != name and not (name == "auto_pad" and a.name == "pads")]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute(name, value)])
    return m, f"node {node.name!r} ({node.op_type}): attribute {name} set to {value!r}"


#: other values for the shape-like constants of the base models (negative pads crop; -1/0 in Reshape)
PLAUSIBLE_CONSTANTS = {
    "shape": ([1, -1, 2, 6], [0, 2, 2, -1], [1, 2, 2, 6, 1], [2, 2, 6], [-1]),
    "starts": ([0], [-3], [5], [-100]), "ends": ([8], [-1], [100], [0], [-100]), "steps": ([1], [3], [-1], [-2]),
    "axes": ([-3], [0], [3], [2]), "uaxes": ([-1], [2], [4]), "repeats": ([2, 1, 1, 1], [1, 1, 1, 1], [1, 3, 2, 1]),
    "idx": ([-1, 3], [[0, 1], [2, 3]], [7], [-8], [8]),
    "scales": ([1, 1, 1.5, 0.5], [1, 1, 3, 3], [1, 1, 0.5, 0.5], [1, 1, 1, 1], [2, 1, 1, 1]),
    "sizes": ([1, 2, 3, 9], [1, 2, 1, 1], [1, 2, 4, 4], [1, 2, 16, 3]),
    "pads": ([0, 0, 0, 1, 0, 0, 2, 0], [0, 0, -1, 0, 0, 0, 0, -1], [0, 0, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0]),
    "lo": (0.7, -2.0), "hi": (-0.7, 3.0),
}


def plausible_constant(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    tensors = [t for t in m.graph.initializer if t.name in PLAUSIBLE_CONSTANTS]
    if not tensors:  # the weights of convnet and mlp: rescaled, zeroed or made large
        tensor = rnd.choice(list(m.graph.initializer))
        array = numpy_helper.to_array(tensor)
        how = rnd.choice(("zero", "large", "negate", "sparse"))
        mask = np.random.default_rng(rnd.randrange(1 << 30)).random(array.shape) < 0.5
        new = {"zero": np.zeros_like(array), "large": array * 1e3, "negate": -array,
               "sparse": np.where(mask, 0, array).astype(array.dtype)}[how]
        tensor.CopyFrom(numpy_helper.from_array(new, tensor.name))
        return m, f"initializer {tensor.name!r}: values {how}"
    tensor = rnd.choice(tensors)
    old = numpy_helper.to_array(tensor)
    value = np.array(rnd.choice(PLAUSIBLE_CONSTANTS[tensor.name]), dtype=old.dtype)
    tensor.CopyFrom(numpy_helper.from_array(value, tensor.name))
    return m, f"initializer {tensor.name!r}: {old.tolist()} -> {value.tolist()}"


def plausible_input_dims(m: onnx.ModelProto, rnd: random.Random) -> Mutated:
    info = m.graph.input[0]
    dims = _dims(info)
    for i in rnd.sample(range(len(dims)), min(2, len(dims))):
        if i >= 2 or len(dims) == 2:
            dims[i].dim_value = rnd.randint(1, 12)
        elif i == 0:
            dims[i].dim_param = "N" if rnd.random() < 0.5 else ""
            if not dims[i].dim_param:
                dims[i].dim_value = rnd.randint(1, 3)
    return m, f"graph input {info.name!r}: dims -> {[d.dim_param or d.dim_value for d in dims]}"


STRUCTURAL = [bad_attribute_value, bad_attribute_type, bad_attribute_added, attribute_dropped, wrong_input_dims,
              wrong_initializer_dims, drop_initializer, retype_initializer, delete_node, make_cycle, rename_input,
              rename_node_io, huge_dims, negative_dims, swap_op, retype_input, mangle_outputs, shuffle_nodes]

#: the mutation kinds, cycled through by case index (attribute and dim mutations weigh double, and the
#: plausible ones, whose answers are compared with ONNX Runtime's, triple)
MUTATIONS = [flip_bytes, truncate_bytes, bad_attribute_value, bad_attribute_added, bad_attribute_type,
             attribute_dropped, wrong_input_dims, wrong_initializer_dims, drop_initializer, retype_initializer,
             delete_node, make_cycle, rename_input, rename_node_io, huge_dims, negative_dims, swap_op,
             change_opset, retype_input, mangle_outputs, shuffle_nodes, duplicate_node, two_mutations,
             bad_attribute_value, bad_attribute_added, wrong_input_dims, flip_bytes,
             plausible_attribute, plausible_attribute, plausible_attribute, plausible_constant, plausible_constant,
             plausible_constant, plausible_input_dims, plausible_input_dims]


# -- cases ---------------------------------------------------------------------------------------

#: cases in the test: every mutation kind on every base model at least once
CASES = 12 * len(MUTATIONS)


@functools.lru_cache(maxsize=None)
def _base(name: str) -> onnx.ModelProto:
    return BASE_MODELS[name]()  # callers copy it before mutating

@dataclass
class Case:
    """One mutated model with the inputs to run it on (both derived from seed and index)."""

    seed: int
    index: int
    base: str
    mutation: str
    model: bytes
    feeds: dict[str, np.ndarray] | None = None  # None: the declared inputs cannot be built
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"case {self.index} (seed {self.seed}, {self.base}): {self.mutation}"


def _case_rng(seed: int, index: int) -> random.Random:
    return random.Random(zlib.crc32(f"{seed}:{index}".encode()))


def _feeds(model_bytes: bytes, base: onnx.ModelProto, seed: int, index: int):
    """Inputs for the model's declared (non-initializer) graph inputs, or None if one cannot be built."""
    try:
        model = onnx.load_from_string(model_bytes)
    except Exception:
        model = base
    rng = np.random.default_rng([seed, index])
    base_shapes = {i.name: [d.dim_value for d in _dims(i)] for i in base.graph.input}
    initializers = {t.name for t in model.graph.initializer}
    feeds, shapes, buildable = {}, {}, True
    for k, info in enumerate(model.graph.input):
        if info.name in initializers or info.name in feeds:
            continue
        fallback = base_shapes.get(info.name) or list(base_shapes.values())[min(k, len(base_shapes) - 1)]
        tensor_type = info.type.tensor_type
        if tensor_type.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") else (fallback[i] if i < len(fallback) else 2)
                     for i, d in enumerate(tensor_type.shape.dim)]
        else:
            shape = list(fallback)
        shapes[info.name] = tuple(shape)
        if any(d < 0 for d in shape) or np.prod(shape, dtype=np.float64) > MAX_FEED_ELEMENTS:
            buildable = False
            continue
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
        except Exception:
            dtype = np.dtype(np.float32)
        if dtype.kind == "f":
            feeds[info.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[info.name] = rng.integers(0, 3, size=shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[info.name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            feeds[info.name] = np.array([str(v) for v in rng.integers(0, 9, size=shape).reshape(-1)],
                                        dtype=object).reshape(shape)
    return (feeds if buildable else None), shapes


def make_case(index: int, seed: int = SEED) -> Case:
    """Case ``index`` of the corpus for ``seed``: the same bytes and inputs on every call."""
    names = list(BASE_MODELS)
    mutation = MUTATIONS[index % len(MUTATIONS)]
    base_name = names[(index % len(MUTATIONS) + index // len(MUTATIONS)) % len(names)]
    base = _base(base_name)
    mutated = onnx.ModelProto()
    mutated.CopyFrom(base)
    result, description = mutation(mutated, _case_rng(seed, index))
    model_bytes = result if isinstance(result, bytes) else result.SerializeToString()
    feeds, shapes = _feeds(model_bytes, base, seed, index)
    return Case(seed, index, base_name, f"{mutation.__name__}: {description}", model_bytes, feeds, shapes)


# -- running one case (used by the fuzz workers and the CLI) ----------------------------------------

def run_gpumnn(case: Case, backend: str) -> dict[str, np.ndarray]:
    """load -> session -> run on ``backend``; raises whatever gpumnn raises."""
    import gpumnn
    net = gpumnn.load(case.model)
    session = net.session(backend=backend, input_shapes=case.input_shapes or None, fallback=False, threads=1)
    try:
        if case.feeds is None:
            raise UnrunnableCase(f"session created for declared input shapes {case.input_shapes}, which cannot be fed")
        return {k: np.asarray(v) for k, v in session.run(case.feeds).items()}
    finally:
        session.close()


def run_onnxruntime(case: Case) -> dict[str, np.ndarray]:
    """The reference: ONNX Runtime's CPU provider on the same bytes and inputs."""
    import onnxruntime as ort
    if case.feeds is None:
        raise UnrunnableCase("declared input shapes cannot be fed")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 4
    session = ort.InferenceSession(case.model, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, case.feeds)))


class UnrunnableCase(Exception):
    """The model was accepted but its declared inputs (huge or negative dims) cannot be built."""


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rerun one case of the gpumnn fuzz corpus, in this process.")
    parser.add_argument("--case", type=int, required=True, help="case index")
    parser.add_argument("--backend", default="cpu", help="cpu, opencl, vulkan or gl")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--save", help="write the mutated model to this .onnx path")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import traceback

    import gpumnn
    case = make_case(args.case, args.seed)
    print(case.label)
    print("inputs:", {k: (v.shape, v.dtype.name) for k, v in case.feeds.items()} if case.feeds is not None
          else f"not buildable {case.input_shapes}")
    if args.save:
        Path(args.save).write_bytes(case.model)
    try:
        ref = run_onnxruntime(case)
        print("onnxruntime: runs;", {k: v.shape for k, v in ref.items()})
    except Exception as exc:
        ref = None
        print(f"onnxruntime: refuses: {type(exc).__name__}: {str(exc)[:300]}")
    try:
        got = run_gpumnn(case, args.backend)
    except gpumnn.InternalError:
        print(f"gpumnn[{args.backend}]: INTERNAL ERROR (a bug, not a refusal)")
        traceback.print_exc()
        return 1
    except gpumnn.GpumnnError as exc:
        print(f"gpumnn[{args.backend}]: {type(exc).__name__}: {exc}")
        return 0
    except Exception:
        print(f"gpumnn[{args.backend}]: RAW EXCEPTION")
        traceback.print_exc()
        return 1
    print(f"gpumnn[{args.backend}]: runs;", {k: v.shape for k, v in got.items()})
    if ref is not None:
        from fuzz_harness import compare
        verdict = compare(got, ref)
        print("compared with onnxruntime:", verdict or "correct")
        return 1 if verdict else 0
    return 0


if __name__ == "__main__":
    sys.exit(_main())
