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
import placement_check  # noqa: E402
from gpumnn.backends import REGISTRY, probe  # noqa: E402

REQUIRED = [b for b in os.environ.get("GPUMNN_REQUIRE_BACKENDS", "").split(",") if b]
REQUIRED_TOOLS = [t for t in os.environ.get("GPUMNN_REQUIRE_TOOLS", "").split(",") if t]


def backend_lines() -> list[str]:
    lines = []
    for name in REGISTRY:
        reason = probe(name)
        lines.append(f"{name:<7} {'RUNS' if reason is None else 'skipped: ' + reason}")
        if name == "vulkan" and reason is None:
            from gpumnn.backends.kernels.glsl.compile import describe_compiler
            lines.append(f"        GLSL compiler: {describe_compiler()}")
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


#: the layer's synchronization validation (off by default): a missing or too narrow barrier between
#: dispatches is a hazard it reports, where the core checks see nothing
SYNC_VALIDATION = {"VK_LAYER_ENABLES": "VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT"}


def vulkan_validation_missing() -> str | None:
    """Why the Khronos validation layer cannot run here (tool "vulkan-validation"), or None."""
    reason = probe("vulkan")
    if reason is not None:
        return f"Vulkan cannot start: {reason}"
    from gpumnn.backends.vulkan.device import validation_layer_available
    if not validation_layer_available():
        return "VK_LAYER_KHRONOS_validation is not installed (Debian/Ubuntu: vulkan-validationlayers)"
    return None


class ValidatedRun:
    """The Vulkan devices a test started under the validation layer, and their messages."""

    def __init__(self) -> None:
        self.devices: list = []

    def messages(self) -> list[str]:
        return [m for dev in self.devices for m in dev.messages]

    def check(self) -> None:
        """Fail unless some device ran validated and the layer reported nothing."""
        assert self.devices, "no Vulkan device was started under the validation layer"
        assert all(dev.validation for dev in self.devices), "a Vulkan device started without the validation layer"
        messages = self.messages()
        assert not messages, (f"{len(messages)} validation-layer messages ({len(set(messages))} distinct):\n"
                              + "\n".join(m[:400] for m in sorted(set(messages))[:10]))


@pytest.fixture
def vulkan_validation(monkeypatch) -> ValidatedRun:
    """Every Vulkan backend the test starts runs under VK_LAYER_KHRONOS_validation (a required tool
    in CI); the test calls ``check()`` at its end, and any message fails it."""
    require_backend("vulkan")
    require_tool("vulkan-validation", vulkan_validation_missing())
    from gpumnn.backends.vulkan import device as vulkan_device

    run = ValidatedRun()
    original = vulkan_device.VulkanDevice.__init__

    def recording(self, *args, **kwargs):
        original(self, *args, **kwargs)
        run.devices.append(self)

    monkeypatch.setattr(vulkan_device.VulkanDevice, "__init__", recording)
    monkeypatch.setenv("GPUMNN_VULKAN_VALIDATION", "1")
    for name, value in SYNC_VALIDATION.items():
        monkeypatch.setenv(name, value)
    return run


@pytest.fixture(params=list(REGISTRY))
def backend(request) -> str:
    require_backend(request.param)
    return request.param


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the item, so fixtures can see whether the test passed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)
    seed = getattr(item, "random_seed", None)
    if seed is not None and report.failed:
        report.sections.append(("random seed", f"this test drew fresh inputs from seed {seed}: "
                                               f"GPUMNN_TEST_SEED={seed} reruns it with the same ones"))


@pytest.fixture
def fresh_rng(request) -> np.random.Generator:
    """A generator with a fresh seed every run (inputs and weights vary from run to run, to find
    what fixed ones miss), or GPUMNN_TEST_SEED's; a failing test's report shows the seed."""
    seed = int(os.environ.get("GPUMNN_TEST_SEED") or np.random.SeedSequence().entropy % 2 ** 63)
    request.node.random_seed = seed
    return np.random.default_rng(seed)


@pytest.fixture(autouse=True)
def _placement_is_checked(request, monkeypatch):
    """In the op-level test modules (placement_check.CHECKED_MODULES): every op of a session on one
    GPU backend ran there, except the cpu fallbacks that placement_check.EXPECTED_CPU lists."""
    module = request.node.module.__name__.rsplit(".", 1)[-1] if request.node.module else ""
    if module not in placement_check.CHECKED_MODULES:
        yield
        return
    from gpumnn.runtime import shape_set as prepared

    placements = []
    place = prepared.place

    def recording(program, backends, candidates, *args, **kwargs):
        placement = place(program, backends, candidates, *args, **kwargs)
        placements.append((program, tuple(candidates), placement))
        return placement

    monkeypatch.setattr(prepared, "place", recording)
    yield
    report = getattr(request.node, "report_call", None)
    problem = placement_check.check(request.node.nodeid, placements, passed=report is not None and report.passed)
    if problem:
        pytest.fail(problem, pytrace=False)


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
