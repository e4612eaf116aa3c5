"""Accuracy per precision (issue 30 part 3): every zoo model, each precision gpumnn runs, against
ONNX Runtime's float32 output on the same fresh random inputs.

    python bench/accuracy.py                                  # every zoo model and precision, cpu, 200 inputs
    python bench/accuracy.py --backends all --gpu-inputs 10   # and every GPU backend here, 10 inputs each
    python bench/accuracy.py --models resnet18 --precisions int8_static

The precisions:

- ``fp32``: the float model as it is;
- ``fp16``: the float model in a session with ``precision="fp16"`` (where the backend takes it);
- ``int8_dynamic``: the float model with ``precision="int8"`` (gpumnn's own dynamic quantization of
  MatMul weights, MNN's seed 004);
- ``int8_static``: the model ``onnxruntime.quantization.quantize_static`` makes (QDQ, int8
  activations, per-channel int8 weights, four random calibration inputs), run by gpumnn at
  float32; its yardstick column is ONNX Runtime running the same quantized model.

Per model, precision and backend: the relative L2 error of the first output (median and largest
over the inputs), the share of rows whose top-1 (argmax along the last axis) agrees with float32,
and the weights' bytes: in the model file, and the constants the session holds on its devices.
Nothing here asserts; ``tests/test_precision_accuracy.py`` holds every backend to bounds these
figures justify.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gpumnn, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))  # quantized.py, beside this script

import gpumnn  # noqa: E402
from gpumnn import zoo  # noqa: E402
from gpumnn.tools.benchmark import rel_l2, resolve_backends  # noqa: E402
from quantized import device_constant_bytes, initializer_bytes, make_case, onnxruntime_session  # noqa: E402

PRECISIONS = ("fp32", "fp16", "int8_dynamic", "int8_static")
MIB = 1 << 20


@dataclass
class Row:
    model: str
    precision: str
    backend: str
    inputs: int = 0
    errors: tuple[float, ...] = ()
    top1: float | None = None
    yardstick: tuple[float, ...] = ()  # ONNX Runtime on the quantized model, against its float32
    file_bytes: tuple[int, int] | None = None  # float model, the model this precision runs
    device_bytes: int | None = None
    note: str = ""


def top1_agreement(got: np.ndarray, ref: np.ndarray) -> tuple[int, int]:
    """(rows whose argmax along the last axis agrees, rows)."""
    got, ref = got.reshape(-1, got.shape[-1]), ref.reshape(-1, ref.shape[-1])
    return int(np.sum(got.argmax(axis=1) == ref.argmax(axis=1))), got.shape[0]


def inputs_of(model: onnx.ModelProto, count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """``count`` fresh standard-normal inputs in the model's input shape."""
    graph_input = model.graph.input[0]
    shape = tuple(d.dim_value for d in graph_input.type.tensor_type.shape.dim)
    rng = np.random.default_rng(seed)
    return [{graph_input.name: rng.standard_normal(shape).astype(np.float32)} for _ in range(count)]


def session_for(precision: str, float_model: onnx.ModelProto, static_model: onnx.ModelProto | None, backend: str,
                threads: int):
    model = static_model if precision == "int8_static" else float_model
    session_precision = {"fp16": "fp16", "int8_dynamic": "int8"}.get(precision, "fp32")
    return gpumnn.load(model).session(backend=backend, threads=threads, precision=session_precision)


def measure(name: str, precisions: list[str], backends: list[str], count: int, gpu_count: int, threads: int,
            cache: Path) -> list[Row]:
    float_model = zoo.build(name)
    feeds = inputs_of(float_model, max(count, gpu_count), seed=30)
    reference = onnxruntime_session(float_model.SerializeToString(), threads, fused=True)
    refs = [reference.run(None, feed)[0] for feed in feeds]
    static_model, yardstick = None, ()
    if "int8_static" in precisions:
        static_model = onnx.load(make_case(f"{name}/qdq_s8", cache, float_model).quantized_path)
        ort_static = onnxruntime_session(static_model.SerializeToString(), threads, fused=True)
        yardstick = tuple(rel_l2(ort_static.run(None, feed)[0], ref) for feed, ref in zip(feeds[:count], refs))
    rows = []
    for precision in precisions:
        for backend in backends:
            n = count if backend == "cpu" else gpu_count
            row = Row(name, precision, backend, n)
            rows.append(row)
            try:
                with session_for(precision, float_model, static_model, backend, threads) as sess:
                    agree = total = 0
                    errors = []
                    for feed, ref in zip(feeds[:n], refs[:n]):
                        got = sess.run(feed)[sess.program.outputs[0]]
                        errors.append(rel_l2(got, ref))
                        a, t = top1_agreement(got, ref)
                        agree, total = agree + a, total + t
                    row.errors, row.top1 = tuple(errors), agree / total
                    row.device_bytes = device_constant_bytes(sess)
            except (gpumnn.GpumnnError, ValueError) as exc:
                row.note = f"{type(exc).__name__}: {exc}".splitlines()[0][:120]
            model = static_model if precision == "int8_static" else float_model
            row.file_bytes = (initializer_bytes(float_model), initializer_bytes(model))
            if precision == "int8_static":
                row.yardstick = yardstick[:n]
            print(format_row(row), flush=True)
    return rows


def format_row(row: Row) -> str:
    if not row.errors:
        return f"| {row.model} | {row.precision} | {row.backend} | - | - | - | - | - | - | {row.note} |"
    yard = f"{statistics.median(row.yardstick):.2e} / {max(row.yardstick):.2e}" if row.yardstick else "-"
    files = f"{row.file_bytes[0] / MIB:.2f} -> {row.file_bytes[1] / MIB:.2f}" if row.file_bytes else "-"
    return (f"| {row.model} | {row.precision} | {row.backend} | {row.inputs} | {statistics.median(row.errors):.2e} | "
            f"{max(row.errors):.2e} | {100 * row.top1:.1f}% | {yard} | {files} | "
            f"{row.device_bytes / MIB:.2f} | {row.note} |")


HEADER = ("| model | precision | backend | inputs | rel. L2 median | rel. L2 max | top-1 agrees | ORT on the same "
          "model (median / max) | file MiB float -> run | device weights MiB | note |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=zoo.names(), choices=zoo.names())
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--backends", nargs="+", default=["cpu"], help="backends, or 'all' (every one here)")
    parser.add_argument("--inputs", type=int, default=200, help="fresh random inputs per model on the cpu")
    parser.add_argument("--gpu-inputs", type=int, default=10, help="inputs per model on the other backends")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "gpumnn-quantized",
                        help="where the quantized models are kept between runs")
    args = parser.parse_args(argv)
    backends, skipped = resolve_backends(args.backends)
    for name, reason in skipped.items():
        print(f"{name}: skipped ({reason})", flush=True)
    print(HEADER, flush=True)
    for name in args.models:
        measure(name, args.precisions, backends, args.inputs, args.gpu_inputs, args.threads, args.cache)


if __name__ == "__main__":
    main()
