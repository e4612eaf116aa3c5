"""Models too large for a device (or the host) fail with a ResourceError before anything is allocated.

Every case runs on every backend. "Nothing allocated" is checked by counting calls of every
backend class's ``allocate`` and ``constant`` during the failing session creation.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import gpumnn
from gpumnn import zoo
from gpumnn.backends import backend_class
from gpumnn.backends.cpu.backend import CpuBackend
from gpumnn.backends.limits import MemoryLimits

HUGE = 2 ** 40
F = TensorProto.FLOAT


def _model(nodes, inputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_empty_tensor_value_info(nodes[-1].output[0])],
                              initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


@pytest.fixture
def allocations(monkeypatch, backend):
    """Calls of ``allocate`` / ``constant`` on the tested backend and the CPU backend."""
    calls: list[str] = []
    for cls in {backend_class(backend), CpuBackend}:
        for method in ("allocate", "constant"):
            original = getattr(cls, method)

            def spy(self, *args, _original=original, _name=f"{cls.__name__}.{method}", **kwargs):
                calls.append(_name)
                return _original(self, *args, **kwargs)
            monkeypatch.setattr(cls, method, spy)
    return calls


def _refused(net, backend, allocations, input_shapes=None, match="available"):
    with pytest.raises(gpumnn.ResourceError, match=match) as info:
        net.session(backend=backend, input_shapes=input_shapes, fallback=False)
    message = str(info.value)
    assert "bytes" in message and "needs" in message and "available" in message, message
    assert allocations == [], f"allocated before refusing: {allocations}"
    return message


def test_expand_to_a_huge_dimension(backend, allocations):
    net = gpumnn.load(_model([helper.make_node("Expand", ["x", "s"], ["y"], name="big_expand")],
                             [helper.make_tensor_value_info("x", F, [1, 1])], [_ints("s", [1, HUGE])]))
    message = _refused(net, backend, allocations)
    assert "big_expand" in message and str(HUGE) in message


def test_tile_to_a_huge_dimension(backend, allocations):
    net = gpumnn.load(_model([helper.make_node("Tile", ["x", "r"], ["y"], name="big_tile")],
                             [helper.make_tensor_value_info("x", F, [1, 4])], [_ints("r", [1, HUGE])]))
    assert "big_tile" in _refused(net, backend, allocations)


def test_constant_of_shape_with_a_huge_dimension(backend, allocations):
    fill = numpy_helper.from_array(np.array([1.0], np.float32))
    net = gpumnn.load(_model([helper.make_node("ConstantOfShape", ["s"], ["c"], name="big_constant", value=fill),
                              helper.make_node("Add", ["x", "c"], ["y"])],
                             [helper.make_tensor_value_info("x", F, [1, 1])], [_ints("s", [1, HUGE])]))
    assert "big_constant" in _refused(net, backend, allocations)


def test_input_shapes_with_a_huge_dimension(backend, allocations):
    net = gpumnn.load(_model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, [1, "n"])]))
    message = _refused(net, backend, allocations, input_shapes={"x": (1, HUGE)})
    assert f"[1, {HUGE}]" in message  # the largest tensor, with its shape


def test_transpose_of_a_huge_input_stops_in_lowering(backend, allocations):
    net = gpumnn.load(_model([helper.make_node("Transpose", ["x"], ["y"], name="big_transpose", perm=[1, 0])],
                             [helper.make_tensor_value_info("x", F, ["a", "b"])]))
    assert "index maps" in _refused(net, backend, allocations, input_shapes={"x": (2 ** 20, 2 ** 20)})


def _many_live_tensors(count: int):
    """``count`` tensors y_i = x * c_i, all alive until a chain of Adds sums them."""
    nodes, inits = [], []
    for i in range(count):
        inits.append(numpy_helper.from_array(np.array(1.0 + i, np.float32), f"c{i}"))
        nodes.append(helper.make_node("Mul", ["x", f"c{i}"], [f"y{i}"]))
    acc = "y0"
    for i in range(1, count):
        nodes.append(helper.make_node("Add", [acc, f"y{i}"], [f"s{i}"]))
        acc = f"s{i}"
    return _model(nodes, [helper.make_tensor_value_info("x", F, [1, "n"])], inits)


def test_a_graph_just_too_big_for_the_device(backend, allocations):
    """Tensors each small enough for one kernel binding, together more than the device gives."""
    be = backend_class(backend)()
    try:
        limits = be.memory_limits()
    finally:
        be.close()
    tensor = min(64 * 2 ** 20, limits.max_binding) // 4 * 4
    count = int(limits.available * 1.25) // tensor + 2
    net = gpumnn.load(_many_live_tensors(count))
    message = _refused(net, backend, allocations, input_shapes={"x": (1, tensor // 4)})
    assert f"backend {backend!r}" in message and "largest tensor" in message


def test_device_limits_are_respected(backend, allocations, monkeypatch):
    """A small model on a device that says it has 1 MiB is refused, naming that backend; the
    same model runs where the device has room."""
    net = gpumnn.load(zoo.build("squeezenet1_1"))
    tiny = MemoryLimits(2 ** 20, 2 ** 20, 2 ** 20, 2 ** 20, host_memory=False, source="the test")
    monkeypatch.setattr(backend_class(backend), "memory_limits", lambda self: tiny)
    message = _refused(net, backend, allocations, match=f"backend {backend!r}")
    assert "1048576 bytes (1.0 MiB) available (the test)" in message
    monkeypatch.undo()
    with net.session(backend=backend, fallback=False) as sess:
        assert sess.memory_summary()[backend]["pool_bytes"] > 2 ** 20


def test_memory_limits_are_plausible(backend):
    be = backend_class(backend)()
    try:
        limits = be.memory_limits()
    finally:
        be.close()
    assert 0 < limits.available <= limits.total
    assert limits.max_allocation > 0 and limits.max_binding > 0 and limits.source
    assert limits.used is None or limits.used >= 0


def test_resource_error_is_a_gpumnn_error_and_a_memory_error():
    assert issubclass(gpumnn.ResourceError, gpumnn.GpumnnError)
    assert issubclass(gpumnn.ResourceError, MemoryError)
