"""The lowerings of ONNX ops to atomic ops, a module per op family; importing this package fills
:mod:`gpumnn.geometry.registry`."""
from . import (control_flow, conv, einsum, elementwise, indexing, logic, matmul, normalization, recurrent,  # noqa: F401
               quantize, reduce, reorder, resize)
