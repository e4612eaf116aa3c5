"""Backends for the parametrised tests, and the rule that CI may not skip the APIs it can run.

Every test that takes the ``backend`` fixture runs once per backend gpumnn knows. A backend that
cannot start here is skipped with its reason, except those named in GPUMNN_REQUIRE_BACKENDS
(.ci/run sets it to the APIs CI installs), which fail instead. Tools that tests use without a
backend (NVRTC, which compiles the kernels as CUDA on a machine without a GPU) follow the same
rule through GPUMNN_REQUIRE_TOOLS and :func:`require_tool`.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpumnn  # noqa: E402
from gpumnn.backends import REGISTRY, probe  # noqa: E402

REQUIRED = [b for b in os.environ.get("GPUMNN_REQUIRE_BACKENDS", "").split(",") if b]
REQUIRED_TOOLS = [t for t in os.environ.get("GPUMNN_REQUIRE_TOOLS", "").split(",") if t]


def backend_lines() -> list[str]:
    lines = []
    for name in REGISTRY:
        reason = probe(name)
        lines.append(f"{name:<7} {'RUNS' if reason is None else 'skipped: ' + reason}")
    if REQUIRED:
        lines.append(f"required here (GPUMNN_REQUIRE_BACKENDS): {', '.join(REQUIRED)}")
    if REQUIRED_TOOLS:
        lines.append(f"tools required here (GPUMNN_REQUIRE_TOOLS): {', '.join(REQUIRED_TOOLS)}")
    return lines


def pytest_report_header(config):
    return ["gpumnn backends:"] + ["  " + line for line in backend_lines()]


VALIDATED_DEVICES: list = []
if os.environ.get("GPUMNN_VULKAN_VALIDATION", "").lower() in ("1", "true", "yes", "on") and probe("vulkan") is None:
    # every Vulkan device of the run keeps its validation-layer messages for the summary below
    from gpumnn.backends.vulkan import device as _vd

    _original_init = _vd.VulkanDevice.__init__

    def _recording_init(self, *args, **kwargs):
        _original_init(self, *args, **kwargs)
        VALIDATED_DEVICES.append(self)

    _vd.VulkanDevice.__init__ = _recording_init


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say which backends ran, even under -q (which hides the header)."""
    terminalreporter.write_sep("-", "gpumnn backends in this run")
    for line in backend_lines():
        terminalreporter.write_line(line)
    if VALIDATED_DEVICES:
        messages = [m for dev in VALIDATED_DEVICES for m in dev.messages]
        terminalreporter.write_line(f"Vulkan validation layer: {len(VALIDATED_DEVICES)} devices, "
                                    f"{len(messages)} messages ({len(set(messages))} distinct)")
        for message in sorted(set(messages))[:20]:
            terminalreporter.write_line(f"  {message[:300]}")


def require_backend(name: str) -> None:
    """Skip (or, for a required backend, fail) when ``name`` cannot start here."""
    reason = probe(name)
    if reason is None:
        return
    if name in REQUIRED:
        pytest.fail(f"backend {name!r} is required here but cannot start: {reason}")
    pytest.skip(f"backend {name!r} unavailable: {reason}")


def require_tool(name: str, reason: str | None) -> None:
    """Skip (or, for a tool named in GPUMNN_REQUIRE_TOOLS, fail) when ``reason`` says ``name`` is
    missing here; None means it is present."""
    if reason is None:
        return
    if name in REQUIRED_TOOLS:
        pytest.fail(f"tool {name!r} is required here but missing: {reason}")
    pytest.skip(f"tool {name!r} unavailable: {reason}")


@pytest.fixture(params=list(REGISTRY))
def backend(request) -> str:
    require_backend(request.param)
    return request.param


def bench_script(name: str):
    """The module of ``bench/NAME.py`` (scripts, not a package), loaded once per test process
    under the name ``bench_NAME`` (registered first: dataclasses look their module up there)."""
    module_name = f"bench_{name}"
    if module_name not in sys.modules:
        path = Path(__file__).resolve().parent.parent / "bench" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def onnxruntime_session(model):
    """ONNX Runtime on the CPU for ``model`` (a ModelProto): the reference every test compares with."""
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def rel_l2(got: np.ndarray, ref: np.ndarray) -> float:
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"shape {got.shape} != reference {ref.shape}"
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-12))
