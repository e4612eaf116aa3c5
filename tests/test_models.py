"""Every zoo model on every backend against ONNX Runtime (relative L2 < 1e-3)."""
from __future__ import annotations

import functools
import zlib

import numpy as np
import pytest

import gpumnn
from conftest import onnxruntime_session, rel_l2
from gpumnn import zoo

TOLERANCE = 1e-3


@functools.lru_cache(maxsize=None)
def _model_and_reference(name: str):
    model = zoo.build(name)
    # crc32, not hash(): str hashes are salted per process, so a failure could not be rerun with its input
    x = np.random.default_rng(zlib.crc32(name.encode())).standard_normal(zoo.input_shape(name)).astype(np.float32)
    sess = onnxruntime_session(model)
    return model, x, sess.run(None, {"input": x})[0]


@pytest.mark.parametrize("name", zoo.names())
def test_zoo_model_matches_onnxruntime(name, backend):
    model, x, ref = _model_and_reference(name)
    sess = gpumnn.load(model).session(backend=backend, fallback=False)
    out = sess.run({"input": x})["output"]
    assert out.shape == ref.shape
    assert np.all(np.isfinite(out))
    err = rel_l2(out, ref)
    assert err < TOLERANCE, f"{name} on {backend}: relative L2 error {err:.2e}"
    fallbacks = [r for r in sess.report_rows() if r["fallback"]]
    assert not fallbacks, f"ops fell back to the cpu: {fallbacks[:3]}"


@pytest.mark.parametrize("name", ["resnet18", "transformer_encoder"])
def test_eager_mode_gives_the_recorded_answer(name, backend):
    model, x, ref = _model_and_reference(name)
    net = gpumnn.load(model)
    recorded = net.session(backend=backend, fallback=False).run({"input": x})["output"]
    eager = net.session(backend=backend, record=False, fallback=False).run({"input": x})["output"]
    assert rel_l2(eager, ref) < TOLERANCE
    np.testing.assert_allclose(eager, recorded, rtol=1e-5, atol=1e-5)

