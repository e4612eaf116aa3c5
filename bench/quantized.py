"""Quantized and float16 models on every backend, beside ONNX Runtime (issue 28's closing figures).

    python bench/quantized.py                                  # every model, every backend here
    python bench/quantized.py --models squeezenet1_1/qdq_s8 --backends cpu --repeats 3
    python bench/quantized.py --profile                        # and where a cpu run spends its time
    python bench/quantized.py --models resnet18/qdq_s8_folded mobilenet_v2/qdq_s8_folded --backends cpu \
        --repeats 7 --runs 10 --own-float                      # static int8 on the cpu (issue 30)

The models are made here from zoo models by ``onnxruntime.quantization`` (cached under the temp
dir, ``--cache``): ``quantize_static`` in QDQ form with int8 activations and per-channel weights
(``qdq_s8``; ``qdq_s8_folded`` after ONNX Runtime's pre-processing folds BatchNormalization into the
convolutions, the form its int8 kernels take whole) or uint8 activations and per-tensor weights
(``qdq_u8``), in QOperator form
(``qoperator``), ``quantize_dynamic`` (``dynamic``), ``MatMulNBitsQuantizer``'s int4 MatMulNBits
in blocks of 32 (``int4``), and a float16 model with float16 inputs, weights, intermediates and
output (``float16``, by ``gpumnn.zoo.with_float16``: as ONNX Runtime's CPU kernels run it, each
node in float32 between casts). Per model and backend the table gives:

- agreement: the relative L2 error of gpumnn's output against ONNX Runtime's unfused path
  (``ORT_DISABLE_ALL``, what the tests hold gpumnn to) and, for information, its default fused path;
  where the output is dequantized, the largest difference in the output's quantization steps; and, as
  a yardstick, ONNX Runtime's fused path against its unfused one (one step's flip in a hidden layer
  moves the output by more than one step in a deep model, in either engine);
- the weights' bytes: the model file's initializers, float model -> quantized model, and the
  constants the session holds on its devices (every upload of its backends, cpu fallbacks included),
  float model -> quantized model;
- the atomic ops of the float model's program -> the quantized model's;
- session creation: load, session and the first run (which prepares: lowering, placement, uploads);
- run time in the paper's protocol (batch 1, one warm-up, the mean of ``--runs`` runs), gpumnn and
  ONNX Runtime's default path on the same quantized model in alternation, ``--repeats`` times:
  medians with their min-max spread, and the median of the per-repeat ratios.

``--profile`` adds, per model on the cpu, the time of each op in a recorded run
(bench/cpu_profile.py) summed by the ONNX op of the node it was lowered from: the share that the
quantization nodes' float ops (QuantizeLinear, DequantizeLinear, ...) take. Nothing here asserts speed.
"""
from __future__ import annotations

import argparse
import collections
import copy
import logging
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gpumnn, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))  # cpu_profile, beside this script

import gpumnn  # noqa: E402
from gpumnn import zoo  # noqa: E402
from gpumnn.tools.benchmark import (Spread, add_protocol_arguments, alternate, rel_l2,  # noqa: E402
                                    resolve_backends)

MIB = 1 << 20
#: ONNX ops whose lowering is the quantization arithmetic itself (scale, round, clip, shift)
QUANTIZATION_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}


# -- the models ---------------------------------------------------------------------------------------

def _calibration(input_name: str, shape: tuple[int, ...], count: int = 4):
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(4)
            self.batches = iter([{input_name: rng.standard_normal(shape).astype(np.float32)} for _ in range(count)])

        def get_next(self):
            return next(self.batches, None)
    return Reader()


def _static(fmt: str, activations: str, per_channel: bool) -> Callable[[Path, Path], None]:
    def make(source: Path, target: Path) -> None:
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

        model = onnx.load(source)
        shape = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
        quantize_static(source, target, _calibration(model.graph.input[0].name, shape), quant_format=QuantFormat[fmt],
                        activation_type=QuantType[activations], weight_type=QuantType.QInt8, per_channel=per_channel)
    return make


def _folded_static(source: Path, target: Path) -> None:
    """ONNX Runtime's pre-processing first (``quant_pre_process``: BatchNormalization folded into the
    convolutions, as an exported inference model has it), then ``quantize_static`` in QDQ form with
    int8 activations and per-channel int8 weights: the model ONNX Runtime's documentation asks for."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    folded = target.with_suffix(".folded.onnx")
    quant_pre_process(str(source), str(folded), skip_symbolic_shape=True)
    _static("QDQ", "QInt8", True)(folded, target)
    folded.unlink()


def _dynamic(source: Path, target: Path) -> None:
    from onnxruntime.quantization import quantize_dynamic

    quantize_dynamic(source, target)


def _int4(source: Path, target: Path) -> None:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    quantizer = MatMulNBitsQuantizer(onnx.load(source), bits=4, block_size=32)
    quantizer.process()
    onnx.save(quantizer.model.model, target)


def _float16(source: Path, target: Path) -> None:
    onnx.save(zoo.with_float16(onnx.load(source)), target)


#: the ways of making a quantized (or float16) model from a float one: (label, maker)
FORMS: dict[str, tuple[str, Callable[[Path, Path], None]]] = {
    "qdq_s8": ("QDQ, int8 activations, per-channel int8 weights", _static("QDQ", "QInt8", True)),
    "qdq_s8_folded": ("BatchNormalization folded (quant_pre_process), then QDQ, int8 activations, per-channel int8 "
                      "weights", _folded_static),
    "qdq_u8": ("QDQ, uint8 activations, per-tensor int8 weights", _static("QDQ", "QUInt8", False)),
    "qoperator": ("QOperator, uint8 activations, per-channel int8 weights", _static("QOperator", "QUInt8", True)),
    "dynamic": ("quantize_dynamic (int8 weights, uint8 activations at run time)", _dynamic),
    "int4": ("MatMulNBitsQuantizer: int4 MatMulNBits, blocks of 32", _int4),
    "float16": ("float16 inputs, weights, intermediates and output", _float16),
}
#: the figures' models: zoo model / form
DEFAULT_MODELS = ("squeezenet1_1/qdq_s8", "squeezenet1_1/qdq_u8", "squeezenet1_1/qoperator", "mobilenet_v2/qdq_s8",
                  "mobilenet_v2/qdq_u8", "transformer_encoder/dynamic", "transformer_encoder/int4",
                  "squeezenet1_1/float16")


@dataclass
class Case:
    """A float model and its quantized (or float16) version, both as files."""

    name: str
    float_path: Path
    quantized_path: Path


def make_case(name: str, cache: Path, float_model: onnx.ModelProto | None = None) -> Case:
    """``name`` is ``ZOO_MODEL/FORM`` (``float_model`` given: any base name): the float model and its
    quantized version under ``cache``, made once."""
    base, form = name.split("/")
    cache.mkdir(parents=True, exist_ok=True)
    float_path, quantized_path = cache / f"{base}.onnx", cache / f"{base}.{form}.onnx"
    if not float_path.exists():
        onnx.save(float_model if float_model is not None else zoo.build(base), float_path)
    if not quantized_path.exists():
        logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice on pre-processing
        partial = quantized_path.with_suffix(".partial.onnx")
        FORMS[form][1](float_path, partial)
        partial.replace(quantized_path)
    return Case(name, float_path, quantized_path)


# -- the figures --------------------------------------------------------------------------------------

@dataclass
class Row:
    model: str
    backend: str
    err_unfused: float | None = None
    err_fused: float | None = None
    steps_unfused: float | None = None  # max |gpumnn - ORT unfused| in steps of the output's DequantizeLinear
    ort_fused_vs_unfused: float | None = None
    file_bytes: tuple[int, int] | None = None  # float model, quantized model
    device_bytes: tuple[int, int] | None = None
    ops: tuple[int, int] | None = None
    create_s: float | None = None
    samples: dict[str, list[list[float]]] = field(default_factory=dict)
    note: str = ""

    def cell(self, series: str) -> Spread | None:
        runs = self.samples.get(series)
        return Spread.of([statistics.mean(r) for r in runs]) if runs else None

    def ratio(self, over: str = "onnxruntime", series: str = "gpumnn") -> Spread | None:
        """The median (min-max) of the per-repeat ratios ``series`` / ``over`` of mean run times."""
        if not self.samples.get(series) or not self.samples.get(over):
            return None
        return Spread.of([statistics.mean(a) / statistics.mean(b)
                          for a, b in zip(self.samples[series], self.samples[over])])


def initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the model's weights as stored (4-bit tensors two to a byte)."""
    total = 0
    for t in model.graph.initializer:
        count = int(np.prod(t.dims)) if t.dims else 1
        total += (count + 1) // 2 if t.data_type in (TensorProto.INT4, TensorProto.UINT4) else \
            count * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return total


def device_constant_bytes(session) -> int:
    """Bytes of the constants the session has uploaded, on all of its backends."""
    return sum(m["constant_bytes"] for m in session.memory_summary().values())


def output_step(model: onnx.ModelProto) -> float | None:
    """The scale of the DequantizeLinear that produces the graph's first output, if a constant one does."""
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.output[0] == model.graph.output[0].name:
            scale = constants.get(node.input[1])
            return float(scale) if scale is not None and scale.size == 1 else None
    return None


def onnxruntime_session(model_bytes: bytes, threads: int, fused: bool):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    if not fused:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def feed_of(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """One seeded standard-normal input in the model's input dtype."""
    graph_input = model.graph.input[0]
    shape = tuple(d.dim_value for d in graph_input.type.tensor_type.shape.dim)
    dtype = helper.tensor_dtype_to_np_dtype(graph_input.type.tensor_type.elem_type)
    return {graph_input.name: np.random.default_rng(0).standard_normal(shape).astype(dtype)}


def _float_figures(path: Path, backend: str, threads: int, known: dict) -> tuple[int, int]:
    """(device constant bytes, atomic ops) of the float model's session on ``backend``, once per model."""
    key = (path, backend)
    if key not in known:
        model = onnx.load(path)
        with gpumnn.load(model).session(backend=backend, threads=threads) as session:
            session.run(feed_of(model))
            known[key] = (device_constant_bytes(session), len(session.program.ops))
    return known[key]


def _float_path_session(model: onnx.ModelProto, backend: str, threads: int, feed):
    """A session of the quantized ``model`` lowered in float, as before static int8 (issue 30) and
    as the GPU APIs run it: its shape set prepared while the scheme backend is said to lack
    QuantizedConv2D."""
    from gpumnn.runtime import shape_set

    decide = shape_set.lowers_static_int8
    shape_set.lowers_static_int8 = lambda backend: False
    try:
        session = gpumnn.load(model).session(backend=backend, threads=threads)
        session.run(feed)
    finally:
        shape_set.lowers_static_int8 = decide
    assert not any(type(op).__name__ == "QuantizedConv2D" for op in session.program.ops)
    return session


def measure(case: Case, backends: list[str], threads: int, runs: int, warmup: int, repeats: int, pause: float,
            float_known: dict | None = None, on_step: Callable[[str], None] = lambda _: None,
            own_float: bool = False, clock: Callable[[], float] = time.perf_counter) -> list[Row]:
    """One row per backend for ``case``; a backend that fails gets a row with the error as its note.
    ``own_float``: gpumnn on the float model and on the quantized model lowered in float join the
    alternation (series "gpumnn fp32", "gpumnn float path"). ``clock``: what a run's time is read from."""
    float_known = {} if float_known is None else float_known
    model = onnx.load(case.quantized_path)
    model_bytes = model.SerializeToString()
    feed = feed_of(model)
    unfused = onnxruntime_session(model_bytes, threads, fused=False).run(None, feed)[0]
    fused_session = onnxruntime_session(model_bytes, threads, fused=True)
    fused = fused_session.run(None, feed)[0]
    file_bytes = (initializer_bytes(onnx.load(case.float_path)), initializer_bytes(model))
    step = output_step(model)
    rows = []
    for backend in backends:
        row = Row(case.name, backend, file_bytes=file_bytes, ort_fused_vs_unfused=rel_l2(fused, unfused))
        rows.append(row)
        on_step(f"{case.name} on {backend}")
        session = float_session = float_path_session = None
        try:
            start = time.perf_counter()
            session = gpumnn.load(model).session(backend=backend, threads=threads)
            got = next(iter(session.run(feed).values()))
            row.create_s = time.perf_counter() - start
            row.err_unfused, row.err_fused = rel_l2(got, unfused), rel_l2(got, fused)
            if step is not None:
                row.steps_unfused = float(np.abs(got.astype(np.float64) - unfused).max()) / step
            float_bytes, float_ops = _float_figures(case.float_path, backend, threads, float_known)
            row.device_bytes = (float_bytes, device_constant_bytes(session))
            row.ops = (float_ops, len(session.program.ops))
            fallbacks = sorted({r["fallback"] for r in session.report_rows() if r["fallback"]})
            if fallbacks:
                row.note = "cpu fallback: " + "; ".join(fallbacks)[:100]
            series = {"gpumnn": lambda: session.run(feed), "onnxruntime": lambda: fused_session.run(None, feed)}
            if own_float:  # gpumnn on the float model beside the quantized one, and the quantized one lowered in float
                float_session = gpumnn.load(onnx.load(case.float_path)).session(backend=backend, threads=threads)
                float_feed = feed_of(onnx.load(case.float_path))
                series["gpumnn fp32"] = lambda: float_session.run(float_feed)
                float_path_session = _float_path_session(model, backend, threads, feed)
                series["gpumnn float path"] = lambda: float_path_session.run(feed)
            row.samples = alternate(series, repeats, runs, warmup, pause=pause, clock=clock)
        except Exception as exc:  # one failing backend must not hide the others' figures
            row.note = f"failed: {type(exc).__name__}: {exc}"[:160]
        finally:
            for opened in (session, float_session, float_path_session):
                if opened is not None:
                    opened.close()
    return rows


def where_the_time_goes(case: Case, threads: int, runs: int) -> str:
    """The cpu's per-op medians of a recorded run summed by the ONNX op each atomic op was lowered from."""
    import cpu_profile

    model = onnx.load(case.quantized_path)
    op_type = {n.name: n.op_type for n in model.graph.node}
    rows, whole = cpu_profile.profile(str(case.quantized_path), threads, runs)
    by_node: dict[str, float] = collections.defaultdict(float)
    by_kind: dict[str, float] = collections.defaultdict(float)
    for kind, node, ms in rows:
        by_node[op_type.get(node, "(node not named in the model)")] += ms
        by_kind[kind] += ms
    total = sum(by_node.values())
    quantization = sum(ms for op, ms in by_node.items() if op in QUANTIZATION_OPS)
    nodes = ", ".join(f"{op} {ms / total:.0%}" for op, ms in sorted(by_node.items(), key=lambda kv: -kv[1])[:4])
    kinds = ", ".join(f"{kind} {ms / total:.0%}" for kind, ms in sorted(by_kind.items(), key=lambda kv: -kv[1])[:3])
    return (f"{case.name}: {len(rows)} ops, sum of per-op medians {total:.1f} ms (whole run {whole:.1f} ms); "
            f"quantization nodes {quantization / total:.0%}; by ONNX op: {nodes}; by atomic op: {kinds}")


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _pair(pair: tuple[int, int] | None, scale: float = MIB, spec: str = ".2f") -> str:
    return "-" if pair is None else f"{pair[0] / scale:{spec}} -> {pair[1] / scale:{spec}}"


def format_table(rows: list[Row], threads: int, runs: int, warmup: int, repeats: int) -> str:
    columns = [("model", lambda r: r.model), ("backend", lambda r: r.backend),
               ("err unfused", lambda r: _fmt(r.err_unfused, ".1e")), ("err fused", lambda r: _fmt(r.err_fused, ".1e")),
               ("steps", lambda r: _fmt(r.steps_unfused, ".0f")),
               ("ORT fused err", lambda r: _fmt(r.ort_fused_vs_unfused, ".1e")),
               ("file MiB", lambda r: _pair(r.file_bytes)), ("device MiB", lambda r: _pair(r.device_bytes)),
               ("ops", lambda r: "-" if r.ops is None else f"{r.ops[0]} -> {r.ops[1]}"), ("create s", lambda r: _fmt(r.create_s, ".2f")),
               ("gpumnn ms", lambda r: _fmt(r.cell("gpumnn"), ".1f")), ("ORT ms", lambda r: _fmt(r.cell("onnxruntime"), ".1f")),
               ("gpumnn/ORT", lambda r: _fmt(r.ratio(), ".2f"))]
    cells = [[fn(r) for _, fn in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _) in enumerate(columns)]

    def line(values, note=""):
        return ("  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths)))
                + f"  {note}").rstrip()
    header = line([h for h, _ in columns], "note")
    protocol = (f"batch 1, {threads} CPU thread(s) for both engines; each repeat times gpumnn then ONNX Runtime (default, "
                f"fused path) on the same quantized model ({warmup} warm-up, then the mean of {runs} runs); ms: median "
                f"over {repeats} repeats (min-max); gpumnn/ORT: median of per-repeat ratios (min-max); err: relative L2 "
                f"against ONNX Runtime unfused (ORT_DISABLE_ALL) and fused (default); steps: the largest difference from ORT unfused "
                f"in quantization steps of the output; ORT fused err: ONNX Runtime's fused path against its unfused one; file/device MiB and ops: float "
                f"model -> quantized model")
    lines = [protocol, header, "-" * len(header)] + [line(c, r.note) for c, r in zip(cells, rows)]
    own = [r for r in rows if r.samples.get("gpumnn fp32")]
    if own:
        lines += ["", "gpumnn in the same alternation: the quantized model (int8 where the backend has the kernels), "
                      "the float model (fp32), the quantized model lowered in float (float path, as before issue 30); "
                      "ms medians (min-max) and the medians of per-repeat ratios (min-max)",
                  f"{'model':<28} {'backend':<7} {'quantized ms':>22} {'fp32 ms':>22} {'float path ms':>22} "
                  f"{'fp32/quantized':>18} {'float path/quantized':>22}"]
        lines += [f"{r.model:<28} {r.backend:<7} {_fmt(r.cell('gpumnn'), '.1f'):>22} {_fmt(r.cell('gpumnn fp32'), '.1f'):>22}"
                  f" {_fmt(r.cell('gpumnn float path'), '.1f'):>22}"
                  f" {_fmt(r.ratio(over='gpumnn', series='gpumnn fp32'), '.2f'):>18}"
                  f" {_fmt(r.ratio(over='gpumnn', series='gpumnn float path'), '.2f'):>22}" for r in own]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                        help=f"ZOO_MODEL/FORM, FORM one of {', '.join(FORMS)} (default: {' '.join(DEFAULT_MODELS)})")
    parser.add_argument("--backends", nargs="+", default=["all"], help="backends, or 'all' that start here (default)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "gpumnn-bench-quantized",
                        help="where the quantized models are kept between runs")
    parser.add_argument("--profile", action="store_true", help="per model, where a recorded cpu run spends its time")
    parser.add_argument("--own-float", action="store_true",
                        help="time gpumnn on each float model too, in the same alternation (int8 against our own fp32)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time runs by the process's CPU time (time.process_time), which other jobs on the machine "
                             "do not move; fair between engines only on one thread (a pool's spinning threads count)")
    add_protocol_arguments(parser)
    parser.set_defaults(repeats=3)
    args = parser.parse_args(argv)
    backends, skipped = resolve_backends(args.backends)
    rows, float_known = [], {}
    cases = [make_case(name, args.cache) for name in args.models]
    for case in cases:
        rows += measure(case, backends, args.threads, args.runs, args.warmup, args.repeats, args.pause, float_known,
                        on_step=lambda label: print(f"... {label}", file=sys.stderr, flush=True), own_float=args.own_float,
                        clock=time.process_time if args.cpu_time else time.perf_counter)
    print(format_table(rows, args.threads, args.runs, args.warmup, args.repeats))
    for name, reason in skipped.items():
        print(f"{name}: not run ({reason})")
    if args.profile:
        print("\nwhere a recorded cpu run spends its time (per-op medians, summed by the ONNX op lowered):")
        for case in cases:
            print(where_the_time_goes(case, args.threads, args.runs))


if __name__ == "__main__":
    main()
