"""The PyTorch peer (bench/torch_peer.py): onnx2torch turns a zoo model into a module that computes
like ONNX Runtime, and the peer times gpumnn and PyTorch in alternation in one process.

torch (and onnx2torch, which imports torchvision) is not in CI's install (several GB); the tests
that need it skip with the import error as their reason. The series/ratio/target bookkeeping
needs no torch and runs everywhere."""
from __future__ import annotations

import pytest

from conftest import bench_script
from gpumnn.tools import benchmark
from gpumnn.tools.benchmark import BenchRow


@pytest.fixture
def peer():
    return bench_script("torch_peer")


@pytest.fixture
def torch_peer(peer):
    try:
        peer.require_torch()
    except peer.PeerUnavailable as exc:
        pytest.skip(f"the optional PyTorch peer cannot run here: {exc}")
    pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")
    return peer


def test_series_and_ratios_cover_every_target(peer):
    backends = ["cpu", "opencl", "vulkan", "gl", "cuda"]
    series = peer.series_for(backends, graph=True)
    assert series[:2] == ["cpu-recorded", "cpu-eager"] and series[-2:] == ["torch-eager", "torch-graph"]
    ratios = peer.ratios_for(backends, graph=True)
    for target in peer.TARGETS:
        assert (target.numerator, target.denominator) in ratios
    assert all(a in series and b in series for a, b in ratios)
    # without CUDA: no graph series, and no ratio names a series that is not timed
    cpu_only = peer.ratios_for(["cpu"], graph=False)
    assert cpu_only == [("cpu-recorded", "cpu-eager"), ("cpu-recorded", "torch-eager")]


def test_tf32_series_go_beside_fp32_on_the_backends_that_have_it(peer):
    """``--precision fp32 tf32``: a cuda-tf32 series pair beside each backend's fp32 pair (tf32 only
    where the backend has it), with its ratios to PyTorch and to cuda in fp32."""
    labels = peer.labels_for(["opencl", "cuda"], ["fp32", "tf32"])
    assert labels == [("opencl", "opencl", "fp32"), ("cuda", "cuda", "fp32"), ("cuda-tf32", "cuda", "tf32")]
    names = [label for label, _, _ in labels]
    assert peer.series_for(names, graph=True)[4:6] == ["cuda-tf32-recorded", "cuda-tf32-eager"]
    ratios = peer.ratios_for(names, graph=True)
    assert ("cuda-tf32-recorded", "torch-graph") in ratios and ("cuda-tf32-recorded", "cuda-recorded") in ratios


def test_report_prints_targets_beside_ratios_without_judging_other_models(peer):
    series = peer.series_for(["cuda"], graph=True)
    ms = {"cuda-recorded": 0.5, "cuda-eager": 2.0, "torch-eager": 3.0, "torch-graph": 0.4}
    rows = []
    for model in ("resnet18", "transformer_encoder"):
        row = BenchRow(model, "cuda", device="test")
        row.samples = {s: [[ms[s]], [ms[s]]] for s in series}
        rows.append(row)
    text = peer.format_report(rows, series, peer.ratios_for(["cuda"], graph=True), "header")
    resnet, transformer = text.split("transformer_encoder")
    assert "cuda-recorded/torch-graph" in resnet and "target <= 1.00: missed" in resnet  # 0.5 / 0.4
    assert "target <= 0.33: met" in resnet  # 0.5 / 3.0
    assert "target <= 0.50: met" in resnet and "target <= 0.50: met" in transformer  # 0.5 / 2.0
    assert "target <= 1.00" not in transformer  # the PyTorch targets name the paper's three models only


def test_onnx2torch_conversion_computes_like_onnxruntime(torch_peer):
    import onnx
    import torch
    from gpumnn.tools.benchmark import load_model, onnxruntime_runner, rel_l2
    _, model_bytes, feed = load_model("squeezenet1_1")
    (x,) = feed.values()
    _, onnx2torch = torch_peer.require_torch()
    module = onnx2torch.convert(onnx.load_from_string(model_bytes)).eval()
    runners = torch_peer.torch_runners(module, x, torch.device("cpu"), device_io=False)
    assert set(runners) == {"torch-eager"}  # CUDA-graph replay only where the module is on CUDA
    assert rel_l2(runners["torch-eager"](), onnxruntime_runner(model_bytes, 1)(feed)) < 1e-3


def test_peer_row_times_gpumnn_and_torch_in_alternation(torch_peer, monkeypatch):
    calls = []

    def recording_alternate(fns, repeats, runs, warmup, **protocol):
        wrapped = {name: (lambda name=name, fn=fn: (calls.append(name), fn())[1]) for name, fn in fns.items()}
        return benchmark.alternate(wrapped, repeats, runs, warmup, **protocol)

    monkeypatch.setattr(torch_peer, "alternate", recording_alternate)
    row = torch_peer.peer_row("squeezenet1_1", ["cpu"], "cpu", device_io=False, threads=1, runs=1, warmup=0,
                              repeats=2)
    series = torch_peer.series_for(["cpu"], graph=False)
    assert row.note == ""
    assert calls == series * 2  # each repeat times every series once, in turn
    assert {s: len(r) for s, r in row.samples.items()} == {s: 2 for s in series}
    assert set(row.rel_errors) == set(series) and max(row.rel_errors.values()) < 1e-3
    assert row.ratio("cpu-recorded", "torch-eager") is not None
