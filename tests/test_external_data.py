"""External-data tensors are read only from inside the model's folder, as ONNX Runtime does.

A location that is absolute, climbs out with ``..``, or reaches out through a symlink would let a
model read any file of the user into its weights; each is refused with a ModelError naming the
tensor and the location, and ONNX Runtime refuses the same files.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

import gpumnn

ort = pytest.importorskip("onnxruntime")

WEIGHT = np.random.default_rng(7).standard_normal((3, 5)).astype(np.float32)


def _write(folder: Path, location: str, data_file: Path | None = None, length: int | None = None) -> Path:
    """folder/model.onnx: y = x @ W, W stored at ``location`` (its bytes written to ``data_file``)."""
    folder.mkdir(parents=True, exist_ok=True)
    if data_file is not None:
        data_file.parent.mkdir(parents=True, exist_ok=True)
        data_file.write_bytes(WEIGHT.tobytes())
    weight = numpy_helper.from_array(WEIGHT, "W")
    set_external_data(weight, location, offset=0, length=WEIGHT.nbytes if length is None else length)
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "ext",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 5))], [weight])
    path = folder / "model.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                       ir_version=8).SerializeToString())
    return path


def _ort_refuses(path: Path) -> bool:
    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception:
        return True
    return False


@pytest.mark.parametrize("location", ["weights.bin", "data/weights.bin", "data/../weights.bin"])
def test_external_data_inside_the_folder_loads_and_runs(tmp_path, backend, location):
    folder = tmp_path / "model"
    path = _write(folder, location, folder / location)
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    got = gpumnn.load(path).session(backend=backend, fallback=False).run({"x": x})["y"]
    np.testing.assert_allclose(got, x @ WEIGHT, rtol=1e-5, atol=1e-5)
    assert not _ort_refuses(path)


def _outside_cases(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    folder = tmp_path / "model"
    secret = tmp_path / "secret.bin"
    cases = {
        "parent": (_write(folder / "parent", "../../secret.bin", secret), "../../secret.bin"),
        "absolute": (_write(folder / "absolute", str(secret), secret), str(secret)),
    }
    link_folder = folder / "symlink"
    cases["symlink"] = (_write(link_folder, "w.bin"), "w.bin")
    (link_folder / "w.bin").symlink_to(secret)
    dir_folder = folder / "symlinked_dir"
    cases["symlinked_dir"] = (_write(dir_folder, "d/secret.bin"), "d/secret.bin")
    (dir_folder / "d").symlink_to(tmp_path, target_is_directory=True)
    return cases


@pytest.mark.parametrize("case", ["parent", "absolute", "symlink", "symlinked_dir"])
def test_external_data_outside_the_folder_is_refused(tmp_path, case):
    path, location = _outside_cases(tmp_path)[case]
    with pytest.raises(gpumnn.ModelError) as info:
        gpumnn.load(path)
    message = str(info.value)
    assert "'W'" in message and repr(location) in message, message
    assert ("absolute" if case == "absolute" else "outside the model's folder") in message, message
    assert _ort_refuses(path)


def test_external_data_past_the_end_of_its_file_is_refused(tmp_path):
    folder = tmp_path / "model"
    path = _write(folder, "weights.bin", folder / "weights.bin", length=WEIGHT.nbytes * 2)
    with pytest.raises(gpumnn.ModelError, match="'W'.*'weights.bin'"):
        gpumnn.load(path)
    assert _ort_refuses(path)


def test_external_references_in_memory_are_refused(tmp_path):
    """Bytes or a ModelProto have no folder: their locations are not resolved against the cwd."""
    folder = tmp_path / "model"
    path = _write(folder, "weights.bin", folder / "weights.bin")
    unloaded = onnx.load(str(path), load_external_data=False)
    for source in (unloaded, path.read_bytes()):
        with pytest.raises(gpumnn.ModelError, match="'W'.*'weights.bin'.*no folder"):
            gpumnn.load(source)


def test_external_weight_also_declared_as_graph_input_loads(tmp_path):
    """Old exporters (IR < 4) also list every weight as a graph input; the checker must not look for its bytes."""
    folder = tmp_path / "model"
    path = _write(folder, "weights.bin", folder / "weights.bin")
    model = onnx.load(str(path), load_external_data=False)
    model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, WEIGHT.shape))
    path.write_bytes(model.SerializeToString())
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(gpumnn.load(path).session().run({"x": x})["y"], x @ WEIGHT, rtol=1e-5, atol=1e-5)
