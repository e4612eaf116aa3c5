"""Where each atomic op ran, checked in the op-level tests (conftest's ``_placement_is_checked``).

An op a GPU backend refuses (``Backend.unsupported_reason``) is placed on the cpu and the answer
stays right, so a test that compares outputs only cannot see a GPU kernel that stops being chosen.
For the modules in :data:`CHECKED_MODULES`, every placement made for a single GPU backend during a
test is recorded, and each op that fell back to the cpu must be listed in :data:`EXPECTED_CPU`
under its reason for that test; a listed fallback that no longer happens (in a passing test) fails
too, so the list stays exact.

``GPUMNN_PLACEMENT_SURVEY=FILE`` appends the observed fallbacks to FILE (one JSON line per test)
instead of checking: the way to rebuild the list after a deliberate change.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

CHECKED_MODULES = ("test_ops", "test_recurrent", "test_control_flow", "test_indexing_ops", "test_schemes",
                   "test_onnx_node")
SURVEY = os.environ.get("GPUMNN_PLACEMENT_SURVEY")


@dataclass(frozen=True)
class Fallback:
    """One op on the cpu in a GPU session: the atomic op (kind and its ``op`` field, if any) and
    the backend's reason, with the backend's name replaced by ``{backend}``."""
    op: str
    reason: str


@dataclass(frozen=True)
class Expected:
    why: str  # why these ops run on the cpu
    op: str  # the atomic op, as Fallback.op
    reason: str  # the backend's own words (``unsupported_reason``), ``{backend}`` for its name
    tests: tuple[str, ...]  # test ids, the backend's name replaced by ``*`` (see :func:`matches`)
    backends: tuple[str, ...] = ("opencl", "vulkan", "gl", "cuda")  # CUDA compiles OpenCL's kernel set


def _node_tests(*names: str) -> tuple[str, ...]:
    return tuple(f"test_onnx_node.py::TestOnnxNode_*::{name}_cpu" for name in names)


#: Every op the checked tests expect on the cpu on a GPU backend, by reason.
EXPECTED_CPU: tuple[Expected, ...] = (
    Expected("TopK has no GPU kernel: a per-row selection with ties broken by index, run on the cpu",
             "topk", "the {backend} backend has no kernel for atomic op TopK",
             ("test_indexing_ops.py::test_matches_onnxruntime[*-TopK-largest-axis1-ties]",
              "test_indexing_ops.py::test_matches_onnxruntime[*-TopK-smallest-axis1-ties]",
              "test_indexing_ops.py::test_matches_onnxruntime[*-TopK-last-axis-int32]")
             + _node_tests("test_top_k", "test_top_k_negative_axis", "test_top_k_same_values_2d",
                           "test_top_k_same_values", "test_top_k_same_values_largest", "test_top_k_smallest",
                           "test_top_k_uint64")),
    Expected("integer matrix products have no GPU kernel (GPU GEMMs are float32): the einsum of int64 inputs",
             "matmul", "the {backend} backend has no int32 kernel for atomic op MatMul",
             ("test_indexing_ops.py::test_integer_einsum_product_runs_on_the_cpu[*]",)),
)


def describe(op) -> str:
    name = getattr(op, "op", None)
    return f"{op.kind} {name}" if isinstance(name, str) else op.kind


def fallbacks(placements, backend: str) -> set[Fallback]:
    """The cpu fallbacks of the recorded ``(program, candidates, placement)`` of ``backend``."""
    found = set()
    for program, candidates, placement in placements:
        if list(candidates) != [backend]:
            continue
        for op, reason in zip(program.ops, placement.fallback_reasons):
            if reason is not None:
                found.add(Fallback(describe(op), reason.replace(backend, "{backend}")))
    return found


def test_key(nodeid: str, backend: str) -> str:
    """The test's id with the backend's name replaced by ``*`` (the module path dropped)."""
    return re.sub(rf"(?<![A-Za-z]){backend}(?![A-Za-z])", "*", nodeid.split("/")[-1])


def matches(key: str, pattern: str) -> bool:
    """``*`` in ``pattern`` stands for any text; everything else (brackets of test ids too) is literal."""
    return re.fullmatch(".*".join(re.escape(part) for part in pattern.split("*")), key) is not None


def expected_for(key: str, backend: str) -> set[Fallback]:
    return {Fallback(e.op, e.reason) for e in EXPECTED_CPU
            if backend in e.backends and any(matches(key, t) for t in e.tests)}


def gpu_backends(placements) -> list[str]:
    """The backends that placements were made for alone (the cpu and mixed sessions are not checked)."""
    return sorted({c[0] for _, c, _ in placements if len(c) == 1 and c[0] != "cpu"})


def check(nodeid: str, placements, passed: bool) -> str | None:
    """None when the cpu fallbacks of one test's GPU placements are exactly the expected ones, else why not."""
    problems = []
    for backend in gpu_backends(placements):
        key = test_key(nodeid, backend)
        got = fallbacks(placements, backend)
        if SURVEY:
            if got:
                with open(SURVEY, "a") as f:
                    f.write(json.dumps({"test": key, "backend": backend,
                                        "fallbacks": sorted([g.op, g.reason] for g in got)}) + "\n")
            continue
        want = expected_for(key, backend)
        unexpected = got - want
        if unexpected:
            problems.append(f"ops ran on the cpu instead of {backend} (a kernel the backend no longer chooses?); "
                            f"if that is intended, list them in tests/placement_check.py EXPECTED_CPU for {key!r}:\n"
                            + "\n".join(f"  {f.op}: {f.reason.replace('{backend}', backend)}"
                                         for f in sorted(unexpected, key=str)))
        gone = want - got
        if gone and passed:
            problems.append(f"listed in tests/placement_check.py EXPECTED_CPU as falling back on {backend} but ran "
                            f"on {backend}: take them off for {key!r}:\n"
                            + "\n".join(f"  {f.op}: {f.reason}" for f in sorted(gone, key=str)))
    return "\n".join(problems) or None
