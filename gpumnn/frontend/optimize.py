"""Converter-style graph optimisations, run once at load time.

What MNN's converter does before a model ever reaches a device: fold constant subgraphs,
fold BatchNormalization into the preceding convolution, fuse a bias Add into MatMul, fuse the
five-node exact GELU that exporters emit into one Gelu, fuse activations into the op that
produces their input, move a same-size average pool after the 1x1 convolution that narrows its
output (so it pools fewer channels), and drop Identity/Dropout. Each pass keeps
graph outputs' names, so users see the same outputs as in ONNX Runtime.
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np

from ..errors import GpumnnError, InternalError
from ..geometry import LoweringContext, lower_into
from ..geometry.emit import QUICK_GELU, unary_spec
from ..ir import Graph, Node, node_reads, subgraphs

ACTIVATION_HOSTS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Sub", "Mul", "BatchNormalization")
#: the ops whose constant weights (and bias) a DequantizeLinear left unfolded at load, so that the lowering
#: of a QDQ model can run them on the int8 weights themselves (``geometry.lowerings.quantize``)
INT8_PRODUCTS = ("Conv", "Gemm", "MatMul")


def optimize(graph: Graph) -> dict[str, int]:
    """Apply every pass in place; returns how many rewrites each pass made.

    The passes skip what they cannot rewrite (the lowering reports a malformed node with its
    name and shapes); should one still fail, that is gpumnn's bug: the InternalError names the
    pass and keeps the cause.
    """
    passes = (("identity_removed", remove_identities), ("constants_folded", fold_constants),
              ("batchnorm_folded", fold_batchnorm), ("bias_fused", fuse_matmul_bias),
              ("gelu_fused", fuse_gelu), ("silu_fused", fuse_silu), ("activations_fused", fuse_activations),
              ("pools_after_pointwise", pointwise_before_average_pool), ("constants_folded", fold_constants),
              ("dead_nodes_removed", remove_dead_nodes))
    stats: dict[str, int] = {}
    for key, rewrite in passes:
        try:
            count = rewrite(graph)
        except GpumnnError:
            raise
        except Exception as exc:
            raise InternalError(f"optimising the model (pass {rewrite.__name__})", exc) from exc
        if count is not None:
            stats[key] = stats.get(key, 0) + count
    return stats


def _rename_input(graph: Graph, old: str, new: str) -> None:
    for node in graph.nodes:
        node.inputs = [new if n == old else n for n in node.inputs]


def _uses(graph: Graph) -> Counter:
    """How many times each tensor is read, counting reads by subgraphs (If, Loop, Scan bodies)."""
    return Counter(n for node in graph.nodes for n in node_reads(node))


def remove_identities(graph: Graph) -> int:
    """Drop Identity and inference-mode Dropout, rewiring their readers to the source (not where
    a subgraph reads the output by name: the rewiring renames the top graph's inputs only)."""
    outputs = set(graph.output_names)
    outputs.update(*(sub.outer_reads() for node in graph.nodes for sub in subgraphs(node)))
    removed = 0
    for node in list(graph.nodes):
        if node.op_type not in ("Identity", "Dropout") or not node.inputs or not node.inputs[0] or not node.outputs:
            continue
        if node.outputs[0] in outputs or any(node.outputs[1:]):
            continue
        _rename_input(graph, node.outputs[0], node.inputs[0])
        graph.nodes.remove(node)
        removed += 1
    return removed


def fold_constants(graph: Graph) -> int:
    """Evaluate every node whose inputs (and the outer tensors its subgraphs read) are all
    constants, turning its outputs into initializers."""
    folded = 0
    kept: list[Node] = []
    products = {name for node in graph.nodes if node.op_type in INT8_PRODUCTS for name in node.inputs[1:]}
    for node in graph.nodes:
        reads = node_reads(node)
        if node.op_type == "DequantizeLinear" and node.outputs[0] in products:
            kept.append(node)  # an int8 product's weight or bias: folded by each lowering, which may read its integers
            continue
        if reads and all(n in graph.initializers for n in reads):
            ctx = LoweringContext()
            for name in reads:
                ctx.set_const(name, graph.initializers[name])
            try:
                lower_into(ctx, graph, [node])
            except InternalError:
                raise  # a bug, not a node that cannot fold
            except Exception:
                kept.append(node)  # unsupported ops are reported later, with the full context
                continue
            if all(o in ctx.values and ctx.values[o].is_const for o in node.outputs if o):
                for name in node.outputs:
                    if name:
                        graph.initializers[name] = ctx.values[name].const
                folded += 1
                continue
        kept.append(node)
    graph.nodes = kept
    return folded


def _is_channel_vector(array: np.ndarray | None, channels: int) -> bool:
    return array is not None and array.shape == (channels,) and array.dtype.kind == "f"


def _single_consumer(graph: Graph, uses: Counter, name: str) -> bool:
    return uses[name] == 1 and name not in graph.output_names


def fold_batchnorm(graph: Graph) -> int:
    """Conv followed by BatchNormalization becomes one Conv with rescaled weights and bias."""
    producers = graph.producers()
    uses = _uses(graph)
    folded = 0
    for bn in list(graph.nodes):
        if (bn.op_type != "BatchNormalization" or len(bn.inputs) != 5 or any(bn.outputs[1:])
                or bn.attr("training_mode", 0)):  # training mode normalises by the batch statistics
            continue
        conv = producers.get(bn.inputs[0])
        if (conv is None or conv.op_type != "Conv" or len(conv.inputs) < 2
                or not _single_consumer(graph, uses, bn.inputs[0])):
            continue
        params = [graph.initializers.get(n) for n in bn.inputs[1:5]]
        weight = graph.initializers.get(conv.inputs[1])
        if weight is None or weight.ndim < 3 or weight.dtype.kind != "f" or not all(_is_channel_vector(p, weight.shape[0]) for p in params):
            continue  # not a foldable pair: lowering the two nodes reports what is wrong, if anything
        gamma, beta, mean, var = (p.astype(np.float64) for p in params)
        scale = gamma / np.sqrt(var + float(bn.attr("epsilon", 1e-5)))
        bias = graph.initializers.get(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else np.zeros_like(mean)
        if not _is_channel_vector(bias, weight.shape[0]):
            continue
        w_name, b_name = f"{conv.name}/weight_bn", f"{conv.name}/bias_bn"
        graph.initializers[w_name] = (weight * scale.reshape(-1, *[1] * (weight.ndim - 1))).astype(np.float32)
        graph.initializers[b_name] = ((bias - mean) * scale + beta).astype(np.float32)
        conv.inputs = [conv.inputs[0], w_name, b_name]
        conv.outputs = [bn.outputs[0]]
        graph.nodes.remove(bn)
        folded += 1
    return folded


def fuse_matmul_bias(graph: Graph) -> int:
    """MatMul followed by Add of a constant row vector becomes MatMul with a bias epilogue."""
    producers = graph.producers()
    uses = _uses(graph)
    fused = 0
    for add in list(graph.nodes):
        if add.op_type != "Add" or len(add.inputs) != 2:
            continue
        for mm_out, bias in (add.inputs, add.inputs[::-1]):
            mm = producers.get(mm_out)
            const = graph.initializers.get(bias)
            if (mm is None or mm.op_type != "MatMul" or len(mm.inputs) != 2 or const is None
                    or "gpumnn_bias" in mm.attrs or not _single_consumer(graph, uses, mm_out)):
                continue
            weight = graph.initializers.get(mm.inputs[1])
            n = weight.shape[-1] if weight is not None and weight.ndim >= 2 else None
            if n is None or const.size != n or const.shape[-1:] != (n,) or const.ndim > 1:
                continue
            mm.attrs["gpumnn_bias"] = True  # a third input: MatMul's bias epilogue
            mm.inputs = mm.inputs[:2] + [bias]
            mm.outputs = [add.outputs[0]]
            graph.nodes.remove(add)
            fused += 1
            break
    return fused


def _scalar(graph: Graph, name: str) -> float | None:
    """The value of a one-element float constant, else None."""
    value = graph.initializers.get(name)
    if value is None or value.size != 1 or value.dtype.kind != "f":
        return None
    return float(value.reshape(()))


def _operand(graph: Graph, node: Node, value: float, tolerance: float = 1e-6) -> str | None:
    """For a two-input node with a constant ``value`` on one side, the other input."""
    if len(node.inputs) != 2:
        return None
    for other, const in (node.inputs, node.inputs[::-1]):
        found = _scalar(graph, const)
        if found is not None and abs(found - value) <= tolerance * abs(value):
            return other
    return None


def fuse_gelu(graph: Graph) -> int:
    """``x * (1 + Erf(x / sqrt 2)) * 0.5`` (PyTorch's and TensorFlow's exported exact GELU: Div
    or Mul by 1/sqrt 2, Erf, Add 1, Mul by x, Mul by 0.5 -- the halving before or after the
    product) becomes one Gelu, which then fuses into the MatMul before it like any activation:
    four ops and their passes over memory fewer per GELU on every backend."""
    producers, consumers = graph.producers(), graph.consumers()
    uses = _uses(graph)
    fused = 0
    for erf in list(graph.nodes):
        if erf.op_type != "Erf" or not _single_consumer(graph, uses, erf.outputs[0]):
            continue
        scale = producers.get(erf.inputs[0])
        if scale is None or not _single_consumer(graph, uses, scale.outputs[0]):
            continue
        x = (_operand(graph, scale, math.sqrt(2.0)) if scale.op_type == "Div" and _scalar(graph, scale.inputs[1]) is not None
             else _operand(graph, scale, 1 / math.sqrt(2.0)) if scale.op_type == "Mul" else None)
        add = next(iter(consumers.get(erf.outputs[0], [])), None)
        if x is None or add is None or add.op_type != "Add" or _operand(graph, add, 1.0) != erf.outputs[0]:
            continue
        if not _single_consumer(graph, uses, add.outputs[0]):
            continue
        product = next(iter(consumers.get(add.outputs[0], [])), None)
        if product is None or product.op_type != "Mul" or len(product.inputs) != 2:
            continue
        other = product.inputs[1] if product.inputs[0] == add.outputs[0] else product.inputs[0]
        if other == x:  # (x * (1 + erf)) * 0.5: the halving is the last node
            if not _single_consumer(graph, uses, product.outputs[0]):
                continue
            half = next(iter(consumers.get(product.outputs[0], [])), None)
            if half is None or half.op_type != "Mul" or _operand(graph, half, 0.5) != product.outputs[0]:
                continue
            last = half
        else:  # (x * 0.5) * (1 + erf): the product is
            half = producers.get(other)
            if half is None or half.op_type != "Mul" or _operand(graph, half, 0.5) != x or uses[other] != 1:
                continue
            last = product
        graph.nodes[graph.nodes.index(last)] = Node("Gelu", f"{erf.name}/gelu", [x], [last.outputs[0]])
        for node in (scale, erf, add, product, half):
            if node is not last:
                graph.nodes.remove(node)
        producers, consumers = graph.producers(), graph.consumers()
        uses = _uses(graph)
        fused += 1
    return fused


def fuse_silu(graph: Graph) -> int:
    """``x * Sigmoid(x)`` (YOLO's and EfficientNet's SiLU, exported as Sigmoid and Mul) becomes one
    node, ONNX Runtime's QuickGelu at alpha 1 (the atomic ``silu``), which then fuses into the op
    before it like any activation: the product's op and pass over memory fewer, and x read by one
    node where it was read by two."""
    producers, consumers = graph.producers(), graph.consumers()
    uses = _uses(graph)
    fused = 0
    for sigmoid in list(graph.nodes):
        if sigmoid.op_type != "Sigmoid" or len(sigmoid.inputs) != 1 or not _single_consumer(graph, uses, sigmoid.outputs[0]):
            continue
        x = sigmoid.inputs[0]
        product = next(iter(consumers.get(sigmoid.outputs[0], [])), None)
        if (product is None or product.op_type != "Mul" or sorted(product.inputs) != sorted([x, sigmoid.outputs[0]])
                or "gpumnn_activation" in product.attrs):
            continue
        domain, op_type = QUICK_GELU
        graph.nodes[graph.nodes.index(product)] = Node(op_type, f"{sigmoid.name}/silu", [x], [product.outputs[0]],
                                                       {"alpha": 1.0}, domain)
        graph.nodes.remove(sigmoid)
        producers, consumers = graph.producers(), graph.consumers()
        uses = _uses(graph)
        fused += 1
    return fused


def fuse_activations(graph: Graph) -> int:
    """Relu, Clip, Sigmoid, HardSwish, ... fold into the epilogue of the op that feeds them."""
    producers = graph.producers()
    uses = _uses(graph)
    fused = 0
    for act in list(graph.nodes):
        if not act.inputs or not act.outputs:
            continue
        spec = unary_spec(act, graph.initializers.get)
        if spec is None:
            continue
        host = producers.get(act.inputs[0])
        if (host is None or host.op_type not in ACTIVATION_HOSTS or "gpumnn_activation" in host.attrs
                or not _single_consumer(graph, uses, act.inputs[0])):
            continue
        if host.op_type in ("Add", "Sub", "Mul") and len(host.inputs) != 2:
            continue
        host.attrs["gpumnn_activation"] = (spec[0], tuple(spec[1]))
        host.outputs = [act.outputs[0]] + host.outputs[1:]
        graph.nodes.remove(act)
        producers = graph.producers()
        fused += 1
    return fused


def _pointwise_conv(graph: Graph, node: Node) -> tuple[np.ndarray, np.ndarray | None] | None:
    """(weight [OC, C, 1, 1], bias [OC] or None) of a 1x1, stride-1, unpadded, ungrouped Conv with
    constant float32 weights and bias, else None."""
    if node.op_type != "Conv" or len(node.inputs) < 2 or any(node.outputs[1:]):
        return None
    weight = graph.initializers.get(node.inputs[1])
    has_bias = len(node.inputs) > 2 and bool(node.inputs[2])
    bias = graph.initializers.get(node.inputs[2]) if has_bias else None
    if weight is None or weight.ndim != 4 or weight.shape[2:] != (1, 1) or weight.dtype != np.float32:
        return None
    if has_bias and (bias is None or bias.shape != weight.shape[:1] or bias.dtype != np.float32):
        return None
    if (node.attr("group", 1) != 1 or any(v != 1 for v in node.attr("strides", [1, 1]))
            or any(v != 0 for v in node.attr("pads", [0, 0, 0, 0])) or any(v != 1 for v in node.attr("dilations", [1, 1]))
            or node.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID")):
        return None
    return weight, bias


def _same_size_average_pool(node: Node) -> bool:
    """An AveragePool over NCHW at stride 1 whose output keeps its input's height and width."""
    kernel = node.attr("kernel_shape")
    if node.op_type != "AveragePool" or not kernel or len(kernel) != 2 or any(node.outputs[1:]):
        return False
    if any(v != 1 for v in node.attr("strides", [1, 1])) or any(v != 1 for v in node.attr("dilations", [1, 1])):
        return False
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return True
    pads = node.attr("pads", [0, 0, 0, 0])
    return auto_pad == "NOTSET" and len(pads) == 4 and all(pads[i] + pads[i + 2] == kernel[i] - 1 for i in (0, 1))


def pointwise_before_average_pool(graph: Graph) -> int:
    """An average pool that keeps the size, read only by a 1x1 convolution to fewer channels,
    runs after the convolution instead: both are linear, the pool mixing pixels with weights the
    same for every channel and the convolution mixing channels pixel by pixel, so conv(pool(x)) =
    pool(conv(x)) exactly (with or without the padding counted); the bias and activation follow
    as an Add. Inception's pool branches pool 192-2048 channels before a convolution to 32-192."""
    producers = graph.producers()
    uses = _uses(graph)
    swapped = 0
    for conv in list(graph.nodes):
        found = _pointwise_conv(graph, conv)
        pool = producers.get(conv.inputs[0]) if found is not None else None
        if pool is None or not _same_size_average_pool(pool) or not _single_consumer(graph, uses, pool.outputs[0]):
            continue
        weight, bias = found
        if weight.shape[0] >= weight.shape[1]:
            continue  # pooling the convolution's output would not pool fewer channels
        activation = conv.attrs.pop("gpumnn_activation", None)
        mixed, pooled, out = f"{conv.name}/before_pool", f"{pool.name}/after_conv", conv.outputs[0]
        epilogue = bias is not None or activation is not None
        conv.inputs, conv.outputs = [pool.inputs[0], conv.inputs[1]], [mixed]
        pool.inputs, pool.outputs = [mixed], [pooled if epilogue else out]
        at = graph.nodes.index(conv)
        graph.nodes.remove(pool)
        graph.nodes.insert(at, pool)  # the pool now reads the convolution: after it
        if epilogue:
            name = f"{conv.name}/bias"
            graph.initializers[name] = (bias if bias is not None else np.zeros(weight.shape[0], np.float32)).reshape(1, -1, 1, 1)
            add = Node("Add", f"{conv.name}/bias_after_pool", [pooled, name], [out])
            if activation is not None:
                add.attrs["gpumnn_activation"] = activation
            graph.nodes.insert(at + 1, add)
        producers = graph.producers()
        uses = _uses(graph)
        swapped += 1
    return swapped


def remove_dead_nodes(graph: Graph) -> None:
    """Drop nodes whose outputs nobody reads, and initializers nobody uses (a subgraph's reads
    of outer tensors count as uses)."""
    needed = set(graph.output_names)
    kept = []
    for node in reversed(graph.nodes):
        if any(o in needed for o in node.outputs):
            kept.append(node)
            needed.update(node_reads(node))
    graph.nodes = list(reversed(kept))
    graph.initializers = {k: v for k, v in graph.initializers.items() if k in needed}
