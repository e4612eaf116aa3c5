"""Graph inputs that decide shapes: their values key the session's shape sets (issue 31)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import gpumnn

ort = pytest.importorskip("onnxruntime")

F, I = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, initializers=()):
    graph = helper.make_graph(nodes, "shape_inputs", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info("y", F if nodes[-1].op_type != "Range" else I, None)],
                              list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
IMG = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
CASES = {
    "reshape": (_model([helper.make_node("Reshape", ["x", "s"], ["y"])], [("x", F, (2, 3, 4)), ("s", I, (2,))]),
                "s", {"x": X}, [[6, 4], [4, -1]]),
    "resize_sizes": (_model([helper.make_node("Resize", ["x", "", "", "s"], ["y"], mode="nearest")],
                            [("x", F, (1, 1, 3, 4)), ("s", I, (4,))]), "s", {"x": IMG}, [[1, 1, 6, 8], [1, 1, 3, 2]]),
    "resize_scales": (_model([helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest")],
                             [("x", F, (1, 1, 3, 4)), ("s", F, (4,))]), "s", {"x": IMG}, [[1, 1, 2, 2], [1, 1, 1, 0.5]]),
    "slice": (_model([helper.make_node("Slice", ["x", "s", "e"], ["y"])], [("x", F, (2, 3, 4)), ("s", I, (1,))],
                     [helper.make_tensor("e", I, (1,), [4])]), "s", {"x": X}, [[1], [-3]]),
    "expand": (_model([helper.make_node("Expand", ["x", "s"], ["y"])], [("x", F, (3, 1)), ("s", I, (2,))]),
               "s", {"x": np.arange(3, dtype=np.float32).reshape(3, 1)}, [[3, 4], [3, 2]]),
    "tile": (_model([helper.make_node("Tile", ["x", "s"], ["y"])], [("x", F, (2, 3, 4)), ("s", I, (3,))]),
             "s", {"x": X}, [[1, 2, 1], [2, 1, 3]]),
    "constant_of_shape": (_model([helper.make_node("ConstantOfShape", ["s"], ["c"],
                                                   value=helper.make_tensor("v", F, (1,), [2.5])),
                                  helper.make_node("Add", ["c", "x"], ["y"])], [("x", F, (4,)), ("s", I, (2,))]),
                          "s", {"x": np.arange(4, dtype=np.float32)}, [[3, 4], [1, 4]]),
    "range": (_model([helper.make_node("Range", ["a", "s", "d"], ["y"])], [("a", I, ()), ("s", I, ())],
                     [helper.make_tensor("d", I, (), [2])]), "s", {"a": np.array(1, np.int64)}, [7, 12]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_values_of_shape_inputs_key_shape_sets(backend, case):
    """Two values, then the first again: two shape sets prepared, the third run replays the first."""
    model, name, feeds, values = CASES[case]
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    dtype = np.float32 if model.graph.input[[i.name for i in model.graph.input].index(name)].type.tensor_type.elem_type == F else np.int64
    with gpumnn.load(model).session(backend=backend, fallback=False) as sess:
        for value in [*values, values[0]]:
            run = {**feeds, name: np.array(value, dtype)}
            got = sess.run(run)["y"]
            want = reference.run(None, run)[0]
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-6)
        assert name in sess.bound_inputs  # with Range, its start too
        assert (sess.stats["prepares"], sess.stats["cache_hits"]) == (2, 1)


def test_large_shape_inputs_stay_refused():
    """An input above the session's BIND_LIMIT elements is not bound: still a DataDependentError."""
    model = _model([helper.make_node("Reshape", ["x", "s"], ["y"])], [("x", F, (2, 3)), ("s", I, (2000,))])
    with pytest.raises(gpumnn.errors.DataDependentError, match="target shape"):
        gpumnn.load(model).session(backend="cpu")
