"""Device profiles: a device's calibrations and planning facts saved, read back and planned with
on a machine without the device (issue 29 part 3)."""
from __future__ import annotations

import re

import pytest

from gpumnn import load, zoo
from gpumnn.backends import create_backend
from gpumnn.cli import main
from gpumnn.tools.plan_report import plan_on_profile
from gpumnn.scheduler import calibration as C
from gpumnn.scheduler import device_profile
from gpumnn.scheduler import schemes
from gpumnn.scheduler.schemes import EXPANDED

H100 = "nvidia-h100-80gb-hbm3"
H200 = "nvidia-h200"


def _planned_ops(text: str) -> list[tuple[str, str, str]]:
    """(op, scheme, node) per row of ``plan_on_profile``'s table."""
    rows = re.findall(r"^\s*\d+ (\w+)\s+(.+?)\s+\d+\.\d{3}  (\S+)$", text, re.M)
    return [(op, scheme.strip(), node) for op, scheme, node in rows]


def test_a_target_and_calibration_survive_the_file(tmp_path):
    backend = create_backend("opencl")
    try:
        target = device_profile.PlanningTarget.of(backend)
        cal = C.paper_constants(backend)
        path = device_profile.save(tmp_path / "p.json", "here", [(cal, backend)])
    finally:
        backend.close()
    read = device_profile.load(path)
    assert read.machine == "here"
    assert read.targets["opencl"] == target
    assert read.calibrations["opencl"] == cal
    with pytest.raises(device_profile.ProfileError, match="has no 'metal' backend"):
        read.target("metal")


def test_the_cpu_gates_transform_tiles_survive_the_file(tmp_path):
    """The cpu backend's Winograd gate (its transform tiles on the regions) is read back as the
    live backend has it; a profile written before the field reads as Eq. 2's counts."""
    backend = create_backend("cpu", threads=2)
    try:
        target = device_profile.PlanningTarget.of(backend)
        cal = C.paper_constants(backend)
        path = device_profile.save(tmp_path / "p.json", "here", [(cal, backend)])
    finally:
        backend.close()
    assert device_profile.load(path).targets["cpu"] == target
    data = target.as_dict()
    data.pop("winograd_transform_tiles")
    assert device_profile.PlanningTarget.from_dict(data).winograd_transform_tiles is None


def test_unreadable_profiles_are_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpumnn_device_profile": 1, "machine": "x", "backends": [{"calibration": {}}]}')
    with pytest.raises(device_profile.ProfileError, match="incomplete"):
        device_profile.load(bad)
    with pytest.raises(device_profile.ProfileError, match="cannot read"):
        device_profile.load(tmp_path / "missing.json")


def test_the_plan_from_a_profile_is_the_plan_a_session_makes():
    """On a backend that is here, the profile's plan has the ops and schemes of a real session's."""
    backend = create_backend("opencl")
    try:
        profile = device_profile.DeviceProfile("here", {"opencl": C.calibration_for(backend)},
                                               {"opencl": device_profile.PlanningTarget.of(backend)})
    finally:
        backend.close()
    net = load(zoo.build("squeezenet1_1"))
    shapes = {net.inputs[0].name: zoo.input_shape("squeezenet1_1")}
    planned = _planned_ops(plan_on_profile(net, shapes, "opencl", profile))
    with net.session(backend="opencl", input_shapes=shapes, fallback=False) as sess:
        ops = sess.program.ops
    assert [(op, node) for op, _, node in planned] == [(type(o).__name__.lower(), o.source) for o in ops]
    assert [scheme for _, scheme, _ in planned] == [getattr(o, "scheme", "") or "-" for o in ops]


def test_the_bundled_h100_plans_without_the_gpu():
    """The H100's profile plans resnet18 as the H100 would run it now (cuda: Winograd in its own
    kernels, one op a convolution, the 8 residual adds fused into their convolutions as the profile
    lists cuda's residual schemes; vulkan: the rewrite at F(2x2, 3x3)), with the estimate of that
    plan (the H100 printed 0.899 ms in ops, 1.045 ms a run, for its 31 ops before the fusion)."""
    assert H100 in [p.stem for p in device_profile.bundled()]
    h100 = device_profile.load(H100)
    net = load(zoo.build("resnet18"))
    shapes = {net.inputs[0].name: zoo.input_shape("resnet18")}
    cuda = plan_on_profile(net, shapes, "cuda", h100)
    rows = _planned_ops(cuda)
    assert len(rows) == 23
    assert not [op for op, _, _ in rows if op == "binary"]
    assert [s for op, s, n in rows if n == "layer1.0.conv1"] == ["winograd"]
    assert "estimated 0.884 ms in 23 ops; a recorded run 1.030 ms" in cuda
    vulkan = _planned_ops(plan_on_profile(net, shapes, "vulkan", h100))
    assert {s for _, s, n in vulkan if n == "layer1.0.conv1"} == {"winograd F(2x2, 3x3)"}
    cpu = _planned_ops(plan_on_profile(net, shapes, "cpu", h100))  # Winograd in the cpu's own kernel
    assert {op for op, s, _ in cpu if s.split()[0] in EXPANDED} == {"conv2d"}


def test_the_bundled_h200_leaves_the_glsl_winograd_kernel_out():
    """The H200's calibration times vulkan's and gl's one-kernel Winograd many times slower per
    multiplication than their implicit GEMM, so its profile plans every 3x3 of resnet18 there in the
    sliding window (23 ops; the H200 measured 1.634 ms a recorded run), while cuda's Winograd
    kernels, faster per multiplication than its 3x3s, stay."""
    assert H200 in [p.stem for p in device_profile.bundled()]
    h200 = device_profile.load(H200)
    net = load(zoo.build("resnet18"))
    shapes = {net.inputs[0].name: zoo.input_shape("resnet18")}
    for backend in ("vulkan", "gl"):
        assert schemes.winograd_min_saving(h200.target(backend), h200.calibrations[backend]) > 10
        rows = _planned_ops(plan_on_profile(net, shapes, backend, h200))
        assert len(rows) == 23 and {s for op, s, _ in rows if op == "conv2d"} == {"im2col"}
    assert "estimated 1.429 ms in 23 ops; a recorded run 1.769 ms" in plan_on_profile(net, shapes, "vulkan", h200)
    cuda = _planned_ops(plan_on_profile(net, shapes, "cuda", h200))
    assert [s for op, s, n in cuda if n == "layer1.0.conv1"] == ["winograd"]


def test_calibrate_saves_a_profile_that_plan_reads(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPUMNN_CACHE_DIR", str(tmp_path))
    path = tmp_path / "here.json"
    assert main(["calibrate", "--backend", "cpu", "--quick", "--save-profile", str(path), "--machine", "this box"]) == 0
    assert "device profile of this box" in capsys.readouterr().out
    assert main(["plan", "squeezenet1_1", "--backend", "cpu", "--profile", str(path)]) == 0
    out = capsys.readouterr().out
    assert "of this box, from its profile" in out and "quick calibration" in out
    assert main(["plan", "squeezenet1_1", "--backend", "auto", "--profile", str(path)]) == 2
