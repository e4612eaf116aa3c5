"""Resize in every mode and coordinate transformation against the ONNX reference implementation.

ONNX Runtime is the reference of tests/test_ops.py; here it is ``onnx.reference``, the code the
onnx node tests' expected outputs come from, because the two disagree on
``half_pixel_symmetric`` (ONNX Runtime rounds its coordinates in float32) and on
``align_corners`` with scales whose output length is not a whole number. Nearest and linear
modes run on the Resize kernels; cubic, antialias, ``exclude_outside`` and the crop modes run
as two MatMuls with host-built weight matrices (``gpumnn.numerics.sampling.axis_weights``).
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import gpumnn
from conftest import rel_l2

COORDS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric",
          "tf_crop_and_resize")
CASES = [(mode, coord, {}) for mode in ("nearest", "linear", "cubic") for coord in COORDS] + [
    ("linear", "half_pixel", {"antialias": 1}),
    ("cubic", "pytorch_half_pixel", {"antialias": 1, "cubic_coeff_a": -0.5}),
    ("cubic", "half_pixel", {"exclude_outside": 1}),
    ("nearest", "asymmetric", {"nearest_mode": "ceil"}),
    ("nearest", "align_corners", {"nearest_mode": "round_prefer_ceil"}),
]


def _model(mode: str, coord: str, attrs: dict):
    roi = (np.array([0, 0, 0.2, -0.1, 1, 1, 0.9, 1.3], np.float32) if coord == "tf_crop_and_resize"
           else np.zeros(0, np.float32))
    scales = np.array([1, 1, 0.6, 1.7], np.float32)  # down along H, up along W; 0.6 * 5 is not whole
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], name="resize", mode=mode,
                            coordinate_transformation_mode=coord, extrapolation_value=1.5, **attrs)
    graph = helper.make_graph([node], "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 2, 5, 6))],
                              [helper.make_empty_tensor_value_info("y")],
                              [numpy_helper.from_array(roi, "roi"), numpy_helper.from_array(scales, "scales")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


@pytest.mark.parametrize("mode,coord,attrs", CASES, ids=[f"{m}-{c}-{'-'.join(a)}".rstrip("-") for m, c, a in CASES])
def test_resize_matches_the_onnx_reference(mode, coord, attrs, backend):
    model = _model(mode, coord, attrs)
    x = np.random.default_rng(len(CASES)).standard_normal((1, 2, 5, 6)).astype(np.float32)
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    with gpumnn.load(model).session(backend=backend, fallback=False) as sess:
        got = sess.run({"x": x})["y"]
    assert got.shape == expected.shape
    assert rel_l2(got, expected) < 1e-5
