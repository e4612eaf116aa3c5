"""The cpu backend's Rasters of many small regions as one compiled loop (``cpu_jit.raster_regions``)
against ONNX Runtime, with NumPy's copies (``jit=False``) beside: concatenations of several
pieces, reflection padding (negative strides), broadcasts (zero strides), a fill, int32 words and
an LSTM's steps gathered into Y."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from conftest import onnxruntime_session, rel_l2
from gpumnn.backends.cpu import engines
from op_cases import model_proto

pytest.importorskip("numba")


def _model(nodes, inputs, inits=(), dtype=TensorProto.FLOAT):
    graph = helper.make_graph(nodes, "raster", [helper.make_tensor_value_info(n, dtype, s) for n, s in inputs],
                              [helper.make_tensor_value_info("y", dtype, None)], list(inits))
    return model_proto(graph, 13)


def _pieces(count: int, shape, rng, dtype=np.float32):
    return {f"x{i}": (rng.standard_normal(shape) * 10).astype(dtype) for i in range(count)}


def _loops(sess) -> int:
    """Rasters of the session that run as the compiled loop."""
    return sum(exe.work[0].__name__ == "run_loop" for exe in sess.shape_set().first_state.executions
               if type(exe.op).__name__ == "Raster")


def _cases(rng):
    concat = _pieces(6, (2, 3, 5), rng)
    words = _pieces(5, (3, 4), rng, np.int32)
    padded = {"x0": rng.standard_normal((1, 3, 6, 7)).astype(np.float32)}
    return {
        "concat": (_model([helper.make_node("Concat", list(concat), ["y"], axis=1)],
                          [(n, list(v.shape)) for n, v in concat.items()]), concat),
        "int32_concat": (_model([helper.make_node("Concat", list(words), ["y"], axis=0)],
                                [(n, list(v.shape)) for n, v in words.items()], dtype=TensorProto.INT32), words),
        "reflect_pad": (_model([helper.make_node("Pad", ["x0", "pads"], ["y"], mode="reflect")], [("x0", [1, 3, 6, 7])],
                               [numpy_helper.from_array(np.array([0, 0, 2, 3, 0, 0, 3, 2], np.int64), "pads")]),
                        padded),
        "constant_pad": (_model([helper.make_node("Pad", ["x0", "pads", "v"], ["y"])], [("x0", [1, 3, 6, 7])],
                                [numpy_helper.from_array(np.array([0, 1, 2, 3, 0, 2, 3, 2], np.int64), "pads"),
                                 numpy_helper.from_array(np.array(1.5, np.float32), "v")]), padded),
        "concat_of_broadcasts": (_model([helper.make_node("Expand", [f"x{i}", "shape"], [f"e{i}"]) for i in range(4)]
                                        + [helper.make_node("Concat", [f"e{i}" for i in range(4)], ["y"], axis=0)],
                                        [(f"x{i}", [1, 5]) for i in range(4)],
                                        [numpy_helper.from_array(np.array([3, 5], np.int64), "shape")]),
                                 _pieces(4, (1, 5), rng)),
    }


@pytest.mark.parametrize("name", ["concat", "int32_concat", "reflect_pad", "constant_pad", "concat_of_broadcasts"])
def test_rasters_of_many_regions_match_onnxruntime(name, monkeypatch):
    monkeypatch.setattr(engines, "RASTER_LOOP_MIN_REGIONS", 1)  # the padding's one region and fill too
    model, feed = _cases(np.random.default_rng(7))[name]
    ref = onnxruntime_session(model).run(None, feed)[0]
    net = gpumnn.load(model)
    for jit in (True, False):
        with net.session(backend="cpu", threads=2, jit=jit) as sess:
            got = sess.run(feed)["y"]
            if jit:
                assert _loops(sess) >= 1, "the Raster did not run as the compiled loop"
        assert got.shape == ref.shape and got.dtype == ref.dtype
        if got.dtype == np.int32:
            np.testing.assert_array_equal(got, ref)
        else:
            assert rel_l2(got, ref) < 1e-6, f"jit={jit}"
