"""gpumnn on Ray Data (gpumnn.integrations.ray): the Predictor on its own, then a local Ray cluster.

The cluster test starts Ray itself (``ray.init(num_cpus=2)``, shut down after) and sends 256
images through ResNet-18 with a symbolic batch on 2 actors, in batches of 32 with a ragged last
one; every output is checked against ONNX Runtime, by id, so a row lost or duplicated fails. An
actor that raises on a bad batch must give the caller gpumnn's error. Ray is the [ray] extra's
(and [dev]'s and [all]'s); where it is missing the cluster tests skip, or fail where
GPUMNN_REQUIRE_TOOLS names ``ray`` (CI does).
"""
from __future__ import annotations

import importlib.util

import numpy as np
import onnxruntime as ort
import pytest

from conftest import require_tool
from gpumnn import zoo
from gpumnn.errors import InputError, ModelError
from gpumnn.integrations.ray import Predictor

IMAGES = 256


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return zoo.save("resnet18", tmp_path_factory.mktemp("ray") / "resnet18.onnx", batch="N")


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(0).standard_normal(zoo.input_shape("resnet18", IMAGES)).astype(np.float32)


@pytest.fixture(scope="module")
def reference(model_path, images):
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, {"input": images[i:i + 64]})[0] for i in range(0, IMAGES, 64)])


def test_predictor_takes_numpy_and_pandas_batches_of_any_size(model_path, images, reference):
    pd = pytest.importorskip("pandas")
    predictor = Predictor(str(model_path), "cpu", input_column="image", output_column="logits", threads=1)
    for size in (3, 5, 3):
        out = predictor({"image": images[:size], "id": np.arange(size)})
        assert sorted(out) == ["id", "image", "logits"] and out["logits"].shape == (size, 1000)
        np.testing.assert_allclose(out["logits"], reference[:size], rtol=1e-3, atol=1e-3)
    assert predictor.session.stats["prepares"] == 2  # sizes 3 and 5, each once
    frame = pd.DataFrame({"image": list(images[:4]), "id": range(4)})
    out = Predictor(str(model_path), input_column="image", output_column="logits", drop_inputs=True,
                    threads=1)(frame)
    assert list(out.columns) == ["id", "logits"]
    np.testing.assert_allclose(np.stack(out["logits"].to_numpy()), reference[:4], rtol=1e-3, atol=1e-3)


def test_predictor_errors_name_the_missing_file_and_column(model_path, images, tmp_path):
    with pytest.raises(ModelError, match=r"does not exist on worker .*pass the model's bytes"):
        Predictor(str(tmp_path / "nowhere.onnx"))
    predictor = Predictor(model_path.read_bytes(), input_column="image", threads=1)
    with pytest.raises(InputError, match=r"batch has no column 'image' \(its columns: \['pixels'\]\)"):
        predictor({"pixels": images[:2]})
    with pytest.raises(InputError, match=r"does not have; its outputs are \['output'\]"):
        Predictor(str(model_path), output_column={"logits": "x"})


@pytest.fixture(scope="module")
def ray_cluster():
    require_tool("ray", None if importlib.util.find_spec("ray") else "ray is not installed (pip install 'gpumnn[ray]')")
    import ray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def test_two_actors_run_every_image_once_as_onnxruntime_does(ray_cluster, model_path, images, reference):
    from gpumnn.integrations.ray import map_batches
    ds = ray_cluster.data.from_items([{"id": i, "image": images[i]} for i in range(IMAGES)], override_num_blocks=8)
    out = map_batches(ds, str(model_path), "cpu", actors=2, batch_size=32 + 8, input_column="image",
                      output_column="logits", drop_inputs=True, threads=1)
    rows = out.take_all()
    ids = [int(r["id"]) for r in rows]
    assert sorted(ids) == list(range(IMAGES)), "rows lost or duplicated"
    logits = np.stack([r["logits"] for r in rows])
    np.testing.assert_allclose(logits, reference[ids], rtol=1e-3, atol=1e-3)


def test_a_bad_batch_gives_the_user_gpumnns_error(ray_cluster, model_path, images, tmp_path):
    from gpumnn.integrations.ray import map_batches
    ds = ray_cluster.data.from_items([{"id": i, "pixels": images[i]} for i in range(8)])
    with pytest.raises(InputError, match=r"batch has no column 'image' \(its columns: \['id', 'pixels'\]\)"):
        map_batches(ds, str(model_path), "cpu", batch_size=8, input_column="image", threads=1).take_all()
    with pytest.raises(ModelError, match=r"nowhere.onnx' does not exist on worker"):
        map_batches(ds, str(tmp_path / "nowhere.onnx"), "cpu", batch_size=8, input_column="pixels").take_all()
