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


#: every zoo model runs under the Vulkan validation layer too, its synchronization checks included
#: (CI requires the layer: a skip there would hide what only the layer sees)
VALIDATED = tuple(zoo.names())


@pytest.mark.parametrize("name", VALIDATED)
def test_zoo_model_under_vulkan_validation(name, vulkan_validation):
    """Recorded and eager runs on Vulkan with every call checked by VK_LAYER_KHRONOS_validation."""
    model, x, ref = _model_and_reference(name)
    net = gpumnn.load(model)
    for record in (True, False):
        with net.session(backend="vulkan", record=record, fallback=False) as sess:
            for _ in range(2):  # the second run replays (or re-records) what the first built
                out = sess.run({"input": x})["output"]
                assert rel_l2(out, ref) < TOLERANCE, f"{name} (record={record})"
    vulkan_validation.check()
