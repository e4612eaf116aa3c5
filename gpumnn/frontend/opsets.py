"""Which ONNX opsets gpumnn loads, and how a model outside the implemented ones is brought in.

gpumnn's lowerings implement the default-domain ops as defined in opsets ``MIN_IMPLEMENTED`` to
``MAX_IMPLEMENTED`` (11 to 21). A model is accepted from opset ``MIN_OPSET`` (7) up to the newest
opset the installed ``onnx`` package defines (``MAX_OPSET``, 28 with onnx 1.23):

* **Older models (7..10)** are brought up to ``MIN_IMPLEMENTED`` by ``onnx.version_converter``
  (the ONNX project's own op adapters; gpumnn writes no op upgrades of its own). The converter
  works on a whole serialised model, so it is given a *weightless view*
  (:func:`.onnx_check.split_weights`, the same one the checker is given, here with every large
  initializer moved out) and the weights are put back into its result: converting a 100 MB
  model costs about what converting its graph does.
* **Newer models (22..MAX_OPSET)** run unconverted wherever each op's definition at the model's
  opset means what it meant at ``MAX_IMPLEMENTED``. For every node, the op's versions between the
  two (``onnx.defs.get_schema(op, opset).since_version``) are compared: a version that only
  extends type lists (bfloat16, float8, int4, ...) with the same attributes, inputs, outputs and
  text is accepted by that rule; a version whose text or attributes changed is accepted only
  where :data:`REVIEWED` says why it does not change what gpumnn runs (with the attribute values
  it allows). Anything else raises :class:`UnsupportedOpError` naming op, node, opset and what
  changed, so a future ``onnx`` with a new op version is refused until someone reviews it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import onnx
from onnx import defs, version_converter

from ..errors import ModelError, UnsupportedOpError
from ..geometry.registry import supported_ops
from .checker import restore_weights, split_weights

#: the default-domain opsets gpumnn's lowerings implement
MIN_IMPLEMENTED, MAX_IMPLEMENTED = 11, 21
#: the opsets gpumnn loads: older ones are converted up, newer ones checked op by op
MIN_OPSET, MAX_OPSET = 7, defs.onnx_opset_version()

DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class Reviewed:
    """A newer op version whose changes were read and found not to change what gpumnn runs."""

    why: str
    #: attribute -> the values gpumnn runs (the new attribute's default); other values are refused
    allowed: dict[str, tuple] = field(default_factory=dict)


#: (op type, since_version) -> why that version is safe to run with gpumnn's opset-21 lowering
REVIEWED: dict[tuple[str, int], Reviewed] = {
    ("AveragePool", 22): Reviewed("bfloat16 added; the text now says that with ceil_mode a window starting in the "
                                  "right padding is dropped, which gpumnn's output-size rule already does"),
    ("MaxPool", 22): Reviewed("bfloat16 added; the text now says that with ceil_mode a window starting in the "
                              "right padding is dropped, which gpumnn's output-size rule already does"),
    ("Cast", 24): Reviewed("round_mode and the saturation table concern casts to float8 types only"),
    ("CastLike", 24): Reviewed("round_mode and the saturation table concern casts to float8 types only"),
    ("DequantizeLinear", 23): Reviewed("new attribute output_dtype: the float type of the output, which the lowering "
                                       "reads (float32 and float16; others are refused there)"),
    ("QuantizeLinear", 23): Reviewed("x and y_scale may have different float types; new attribute precision, the "
                                     "type of the division: gpumnn divides in float32", allowed={"precision": (0, 1)}),
    ("QuantizeLinear", 25): Reviewed("int2 and uint2 added to the saturation table: the lowering refuses 2-bit types"),
    ("Mod", 28): Reviewed("fmod=0 is now defined for floating-point inputs too (A - floor(A/B)*B, the sign of B): "
                          "gpumnn's mod computes exactly that for floats as for integers"),
    ("Range", 27): Reviewed("stash_type sets the accumulation type of float16/bfloat16 ranges only"),
    ("SpaceToDepth", 28): Reviewed("new attribute mode: DCR (the default, the order of earlier versions) and CRD, "
                                   "both of which gpumnn's lowering implements"),
}


def default_opset(model: onnx.ModelProto) -> int | None:
    """The model's default-domain opset version, or None if it imports none."""
    return next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), None)


def check_opset_range(opset: int) -> None:
    """Refuse an opset outside MIN_OPSET..MAX_OPSET, saying which end it is past and why."""
    if opset < MIN_OPSET:
        raise ModelError(f"opset {opset} is outside the supported range {MIN_OPSET}..{MAX_OPSET}: "
                         f"onnx.version_converter, which brings older models up to opset {MIN_IMPLEMENTED}, "
                         f"starts at opset {MIN_OPSET}")
    if opset > MAX_OPSET:
        raise ModelError(f"opset {opset} is outside the supported range {MIN_OPSET}..{MAX_OPSET}: the installed "
                         f"onnx package ({onnx.__version__}) defines opsets up to {MAX_OPSET}")


def upgrade(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` converted to opset MIN_IMPLEMENTED if older (weights kept out of the converter), else itself."""
    opset = default_opset(model)
    if opset is None or opset >= MIN_IMPLEMENTED:
        return model
    view, moved, declared = split_weights(model, keep_declared=False)
    try:
        converted = version_converter.convert_version(view, MIN_IMPLEMENTED)
    except Exception as exc:  # the converter's C++ errors arrive as RuntimeError and friends
        reason = " ".join(str(exc).split("==> Context:")[0].split())
        raise ModelError(f"the opset-{opset} model could not be converted to opset {MIN_IMPLEMENTED} by "
                         f"onnx.version_converter: {type(exc).__name__}: {reason}") from None
    # the converter keeps an IR-3 model's version but adds initializers (Slice/Pad inputs, ...) that IR 3
    # would need declared as graph inputs: the converted model gets the IR version its opset goes with
    minimum = onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", MIN_IMPLEMENTED)])
    converted.ir_version = max(converted.ir_version, minimum)
    return restore_weights(converted, moved, declared)


def check_newer_ops(model: onnx.ModelProto) -> None:
    """Refuse nodes whose op changed meaning after MAX_IMPLEMENTED, at a model opset past it."""
    opset = default_opset(model)
    if opset is None or opset <= MAX_IMPLEMENTED:
        return
    lowered = set(supported_ops())
    for index, node in enumerate(walk_nodes(model.graph)):
        if node.domain not in DEFAULT_DOMAINS or node.op_type not in lowered:
            continue  # an op gpumnn does not implement at all: the unsupported-op check names it
        changes = unreviewed_changes(node, opset)
        if changes:
            name = node.name or f"{node.op_type}_{index}"
            raise UnsupportedOpError(node.op_type, name, f"at opset {opset}; gpumnn implements {node.op_type} as "
                                     f"defined up to opset {MAX_IMPLEMENTED}, and " + "; ".join(changes))


def walk_nodes(graph: onnx.GraphProto):
    """The graph's nodes and, recursively, those of their subgraphs (If, Loop, Scan bodies)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from walk_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from walk_nodes(sub)


def unreviewed_changes(node: onnx.NodeProto, opset: int) -> list[str]:
    """What changed in ``node``'s op between MAX_IMPLEMENTED and ``opset`` that gpumnn cannot run."""
    try:
        ours = defs.get_schema(node.op_type, MAX_IMPLEMENTED).since_version
        theirs = defs.get_schema(node.op_type, opset).since_version
    except defs.SchemaError:
        return []  # an op newer than opset 21 (or none at all): the unsupported-op check names it
    set_attrs = {a.name: a for a in node.attribute}
    changes = []
    for version in _versions_between(node.op_type, ours, theirs):
        before, after = defs.get_schema(node.op_type, version - 1), defs.get_schema(node.op_type, version)
        review = REVIEWED.get((node.op_type, version))
        if review is not None:
            for attr, allowed in review.allowed.items():
                if attr in set_attrs and _attribute_value(set_attrs[attr]) not in allowed:
                    changes.append(f"{node.op_type}-{version} added attribute {attr!r}; gpumnn runs only "
                                   f"{attr}={allowed[0]!r}, not {_attribute_value(set_attrs[attr])!r}")
            continue
        differences = schema_differences(before, after)
        if differences:
            changes.append(f"{node.op_type}-{version} changed it: {', '.join(differences)}")
    return changes


def _versions_between(op_type: str, ours: int, theirs: int) -> list[int]:
    """The since_versions of ``op_type`` after ``ours`` up to ``theirs``, oldest first."""
    versions, opset = [], theirs
    while opset > ours:
        since = defs.get_schema(op_type, opset).since_version
        if since <= ours:
            break
        versions.append(since)
        opset = since - 1
    return versions[::-1]


def schema_differences(before: defs.OpSchema, after: defs.OpSchema) -> list[str]:
    """How ``after`` differs from ``before`` beyond types added to its type constraints."""
    out = []
    formal = lambda params: [(p.name, p.option, p.type_str) for p in params]  # noqa: E731
    if formal(before.inputs) != formal(after.inputs):
        out.append(f"inputs {[p.name for p in before.inputs]} -> {[p.name for p in after.inputs]}")
    if formal(before.outputs) != formal(after.outputs):
        out.append(f"outputs {[p.name for p in before.outputs]} -> {[p.name for p in after.outputs]}")
    for name in sorted(set(after.attributes) - set(before.attributes)):
        out.append(f"new attribute {name!r}")
    for name in sorted(set(before.attributes) - set(after.attributes)):
        out.append(f"attribute {name!r} removed")
    for name in sorted(set(before.attributes) & set(after.attributes)):
        a, b = before.attributes[name], after.attributes[name]
        if (a.type, a.required, a.default_value) != (b.type, b.required, b.default_value):
            out.append(f"attribute {name!r} redefined")
    old_types = {t.type_param_str: set(t.allowed_type_strs) for t in before.type_constraints}
    for constraint in after.type_constraints:
        dropped = old_types.get(constraint.type_param_str, set()) - set(constraint.allowed_type_strs)
        if dropped:
            out.append(f"types {sorted(dropped)} removed from {constraint.type_param_str}")
    if before.doc != after.doc and not out:
        out.append("its specification text changed (not yet reviewed for gpumnn)")
    return out


def _attribute_value(attr: onnx.AttributeProto):
    value = onnx.helper.get_attribute_value(attr)
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


__all__ = ["MIN_OPSET", "MAX_OPSET", "MIN_IMPLEMENTED", "MAX_IMPLEMENTED", "REVIEWED", "check_newer_ops",
           "check_opset_range", "default_opset", "schema_differences", "unreviewed_changes", "upgrade", "walk_nodes"]
