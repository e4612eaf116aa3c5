"""Every supported ONNX op on every backend against ONNX Runtime (relative L2 < 1e-4)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import gpumnn
from conftest import rel_l2
from op_cases import COMPOSITE_CASES, OP_CASES

TOLERANCE = 1e-4


def _reference(model_bytes: bytes, feeds):
    sess = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _check(model, feeds, backend):
    ref = _reference(model.SerializeToString(), feeds)
    sess = gpumnn.load(model).session(backend=backend, fallback=False)
    got = sess.run(feeds)
    assert set(got) == set(ref)
    for name, value in ref.items():
        assert got[name].shape == value.shape, f"{name}: shape {got[name].shape} != {value.shape}"
        err = rel_l2(got[name], value)
        assert err < TOLERANCE, f"{name}: relative L2 error {err:.2e} on {backend}"
    return sess


@pytest.mark.parametrize("case", OP_CASES, ids=[c.id for c in OP_CASES])
def test_op_matches_onnxruntime(case, backend):
    feeds = case.feeds()
    assert all(np.std(v) > 0 for v in feeds.values()), "inputs must not be constant"
    _check(case.model(), feeds, backend)


@pytest.mark.parametrize("case", COMPOSITE_CASES, ids=[c[0] for c in COMPOSITE_CASES])
def test_composite_graph_matches_onnxruntime(case, backend):
    _, build, shapes = case
    rng = np.random.default_rng(7)
    feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    _check(build(), feeds, backend)


def test_supported_ops_cover_the_cases():
    supported = set(gpumnn.supported_ops())
    missing = {c.op_type for c in OP_CASES} - supported
    assert not missing
    wanted = ("Conv ConvTranspose Gemm MatMul Add Sub Mul Div Pow Max Min Relu LeakyRelu PRelu Clip Sigmoid Tanh Erf "
              "Gelu HardSigmoid HardSwish Exp Log Sqrt Neg Abs Softmax LogSoftmax MaxPool AveragePool GlobalAveragePool "
              "GlobalMaxPool BatchNormalization LayerNormalization InstanceNormalization Concat Split Slice Reshape "
              "Flatten Transpose Squeeze Unsqueeze Pad Resize ReduceMean ReduceSum ReduceMax ReduceMin Gather Cast "
              "Shape Constant ConstantOfShape Expand Tile Sum LRN DepthToSpace SpaceToDepth").split()
    assert not (set(wanted) - supported - {"Constant"})  # Constant becomes an initializer at import
