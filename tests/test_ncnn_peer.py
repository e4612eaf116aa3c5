"""The ncnn peer (bench/ncnn_peer.py): pnnx's converter executable turns a zoo model into ncnn
files that ncnn computes like ONNX Runtime, and the peer times the three in alternation."""
from __future__ import annotations

import pytest

from conftest import bench_script


@pytest.fixture
def peer():
    module = bench_script("ncnn_peer")
    for check in (module.pnnx_executable, module.require_ncnn):
        try:
            check()
        except module.PeerUnavailable as exc:
            pytest.skip(f"the optional ncnn peer cannot run here: {exc}")
    pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")
    return module


def test_pnnx_conversion_computes_like_onnxruntime(peer, tmp_path):
    from gpumnn.tools.benchmark import load_model, onnxruntime_runner, rel_l2
    _, model_bytes, feed = load_model("squeezenet1_1")
    (x,) = feed.values()
    param, bin_ = peer.convert(model_bytes, x.shape, tmp_path)
    assert param.read_text().startswith("7767517\n")
    assert bin_.stat().st_size > 4 * 1_200_000  # float32 weights (fp16=0): SqueezeNet-1.1 has ~1.24 M
    reference = onnxruntime_runner(model_bytes, threads=1)(feed)
    run, net = peer.ncnn_runner(param, bin_, vulkan=False, threads=1)
    try:
        y = run(x)
    finally:
        net.clear()
    assert y.shape == reference.shape
    assert rel_l2(y, reference) < 1e-3


def test_peer_row_alternates_and_checks_every_peer(peer, tmp_path):
    row = peer.peer_row("transformer_encoder", threads=1, runs=1, warmup=0, repeats=2, vulkan=False,
                        workdir=str(tmp_path))
    assert list(row.samples) == ["recorded", "onnxruntime", "ncnn-cpu"]
    assert all(len(repeats) == 2 and all(len(runs) == 1 for runs in repeats) for repeats in row.samples.values())
    assert set(row.rel_errors) == {"recorded", "ncnn-cpu"}
    assert max(row.rel_errors.values()) < 1e-3
    assert row.ratio("ncnn-cpu", "onnxruntime") is not None


def test_pnnx_failure_shows_its_log(peer, tmp_path):
    with pytest.raises(RuntimeError, match="pnnx failed"):
        peer.convert(b"not an onnx model", (1, 3, 8, 8), tmp_path)


def test_missing_pnnx_says_how_to_install_it(monkeypatch):
    module = bench_script("ncnn_peer")
    monkeypatch.setattr(module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(module.PeerUnavailable, match="pip install --no-deps pnnx"):
        module.pnnx_executable()
