"""Issue 32's test models (``bench/real_models.py``: architectures people ship, which the zoo's
kernels were not tuned on) on the cpu backend's engines against ONNX Runtime (relative L2 < 1e-3)."""
from __future__ import annotations

import functools
import zlib

import numpy as np
import pytest

import gpumnn
from conftest import bench_script, onnxruntime_session, rel_l2

TOLERANCE = 1e-3
REAL_MODELS = bench_script("real_models")


@functools.lru_cache(maxsize=None)
def _model_and_reference(name: str):
    model = REAL_MODELS.MODELS[name]()
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    tensor_type = model.graph.input[0].type.tensor_type
    shape = [d.dim_value for d in tensor_type.shape.dim]
    if tensor_type.elem_type == 7:  # int64 bytes
        x = rng.integers(0, 256, shape).astype(np.int64)
    else:
        x = rng.standard_normal(shape).astype(np.float32)
    return model, x, onnxruntime_session(model).run(None, {"input": x})[0]


@pytest.mark.parametrize("options", [{}, {"jit": False}, {"threads": 1}], ids=["regions", "numpy", "one-thread"])
@pytest.mark.parametrize("name", list(REAL_MODELS.MODELS))
def test_real_model_matches_onnxruntime_on_cpu(name, options):
    model, x, ref = _model_and_reference(name)
    with gpumnn.load(model).session(backend="cpu", fallback=False, **{"threads": 2, **options}) as sess:
        out = sess.run({"input": x})["output"]
        assert np.all(np.isfinite(out))
        err = rel_l2(out, ref)
        assert err < TOLERANCE, f"{name} on cpu {options}: relative L2 error {err:.2e}"
        assert np.abs(ref).max() > 1e-3, f"{name}: ONNX Runtime's output is all but zero, so the check proves little"
