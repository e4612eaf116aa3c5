"""float16, int8 and uint8 tensors stored in their own size, on every backend.

A narrow tensor takes 1 (int8, uint8) or 2 (float16) bytes an element in the session's pools, is
moved bit-exactly by the element-moving ops, and is converted to float32 or int32 around every op
that computes (``gpumnn.atomic``). GPU backends without narrow kernels leave the ops on narrow
tensors to the cpu, so the narrow tensors themselves live on the cpu there.
"""
from __future__ import annotations

import zlib

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import gpumnn
from gpumnn import atomic as A, zoo

from conftest import onnxruntime_session, rel_l2

NARROW = {"float16": T.FLOAT16, "int8": T.INT8, "uint8": T.UINT8}
#: float16 has an 11-bit significand: one rounding is within 2**-11 (4.9e-4) of the float32 value.
#: gpumnn and ONNX Runtime round the same float32 values to float16 alike, but their float32 sums
#: differ in the last bits, which moves some values across a float16 rounding boundary: one float16
#: step at those elements, carried on by the layers after them. Four steps in relative L2 bound that.
FLOAT16_TOLERANCE = 4 * 2.0 ** -11


def _model(nodes, inputs, outputs, inits=(), opset=18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "narrow", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _transpose_model(dtype: int, shape=(64, 96)) -> onnx.ModelProto:
    nodes = [helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])]
    return _model(nodes, [helper.make_tensor_value_info("x", dtype, list(shape))],
                  [helper.make_tensor_value_info("y", dtype, list(shape[::-1]))])


def _random(dtype: str, shape, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "float16":  # every bit pattern, NaNs and infinities among them: a copy must keep them all
        return rng.integers(0, 2 ** 16, shape).astype(np.uint16).view(np.float16)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


@pytest.mark.parametrize("dtype", sorted(NARROW))
def test_narrow_tensors_take_their_own_size_in_the_pools(backend, dtype):
    """A Transpose of a narrow tensor: the pools hold input and output in 1 or 2 bytes an element
    (1/4 or 1/2 of the same model's in float32), and the copy is bit-exact."""
    itemsize = np.dtype(dtype).itemsize
    sessions = {d: gpumnn.load(_transpose_model(code)).session(backend=backend)
                for d, code in (("float32", T.FLOAT), (dtype, NARROW[dtype]))}
    pool_bytes = {d: sum(p["pool_bytes"] for p in s.memory_summary().values()) for d, s in sessions.items()}
    assert pool_bytes[dtype] * 4 == pool_bytes["float32"] * itemsize, pool_bytes
    raster = [row for row in sessions[dtype].report_rows() if row["op"] == "raster"]
    assert [row["bytes"] for row in raster] == [64 * 96 * itemsize]
    x = _random(dtype, (64, 96))
    y = sessions[dtype].run({"x": x})["y"]
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(y.view(f"u{itemsize}"), x.T.view(f"u{itemsize}"))


def test_narrow_tensors_live_where_their_ops_run(backend):
    """Every backend here has kernels that move and convert the narrow dtypes, so a float16 model
    runs whole on the backend asked for: no op falls back to the cpu and no tensor is copied."""
    sess = gpumnn.load(_add_model()).session(backend=backend)
    program, placement = sess.program, sess.placement
    assert any(A.NARROW_DTYPES & {op.dtype, op.output_dtype()} for op in program.ops)
    for op, placed, reason in zip(program.ops, placement.op_backends, placement.fallback_reasons):
        assert placed == backend, (op, reason)
    assert not [step.tensor for step in placement.steps if step.kind == "copy"]


@pytest.mark.parametrize("dtype", sorted(NARROW))
def test_a_narrow_input_returned_as_an_output_stays_on_a_backend_that_holds_it(backend, dtype):
    """An output that is the input itself (no op reads it) is held where its dtype can be, and
    comes back bit-exact beside an output computed on the session's backend."""
    code = NARROW[dtype]
    nodes = [helper.make_node("Identity", ["x"], ["same"]), helper.make_node("Relu", ["f"], ["r"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", code, [2, 3]), helper.make_tensor_value_info("f", T.FLOAT, [4])],
                   [helper.make_tensor_value_info("same", code, [2, 3]), helper.make_tensor_value_info("r", T.FLOAT, [4])])
    sess = gpumnn.load(model).session(backend=backend)
    x, f = _random(dtype, (2, 3)), np.array([-1, 2, -3, 4], np.float32)
    got = sess.run({"x": x, "f": f})
    np.testing.assert_array_equal(got["same"].view(f"u{x.itemsize}"), x.view(f"u{x.itemsize}"))
    np.testing.assert_array_equal(got["r"], np.maximum(f, 0))
    assert sess.placement.op_backends == [backend]


def _add_model() -> onnx.ModelProto:
    """float16 inputs and weight, float16 intermediates, a float16 and a float32 output."""
    w = np.random.default_rng(3).standard_normal((6, 5)).astype(np.float16)
    nodes = [helper.make_node("Add", ["x", "y"], ["s"]),
             helper.make_node("MatMul", ["s", "w"], ["m"]),
             helper.make_node("Sigmoid", ["m"], ["z"]),
             helper.make_node("Transpose", ["z"], ["t"], perm=[1, 0]),
             helper.make_node("Cast", ["t"], ["wide"], to=T.FLOAT)]
    return _model(nodes, [helper.make_tensor_value_info("x", T.FLOAT16, [4, 6]),
                          helper.make_tensor_value_info("y", T.FLOAT16, [4, 6])],
                  [helper.make_tensor_value_info("t", T.FLOAT16, [5, 4]),
                   helper.make_tensor_value_info("wide", T.FLOAT, [5, 4])], [("w", w)])


def _check(model: onnx.ModelProto, feeds: dict, backend: str, tolerance: float, reference: str = "ort") -> gpumnn.Session:
    """Run ``model`` on ``backend`` against ONNX Runtime (``reference="ort"``) or the ONNX reference
    evaluator (``"onnx"``: integer graphs, which some ONNX Runtime builds have no int8 kernels for)."""
    if reference == "onnx":
        outputs = [o.name for o in model.graph.output]
        ref = dict(zip(outputs, ReferenceEvaluator(model).run(None, feeds)))
    else:
        ref_sess = onnxruntime_session(model)
        ref = dict(zip([o.name for o in ref_sess.get_outputs()], ref_sess.run(None, feeds)))
    sess = gpumnn.load(model).session(backend=backend)
    got = sess.run(feeds)
    for name, expected in ref.items():
        assert got[name].dtype == expected.dtype, f"{name}: {got[name].dtype}, the reference gives {expected.dtype}"
        if expected.dtype.kind in "iub":
            np.testing.assert_array_equal(got[name], expected, err_msg=name)
        else:
            err = rel_l2(got[name], expected)
            assert err < tolerance, f"{name}: relative L2 error {err:.2e}"
    return sess


def test_float16_graph_matches_onnxruntime(backend):
    rng = np.random.default_rng(4)
    feeds = {n: rng.standard_normal((4, 6)).astype(np.float16) for n in ("x", "y")}
    _check(_add_model(), feeds, backend, FLOAT16_TOLERANCE)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_narrow_integer_graph_matches_the_onnx_reference_exactly(backend, dtype):
    """int8/uint8 inputs through Gather, Concat, Where, Add (wrapping) and Cast to and from them."""
    code = NARROW[dtype]
    nodes = [helper.make_node("Gather", ["x", "idx"], ["g"], axis=1),
             helper.make_node("Concat", ["g", "x"], ["c"], axis=1),
             helper.make_node("Add", ["c", "c"], ["doubled"]),
             helper.make_node("Greater", ["doubled", "zero"], ["positive"]),
             helper.make_node("Where", ["positive", "c", "doubled"], ["picked"]),
             helper.make_node("Cast", ["picked"], ["wide"], to=T.INT32),
             helper.make_node("Cast", ["f"], ["narrowed"], to=code)]
    model = _model(nodes, [helper.make_tensor_value_info("x", code, [3, 5]),
                           helper.make_tensor_value_info("f", T.FLOAT, [3, 5])],
                   [helper.make_tensor_value_info("picked", code, None), helper.make_tensor_value_info("wide", T.INT32, None),
                    helper.make_tensor_value_info("narrowed", code, None)],
                   [("idx", np.array([4, 0, 2], np.int64)), ("zero", np.array(0, dtype))])
    rng = np.random.default_rng(5)
    info = np.iinfo(dtype)
    feeds = {"x": rng.integers(info.min, info.max + 1, (3, 5)).astype(dtype),
             "f": rng.uniform(info.min, info.max, (3, 5)).astype(np.float32)}  # in range: ONNX defines those casts
    _check(model, feeds, backend, 0.0, reference="onnx")


def test_float16_zoo_model_matches_onnxruntime(backend):
    """squeezenet1_1 with float16 input, weights, intermediates and output: the input and output
    are stored as float16, the intermediates (read by computing ops only) as float32 rounded to
    float16 values, the pool needs no more than the float32 model's, and the answer is within
    FLOAT16_TOLERANCE of ONNX Runtime's."""
    model = zoo.with_float16(zoo.build("squeezenet1_1"))
    x = np.random.default_rng(zlib.crc32(b"squeezenet1_1")).standard_normal(zoo.input_shape("squeezenet1_1"))
    sess = _check(model, {"input": x.astype(np.float16)}, backend, FLOAT16_TOLERANCE)
    conversions = [op for op in sess.program.ops if isinstance(op, A.Unary) and op.op == "identity"]
    assert [(op.dtype, op.output_dtype()) for op in conversions] == [("float16", "float32"), ("float32", "float16")], \
        "the float16 intermediates, read by computing ops only, are rounded float32 tensors: only the input and the " \
        "output convert"
    assert _narrow_tensors(sess.program) == {"input", model.graph.output[0].name}
    float32 = gpumnn.load(zoo.build("squeezenet1_1")).session(backend=backend)
    # on the session's backend: a GPU backend without float16 kernels leaves the input's and the
    # output's conversions, and so a small pool of its own, to the cpu
    peak = {name: s.memory_summary()[backend]["pool_bytes"] for name, s in (("float16", sess), ("float32", float32))}
    assert peak["float16"] <= peak["float32"], peak


def test_casts_to_narrow_types_convert_as_numpy_does(backend):
    """Cast to float16 rounds to nearest even and overflows to inf; Cast to int8/uint8 truncates a
    float toward zero and wraps (through int64, as ``astype`` does), and wraps an int32 (ONNX leaves
    out-of-range values to the implementation: these are gpumnn's)."""
    f = np.array([0.1, -2.5, 65519.0, 65520.0, -1e6, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 300.7, -129.9],
                 np.float32)
    i = np.array([-129, 128, 255, 256, -1, 2 ** 31 - 1, -2 ** 31, 7, 0], np.int32)
    nodes = [helper.make_node("Cast", ["f"], ["f_half"], to=T.FLOAT16)]
    outputs = [helper.make_tensor_value_info("f_half", T.FLOAT16, None)]
    for name, code in (("int8", T.INT8), ("uint8", T.UINT8)):
        nodes += [helper.make_node("Cast", ["f"], [f"f_{name}"], to=code),
                  helper.make_node("Cast", ["i"], [f"i_{name}"], to=code)]
        outputs += [helper.make_tensor_value_info(f"{src}_{name}", code, None) for src in "fi"]
    model = _model(nodes, [helper.make_tensor_value_info("f", T.FLOAT, [9]), helper.make_tensor_value_info("i", T.INT32, [9])],
                   outputs)
    got = gpumnn.load(model).session(backend=backend).run({"f": f, "i": i})
    with np.errstate(over="ignore"):  # the overflow to inf is the point
        np.testing.assert_array_equal(got["f_half"], f.astype(np.float16))
    for name in ("int8", "uint8"):
        np.testing.assert_array_equal(got[f"f_{name}"], f.astype(np.int64).astype(name), err_msg=name)
        np.testing.assert_array_equal(got[f"i_{name}"], i.astype(name), err_msg=name)



def test_casts_of_floats_in_range_to_narrow_types_truncate(backend):
    """Cast to int8/uint8 of floats that all truncate into the type's range (the cpu's direct cast,
    without the int64 temporary) truncates toward zero as the cast through int64 does: the range's
    ends, fractions either side of zero and just inside the ends."""
    values = {"int8": [-128.0, -127.9, -0.7, -0.0, 0.7, 1.5, 126.99, 127.0],
              "uint8": [0.0, 0.3, 0.9999, 1.5, 128.5, 254.99, 255.0, 17.0]}
    nodes = [helper.make_node("Cast", [f"f_{name}"], [name], to=code) for name, code in (("int8", T.INT8), ("uint8", T.UINT8))]
    model = _model(nodes, [helper.make_tensor_value_info(f"f_{name}", T.FLOAT, [8]) for name in values],
                   [helper.make_tensor_value_info(name, code, None) for name, code in (("int8", T.INT8), ("uint8", T.UINT8))])
    feed = {f"f_{name}": np.array(v, np.float32) for name, v in values.items()}
    got = gpumnn.load(model).session(backend=backend).run(feed)
    for name in values:
        np.testing.assert_array_equal(got[name], feed[f"f_{name}"].astype(np.int64).astype(name), err_msg=name)

# -- round trips through narrow storage (geometry/round_trips.py) --------------------------------------

def _rounding_count(program: A.AtomicProgram) -> int:
    """The ops of ``program`` that round to float16: Unary ``round_f16`` ops and epilogues."""
    return sum(isinstance(op, A.Unary) and op.op == "round_f16" or getattr(op, "activation", None) == ("round_f16", ())
               for op in program.ops)


def _narrow_tensors(program: A.AtomicProgram) -> set[str]:
    return {n for op in program.ops for n in op.inputs + op.outputs if program.storage_dtype_of(n) in A.NARROW_DTYPES}


def test_float16_round_trips_become_one_rounding(backend):
    """float32 -> float16 -> float32 read by computing ops only: no float16 tensor is left, one
    ``round_f16`` does what the pair did (overflow to inf included), and a second round trip of
    values that are float16 values already (a relu of rounded values) costs nothing."""
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=T.FLOAT16),
             helper.make_node("Cast", ["h"], ["hf"], to=T.FLOAT),
             helper.make_node("Sub", ["x", "hf"], ["error"]),
             helper.make_node("Relu", ["hf"], ["r"]),
             helper.make_node("Cast", ["r"], ["rh"], to=T.FLOAT16),
             helper.make_node("Cast", ["rh"], ["rf"], to=T.FLOAT),
             helper.make_node("Add", ["rf", "rf"], ["doubled"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", T.FLOAT, [12])],
                   [helper.make_tensor_value_info("error", T.FLOAT, None), helper.make_tensor_value_info("doubled", T.FLOAT, None)])
    sess = gpumnn.load(model).session(backend=backend)
    assert not _narrow_tensors(sess.program), sess.program.ops
    assert _rounding_count(sess.program) == 1, sess.program.ops
    x = np.array([0.1, -2.5, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 65519.0, 65520.0, -1e6, 3e-8, -0.3, 7.77, 0, 1e-4],
                 np.float32)
    got = sess.run({"x": x})
    with np.errstate(over="ignore"):  # the overflow to inf is part of the semantics
        rounded = x.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got["error"], x - rounded)
    np.testing.assert_array_equal(got["doubled"], 2 * np.maximum(rounded, 0))


def test_float16_graph_keeps_only_the_narrow_tensors_it_needs(backend):
    """In ``_add_model`` the float16 inputs, the Transpose's input and the output stay float16; the
    Add's float16 result, read only by the MatMul, is rounded in the Add's epilogue instead."""
    sess = gpumnn.load(_add_model()).session(backend=backend)
    assert _narrow_tensors(sess.program) == {"x", "y", "z", "t"}
    assert _rounding_count(sess.program) == 1
    assert [op.kind for op in sess.program.ops] == ["unary", "unary", "binary", "matmul", "unary", "raster", "unary"]


def test_a_narrow_integer_round_trip_that_may_wrap_stays(backend):
    """int32 -> int8/uint8 -> int32 wraps around to 8 bits: lowering cannot know the values fit,
    so the narrow tensor stays and the answer wraps as NumPy's ``astype`` does."""
    i = np.array([-129, 128, 255, 256, -1, 2 ** 31 - 1, -2 ** 31, 7, 0], np.int32)
    for name, code in (("int8", T.INT8), ("uint8", T.UINT8)):
        nodes = [helper.make_node("Cast", ["i"], ["narrow"], to=code), helper.make_node("Cast", ["narrow"], ["wide"], to=T.INT32),
                 helper.make_node("Add", ["wide", "one"], ["y"])]
        model = _model(nodes, [helper.make_tensor_value_info("i", T.INT32, [9])], [helper.make_tensor_value_info("y", T.INT32, None)],
                       [("one", np.array(1, np.int32))])
        sess = gpumnn.load(model).session(backend=backend)
        assert _narrow_tensors(sess.program) == {"narrow"}, name
        np.testing.assert_array_equal(sess.run({"i": i})["y"], i.astype(name).astype(np.int32) + 1, err_msg=name)
