"""The ncnn peer benchmark's exporter (bench/ncnn_peer.py) writes models ncnn computes correctly."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "ncnn_peer.py"


def _load_peer():
    if "ncnn_peer" in sys.modules:
        return sys.modules["ncnn_peer"]
    spec = importlib.util.spec_from_file_location("ncnn_peer", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["ncnn_peer"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_ncnn_cpu_matches_onnxruntime_on_squeezenet(tmp_path):
    pytest.importorskip("ncnn", reason="the optional peer `ncnn` is not installed (pip install ncnn)")
    pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")
    peer = _load_peer()
    param, bin_, in_blob, out_blob = peer.export_ncnn("squeezenet1_1", tmp_path)
    assert Path(param).read_text().startswith("7767517\n")
    x = peer.random_input("squeezenet1_1")
    reference, _ = peer.onnxruntime_reference("squeezenet1_1", x)
    net = peer._ncnn_net(param, bin_, vulkan=False, threads=1)
    try:
        y = peer.run_ncnn(net, x, in_blob, out_blob)
    finally:
        net.clear()
    assert y.shape == reference.shape
    assert peer.rel_l2(y, reference) < 1e-3


def test_unsupported_op_is_named():
    peer = _load_peer()
    with pytest.raises(peer.NcnnExportError, match="MatMul"):
        peer.export_ncnn("transformer_encoder", "/nonexistent-not-written")
