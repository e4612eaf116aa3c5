"""Load time of the largest zoo models with and without opset conversion (onnx_opsets.upgrade).

Each model is saved twice: as the zoo builds it (opset 17) and as an opset-9 exporter would write
it. ``gpumnn.load`` of each file is timed (median of ``--repeats``), and so are the conversion step
alone and, for comparison, ``onnx.version_converter`` on the whole opset-9 model, weights included
(what the weightless view avoids). The outputs of the two loads are compared on the cpu backend.

Why "as an exporter would write it" and not the converter: ``onnx.version_converter`` has no
down-adapters for BatchNormalization-15/14, Relu-14/13 or Identity-16, so it cannot take these
models below opset 13; every op they use (Conv, BatchNormalization, Relu, MaxPool, AveragePool,
GlobalAveragePool, Concat, Add, Flatten, Gemm) reads the same at opset 9 with the attributes they
set (``ceil_mode=0``, the only one opset 9 lacks, is dropped), so the model is relabelled and the
full checker confirms it is a valid opset-9 model.

    .venv/bin/python bench/load_conversion.py --models resnet50 inception_v3 --repeats 7
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import version_converter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpumnn  # noqa: E402
from gpumnn import zoo  # noqa: E402
from gpumnn.tools.benchmark import time_runs  # noqa: E402
from gpumnn.frontend.opsets import upgrade  # noqa: E402


def as_opset9(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model relabelled to opset 9 (IR 4), checked by the full ONNX checker (see the docstring)."""
    old = onnx.ModelProto()
    old.CopyFrom(model)
    old.opset_import[0].version = 9
    old.ir_version = 4
    for node in old.graph.node:
        for attr in list(node.attribute):
            if attr.name == "ceil_mode":
                if attr.i:
                    raise ValueError(f"{node.name} uses ceil_mode, which opset 9 lacks")
                node.attribute.remove(attr)
    onnx.checker.check_model(old, full_check=True)
    return old


def median_ms(fn, repeats: int) -> float:
    """Median of ``repeats`` timed calls, none untimed (the first load is part of what is measured)."""
    return statistics.median(time_runs(fn, runs=repeats, warmup=0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet50", "inception_v3"])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model = zoo.build(name)
            new, old = Path(tmp, f"{name}.onnx"), Path(tmp, f"{name}_opset9.onnx")
            onnx.save(model, new)
            onnx.save(as_opset9(model), old)
            old_proto = onnx.load(old)
            load_new = median_ms(lambda: gpumnn.load(new), args.repeats)
            load_old = median_ms(lambda: gpumnn.load(old), args.repeats)
            convert = median_ms(lambda: upgrade(old_proto), args.repeats)
            read = median_ms(lambda: onnx.load(old), args.repeats)
            whole = median_ms(lambda: version_converter.convert_version(old_proto, 11), max(1, args.repeats // 2))
            x = np.random.default_rng(0).standard_normal(zoo.input_shape(name)).astype(np.float32)
            a = gpumnn.load(new).session("cpu").run({"input": x})["output"]
            b = gpumnn.load(old).session("cpu").run({"input": x})["output"]
            print(f"{name} ({new.stat().st_size / 1e6:.0f} MB), median of {args.repeats}: gpumnn.load at opset "
                  f"{model.opset_import[0].version} {load_new:.0f} ms, at opset 9 {load_old:.0f} ms (of which the "
                  f"conversion {convert:.0f} ms); onnx.load {read:.0f} ms; version_converter on the whole model "
                  f"{whole:.0f} ms; outputs differ by {float(np.abs(a - b).max()):.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
