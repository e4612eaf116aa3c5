"""The benchmark's protocol on a fake clock: alternation order, the per-repeat figures, medians,
spreads and per-repeat ratios, the table and the charts. No speed is asserted anywhere."""
from __future__ import annotations

import pytest

from gpumnn.tools.benchmark import BenchRow, Spread, alternate, format_table, rows_as_dicts, time_runs


class FakeClock:
    """A clock that moves only when a timed function says how long it took."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def spend(self, ms: float) -> None:
        self.now += ms / 1000.0


def test_time_runs_warms_up_untimed_then_times_each_run():
    clock, durations = FakeClock(), iter([100.0, 1.0, 2.0, 3.0])  # the warm-up's 100 ms is not counted
    samples = time_runs(lambda: clock.spend(next(durations)), runs=3, warmup=1, clock=clock)
    assert samples == pytest.approx([1.0, 2.0, 3.0])


def test_alternate_times_every_series_once_per_repeat_in_turn():
    clock, log, repeats_seen = FakeClock(), [], []
    cost = {"a": 10.0, "b": 30.0}

    def timed(name):
        def fn():
            log.append(name)
            clock.spend(cost[name] + len(repeats_seen))  # repeat r costs r ms more
        return fn

    samples = alternate({"a": timed("a"), "b": timed("b")}, repeats=3, runs=2, warmup=1, clock=clock,
                        on_repeat=repeats_seen.append)
    assert repeats_seen == [0, 1, 2]
    assert log == (["a"] * 3 + ["b"] * 3) * 3  # per repeat: a's warm-up and runs, then b's
    assert list(samples) == ["a", "b"]
    assert samples["a"] == [pytest.approx([ms] * 2) for ms in (11.0, 12.0, 13.0)]
    assert samples["b"] == [pytest.approx([ms] * 2) for ms in (31.0, 32.0, 33.0)]


def test_cells_are_medians_of_repeat_means_and_ratios_medians_of_per_repeat_ratios():
    row = BenchRow("m", "cpu", samples={
        "recorded": [[10.0, 12.0], [30.0, 30.0], [20.0, 20.0]],   # repeat means 11, 30, 20
        "eager": [[22.0], [40.0], [20.0]],
        "onnxruntime": [[5.0], [10.0], [20.0]],
    })
    assert row.repeat_means("recorded") == [11.0, 30.0, 20.0]
    assert row.cell("recorded") == Spread(20.0, 11.0, 30.0)
    assert row.recorded_ms == 20.0 and row.onnxruntime_ms == 10.0
    # per-repeat ratios 11/5, 30/10, 20/20 = 2.2, 3.0, 1.0 -> median 2.2; the ratio of the
    # medians (20 / 10 = 2.0) pairs figures from different repeats and is not what is reported
    assert row.ratio("recorded", "onnxruntime") == Spread(pytest.approx(2.2), 1.0, 3.0)
    assert row.vs_onnxruntime == pytest.approx(2.2)
    assert row.decoupling_gain == pytest.approx(0.75 - 1.0)  # recorded/eager: 0.5, 0.75, 1.0
    assert row.cell("ncnn") is None and row.ratio("recorded", "ncnn") is None


def _rows():
    return [BenchRow("squeezenet1_1", "cpu", device="NumPy", prepare_ms=5.0, pool_mib=1.0, naive_mib=2.0,
                     rel_errors={"recorded": 1e-6},
                     samples={"recorded": [[4.0], [6.0], [5.0]], "eager": [[8.0], [9.0], [7.0]],
                              "onnxruntime": [[2.0], [3.0], [2.5]]}),
            BenchRow("squeezenet1_1", "gl", note="failed: RuntimeError: no context")]


def test_table_says_protocol_and_shows_median_spread_and_ratios():
    text = format_table(_rows(), threads=2, runs=7, warmup=1, repeats=3)
    assert "median over 3 repeats (min-max)" in text and "mean of 7 runs" in text
    cpu = next(line for line in text.splitlines() if line.startswith("squeezenet1_1  cpu"))
    assert "5.0 (4.0-6.0)" in cpu and "8.0 (7.0-9.0)" in cpu and "2.5 (2.0-3.0)" in cpu
    assert "2.00 (2.00-2.00)" in cpu  # recorded/ORT per repeat: 2, 2, 2
    gl = next(line for line in text.splitlines() if " gl " in line)
    assert gl.count(" - ") >= 3 and "failed: RuntimeError" in gl


def test_batched_rows_add_a_batch_column_and_items_per_second_beside_onnxruntime():
    rows = [BenchRow("resnet18", "cpu", batch=8, samples={"recorded": [[100.0], [80.0]], "onnxruntime": [[200.0], [160.0]]}),
            BenchRow("resnet18", "cpu", samples={"recorded": [[10.0], [10.0]], "onnxruntime": [[20.0], [20.0]]})]
    assert rows[0].throughput("recorded") == Spread(90.0, 80.0, 100.0)  # 8 items in 100 ms and in 80 ms
    assert rows[0].label == "resnet18 x8" and rows[1].label == "resnet18"
    text = format_table(rows, threads=2, repeats=2, series=("recorded", "onnxruntime"), ratios=(("recorded", "onnxruntime"),))
    assert "batch 1/8, 2 CPU thread(s)" in text and "items/s: batch / a repeat's mean" in text
    header = next(line for line in text.splitlines() if line.startswith("model"))
    assert "batch" in header and "recorded items/s" in header and "ORT items/s" in header
    line = next(line for line in text.splitlines() if line.split()[:3] == ["resnet18", "cpu", "8"])
    assert "90 (80-100)" in line and "45 (40-50)" in line
    assert rows_as_dicts(rows)[0]["items_per_second"]["onnxruntime"]["median"] == 45.0
    assert "items/s" not in format_table(rows[1:], threads=2)  # batch 1 alone: the paper's table


def test_json_rows_keep_raw_samples_and_cells():
    (cpu, gl) = rows_as_dicts(_rows())
    assert cpu["samples"]["recorded"] == [[4.0], [6.0], [5.0]]
    assert cpu["cells"]["recorded"] == {"median": 5.0, "low": 4.0, "high": 6.0}
    assert cpu["ratios"]["recorded/onnxruntime"]["median"] == 2.0 and cpu["vs_onnxruntime"] == 2.0
    assert gl["cells"] == {} and gl["recorded_ms"] is None


def test_png_writes_latency_and_ratio_charts(tmp_path):
    pytest.importorskip("matplotlib", reason="charts need matplotlib (the bench and dev extras install it)")
    from gpumnn.tools.charts import write_charts
    rows = _rows() + [BenchRow("resnet18", "cpu", samples={"recorded": [[40.0]], "onnxruntime": [[20.0]]})]
    paths = write_charts(rows, tmp_path / "png", ("recorded", "eager", "onnxruntime"))
    names = sorted(p.name for p in paths)
    assert names == ["latency_resnet18.png", "latency_squeezenet1_1.png", "ratios.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_missing_matplotlib_is_a_clear_error(monkeypatch):
    import builtins

    from gpumnn.tools import charts as bench_charts
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.split(".")[0] == "matplotlib":
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(bench_charts.ChartsUnavailable, match=r"pip install 'gpumnn\[bench\]'"):
        bench_charts.require_matplotlib()


def test_the_cpu_profile_matches_onnxruntimes_fused_nodes_to_ours():
    """``bench/cpu_profile.py --ort``: ONNX Runtime names a fused node after its last part; the
    profile finds the op of ours it stands for up the model's producers (or by name, without the
    suffixes of fusion and layout), and keeps the name of a node that stands for none."""
    from conftest import bench_script

    cpu_profile = bench_script("cpu_profile")
    ours = {"layer1.0.conv1", "layer1.0.conv2", "layer1.0.add", "Mixed_5b.branch1x1.conv", "fc"}
    found = cpu_profile.ours_of("resnet18", ["layer1.0.relu1", "layer1.0.bn2", "fc", "ReorderOutput"], ours)
    assert found == {"layer1.0.relu1": "layer1.0.conv1", "layer1.0.bn2": "layer1.0.conv2", "fc": "fc",
                     "ReorderOutput": "ReorderOutput"}
    assert cpu_profile.plain_name("Mixed_5b.branch1x1.relu") == cpu_profile.plain_name("Mixed_5b.branch1x1.conv")


def test_the_quantized_models_bench_measures_a_tiny_int4_model(tmp_path):
    """``bench/quantized.py`` on a MatMul -> Relu -> MatMul model that MatMulNBitsQuantizer makes
    int4, on the cpu, one repeat of one run: the figures of a row are there and say what they should
    (gpumnn agrees with ONNX Runtime to float32 rounding; the file's weights shrink, the device's do
    not, since the weights are dequantized at load, and no op dequantizes at run time)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from conftest import bench_script

    quantized = bench_script("quantized")
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)
               for name, shape in (("w1", (64, 32)), ("w2", (32, 8)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 64))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8))], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    case = quantized.make_case("mlp/int4", tmp_path, float_model=model)
    assert {n.op_type for n in onnx.load(case.quantized_path).graph.node} == {"MatMulNBits", "Relu"}
    rows = quantized.measure(case, ["cpu"], threads=1, runs=1, warmup=1, repeats=1, pause=0.0)
    assert len(rows) == 1
    row = rows[0]
    assert row.note == "" and row.err_unfused < 1e-5 and row.err_fused < 1e-4
    float_bytes = (64 * 32 + 32 * 8) * 4
    assert row.file_bytes[0] == float_bytes and row.file_bytes[1] < float_bytes / 4
    assert row.device_bytes == (float_bytes, float_bytes)
    assert 2 == row.ops[0] <= row.ops[1] <= 3  # no dequantizing op at run time: the MatMuls, and the Relu if not fused
    assert [len(r) for r in row.samples["gpumnn"]] == [1] and [len(r) for r in row.samples["onnxruntime"]] == [1]
    table = quantized.format_table(rows, threads=1, runs=1, warmup=1, repeats=1)
    line = next(text for text in table.splitlines() if text.startswith("mlp/int4"))
    assert "cpu" in line and "0.01 -> 0.00" in line and row.ratio() is not None


def test_the_requantization_bench_compares_the_epilogues_on_the_same_sums():
    """``bench/requantize.py``: the float epilogue is the engine's (``int8_conv.quantized_conv_reference``'s
    arithmetic); the Q31 multiplier and shift give back the float32 multiplier exactly; the one-rounding
    fixed point is the exact rounding (ties aside) and gemmlowp's two roundings within one step of it."""
    import numpy as np

    from conftest import bench_script

    requantize = bench_script("requantize")
    rng = np.random.default_rng(0)
    n = 2000
    multiplier = rng.uniform(1e-5, 0.9, n).astype(np.float32)
    pairs = [requantize.q31(m) for m in multiplier]
    integer = np.array([q for q, _ in pairs], np.int64)
    shift = np.array([s for _, s in pairs], np.int64)
    assert np.all(integer.astype(np.float64) * 2.0 ** -(31 + shift) == multiplier.astype(np.float64))
    acc = rng.integers(-(1 << 20), 1 << 20, n).astype(np.int32)
    args = dict(acc=acc, multiplier=multiplier, integer=integer, shift=shift, zero=-3, lo=-128, hi=127)
    exact = np.clip(np.rint(acc.astype(np.float64) * multiplier.astype(np.float64)) - 3, -128, 127)
    outputs = {}
    for name, loop in requantize.LOOPS.items():
        out = np.empty(n, np.int32)
        loop(out=out, **args)
        outputs[name] = out
    ours = np.clip(np.rint(acc.astype(np.float32) * multiplier) + np.float32(-3), -128, 127)
    assert np.array_equal(outputs["float"], ours)
    assert np.array_equal(outputs["single"], exact)
    assert np.abs(outputs["gemmlowp"] - exact).max() <= 1
    assert np.abs(outputs["float"] - exact).max() <= 1


def test_the_core_link_bench_times_hand_overs_between_two_cpus():
    """``bench/core_link.py``: two pinned threads hand a counter back and forth; the figure is a
    time per hand-over (no speed asserted), and the caller's CPU mask is as it was after."""
    import os

    from conftest import bench_script, require_tool
    from gpumnn.backends.cpu import jit as cpu_jit
    require_tool("numba", cpu_jit.MISSING)
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: nothing to hand over between")
    core_link = bench_script("core_link")
    mask = os.sched_getaffinity(0)
    ns = core_link.one_way_ns(rounds=3, count=2000)
    assert ns is not None and ns > 0
    assert os.sched_getaffinity(0) == mask
