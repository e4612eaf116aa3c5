"""Issue 12's end-to-end case: a CRNN-style text recogniser (a CNN, then a bidirectional LSTM over
the image columns, then per-column class scores), whose input width changes with every line of
text. It exercises the RNN lowering and the shape-set cache together: three widths run in
alternation on every backend against ONNX Runtime, each prepared once, then only cache hits."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from conftest import onnxruntime_session, rel_l2
from op_cases import model_proto

HEIGHT, HIDDEN, CLASSES = 16, 24, 11
WIDTHS = (32, 48, 64)  # 8, 12 and 16 LSTM steps after two 2x2 poolings


def text_recognizer() -> onnx.ModelProto:
    """x [1, 1, 16, W] -> 2 x (Conv 3x3 + Relu + MaxPool 2x2) -> [1, 16, 4, W/4] -> columns as a
    sequence [W/4, 1, 64] -> bidirectional LSTM -> [W/4, 1, 2*HIDDEN] -> MatMul + Add -> LogSoftmax."""
    rng = np.random.default_rng(12)
    features = 16 * (HEIGHT // 4)
    weights = {
        "w1": rng.standard_normal((8, 1, 3, 3)) * 0.4, "b1": rng.standard_normal(8) * 0.1,
        "w2": rng.standard_normal((16, 8, 3, 3)) * 0.2, "b2": rng.standard_normal(16) * 0.1,
        "W": rng.standard_normal((2, 4 * HIDDEN, features)) * 0.1,
        "R": rng.standard_normal((2, 4 * HIDDEN, HIDDEN)) * 0.1,
        "B": rng.standard_normal((2, 8 * HIDDEN)) * 0.1,
        "proj": rng.standard_normal((2 * HIDDEN, CLASSES)) * 0.3, "bias": rng.standard_normal(CLASSES) * 0.1,
        "seq_shape": np.array([-1, 1, features]), "out_shape": np.array([-1, 1, 2 * HIDDEN]),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Transpose", ["p2"], ["columns"], perm=[3, 0, 1, 2]),  # [T, 1, 16, 4]
        helper.make_node("Reshape", ["columns", "seq_shape"], ["sequence"]),  # [T, 1, 64]
        helper.make_node("LSTM", ["sequence", "W", "R", "B"], ["Y"], hidden_size=HIDDEN, direction="bidirectional"),
        helper.make_node("Transpose", ["Y"], ["Yt"], perm=[0, 2, 1, 3]),  # [T, 1, 2, HIDDEN]
        helper.make_node("Reshape", ["Yt", "out_shape"], ["states"]),  # [T, 1, 2*HIDDEN]
        helper.make_node("MatMul", ["states", "proj"], ["scores"]),
        helper.make_node("Add", ["scores", "bias"], ["logits"]),
        helper.make_node("LogSoftmax", ["logits"], ["log_probs"], axis=2),
    ]
    inits = [numpy_helper.from_array(np.asarray(v, np.int64 if v.dtype.kind == "i" else np.float32), k)
             for k, v in weights.items()]
    graph = helper.make_graph(
        nodes, "text_recognizer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, HEIGHT, "W"])],
        [helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, ["T", 1, CLASSES])], inits)
    model = model_proto(graph, 17)
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.fixture(scope="module")
def model():
    proto = text_recognizer()
    return gpumnn.load(proto), onnxruntime_session(proto)


def test_text_lines_of_three_widths_in_alternation(backend, model):
    net, reference = model
    rng = np.random.default_rng(0)
    with net.session(backend=backend, fallback=False) as sess:  # no input_shapes: each line's width says
        for width in WIDTHS * 2:
            x = rng.standard_normal((1, 1, HEIGHT, width)).astype(np.float32)
            got = sess.run({"x": x})["log_probs"]
            want = reference.run(None, {"x": x})[0]
            assert got.shape == want.shape == (width // 4, 1, CLASSES)
            assert rel_l2(got, want) < 1e-3, width
        stats = sess.stats
        assert (stats["prepares"], stats["cache_hits"], stats["evictions"]) == (3, 3, 0)
        placed = {row["backend"] for row in sess.report_rows()}
        assert placed == {backend}, f"ops fell back: {placed}"


def test_a_vulkan_device_with_four_bindings_leaves_the_recurrent_cell_to_the_cpu(model, monkeypatch):
    """Vulkan guarantees 4 storage buffers per shader stage; the recurrent cell binds 6. On a
    device with fewer the cell runs on the cpu, visibly, and the answer does not change."""
    from conftest import require_backend
    from gpumnn.backends.vulkan.device import VulkanDevice

    require_backend("vulkan")
    net, reference = model
    original = VulkanDevice.__init__

    def four_bindings(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.max_storage_buffers = 4

    monkeypatch.setattr(VulkanDevice, "__init__", four_bindings)
    x = np.random.default_rng(1).standard_normal((1, 1, HEIGHT, 40)).astype(np.float32)
    with net.session(backend="vulkan", fallback=False, input_shapes={"x": x.shape}) as sess:
        assert rel_l2(sess.run({"x": x})["log_probs"], reference.run(None, {"x": x})[0]) < 1e-3
        fallbacks = {r["op"]: r["fallback"] for r in sess.report_rows() if r["backend"] == "cpu"}
    assert set(fallbacks) == {"recurrent_cell"}, fallbacks
    assert "maxPerStageDescriptorStorageBuffers is 4" in fallbacks["recurrent_cell"]
