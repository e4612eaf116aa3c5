"""The ``onnx`` package's node tests (``onnx.backend.test.BackendTest``) on every gpumnn backend.

The cases come from the installed ``onnx`` (generated from its Python case code, no downloads);
only the node tests run, and of those the ones whose op types gpumnn claims to support
(``gpumnn.supported_ops()``): a case with an op gpumnn does not implement cannot pass, and
:func:`test_unimplemented_ops_are_refused_by_name` checks in one go that each of those is refused
with an UnsupportedOpError (or ModelError) rather than a raw exception.

Every selected case runs on every backend. Those listed in ``onnx_node_expected_failures.py`` are
strict xfails that must fail with the exception and message their group names: a newly passing case
fails the run (take it off the list), and so does a case failing in a new way. BackendTest's cases are
unittest methods of one class per backend (``TestOnnxNode_<backend>``); run one backend's with
``pytest tests/test_onnx_node.py -k TestOnnxNode_vulkan``, one case with ``-k test_gemm_beta``.
"""
from __future__ import annotations

import functools
import re
import warnings
from typing import Callable

import onnx
import pytest
from onnx.backend.test import BackendTest
from onnx.backend.test.loader import load_model_tests

import gpumnn
from conftest import require_backend
from gpumnn.backends import REGISTRY, probe
from gpumnn.onnx_backend import backend_for
from gpumnn.frontend.opsets import upgrade, walk_nodes
from onnx_node_expected_failures import EXPECTED, Group, expected_failure

with warnings.catch_warnings():  # the case generators' own overflow/divide warnings
    warnings.simplefilter("ignore")
    NODE_CASES = load_model_tests(kind="node")

SUPPORTED = set(gpumnn.supported_ops()) | {"Constant"}  # Constant nodes become initializers at import


def claimed(model: onnx.ModelProto) -> bool:
    """Whether gpumnn claims every op of the case's graph and its subgraphs (default domain, an op
    it lowers), after the version conversion that loading applies to opsets 7-10 (Upsample-9
    becomes Resize)."""
    try:
        model = upgrade(model)
    except gpumnn.ModelError:
        pass
    return all(n.domain in ("", "ai.onnx") and n.op_type in SUPPORTED for n in walk_nodes(model.graph))


CLAIMED = sorted(c.name for c in NODE_CASES if claimed(c.model))
UNCLAIMED = [c for c in NODE_CASES if not claimed(c.model)]


def _expect_failure(method: Callable, group: Group) -> Callable:
    """``method`` as a strict xfail that must fail with ``group.raises``, its message matching ``group.match``.

    The same outcomes as ``pytest.mark.xfail(strict=True, raises=...)``, but the expected exception
    is caught here and the xfail raised afresh, outside it: pytest then formats a one-frame
    traceback instead of the case's own (through onnx's runner, gpumnn's loader and lowering),
    which cost 0.15 s per case, a minute per backend.
    """
    @functools.wraps(method)
    def run(self) -> None:
        failure = None
        try:
            method(self)
        except group.raises as exc:
            failure = f"{type(exc).__name__}: {exc}"
        if failure is None:
            pytest.fail(f"listed as expected to fail ({group.reason}) but passed: take it off "
                        "tests/onnx_node_expected_failures.py", pytrace=False)
        if not re.search(group.match, failure):  # the right type for another reason is a new failure
            pytest.fail(f"expected to fail ({group.reason}) with a message matching {group.match!r}, "
                        f"but failed with {failure[:500]}", pytrace=False)
        pytest.xfail(group.reason)
    return run


def _node_test_class(backend: str) -> type:
    """BackendTest's node-test class for one backend: the claimed cases, expected failures marked."""
    runner = BackendTest(backend_for(backend), __name__)
    cls = runner.test_cases["OnnxBackendNodeModelTest"]
    wanted = set(CLAIMED)
    for attr in [a for a in vars(cls) if a.startswith("test_")]:
        case = attr[:-len("_cpu")] if attr.endswith("_cpu") else None
        if case not in wanted:  # device "CUDA" variants, and cases with ops gpumnn does not implement
            delattr(cls, attr)
            continue
        expected = expected_failure(case, backend)
        if expected is not None:
            setattr(cls, attr, _expect_failure(getattr(cls, attr), expected))
    cls.__name__ = cls.__qualname__ = f"TestOnnxNode_{backend}"
    return cls


for _backend in REGISTRY:
    if probe(_backend) is None:
        globals()[f"TestOnnxNode_{_backend}"] = _node_test_class(_backend)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_node_tests_run_on(name):
    """A backend whose node tests were not collected could not start: skip, or fail where CI requires it."""
    require_backend(name)
    assert f"TestOnnxNode_{name}" in globals()


def test_unimplemented_ops_are_refused_by_name():
    """Every node-test case using an op gpumnn does not implement is refused at load, by a gpumnn error."""
    raw = []
    for case in UNCLAIMED:
        try:
            backend_for("cpu").prepare(case.model)
        except gpumnn.ModelError:  # UnsupportedOpError is one
            continue
        except Exception as exc:  # noqa: BLE001 -- what this test looks for
            raw.append(f"{case.name}: {type(exc).__name__}: {exc}"[:300])
        else:
            raw.append(f"{case.name}: loaded although it uses "
                       f"{sorted({n.op_type for n in walk_nodes(case.model.graph)} - SUPPORTED)}")
    assert not raw, f"{len(raw)} of {len(UNCLAIMED)} cases:\n" + "\n".join(raw)


def test_expected_failures_name_cases_that_run():
    """Every listed case is a claimed node test of the installed onnx (a stale entry would go unnoticed)."""
    unknown = sorted({case for case, _ in EXPECTED} - set(CLAIMED))
    assert not unknown, f"listed in onnx_node_expected_failures.py but not run: {unknown}"
    bad_backends = sorted({b for _, b in EXPECTED if b is not None} - set(REGISTRY))
    assert not bad_backends
