"""The paper's Table 1 (convolution schemes) and Table 3 (Strassen) on every backend here.

Table 1: (kernel, in channels, out channels, input size) = (2, 3, 16, 224), (2, 512, 512, 16),
(3, 64, 64, 112), batch 1, stride 1, padding (k - 1) // 2; schemes: the sliding window,
Winograd with the smallest tile (WinoMin, F(2x2, kxk)), with the largest tile we allow
(WinoMax), and the scheme step's own choice (Ours). Table 3: [a, b] x [b, c] for the paper's
sizes, a plain GEMM against Strassen (the levels Eq. 9 gives, at least one).

Every variant of one setting is a session prepared once; the variants are timed in alternation
(one run of each, repeated), so machine noise hits them alike; the figure is the median of the
repeats in milliseconds with the spread (min-max) after it. Outputs are checked against the
first variant's (relative L2).

Models (``--models``): each zoo model as the scheme step plans it (Ours), with every convolution
forced to the sliding window (one kernel each: Sliding) and with every 3x3 convolution forced to
F(2x2, 3x3) (WinoMin, the smallest Winograd tile); per variant the ms (the mean of ``--runs`` runs)
and the atomic ops a run submits, so a rewrite's extra launches are weighed against the
multiplications it saves on the device at hand.

    python bench/schemes.py [--backends cpu,opencl] [--repeats 5] [--tables 1,3] [--json]
    python bench/schemes.py --tables m --models resnet18 squeezenet1_1 --backends cuda
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpumnn  # noqa: E402
from gpumnn.tools.benchmark import Spread, alternate, rel_l2  # noqa: E402
from gpumnn.scheduler import schemes  # noqa: E402

TABLE1 = [(2, 3, 16, 224), (2, 512, 512, 16), (3, 64, 64, 112)]
TABLE3 = [(256, 256, 256), (512, 512, 512), (512, 512, 1024), (1024, 1024, 1024)]


def conv_model(k: int, ic: int, oc: int, size: int) -> onnx.ModelProto:
    rng = np.random.default_rng(k * 1000 + ic)
    w = (rng.standard_normal((oc, ic, k, k)) / np.sqrt(ic * k * k)).astype(np.float32)
    b = rng.standard_normal(oc).astype(np.float32) * 0.1
    p = (k - 1) // 2
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[p, p, p, p])
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ic, size, size])],
                              [helper.make_empty_tensor_value_info("y")],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def matmul_model(a: int, b: int, c: int) -> onnx.ModelProto:
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="matmul")
    graph = helper.make_graph([node], "matmul", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [a, b]),
                                                 helper.make_tensor_value_info("b", TensorProto.FLOAT, [b, c])],
                              [helper.make_empty_tensor_value_info("y")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _session(model: onnx.ModelProto, backend: str, **force):
    with schemes.forced_schemes(**force):
        return gpumnn.load(model).session(backend=backend, fallback=False)


def time_alternating(sessions: dict, feeds: dict, repeats: int, runs: int = 1) -> dict:
    """{variant: (median ms, min ms, max ms, relative L2 to the first variant)}: the mean of
    ``runs`` runs of each variant per repeat (:func:`gpumnn.tools.benchmark.alternate`), after one
    untimed run of each."""
    outputs = {name: next(iter(s.run(feeds).values())) for name, s in sessions.items()}  # warm-up and answers
    first = next(iter(outputs.values()))
    samples = alternate({name: (lambda s=s: s.run(feeds)) for name, s in sessions.items()}, repeats, runs=runs, warmup=0)
    cells = {name: Spread.of([float(np.mean(times)) for times in repeats_]) for name, repeats_ in samples.items()}
    return {name: (c.median, c.low, c.high, rel_l2(outputs[name], first)) for name, c in cells.items()}


def table1(backend: str, repeats: int) -> list[dict]:
    rows = []
    for k, ic, oc, size in TABLE1:
        tiles = schemes.winograd_tiles(k)
        model = conv_model(k, ic, oc, size)
        sessions = {"Sliding": _session(model, backend, conv=("im2col", 0)),
                    f"WinoMin F({tiles[0]})": _session(model, backend, conv=("winograd", tiles[0])),
                    f"WinoMax F({tiles[-1]})": _session(model, backend, conv=("winograd", tiles[-1])),
                    "Ours": _session(model, backend)}
        ours = sessions["Ours"].program.decisions[0]
        x = np.random.default_rng(0).standard_normal((1, ic, size, size)).astype(np.float32)
        result = time_alternating(sessions, {"x": x}, repeats)
        rows.append({"setting": (k, ic, oc, size), "ours": f"{ours.scheme} {ours.detail.split(' (')[0]}".strip(),
                     "times": result})
        for s in sessions.values():
            s.close()
    return rows


def table3(backend: str, repeats: int) -> list[dict]:
    rows = []
    for a, b, c in TABLE3:
        model = matmul_model(a, b, c)
        levels = max(1, schemes.strassen_levels(a, c, b))
        ours = _session(model, backend)
        sessions = {"w/o Strassen": _session(model, backend, strassen=0),
                    f"w/ Strassen ({levels} level{'s' * (levels > 1)})": _session(model, backend, strassen=levels)}
        chosen = ours.program.decisions[0]
        ours.close()
        rng = np.random.default_rng(1)
        feeds = {"a": rng.standard_normal((a, b)).astype(np.float32), "b": rng.standard_normal((b, c)).astype(np.float32)}
        result = time_alternating(sessions, feeds, repeats)
        rows.append({"setting": (a, b, c), "ours": f"{chosen.scheme} {chosen.detail.split(' (')[0]}".strip(),
                     "times": result})
        for s in sessions.values():
            s.close()
    return rows


def table_models(backend: str, models: list[str], repeats: int, runs: int, on_row=None) -> list[dict]:
    from gpumnn.tools.benchmark import load_model
    rows = []
    for name in models:
        _, model, feeds = load_model(name)
        sessions = {"Ours": _session(model, backend), "Sliding": _session(model, backend, conv=("im2col", 0)),
                    "WinoMin F(2)": _session(model, backend, conv=("winograd", 2))}
        result = time_alternating(sessions, feeds, repeats, runs)
        ops = {variant: len(s.program.ops) for variant, s in sessions.items()}
        rows.append({"setting": name, "ours": ", ".join(f"{v} {n} ops" for v, n in ops.items()), "times": result})
        for s in sessions.values():
            s.close()
        if on_row is not None:  # as each model ends, so a run cut short keeps what it measured
            on_row(rows[-1])
    return rows


def _print(title: str | None, backend: str, rows: list[dict]) -> None:
    if title is not None:
        print(f"\n{title} on {backend}: median ms (min-max) over alternating repeats; [rel. L2 vs first]", flush=True)
    for row in rows:
        cells = "  ".join(f"{name} {med:.3g} ({lo:.3g}-{hi:.3g}) [{err:.0e}]"
                          for name, (med, lo, hi, err) in row["times"].items())
        print(f"  {row['setting']}: {cells}   -> ours: {row['ours']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(b for b in gpumnn.available_backends() if b != "cuda"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tables", default="1,3", help="1, 3 and m (models), comma-separated")
    parser.add_argument("--models", nargs="+", default=["resnet18", "squeezenet1_1"], help="zoo models for table m")
    parser.add_argument("--runs", type=int, default=10, help="runs per figure in table m")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = {}
    for backend in args.backends.split(","):
        if backend not in gpumnn.available_backends():
            print(f"\n{backend}: not available here")
            continue
        entry = {}
        if "1" in args.tables:
            entry["table1"] = table1(backend, args.repeats)
            if not args.json:
                _print("Table 1 (convolution schemes)", backend, entry["table1"])
        if "3" in args.tables:
            entry["table3"] = table3(backend, args.repeats)
            if not args.json:
                _print("Table 3 (Strassen)", backend, entry["table3"])
        if "m" in args.tables:
            if not args.json:
                _print("Models: the scheme step's choice, every convolution sliding, every 3x3 F(2x2, 3x3)", backend, [])
            entry["models"] = table_models(backend, args.models, args.repeats, args.runs,
                                           on_row=None if args.json else (lambda row: _print(None, backend, [row])))
        report[backend] = entry
    if args.json:
        print(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
