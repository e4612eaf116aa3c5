"""Static int8 on the GPU APIs (issue 30): QuantizedConv2D's kernels of both GPU families
(quantized_conv.cl on opencl and cuda, quantized_conv2d.comp on vulkan and gl, packed bytes and
native 8-bit storage) give the contract's bits exactly: those of the NumPy reference."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import require_backend
from gpumnn.backends import create_backend
from gpumnn.backends.cpu import int8_conv
from test_static_int8 import GEOMETRIES, _case

#: backend, its options: both kernel families and Vulkan's packed bytes beside its native ones
TARGETS = [("opencl", {"kernels": "tiled"}), ("opencl", {"kernels": "simd"}), ("vulkan", {}), ("vulkan", {"kernels": "tiled"}),
           ("vulkan", {"narrow_storage": "packed"}), ("gl", {}), ("gl", {"kernels": "tiled"}), ("cuda", {})]


@pytest.fixture(scope="module", params=TARGETS, ids=[f"{n}{'-' + '-'.join(o.values()) if o else ''}" for n, o in TARGETS])
def gpu(request):
    name, options = request.param
    require_backend(name)
    be = create_backend(name, **options)
    yield be
    be.close()


def _run(be, op, x, w, bias, multiplier) -> np.ndarray:
    """The op on ``be``: x and the output at unaligned-looking offsets of one pool, the rest constants."""
    out_shape = (op.batch, op.out_channels) + op.out_hw
    x_at, out_at = 4 * be.alignment, 8 * be.alignment + x.nbytes
    pool = be.allocate(out_at + int(np.prod(out_shape)) + 4 * be.alignment)
    try:
        xh = be.tensor(pool, x_at, x.shape, op.dtype)
        yh = be.tensor(pool, out_at, out_shape, op.out_dtype)
        be.write(xh, x)
        be.write(yh, np.full(out_shape, 7, op.out_dtype))
        ins = [xh, be.constant(w), be.constant(bias), be.constant(multiplier)]
        exe = be.create_execution(op, ins, [yh])
        be.submit(be.record([exe]))
        return be.read(yh)
    finally:
        be.release(pool)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=[g[0] for g in GEOMETRIES])
@pytest.mark.parametrize("types", [("int8", "int8"), ("uint8", "uint8"), ("uint8", "int8")], ids="-".join)
def test_gpu_quantized_conv_is_the_contract_exactly(gpu, geometry, types):
    op, x, w, bias, multiplier, _ = _case(geometry, *types, seed=1)
    got = _run(gpu, op, x, w, bias, multiplier)
    np.testing.assert_array_equal(got, int8_conv.quantized_conv_reference(op, x, w, bias, multiplier))
