"""ncnn as a peer benchmark: export gpumnn's models to ncnn's .param/.bin and time ncnn on them.

ncnn (PyPI package ``ncnn``) is an optional peer. Its model zoo and converters (onnx2ncnn, pnnx)
are not available offline, so this module writes ncnn's own formats directly from gpumnn's IR:

* ``.param``: text; magic ``7767517``, ``layer_count blob_count``, then one line per layer
  ``Type name n_in n_out in... out... k=v ...``. Every blob has exactly one producer and one
  consumer, so a blob read by several layers goes through an explicit ``Split`` layer.
* ``.bin``: the weights of each layer, in layer order. Convolution / ConvolutionDepthWise /
  InnerProduct load their weight with ``ModelBin::load(n, 0)``, i.e. a 4-byte storage flag
  (``0`` = raw float32) precedes the data; their bias is loaded with ``load(n, 1)`` (raw float32,
  no flag). Every buffer is a multiple of 4 bytes, so no padding is needed.

Supported: exactly what mobilenet_v1, squeezenet1_1, resnet18 (and mobilenet_v2, resnet50) need:
Conv (any group, depthwise included), BatchNormalization after Conv (folded), Relu / Clip /
LeakyRelu / Sigmoid (fused into the host or as layers), MaxPool / AveragePool (ceil_mode too),
GlobalAveragePool / GlobalMaxPool, Flatten, Gemm, Add, Concat, Identity / Dropout. Anything else
raises :class:`NcnnExportError` naming the op.

Run ``python bench/ncnn_peer.py [models...] [--threads N] [--runs N]`` for the table.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import struct
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import gpumnn  # noqa: E402
from gpumnn import zoo  # noqa: E402
from gpumnn.benchmark import time_runs  # noqa: E402
from gpumnn.ir import Graph  # noqa: E402

MAGIC = 7767517
SUPPORTED_OPS = frozenset({"Conv", "BatchNormalization", "Relu", "Clip", "LeakyRelu", "Sigmoid", "MaxPool",
                           "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Flatten", "Gemm", "Add",
                           "Concat", "Identity", "Dropout"})
FLT_MAX = 3.4028234663852886e38
INPUT_BLOB = "in0"
OUTPUT_BLOB = "out0"

# ncnn fused activation_type codes (src/layer/fused_activation.h)
_ACT_RELU, _ACT_LEAKY, _ACT_CLIP, _ACT_SIGMOID = 1, 2, 3, 4


class NcnnExportError(NotImplementedError):
    """The model uses an op (or an op variant) this exporter does not write."""

    def __init__(self, op_type: str, node_name: str, why: str = "not supported by the ncnn exporter"):
        super().__init__(f"ncnn export: {op_type} (node {node_name!r}): {why}")
        self.op_type = op_type
        self.node_name = node_name


@dataclass
class _Layer:
    type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    params: dict[int, Any] = field(default_factory=dict)
    weights: list[bytes] = field(default_factory=list)


def _fmt_value(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join([str(len(v))] + [_fmt_value(x) for x in v])
    if isinstance(v, (bool, np.bool_)):
        return str(int(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    f = float(v)
    f = max(-FLT_MAX, min(FLT_MAX, f))  # ncnn parses float32; +-inf becomes +-FLT_MAX
    return f"{f:e}"  # always has a '.' or 'e', which is how ncnn tells a float from an int


def _fmt_param(key: int, v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return f"{-23300 - key}={_fmt_value(v)}"
    return f"{key}={_fmt_value(v)}"


def _f32(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype="<f4").tobytes()


def _flagged(a: np.ndarray) -> bytes:
    """A weight buffer loaded with ModelBin::load(n, 0): uint32 flag 0 (= float32), then data."""
    return struct.pack("<I", 0) + _f32(a)


def _to_graph(model: Any) -> tuple[Graph, str]:
    """(IR graph, display name) for a zoo name, an ONNX path / ModelProto, a gpumnn Net or a Graph."""
    if isinstance(model, Graph):
        return model, model.name
    if hasattr(model, "graph") and isinstance(getattr(model, "graph"), Graph):
        return model.graph, getattr(model, "source", "net")
    if isinstance(model, str) and model in zoo.names():
        return gpumnn.load(zoo.build(model)).graph, model
    return gpumnn.load(model).graph, str(getattr(model, "name", "") or model)


def _clip_bounds(graph: Graph, node) -> tuple[float, float]:
    bounds = []
    for i, default, attr in ((1, -np.inf, "min"), (2, np.inf, "max")):
        if len(node.inputs) > i and node.inputs[i]:
            value = graph.initializers.get(node.inputs[i])
            if value is None:
                raise NcnnExportError(node.op_type, node.name, "bounds must be constants")
            bounds.append(float(np.asarray(value).reshape(-1)[0]))
        else:
            bounds.append(float(node.attrs.get(attr, default)))
    return bounds[0], bounds[1]


def _activation(node) -> tuple[str, tuple[float, ...]] | None:
    act = node.attrs.get("gpumnn_activation")
    if act is None:
        return None
    name, params = act[0], tuple(float(p) for p in act[1])
    if name not in ("relu", "clip", "leaky_relu", "sigmoid"):
        raise NcnnExportError(node.op_type, node.name, f"fused activation {name!r} is not supported")
    return name, params


def _fused_params(act: tuple[str, tuple[float, ...]] | None) -> dict[int, Any]:
    """activation_type (9) and activation_params (10) for Convolution / InnerProduct."""
    if act is None:
        return {}
    name, p = act
    if name == "relu":
        return {9: _ACT_RELU}
    if name == "leaky_relu":
        return {9: _ACT_LEAKY, 10: [float(p[0])]}
    if name == "clip":
        return {9: _ACT_CLIP, 10: [float(p[0]), float(p[1])]}
    return {9: _ACT_SIGMOID}


def _activation_layer(act: tuple[str, tuple[float, ...]], name: str, src: str, dst: str) -> _Layer:
    kind, p = act
    if kind == "relu":
        return _Layer("ReLU", name, [src], [dst])
    if kind == "leaky_relu":
        return _Layer("ReLU", name, [src], [dst], {0: float(p[0])})
    if kind == "clip":
        return _Layer("Clip", name, [src], [dst], {0: float(p[0]), 1: float(p[1])})
    return _Layer("Sigmoid", name, [src], [dst])


def _fold_batchnorm(graph: Graph) -> Graph:
    """Fold BatchNormalization nodes that follow a single-consumer Conv into its weight and bias
    (gpumnn's optimiser already does this; this covers graphs loaded with optimize=False)."""
    if not any(n.op_type == "BatchNormalization" for n in graph.nodes):
        return graph
    graph = graph.copy()
    producers = {o: n for n in graph.nodes for o in n.outputs}
    uses: dict[str, int] = {}
    for n in graph.nodes:
        for i in n.inputs:
            uses[i] = uses.get(i, 0) + 1
    for o in graph.output_names if hasattr(graph, "output_names") else [v.name for v in graph.outputs]:
        uses[o] = uses.get(o, 0) + 1
    for bn in list(graph.nodes):
        if bn.op_type != "BatchNormalization":
            continue
        conv = producers.get(bn.inputs[0])
        if conv is None or conv.op_type != "Conv" or uses.get(bn.inputs[0], 0) != 1 or "gpumnn_activation" in conv.attrs:
            raise NcnnExportError(bn.op_type, bn.name, "only BatchNormalization right after a Conv is supported")
        try:
            scale, beta, mean, var = (np.asarray(graph.initializers[n], np.float64) for n in bn.inputs[1:5])
        except KeyError:
            raise NcnnExportError(bn.op_type, bn.name, "parameters must be constants") from None
        eps = float(bn.attrs.get("epsilon", 1e-5))
        k = scale / np.sqrt(var + eps)
        w = np.asarray(graph.initializers[conv.inputs[1]], np.float64)
        b = (np.asarray(graph.initializers[conv.inputs[2]], np.float64)
             if len(conv.inputs) > 2 and conv.inputs[2] else np.zeros(w.shape[0]))
        wname, bname = conv.name + ".ncnn_folded_w", conv.name + ".ncnn_folded_b"
        graph.initializers[wname] = (w * k.reshape(-1, 1, 1, 1)).astype(np.float32)
        graph.initializers[bname] = ((b - mean) * k + beta).astype(np.float32)
        conv.inputs = [conv.inputs[0], wname, bname]
        conv.outputs = [bn.outputs[0]]
        graph.nodes.remove(bn)
        producers[bn.outputs[0]] = conv
    return graph


def _pool_params(node, graph: Graph, in_shape_hw: tuple[int, int] | None) -> dict[int, Any]:
    k = list(node.attrs.get("kernel_shape", []))
    if len(k) != 2:
        raise NcnnExportError(node.op_type, node.name, "only 2-D pooling is supported")
    if node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        raise NcnnExportError(node.op_type, node.name, "auto_pad is not supported")
    if any(d != 1 for d in node.attrs.get("dilations", [1, 1])):
        raise NcnnExportError(node.op_type, node.name, "dilated pooling is not supported")
    s = list(node.attrs.get("strides", [1, 1]))
    pt, pl, pb, pr = list(node.attrs.get("pads", [0, 0, 0, 0]))
    ceil = int(node.attrs.get("ceil_mode", 0))
    params: dict[int, Any] = {0: 0 if node.op_type == "MaxPool" else 1, 1: k[1], 11: k[0], 2: s[1], 12: s[0],
                              3: pl, 14: pr, 13: pt, 15: pb, 5: 0 if ceil else 1}
    if node.op_type == "AveragePool":
        params[6] = int(node.attrs.get("count_include_pad", 0))
    if ceil and in_shape_hw is not None:
        # ncnn's "full" padding is plain ceil; ONNX also drops a last window that would start in
        # the right/bottom padding. Refuse the (rare) shapes where the two disagree.
        for size, kk, ss, lo, hi in ((in_shape_hw[0], k[0], s[0], pt, pb), (in_shape_hw[1], k[1], s[1], pl, pr)):
            ncnn_out = -(-(size + lo + hi - kk) // ss) + 1
            onnx_out = ncnn_out - (1 if (ncnn_out - 1) * ss >= size + lo else 0)
            if ncnn_out != onnx_out:
                raise NcnnExportError(node.op_type, node.name, "ceil_mode window starting in the padding")
    return params


def _spatial_shapes(graph: Graph) -> dict[str, tuple[int, int]]:
    """H, W of every 4-D tensor (via gpumnn's shape inference), for the ceil_mode check."""
    try:
        from gpumnn.geometry import lower
        from gpumnn.session import resolve_input_shapes
        shapes = lower(graph, resolve_input_shapes(graph, None)).shapes
        return {k: (int(v[2]), int(v[3])) for k, v in shapes.items() if len(v) == 4}
    except Exception:  # noqa: BLE001 - best effort; without shapes the check is skipped
        return {}


def _convert(graph: Graph) -> list[_Layer]:
    for node in graph.nodes:  # name the first unsupported op before anything else
        if node.op_type not in SUPPORTED_OPS:
            raise NcnnExportError(node.op_type, node.name)
    graph = _fold_batchnorm(graph)
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        raise NcnnExportError("Graph", graph.name, "exactly one input and one output are supported")
    vin, vout = graph.inputs[0], graph.outputs[0]
    shape = vin.shape
    if shape is None or len(shape) != 4 or shape[0] not in (1, None, "", "N") or not all(
            isinstance(d, int) for d in shape[1:]):
        raise NcnnExportError("Input", vin.name, f"needs a static NCHW shape with batch 1, got {shape}")
    hw = _spatial_shapes(graph) if any(n.attrs.get("ceil_mode") for n in graph.nodes) else {}

    names: dict[str, str] = {vin.name: INPUT_BLOB}  # ONNX tensor name -> ncnn blob name
    counter = [0]

    def fresh() -> str:
        counter[0] += 1
        return f"b{counter[0]}"

    used_layer_names: set[str] = set()

    def lname(base: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_.\-]", "_", base)[:200] or "layer"
        name, i = base, 1
        while name in used_layer_names:
            i += 1
            name = f"{base}_{i}"
        used_layer_names.add(name)
        return name

    layers = [_Layer("Input", lname("input"), [], [INPUT_BLOB], {0: shape[3], 1: shape[2], 2: shape[1]})]
    init = graph.initializers

    def blob(tensor: str, node) -> str:
        if tensor not in names:
            why = "constant inputs are not supported" if tensor in init else f"unknown input {tensor!r}"
            raise NcnnExportError(node.op_type, node.name, why)
        return names[tensor]

    for node in graph.nodes:
        op = node.op_type
        if node.domain not in ("", "ai.onnx"):
            raise NcnnExportError(op, node.name, f"domain {node.domain!r} is not supported")
        act = _activation(node)
        out_tensor = node.outputs[0]

        if op in ("Identity", "Dropout"):
            names[out_tensor] = blob(node.inputs[0], node)
            continue

        if op == "Conv":
            w = init.get(node.inputs[1])
            if w is None or w.ndim != 4:
                raise NcnnExportError(op, node.name, "needs a constant 4-D (2-D convolution) weight")
            if node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
                raise NcnnExportError(op, node.name, "auto_pad is not supported")
            b = init.get(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
            if len(node.inputs) > 2 and node.inputs[2] and b is None:
                raise NcnnExportError(op, node.name, "bias must be a constant")
            cout, _, kh, kw = (int(d) for d in w.shape)
            group = int(node.attrs.get("group", 1))
            sh, sw = node.attrs.get("strides", [1, 1])
            dh, dw = node.attrs.get("dilations", [1, 1])
            pt, pl, pb, pr = node.attrs.get("pads", [0, 0, 0, 0])
            params = {0: cout, 1: kw, 11: kh, 2: dw, 12: dh, 3: sw, 13: sh,
                      4: pl, 15: pr, 14: pt, 16: pb, 5: int(b is not None), 6: int(w.size)}
            if group > 1:
                params[7] = group
            params.update(_fused_params(act))
            weights = [_flagged(w)] + ([_f32(b)] if b is not None else [])
            out = fresh()
            layers.append(_Layer("ConvolutionDepthWise" if group > 1 else "Convolution", lname(node.name),
                                 [blob(node.inputs[0], node)], [out], params, weights))
            names[out_tensor] = out
            continue

        if op == "Gemm":
            if int(node.attrs.get("transA", 0)):
                raise NcnnExportError(op, node.name, "transA=1 is not supported")
            w = init.get(node.inputs[1])
            if w is None or w.ndim != 2:
                raise NcnnExportError(op, node.name, "needs a constant 2-D B")
            w = np.asarray(w, np.float32)
            if not int(node.attrs.get("transB", 0)):
                w = w.T  # InnerProduct wants [num_output, num_input] row-major
            w = w * np.float32(node.attrs.get("alpha", 1.0))
            c = init.get(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
            if len(node.inputs) > 2 and node.inputs[2] and c is None:
                raise NcnnExportError(op, node.name, "C must be a constant")
            if c is not None:
                c = np.broadcast_to(np.asarray(c, np.float32).reshape(-1), (w.shape[0],))
                c = c * np.float32(node.attrs.get("beta", 1.0))
            params = {0: int(w.shape[0]), 1: int(c is not None), 2: int(w.size)}
            params.update(_fused_params(act))
            out = fresh()
            layers.append(_Layer("InnerProduct", lname(node.name), [blob(node.inputs[0], node)], [out], params,
                                 [_flagged(w)] + ([_f32(c)] if c is not None else [])))
            names[out_tensor] = out
            continue

        # Ops without a fused activation slot in ncnn: the layer, then (if any) an activation layer.
        if op in ("MaxPool", "AveragePool"):
            layer = _Layer("Pooling", lname(node.name), [blob(node.inputs[0], node)], [fresh()],
                           _pool_params(node, graph, hw.get(node.inputs[0])))
        elif op in ("GlobalAveragePool", "GlobalMaxPool"):
            # ncnn's global pooling yields a 1-D blob (C); only Flatten / Gemm may read it next.
            consumers = [n for n in graph.nodes if out_tensor in n.inputs]
            if any(n.op_type not in ("Flatten", "Gemm", "Identity", "Dropout") for n in consumers):
                raise NcnnExportError(op, node.name, "global pooling is only supported before Flatten / Gemm")
            layer = _Layer("Pooling", lname(node.name), [blob(node.inputs[0], node)], [fresh()],
                           {0: 1 if op == "GlobalAveragePool" else 0, 4: 1})
        elif op == "Flatten":
            if int(node.attrs.get("axis", 1)) != 1:
                raise NcnnExportError(op, node.name, "only axis=1 is supported")
            layer = _Layer("Flatten", lname(node.name), [blob(node.inputs[0], node)], [fresh()])
        elif op == "Add":
            if len(node.inputs) != 2:
                raise NcnnExportError(op, node.name, "needs two inputs")
            layer = _Layer("BinaryOp", lname(node.name), [blob(t, node) for t in node.inputs], [fresh()], {0: 0})
        elif op == "Concat":
            axis = int(node.attrs.get("axis", 1))
            axis = axis + 4 if axis < 0 else axis
            if axis == 0:
                raise NcnnExportError(op, node.name, "concatenation along the batch axis is not supported")
            layer = _Layer("Concat", lname(node.name), [blob(t, node) for t in node.inputs], [fresh()],
                           {0: axis - 1})  # ncnn blobs are CHW: drop the batch axis
        elif op in ("Relu", "Clip", "LeakyRelu", "Sigmoid"):
            spec = {"Relu": ("relu", ()), "Sigmoid": ("sigmoid", ()),
                    "LeakyRelu": ("leaky_relu", (float(node.attrs.get("alpha", 0.01)),))}.get(op)
            if op == "Clip":
                spec = ("clip", _clip_bounds(graph, node))
            layer = _activation_layer(spec, lname(node.name), blob(node.inputs[0], node), fresh())
        else:
            raise NcnnExportError(op, node.name)
        if len(node.outputs) != 1:
            raise NcnnExportError(op, node.name, "only single-output nodes are supported")
        layers.append(layer)
        if act is not None:
            out = fresh()
            layers.append(_activation_layer(act, lname(node.name + "_act"), layer.outputs[0], out))
            layer = layers[-1]
        names[out_tensor] = layer.outputs[0]

    if vout.name not in names:
        raise NcnnExportError("Graph", graph.name, f"output {vout.name!r} is not produced by the exported layers")
    final = names[vout.name]
    if final == INPUT_BLOB:
        raise NcnnExportError("Graph", graph.name, "the output is the input")
    for layer in layers:  # rename the output blob to a fixed name
        layer.inputs = [OUTPUT_BLOB if b == final else b for b in layer.inputs]
        layer.outputs = [OUTPUT_BLOB if b == final else b for b in layer.outputs]
    return _insert_splits(layers, OUTPUT_BLOB, lname)


def _insert_splits(layers: list[_Layer], output_blob: str, lname) -> list[_Layer]:
    """ncnn blobs have one consumer each: route a blob read n > 1 times through Split (n outputs)."""
    readers: dict[str, int] = {}
    for layer in layers:
        for b in layer.inputs:
            readers[b] = readers.get(b, 0) + 1
    readers[output_blob] = readers.get(output_blob, 0) + 1  # the extractor reads it too
    pending: dict[str, list[str]] = {}  # blob -> split outputs not yet handed to a reader
    result: list[_Layer] = []
    for layer in layers:
        layer.inputs = [pending[b].pop(0) if b in pending else b for b in layer.inputs]
        result.append(layer)
        for b in layer.outputs:
            n = readers.get(b, 0)
            if n > 1:
                if b == output_blob:
                    raise NcnnExportError(layer.type, layer.name, "the graph output is also read by other layers")
                outs = [f"{b}_split{i}" for i in range(n)]
                result.append(_Layer("Split", lname(f"split_{b}"), [b], outs))
                pending[b] = list(outs)
    return result


def export_ncnn(model_name_or_net: Any, directory: str | os.PathLike) -> tuple[str, str, str, str]:
    """Write ``<name>.param`` and ``<name>.bin`` under ``directory``.

    ``model_name_or_net``: a zoo model name (exported from gpumnn's optimised graph: BN folded,
    activations fused into Conv / Gemm), an ONNX path or ModelProto, a :class:`gpumnn.Net` or a
    gpumnn IR Graph. Returns ``(param_path, bin_path, input_blob, output_blob)``.
    Raises :class:`NcnnExportError` naming the first op it cannot write.
    """
    graph, display = _to_graph(model_name_or_net)
    layers = _convert(graph)
    blobs = {b for layer in layers for b in layer.inputs + layer.outputs}
    stem = re.sub(r"[^A-Za-z0-9_.\-]", "_", Path(str(display)).stem or "model") or "model"
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    param_path, bin_path = directory / f"{stem}.param", directory / f"{stem}.bin"
    lines = [str(MAGIC), f"{len(layers)} {len(blobs)}"]
    for layer in layers:
        parts = [f"{layer.type:<20}", f"{layer.name:<24}", str(len(layer.inputs)), str(len(layer.outputs)),
                 *layer.inputs, *layer.outputs, *(_fmt_param(k, v) for k, v in layer.params.items())]
        lines.append(" ".join(parts))
    param_path.write_text("\n".join(lines) + "\n")
    with open(bin_path, "wb") as f:
        for layer in layers:
            for buf in layer.weights:
                assert len(buf) % 4 == 0
                f.write(buf)
    return str(param_path), str(bin_path), INPUT_BLOB, OUTPUT_BLOB


# -- running and timing --------------------------------------------------------------------------

def ncnn_available() -> str | None:
    """None if ``import ncnn`` works, else the reason it does not."""
    try:
        import ncnn  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken native library
        return f"{type(exc).__name__}: {exc}"
    return None


def _ncnn_net(param: str, bin_: str, vulkan: bool, threads: int, fp16: bool = False):
    import ncnn
    net = ncnn.Net()
    opt = net.opt
    opt.num_threads = int(threads)
    opt.use_vulkan_compute = bool(vulkan)
    # fp32 throughout unless asked otherwise: ncnn defaults to fp16 storage/arithmetic where the
    # device supports it (lavapipe does), which alone costs ~1e-3 relative error.
    for flag in ("use_fp16_packed", "use_fp16_storage", "use_fp16_arithmetic"):
        setattr(opt, flag, bool(fp16))
    opt.use_bf16_storage = False
    opt.use_int8_inference = False
    if net.load_param(param) != 0:
        raise RuntimeError(f"ncnn could not load {param}")
    if net.load_model(bin_) != 0:
        raise RuntimeError(f"ncnn could not load {bin_}")
    return net


def _device(net, vulkan: bool, threads: int) -> str:
    import ncnn
    if not vulkan:
        return f"cpu, {threads} threads"
    dev = net.vulkan_device()
    if dev is None:
        return "cpu (vulkan requested but no Vulkan device)"
    name = ncnn.get_gpu_info(ncnn.get_default_gpu_index()).device_name()
    layers = [layer for layer in net.layers() if layer.type not in ("Input",)]
    on_gpu = sum(1 for layer in layers if layer.support_vulkan)
    return f"vulkan: {name} ({on_gpu}/{len(layers)} layers on Vulkan)"


def run_ncnn(net, x: np.ndarray, input_blob: str = INPUT_BLOB, output_blob: str = OUTPUT_BLOB) -> np.ndarray:
    """One inference on a fresh extractor; ``x`` is NCHW with batch 1; returns a batch-1 array."""
    import ncnn
    ex = net.create_extractor()
    ex.input(input_blob, ncnn.Mat(np.ascontiguousarray(x[0], dtype=np.float32)))
    ret, out = ex.extract(output_blob)
    if ret != 0:
        raise RuntimeError(f"ncnn extract({output_blob!r}) failed with {ret}")
    return np.array(out, dtype=np.float32)[None]


def onnxruntime_reference(model_name: str, x: np.ndarray, threads: int = 1, runs: int = 0, warmup: int = 0):
    """(output, mean ms or None) of ONNX Runtime on the zoo model's raw ONNX (CPU provider)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    sess = ort.InferenceSession(zoo.build(model_name).SerializeToString(), options,
                                providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}
    out = sess.run(None, feed)[0]
    ms = statistics.fmean(time_runs(lambda: sess.run(None, feed), runs, warmup)) if runs else None
    return out, ms


def rel_l2(y: np.ndarray, ref: np.ndarray) -> float:
    y, ref = np.asarray(y, np.float64).reshape(-1), np.asarray(ref, np.float64).reshape(-1)
    if y.shape != ref.shape:
        return float("inf")
    return float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-30))


def random_input(model_name: str, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(zoo.input_shape(model_name)).astype(np.float32)


def time_ncnn(model_name: str, vulkan: bool, threads: int, runs: int = 10, warmup: int = 1,
              fp16: bool = False, reference: np.ndarray | None = None, workdir: str | None = None) -> dict:
    """Time ncnn (Vulkan or CPU) on a zoo model with the paper's protocol: batch 1, ``warmup``
    untimed runs, then the mean of ``runs`` timed runs.

    Each run creates a fresh extractor (as ncnn applications do: an extractor caches its blobs),
    feeds a ``ncnn.Mat`` made from the NumPy input and extracts the output into NumPy, so a
    Vulkan run includes the upload and download. Net loading and pipeline creation are not timed.
    ``rel_error`` is the relative L2 error against ONNX Runtime on the same N(0, 1) input
    (seed 0); pass ``reference`` to reuse an ONNX Runtime output. ``fp16=False`` (default) turns
    off ncnn's fp16 storage/arithmetic so both paths compute in fp32.

    Returns ``dict(mean_ms, samples, rel_error, device)``.
    """
    x = random_input(model_name)
    if reference is None:
        reference, _ = onnxruntime_reference(model_name, x, threads)
    with tempfile.TemporaryDirectory(prefix="ncnn_peer_") as tmp:
        param, bin_, in_blob, out_blob = export_ncnn(model_name, workdir or tmp)
        net = _ncnn_net(param, bin_, vulkan, threads, fp16)
        try:
            device = _device(net, vulkan, threads)
            y = run_ncnn(net, x, in_blob, out_blob)
            err = rel_l2(y, reference)
            samples = time_runs(lambda: run_ncnn(net, x, in_blob, out_blob), runs, max(0, warmup - 1))
        finally:
            net.clear()
            del net
    # the correctness run above doubles as the first warm-up run
    return {"mean_ms": statistics.fmean(samples) if samples else float("nan"), "samples": samples,
            "rel_error": err, "device": device}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time ncnn (Vulkan and CPU) on gpumnn's zoo models, "
                                                 "checked against ONNX Runtime.")
    parser.add_argument("models", nargs="*", default=list(zoo.PAPER_MODELS),
                        help=f"zoo model names (default: {' '.join(zoo.PAPER_MODELS)})")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--fp16", action="store_true", help="keep ncnn's default fp16 storage/arithmetic")
    parser.add_argument("--no-vulkan", action="store_true", help="time ncnn's CPU path only")
    args = parser.parse_args(argv)

    reason = ncnn_available()
    if reason is not None:
        print(f"ncnn peer skipped: the optional `ncnn` package is not importable ({reason}); pip install ncnn")
        return 0
    import ncnn
    gpus = ncnn.get_gpu_count()
    vulkan = gpus > 0 and not args.no_vulkan
    if gpus == 0 and not args.no_vulkan:
        print("ncnn: get_gpu_count() == 0, no Vulkan device; timing the CPU path only")

    header = (f"{'model':<16}{'ncnn-vulkan ms':>16}{'rel err':>10}{'ncnn-cpu ms':>14}{'rel err':>10}"
              f"{'onnxruntime ms':>16}")
    rows, devices = [header, "-" * len(header)], []
    for name in args.models:
        x = random_input(name)
        reference, ort_ms = onnxruntime_reference(name, x, args.threads, args.runs, args.warmup)
        cells = []
        for use_vulkan in (True, False):
            if use_vulkan and not vulkan:
                cells.append((None, None))
                continue
            try:
                r = time_ncnn(name, use_vulkan, args.threads, args.runs, args.warmup, args.fp16, reference)
            except NcnnExportError as exc:
                print(f"{name}: {exc}")
                cells.append((None, None))
                continue
            devices.append(f"{name}: {r['device']}")
            cells.append((r["mean_ms"], r["rel_error"]))
        fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
        rows.append(f"{name:<16}{fmt(cells[0][0], '.1f'):>16}{fmt(cells[0][1], '.1e'):>10}"
                    f"{fmt(cells[1][0], '.1f'):>14}{fmt(cells[1][1], '.1e'):>10}{fmt(ort_ms, '.1f'):>16}")
    print(f"ncnn {getattr(ncnn, '__version__', '?')}, threads={args.threads}, batch 1, "
          f"{args.warmup} warm-up + mean of {args.runs} runs, {'fp16' if args.fp16 else 'fp32'}; "
          f"rel err = relative L2 vs ONNX Runtime")
    for d in devices:
        print(f"  {d}")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
