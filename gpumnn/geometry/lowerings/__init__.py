"""The lowerings of ONNX ops to atomic ops, a module per op family; importing this package fills
:mod:`gpumnn.geometry.registry`."""
from . import (control_flow, conv, einsum, elementwise, indexing, logic, matmul, microsoft, normalization,  # noqa: F401
               quantize, recurrent, reduce, reorder, resize)
from . import int8_products  # noqa: F401  (after conv, matmul and quantize: it registers Conv, Gemm, MatMul, QLinearConv)
