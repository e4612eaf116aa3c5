"""The zoo's models are valid ONNX, run in onnxruntime, and are numerically sane.

"Sane" matters because the engine's correctness tests compare against
onnxruntime on these graphs: a model whose activations overflow, or whose
layers collapse to zero, would let a broken kernel pass unnoticed.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from gpumnn import zoo

ort = pytest.importorskip("onnxruntime")

EXPECTED_NAMES = [
    "mobilenet_v1",
    "squeezenet1_1",
    "resnet18",
    "mobilenet_v2",
    "resnet50",
    "inception_v3",
    "transformer_encoder",
]

_CACHE: dict[str, onnx.ModelProto] = {}


def _model(name: str) -> onnx.ModelProto:
    """Build each model once per test session (resnet50/inception carry ~100 MB)."""
    if name not in _CACHE:
        _CACHE[name] = zoo.build(name)
    return _CACHE[name]


def _session(model: onnx.ModelProto) -> "ort.InferenceSession":
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _with_all_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Copy of ``model`` exposing every node output as a graph output (name only)."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    seen = {o.name for o in exposed.graph.output}
    for node in exposed.graph.node:
        for out in node.output:
            if out and out not in seen:
                exposed.graph.output.append(onnx.ValueInfoProto(name=out))
                seen.add(out)
    return exposed


def _expected_output_shape(name: str) -> tuple[int, ...]:
    return tuple(zoo.input_shape(name)) if name == "transformer_encoder" else (1, 1000)


# --------------------------------------------------------------------------- API
def test_names_order_and_registry() -> None:
    assert zoo.names() == EXPECTED_NAMES
    assert list(zoo.MODELS) == EXPECTED_NAMES
    assert set(zoo.PAPER_MODELS) <= set(EXPECTED_NAMES)
    assert zoo.PAPER_MODELS == ("mobilenet_v1", "squeezenet1_1", "resnet18")
    for name, spec in zoo.MODELS.items():
        assert spec.name == name and callable(spec.builder) and spec.description
    assert zoo.input_shape("inception_v3") == (1, 3, 299, 299)
    assert zoo.input_shape("transformer_encoder") == (1, 128, 256)
    assert zoo.input_shape("resnet18") == (1, 3, 224, 224)


def test_unknown_name_lists_known_models() -> None:
    with pytest.raises(KeyError) as info:
        zoo.build("alexnet")
    assert "mobilenet_v1" in str(info.value) and "transformer_encoder" in str(info.value)
    with pytest.raises(KeyError):
        zoo.input_shape("alexnet")


def test_save_roundtrip_and_determinism(tmp_path) -> None:
    path = zoo.save("squeezenet1_1", tmp_path / "sub" / "sq.onnx")
    assert path.exists()
    loaded = onnx.load(str(path))
    assert loaded.SerializeToString() == zoo.build("squeezenet1_1").SerializeToString()
    assert zoo.build("transformer_encoder").SerializeToString() == _model("transformer_encoder").SerializeToString()


# ------------------------------------------------------------------ per model
@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_model_structure(name: str) -> None:
    model = _model(name)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version <= 9
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    graph = model.graph
    assert [i.name for i in graph.input] == ["input"]
    assert [o.name for o in graph.output] == ["output"]
    dims = tuple(d.dim_value for d in graph.input[0].type.tensor_type.shape.dim)
    assert dims == zoo.input_shape(name)
    node_names = [n.name for n in graph.node]
    assert all(node_names), "every node needs a name"
    assert len(set(node_names)) == len(node_names), "node names must be unique"
    for init in graph.initializer:
        assert init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.INT64), init.name


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_model_runs_and_activations_are_sane(name: str) -> None:
    model = _model(name)
    x = np.random.default_rng(0).standard_normal(zoo.input_shape(name)).astype(np.float32)

    (out,) = _session(model).run(None, {"input": x})
    assert out.shape == _expected_output_shape(name)
    assert out.dtype == np.float32
    assert np.isfinite(out).all()
    assert 1e-2 <= float(out.std()) <= 1e3, f"output std {out.std()}"

    exposed = _session(_with_all_outputs(model))
    names = [o.name for o in exposed.get_outputs()]
    values = exposed.run(None, {"input": x})
    assert len(names) == sum(len(n.output) for n in model.graph.node)
    for tensor_name, value in zip(names, values):
        assert np.isfinite(value).all(), f"{name}: {tensor_name} has non-finite values"
        assert np.any(value != 0), f"{name}: {tensor_name} is all zeros"
    np.testing.assert_allclose(dict(zip(names, values))["output"], out, rtol=1e-3, atol=1e-3 * float(np.abs(out).max()))


@pytest.mark.parametrize("name", ["squeezenet1_1", "transformer_encoder"])
def test_any_batch_fixed_or_symbolic_runs_item_for_item_as_batch_1(name: str) -> None:
    import gpumnn
    x = np.random.default_rng(0).standard_normal(zoo.input_shape(name, 3)).astype(np.float32)
    fixed, symbolic = zoo.build(name, batch=3), zoo.build(name, batch="N")
    assert [d.dim_value for d in fixed.graph.input[0].type.tensor_type.shape.dim] == list(zoo.input_shape(name, 3))
    assert fixed.graph.output[0].type.tensor_type.shape.dim[0].dim_value == 3
    assert symbolic.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    one = _session(_model(name))
    expected = np.concatenate([one.run(None, {"input": x[i:i + 1]})[0] for i in range(3)])
    np.testing.assert_allclose(_session(fixed).run(None, {"input": x})[0], expected, rtol=1e-4, atol=1e-4)
    with gpumnn.load(symbolic).session(backend="cpu") as sess:
        for size in (3, 2):
            np.testing.assert_allclose(sess.run({"input": x[:size]})["output"], expected[:size], rtol=1e-3, atol=1e-3)
    with pytest.raises(ValueError, match="positive int or a dim name"):
        zoo.build(name, batch=0)
