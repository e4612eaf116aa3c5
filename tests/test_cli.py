"""The gpumnn command: info, run, bench and zoo, as a user types them."""
from __future__ import annotations

import itertools
import json

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import gpumnn
from gpumnn import zoo
from gpumnn.tools.cli import main
from gpumnn.tools.ops_table import ops_section, readme_section


def test_info_lists_every_backend_and_why_missing(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for name in ("cpu", "opencl", "vulkan", "gl", "cuda"):
        assert name in out
    assert "available" in out


def test_info_names_the_int8_product_path_the_cpu_uses(capsys):
    """The cpu's line names the path QuantizedMatMul runs on and the ones this host could pick."""
    from gpumnn.backends.cpu import int8 as cpu_int8
    assert main(["info"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if "int8 products:" in l)
    assert cpu_int8.tile_name() in line and all(p in line for p in cpu_int8.host_paths()), line


def test_info_says_which_int8_arithmetic_each_gpu_api_uses(capsys, monkeypatch):
    """A line per started GPU backend says whether its int8 convolutions multiply on integer dot
    products (and which) or in plain int32: the sentence the backend chose at start."""
    from gpumnn.backends import create_backend, probe

    monkeypatch.setenv("GPUMNN_KERNELS", "tiled")
    assert main(["info"]) == 0
    lines = capsys.readouterr().out.splitlines()
    started = [name for name in ("opencl", "vulkan", "gl", "cuda") if probe(name) is None]
    for name in started:
        head = next(i for i, line in enumerate(lines) if line.split()[:2] == [name, "available"])
        line = next(line for line in lines[head + 1:] if "int8 convolutions:" in line)
        be = create_backend(name)
        try:
            assert line.strip() == f"int8 convolutions: {be.int8_arithmetic}"
            assert line.strip().startswith("int8 convolutions: integer dot products in the implicit GEMM: "
                                           if be.int8_dot else "int8 convolutions: plain int32 products"), line
        finally:
            be.close()


def test_info_says_which_storage_dtypes_each_backend_holds_natively_or_packed(capsys, monkeypatch):
    """A line per started backend names the native and the packed storage dtypes and what decided;
    Vulkan forced to pack (GPUMNN_VULKAN_NARROW_STORAGE) says so."""
    from gpumnn.backends import probe
    from conftest import require_backend

    require_backend("vulkan")
    monkeypatch.setenv("GPUMNN_VULKAN_NARROW_STORAGE", "packed")
    assert main(["info"]) == 0
    lines = capsys.readouterr().out.splitlines()
    storage = {}
    for above, line in zip(lines, lines[2:]):
        name = above.split()[0]
        if "available" in above and line.strip().startswith("storage:"):
            storage[name] = line.strip()
    assert set(storage) == {name for name in ("cpu", "opencl", "vulkan", "gl", "cuda") if probe(name) is None}
    assert storage["vulkan"] == ("storage: native float32, int32; packed in 32-bit words float16 "
                                 "(narrow_storage='packed'), int8, uint8 (narrow_storage='packed')")
    if "opencl" in storage:
        assert storage["opencl"].startswith("storage: native float32, int32, float16 (")


def test_info_gives_the_compute_units_of_each_gpu_api_and_where_they_came_from(capsys):
    """The GPU families size their GEMM tiles and split K by the device's compute units; info says
    how many each API reports (vulkan and gl: the vendor extension, a CPU device, or the default)."""
    from gpumnn.backends import probe
    assert main(["info"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in ("vulkan", "gl"):
        if probe(name) is None:
            start = next(i for i, line in enumerate(lines) if line.startswith(f"  {name:<7} available"))
            details = list(itertools.takewhile(lambda line: line.startswith(" " * 10), lines[start + 1:]))
            units = next(line for line in details if "compute units: " in line)
            assert int(units.split("compute units: ")[1].split()[0]) >= 1 and "(" in units, units


def test_info_ops_prints_the_opsets_and_every_supported_op(capsys):
    assert main(["info", "--ops"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"opsets up to {onnx.defs.onnx_opset_version()}" in out
    for op in gpumnn.supported_ops():
        assert f"`{op}`" in out


def test_readme_lists_the_supported_ops_from_the_code():
    readme = Path(__file__).resolve().parent.parent / "README.md"
    assert readme_section(readme) == ops_section(), "README.md is stale: run python -m gpumnn.tools.ops_table README.md"


def test_run_reads_input_and_writes_outputs(tmp_path, capsys):
    model = zoo.save("squeezenet1_1", tmp_path / "squeezenet.onnx")
    x = np.random.default_rng(11).standard_normal((1, 3, 224, 224)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out_path = tmp_path / "out.npz"
    assert main(["run", str(model), "--input", str(tmp_path / "x.npy"), "--output", str(out_path), "--report"]) == 0
    printed = capsys.readouterr().out
    assert "memory[cpu]" in printed and "output: shape [1, 1000]" in printed
    ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    got = np.load(out_path)["output"]
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-3


def test_run_takes_every_input_by_name_or_from_an_npz(tmp_path, capsys):
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Sub", ["a", "b"], ["y"], name="sub")], "two",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, ("n", 3)) for n in "ab"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ("n", 3))])
    model = tmp_path / "two.onnx"
    model.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString())
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((2, 3), np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    np.savez(tmp_path / "ab.npz", a=a, b=b)
    for given in ([f"a={tmp_path / 'a.npy'}", f"b={tmp_path / 'b.npy'}"], [str(tmp_path / "ab.npz")]):
        out = tmp_path / "y.npz"
        assert main(["run", str(model), "--input", *given, "--output", str(out)]) == 0
        np.testing.assert_array_equal(np.load(out)["y"], a - b)
    assert main(["run", str(model), "--input", f"c={tmp_path / 'a.npy'}"]) == 1
    assert "does not take; its inputs are ['a', 'b']" in capsys.readouterr().err


def test_run_reports_model_errors_without_a_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert main(["run", str(bad)]) == 1
    assert "gpumnn: error:" in capsys.readouterr().err


def test_bench_json_has_recorded_eager_and_onnxruntime_per_repeat(capsys):
    assert main(["bench", "transformer_encoder", "--backend", "cpu", "--runs", "2", "--repeats", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["repeats"] == 2 and report["runs"] == 2
    (row,) = report["rows"]
    assert row["model"] == "transformer_encoder" and row["backend"] == "cpu"
    assert row["recorded_ms"] > 0 and row["eager_ms"] > 0 and row["onnxruntime_ms"] > 0
    assert row["rel_errors"]["recorded"] < 1e-3
    for series in ("recorded", "eager", "onnxruntime"):
        assert [len(runs) for runs in row["samples"][series]] == [2, 2]  # raw: 2 repeats of 2 runs
        cell = row["cells"][series]
        assert cell["low"] <= cell["median"] <= cell["high"]


def test_bench_table_and_png(tmp_path, capsys):
    args = ["bench", "transformer_encoder", "--backend", "cpu", "--runs", "1", "--repeats", "2", "--no-eager"]
    try:
        import matplotlib  # noqa: F401
        args += ["--png", str(tmp_path)]
    except ImportError:
        pass  # the table is still checked; test_bench.py says why the charts were skipped
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "recorded ms" in out and "transformer_encoder" in out and "median over 2 repeats" in out
    if "--png" in args:
        assert sorted(p.name for p in tmp_path.iterdir()) == ["latency_transformer_encoder.png", "ratios.png"]


def test_bench_batch_times_zoo_names_and_onnx_paths_at_each_batch(tmp_path, capsys):
    fixed = tmp_path / "fixed.onnx"  # batch 1 fixed in the file: set to each batch
    zoo.save("transformer_encoder", fixed)
    assert main(["bench", "transformer_encoder", str(fixed), "--backend", "cpu", "--runs", "1", "--repeats", "1",
                 "--no-eager", "--batch", "1,3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["batches"] == [1, 3]
    rows = report["rows"]
    assert [(r["model"], r["batch"]) for r in rows] == [("transformer_encoder", 1), ("transformer_encoder", 3),
                                                        (str(fixed), 1), (str(fixed), 3)]
    for row in rows:
        assert row["note"] == "" and row["rel_errors"]["recorded"] < 1e-3
        rate = row["items_per_second"]["recorded"]["median"]
        assert rate == pytest.approx(row["batch"] * 1000.0 / row["recorded_ms"])
    assert main(["bench", "transformer_encoder", "--backend", "cpu", "--runs", "1", "--repeats", "1", "--no-eager",
                 "--batch", "2"]) == 0
    assert "ORT items/s" in capsys.readouterr().out


def test_zoo_export(tmp_path, capsys):
    assert main(["zoo", str(tmp_path), "transformer_encoder"]) == 0
    assert (tmp_path / "transformer_encoder.onnx").exists()
