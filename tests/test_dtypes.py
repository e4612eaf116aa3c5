"""Integer, boolean and float16 tensors through a whole session, on every backend.

Models take and return the dtypes users' models do (int64 token ids, bool masks, float16), and
every result is checked against ONNX Runtime, dtype included. Integer work the model puts on a
GPU backend runs there (the report shows no fallback for it).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import gpumnn
from gpumnn.errors import InputError, ModelError

from conftest import onnxruntime_session, rel_l2


def _model(nodes, inputs, outputs, inits=(), opset=18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "dtypes", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _check(model: onnx.ModelProto, feeds: dict, backend: str) -> gpumnn.Session:
    ref_sess = onnxruntime_session(model)
    ref = dict(zip([o.name for o in ref_sess.get_outputs()], ref_sess.run(None, feeds)))
    sess = gpumnn.load(model).session(backend=backend)
    got = sess.run(feeds)
    assert set(got) == set(ref), f"outputs {sorted(got)}, ONNX Runtime gives {sorted(ref)}"
    for name, expected in ref.items():  # by name: a session returning its outputs in another order is caught
        value = got[name]
        assert value.dtype == expected.dtype, f"{name}: dtype {value.dtype}, ONNX Runtime gives {expected.dtype}"
        assert value.shape == expected.shape, name
        if expected.dtype.kind in "iub":
            np.testing.assert_array_equal(value, expected, err_msg=name)
        else:
            assert rel_l2(value.astype(np.float64), expected.astype(np.float64)) < 1e-3, name
    return sess


def _token_model() -> onnx.ModelProto:
    """Token ids (int64) -> embedding rows -> a masked mean: int64 input, bool mask, int64 and
    float outputs (what text classifiers do)."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((50, 8)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"]),
        helper.make_node("Greater", ["ids", "pad"], ["mask"]),                   # bool [2, 7]
        helper.make_node("Cast", ["mask"], ["maskf"], to=T.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis2"], ["mask3"]),
        helper.make_node("Mul", ["emb", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["pooled"], keepdims=0),
        helper.make_node("Cast", ["mask"], ["maski"], to=T.INT64),
        helper.make_node("ReduceSum", ["maski", "axis1"], ["count"], keepdims=0),  # int64 [2]
        helper.make_node("ArgMax", ["pooled"], ["best"], axis=1, keepdims=0),      # int64 [2]
        helper.make_node("Not", ["mask"], ["padding"]),                            # bool [2, 7]
        helper.make_node("Where", ["padding", "ids", "minus_one"], ["kept"]),      # int64 [2, 7]
    ]
    return _model(nodes, [_vi("ids", T.INT64, [2, 7])],
                  [_vi("pooled", T.FLOAT, None), _vi("count", T.INT64, None), _vi("best", T.INT64, None),
                   _vi("padding", T.BOOL, None), _vi("kept", T.INT64, None)],
                  [("table", table), ("pad", np.array(2, np.int64)), ("axis1", np.array([1], np.int64)),
                   ("axis2", np.array([2], np.int64)), ("minus_one", np.array(-1, np.int64))])


def test_int64_and_bool_tensors_match_onnxruntime(backend):
    ids = np.random.default_rng(1).integers(0, 50, (2, 7)).astype(np.int64)
    ids[0, 5:] = 0
    _check(_token_model(), {"ids": ids}, backend)


def test_bool_inputs_and_logic(backend):
    nodes = [helper.make_node("And", ["a", "b"], ["and"]), helper.make_node("Or", ["a", "b"], ["or"]),
             helper.make_node("Xor", ["and", "b"], ["xor"]), helper.make_node("Equal", ["or", "a"], ["eq"])]
    model = _model(nodes, [_vi("a", T.BOOL, [3, 5]), _vi("b", T.BOOL, [5])],
                   [_vi(n, T.BOOL, None) for n in ("and", "or", "xor", "eq")])
    rng = np.random.default_rng(2)
    _check(model, {"a": rng.integers(0, 2, (3, 5)).astype(bool), "b": rng.integers(0, 2, 5).astype(bool)}, backend)


def test_float16_inputs_and_outputs_keep_their_dtype(backend):
    """float16 tensors are computed in float32 and returned as float16, rounded as ONNX Runtime does."""
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("Cast", ["sq"], ["wide"], to=T.FLOAT),
             helper.make_node("Cast", ["y"], ["narrow"], to=T.FLOAT16), helper.make_node("Cast", ["narrow"], ["back"], to=T.FLOAT)]
    model = _model(nodes, [_vi("x", T.FLOAT16, [4, 6]), _vi("y", T.FLOAT, [4, 6])],
                   [_vi("sq", T.FLOAT16, None), _vi("wide", T.FLOAT, None), _vi("back", T.FLOAT, None)])
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((4, 6)).astype(np.float16), "y": (rng.standard_normal((4, 6)) * 300).astype(np.float32)}
    sess = gpumnn.load(model).session(backend=backend)
    got = sess.run(feeds)
    assert got["sq"].dtype == np.float16 and got["wide"].dtype == np.float32
    # a Cast to float16 and back rounds exactly like NumPy's float16
    np.testing.assert_array_equal(got["back"], feeds["y"].astype(np.float16).astype(np.float32))


def test_integer_casts_wrap_and_truncate(backend):
    nodes = [helper.make_node("Cast", ["x"], ["u8"], to=T.UINT8), helper.make_node("Cast", ["x"], ["i8"], to=T.INT8),
             helper.make_node("Cast", ["f"], ["fi"], to=T.INT32), helper.make_node("Cast", ["f"], ["fb"], to=T.BOOL)]
    model = _model(nodes, [_vi("x", T.INT64, [40]), _vi("f", T.FLOAT, [40])],
                   [_vi("u8", T.UINT8, None), _vi("i8", T.INT8, None), _vi("fi", T.INT32, None), _vi("fb", T.BOOL, None)])
    rng = np.random.default_rng(4)
    f = (rng.standard_normal(40) * 100).astype(np.float32)
    f[::6] = 0.0
    _check(model, {"x": rng.integers(-1000, 1000, 40).astype(np.int64), "f": f}, backend)


def test_integer_work_runs_on_the_backend_the_model_asks_for(backend):
    """No fallback: comparisons, integer arithmetic, Where and ArgMax run on the requested backend."""
    sess = gpumnn.load(_token_model()).session(backend=backend)
    fallbacks = [(r["node"], r["fallback"]) for r in sess.report_rows() if r["fallback"]]
    assert not fallbacks, fallbacks


def test_int64_input_outside_int32_is_refused_with_the_range():
    sess = gpumnn.load(_token_model()).session(backend="cpu")
    ids = np.zeros((2, 7), np.int64)
    ids[1, 3] = 2**40
    with pytest.raises(InputError, match=r"'ids'.*\[0, 1099511627776\].*int32"):
        sess.run({"ids": ids})
    with pytest.raises(InputError, match="dtype float32, expected int64"):
        sess.run({"ids": ids.astype(np.float32)})
    ok = sess.run({"ids": np.ones((2, 7), np.int32)})  # any integer dtype fits an integer input
    assert ok["count"].dtype == np.int64


def test_runtime_constant_outside_int32_is_refused_by_name():
    nodes = [helper.make_node("Add", ["x", "big"], ["y"])]
    model = _model(nodes, [_vi("x", T.INT64, [3])], [_vi("y", T.INT64, None)], [("big", np.array([2**40, 1, 2], np.int64))])
    with pytest.raises(ModelError, match="'big'.*outside int32"):
        gpumnn.load(model).session(backend="cpu")


def test_integer_tensors_share_the_pool_with_float_ones():
    sess = gpumnn.load(_token_model()).session(backend="cpu")
    summary = sess.memory_summary()["cpu"]
    assert summary["pool_bytes"] <= summary["naive_bytes"]
    assert {str(d) for d in sess.program.dtypes.values()} >= {"int64", "bool", "float32"}
