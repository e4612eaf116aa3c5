"""Index-driven ops (GatherElements, GatherND, ScatterND, ScatterElements, OneHot, Trilu, TopK,
NonZero) and Einsum on every backend against ONNX Runtime: floats to relative L2 < 1e-4,
integers exactly, output dtypes as ONNX Runtime gives them."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import gpumnn
from conftest import onnxruntime_session, rel_l2
from gpumnn.errors import DataDependentError

TOLERANCE = 1e-4
RNG = np.random.default_rng(2024)


def _f32(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _ints(low: int, high: int, *shape, dtype=np.int64) -> np.ndarray:
    return RNG.integers(low, high, size=shape).astype(dtype)


@dataclass
class Case:
    id: str
    op_type: str
    feeds: dict[str, np.ndarray]  # run-time inputs
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    order: list[str] | None = None  # node inputs in order ("" for an absent optional one)
    attrs: dict = field(default_factory=dict)
    outputs: int = 1
    opset: int = 18

    def model(self) -> onnx.ModelProto:
        names = self.order if self.order is not None else list(self.feeds) + list(self.consts)
        outs = [f"y{i}" for i in range(self.outputs)]
        node = helper.make_node(self.op_type, names, outs, name=f"{self.op_type.lower()}_node", **self.attrs)
        graph = helper.make_graph(
            [node], self.id.replace("-", "_"),
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
             for n, v in self.feeds.items()],
            [helper.make_empty_tensor_value_info(o) for o in outs],
            [numpy_helper.from_array(np.asarray(v), n) for n, v in self.consts.items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=8)


def _distinct_rows(count: int, rows: int, *, negative: bool = True) -> np.ndarray:
    """``count`` distinct row indices of ``rows``, some spelled negatively (ScatterND with
    reduction none: repeated rows have no defined result)."""
    picked = RNG.permutation(rows)[:count].astype(np.int64)
    if negative:
        picked[::2] -= rows
    return picked


def _cases() -> list[Case]:
    c: list[Case] = []
    # -- GatherElements
    c.append(Case("GatherElements-axis0-negative", "GatherElements",
                  {"x": _f32(4, 5), "i": _ints(-4, 4, 3, 5)}, attrs={"axis": 0}))
    c.append(Case("GatherElements-last-axis-smaller", "GatherElements",
                  {"x": _f32(3, 4, 6), "i": _ints(-6, 6, 2, 4, 3)}, attrs={"axis": -1}))
    c.append(Case("GatherElements-int32-data", "GatherElements",
                  {"x": _ints(-100, 100, 4, 5, dtype=np.int32), "i": _ints(-5, 5, 4, 2, dtype=np.int32)},
                  attrs={"axis": 1}))
    c.append(Case("GatherElements-const-indices", "GatherElements", {"x": _f32(4, 5)},
                  {"i": _ints(-4, 4, 2, 5)}, attrs={"axis": 0}))
    # -- GatherND
    c.append(Case("GatherND-batch0", "GatherND",
                  {"x": _f32(3, 4, 5), "i": np.stack([_ints(-3, 3, 2, 3), _ints(-4, 4, 2, 3)], axis=-1)}))
    c.append(Case("GatherND-batch0-full-tuple", "GatherND",
                  {"x": _f32(3, 4, 5), "i": np.stack([_ints(0, 3, 4), _ints(0, 4, 4), _ints(-5, 5, 4)], axis=-1)}))
    c.append(Case("GatherND-batch1", "GatherND",
                  {"x": _f32(2, 3, 4), "i": _ints(-3, 3, 2, 5, 1)}, attrs={"batch_dims": 1}))
    c.append(Case("GatherND-batch1-const", "GatherND", {"x": _f32(2, 3, 4)},
                  {"i": np.stack([_ints(0, 3, 2, 2), _ints(-4, 4, 2, 2)], axis=-1)}, attrs={"batch_dims": 1}))
    # -- ScatterND
    c.append(Case("ScatterND-none", "ScatterND",
                  {"x": _f32(5, 3, 2), "i": _distinct_rows(3, 5).reshape(3, 1), "u": _f32(3, 3, 2)}))
    c.append(Case("ScatterND-none-elements", "ScatterND",
                  {"x": _f32(4, 3), "i": np.array([[0, 1], [-1, -1], [2, 0]], np.int64), "u": _f32(3)}))
    c.append(Case("ScatterND-add-repeated", "ScatterND",
                  {"x": _f32(4, 3), "i": np.array([[1], [1], [-1], [1]], np.int64), "u": _f32(4, 3)},
                  attrs={"reduction": "add"}))
    c.append(Case("ScatterND-add-int32", "ScatterND",
                  {"x": _ints(-9, 9, 4, 3, dtype=np.int32), "i": _ints(-4, 4, 5, 1), "u": _ints(-9, 9, 5, 3, dtype=np.int32)},
                  attrs={"reduction": "add"}))
    # -- ScatterElements
    c.append(Case("ScatterElements-none-axis1", "ScatterElements",
                  {"x": _f32(3, 5), "i": np.stack([_distinct_rows(2, 5) for _ in range(3)]), "u": _f32(3, 2)},
                  attrs={"axis": 1}))
    c.append(Case("ScatterElements-none-axis0", "ScatterElements",
                  {"x": _f32(4, 3), "i": np.stack([_distinct_rows(2, 4) for _ in range(3)], axis=1), "u": _f32(2, 3)}))
    c.append(Case("ScatterElements-mul-axis1", "ScatterElements",
                  {"x": _f32(3, 5), "i": _ints(-5, 5, 3, 4), "u": _f32(3, 4)}, attrs={"axis": 1, "reduction": "mul"}))
    c.append(Case("ScatterElements-max-const-indices", "ScatterElements", {"x": _f32(3, 5), "u": _f32(3, 4)},
                  {"i": _ints(-5, 5, 3, 4)}, order=["x", "i", "u"], attrs={"axis": 1, "reduction": "max"}))
    # -- OneHot
    values = np.array([-0.5, 2.0], np.float32)
    c.append(Case("OneHot-last-axis", "OneHot", {"i": _ints(-5, 5, 3, 4)}, {"depth": np.int64(5), "v": values}))
    c.append(Case("OneHot-axis0-out-of-range", "OneHot", {"i": _ints(-7, 7, 3, 4)},
                  {"depth": np.float32(5), "v": values}, attrs={"axis": 0}))
    c.append(Case("OneHot-runtime-int-values", "OneHot", {"i": _ints(-4, 4, 6), "v": np.array([3, 9], np.int64)},
                  {"depth": np.int64(4)}, order=["i", "depth", "v"], attrs={"axis": -2}))
    c.append(Case("OneHot-float-indices", "OneHot", {"i": _ints(-3, 3, 2, 3).astype(np.float32)},
                  {"depth": np.float32(3), "v": values}, attrs={"axis": 1}))
    # -- Trilu
    for upper in (1, 0):
        for k in (-1, 0, 2):
            c.append(Case(f"Trilu-{'upper' if upper else 'lower'}-k{k}", "Trilu", {"x": _f32(2, 4, 5)},
                          {"k": np.int64(k)}, attrs={"upper": upper}))
    c.append(Case("Trilu-default-k-int", "Trilu", {"x": _ints(-9, 9, 5, 3)}, attrs={"upper": 0}))
    # -- TopK (inputs with ties: integers held as floats)
    tied = RNG.integers(-3, 3, size=(3, 6, 4)).astype(np.float32)
    for largest in (1, 0):
        c.append(Case(f"TopK-{'largest' if largest else 'smallest'}-axis1-ties", "TopK", {"x": tied},
                      {"k": np.array([3], np.int64)}, attrs={"axis": 1, "largest": largest}, outputs=2))
    c.append(Case("TopK-last-axis-int32", "TopK", {"x": _ints(-5, 5, 4, 7, dtype=np.int32)},
                  {"k": np.array([7], np.int64)}, outputs=2))
    # -- NonZero of a constant (folded)
    c.append(Case("NonZero-constant", "NonZero", {}, {"x": _ints(-1, 2, 3, 4)}))
    # -- Einsum
    for eq, shapes in [("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
                       ("ii->i", [(4, 4)]), ("ij->", [(3, 5)]), ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)]),
                       ("i,i->", [(7,), (7,)]), ("...ij,...jk", [(2, 1, 4, 5), (1, 3, 5, 2)]), ("ij,jk", [(3, 4), (4, 2)]),
                       ("ij->ji", [(3, 4)]), ("ij,kj->ikj", [(3, 4), (5, 4)]), ("bii->bi", [(2, 3, 3)]),
                       ("ab,bc,cd->ad", [(2, 3), (3, 4), (4, 5)]), ("ijk,ikl->jl", [(2, 3, 4), (2, 4, 5)]),
                       ("i,j->ij", [(3,), (4,)]), ("...ii->...i", [(2, 3, 3)]), ("iij,jk->ik", [(3, 3, 4), (4, 2)])]:
        feeds = {f"x{n}": _f32(*s) for n, s in enumerate(shapes)}
        c.append(Case(f"Einsum-{eq}", "Einsum", feeds, attrs={"equation": eq}))
    c.append(Case("Einsum-int-transpose-sum", "Einsum", {"x": _ints(-9, 9, 3, 4, 2)}, attrs={"equation": "ijk->kj"}))
    return c


CASES = _cases()


def _reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = onnxruntime_session(model)
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_matches_onnxruntime(case: Case, backend: str) -> None:
    model = case.model()
    ref = _reference(model, case.feeds)
    got = gpumnn.load(model).session(backend=backend, fallback=False).run(case.feeds)
    assert set(got) == set(ref)
    for name, want in ref.items():
        have = np.asarray(got[name])
        assert have.dtype == want.dtype, f"{name}: dtype {have.dtype} != {want.dtype}"
        assert have.shape == want.shape, f"{name}: shape {have.shape} != {want.shape}"
        if want.dtype.kind == "f":
            assert rel_l2(have, want) < TOLERANCE, f"{name}: relative L2 {rel_l2(have, want):.2e} on {backend}"
        else:
            np.testing.assert_array_equal(have, want, err_msg=f"{name} on {backend}")


def test_nonzero_of_small_runtime_data_is_bound_and_of_large_refused() -> None:
    """NonZero's output shape is its input's count of non-zero elements: a small input is bound (each
    value prepares its shape set once, as MNN's resizeSession reads such inputs); a large one is refused."""
    case = Case("NonZero-runtime", "NonZero", {"x": _f32(3, 4)})
    with gpumnn.load(case.model()).session(backend="cpu") as sess:
        for x in (case.feeds["x"], np.where(case.feeds["x"] > 0, case.feeds["x"], 0), case.feeds["x"]):
            (got,) = sess.run({"x": x}).values()
            np.testing.assert_array_equal(got, np.array(np.nonzero(x), dtype=np.int64))
        assert (sess.stats["prepares"], sess.stats["cache_hits"]) == (2, 1)
    big = Case("NonZero-large", "NonZero", {"x": _f32(64, 64)})
    with pytest.raises(DataDependentError, match="NonZero"):
        gpumnn.load(big.model()).session(backend="cpu")


def test_integer_einsum_product_runs_on_the_cpu(backend: str) -> None:
    """GPU matrix kernels are float: an integer product is placed on the cpu backend, visibly."""
    case = Case("Einsum-int-product", "Einsum", {"a": _ints(-9, 9, 2, 3), "b": _ints(-9, 9, 3, 2)},
                attrs={"equation": "ij,jk->ik"})
    sess = gpumnn.load(case.model()).session(backend=backend)
    (got,) = sess.run(case.feeds).values()
    np.testing.assert_array_equal(got, case.feeds["a"] @ case.feeds["b"])
    matmuls = [r for r in sess.report_rows() if r["op"] == "matmul"]
    assert matmuls and all(r["backend"] == "cpu" for r in matmuls)


def test_constant_indices_out_of_range_are_refused() -> None:
    case = Case("GatherElements-bad", "GatherElements", {"x": _f32(3, 4)}, {"i": np.array([[0, 4]], np.int64)},
                attrs={"axis": 1})
    with pytest.raises(gpumnn.ModelError, match="out of range"):
        gpumnn.load(case.model()).session(backend="cpu")


def test_runtime_indices_gather_on_flat_data() -> None:
    """GatherElements with run-time indices is one atomic Gather on the flattened data (and no
    Raster), its flat positions computed by integer Binary ops."""
    case = CASES[0]
    program = gpumnn.load(case.model()).session(backend="cpu").program
    kinds = [type(op).__name__ for op in program.ops]
    assert kinds.count("Gather") == 1 and "Raster" not in kinds
    gather = next(op for op in program.ops if type(op).__name__ == "Gather")
    assert (gather.outer, gather.axis, gather.inner, gather.count) == (1, 20, 1, 15)
