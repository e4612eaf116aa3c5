"""The lowerings of ONNX ops to atomic ops, a module per op family; importing this package fills
:mod:`gpumnn.geometry.registry`."""
from . import compute, control_flow, einsum, indexing, logic, recurrent, reorder  # noqa: F401
