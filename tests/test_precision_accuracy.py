"""Accuracy per precision (issue 30 part 3) on every backend: zoo models at each lower precision
against ONNX Runtime's float32 output, within bounds that ``bench/accuracy.py`` justifies (its
largest relative L2 error over 200 fresh inputs on the cpu, with headroom: bench/RESULTS.md,
"Accuracy per precision"), and with the top-1 of float32."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from conftest import bench_script, onnxruntime_session, rel_l2, require_backend

#: (model, precision) -> (largest relative L2 error, least share of rows whose top-1 agrees)
BOUNDS = {
    ("squeezenet1_1", "int8_static"): (4.5e-2, 1.0),
    ("mobilenet_v2", "int8_static"): (9e-2, 1.0),
    ("transformer_encoder", "int8_static"): (7e-2, 0.85),
    ("resnet18", "int8_dynamic"): (2.5e-2, 1.0),
    ("transformer_encoder", "int8_dynamic"): (2.7e-2, 0.9),
}
INPUTS = 2


@pytest.fixture(scope="module")
def static_models(tmp_path_factory):
    """Each model's ``quantize_static`` QDQ version, made once as the bench makes it."""
    accuracy = bench_script("accuracy")
    cache = tmp_path_factory.mktemp("quantized")
    made = {}

    def static(name: str, float_model: onnx.ModelProto) -> onnx.ModelProto:
        if name not in made:
            made[name] = onnx.load(accuracy.make_case(f"{name}/qdq_s8", cache, float_model).quantized_path)
        return made[name]
    return static


@pytest.mark.parametrize("name, precision", list(BOUNDS))
def test_lower_precision_stays_within_its_measured_bound(backend, static_models, name, precision):
    require_backend(backend)
    from gpumnn import zoo

    accuracy = bench_script("accuracy")
    bound, least_top1 = BOUNDS[(name, precision)]
    float_model = zoo.build(name)
    static_model = static_models(name, float_model) if precision == "int8_static" else None
    feeds = accuracy.inputs_of(float_model, INPUTS, seed=31)
    reference = onnxruntime_session(float_model)
    with accuracy.session_for(precision, float_model, static_model, backend, threads=2) as sess:
        for feed in feeds:
            ref = reference.run(None, feed)[0]
            got = sess.run(feed)[sess.program.outputs[0]]
            assert rel_l2(got, ref) < bound
            agree, rows = accuracy.top1_agreement(got, ref)
            assert agree >= least_top1 * rows
        if precision == "int8_static":  # the int8 weights are no bigger in the file than a quarter of float32's
            assert accuracy.initializer_bytes(static_model) < 0.3 * accuracy.initializer_bytes(float_model)


def test_top1_agreement_counts_rows_along_the_last_axis():
    accuracy = bench_script("accuracy")
    ref = np.array([[[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]]])
    got = np.array([[[0.0, 0.9, 0.1], [0.0, 0.0, 3.0]]])
    assert accuracy.top1_agreement(got, ref) == (1, 2)
