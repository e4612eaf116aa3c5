"""Dynamic int8 on the GPU APIs (issue 30): QuantizedMatMul's kernels of both GPU families
(quantized_matmul.cl on opencl and cuda; quantize_rows.comp and quantized_matmul.comp on vulkan and
gl, packed bytes and native 8-bit storage) give the contract's bits: rows quantized at run time
exactly as the NumPy reference quantizes them (ties to even included), int32 sums, and the
epilogue's float operations rounded one at a time, so the outputs equal the reference's."""
from __future__ import annotations

import numpy as np
import pytest

from gpumnn import atomic as A
from gpumnn.backends.cpu import activations as cpu_activations, int8 as cpu_int8
from test_gpu_int8 import gpu  # noqa: F401 (the fixture: every GPU backend, both kernel families)
from test_int8 import _run_prequantized, _unfused_dequantized_product

#: (M, K, N): one row, one row wide enough for the widest tiling, K not a multiple of a tile's
#: depth (16) nor of 4, tiles cut at both edges
SHAPES = [(1, 7, 5), (1, 200, 300), (13, 37, 33), (70, 301, 97), (8, 4, 32)]


def _rows(rng, m: int, k: int) -> np.ndarray:
    """x [M, K] with a row of only positive values, one of zeros, and (when K allows) a row whose
    scale is exactly 1 with values halfway between integers, so that rint's ties to even count."""
    x = rng.standard_normal((m, k)).astype(np.float32) * 3
    if m > 2:
        x[1] = np.abs(x[1]) + 0.5
        x[2] = 0.0
    if m > 3 and k >= 4:  # min -100, max 155: scale (155 + 100) / 255 = 1, zero point 100
        x[3] = (np.arange(k) % 9 - 4 + 0.5).astype(np.float32)
        x[3, :2] = -100.0, 155.0
    return x


def _integer_reference(x, weight, weight_scale, bias):
    """The contract's output in NumPy (rows quantized by ``quantize_rows_reference``)."""
    q, scale, zero = cpu_int8.quantize_rows_reference(x)
    acc = q.astype(np.int64) @ weight.astype(np.int64)
    colsum = weight.astype(np.int64).sum(axis=0)
    out = (acc - zero[:, None].astype(np.int64) * colsum).astype(np.float32) * (scale[:, None] * weight_scale)
    return out + bias if bias is not None else out


def _run(be, op, x, weight, weight_scale, bias) -> np.ndarray:
    """The op on ``be``, recorded: x and the output in one pool, the weight and scales constants."""
    x_at, out_at = be.alignment, 2 * be.alignment + x.nbytes
    pool = be.allocate(out_at + 4 * op.m * op.n + be.alignment)
    try:
        xh = be.tensor(pool, x_at // 4, x.shape, A.FLOAT32)
        out = be.tensor(pool, out_at // 4, (op.m, op.n), A.FLOAT32)
        be.write(xh, x)
        be.write(out, np.full((op.m, op.n), 7, np.float32))
        ins = [xh, be.constant(weight), be.constant(weight_scale)] + ([be.constant(bias)] if bias is not None else [])
        exe = be.create_execution(op, ins, [out])
        be.submit(be.record([exe]))
        assert exe.scheme.startswith("int8"), exe.scheme
        return be.read(out)
    finally:
        be.release(pool)


@pytest.mark.parametrize("m,k,n", SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in SHAPES])
@pytest.mark.parametrize("has_bias", [False, True], ids=["nobias", "bias"])
def test_gpu_quantized_matmul_is_the_contract_exactly(gpu, m, k, n, has_bias):  # noqa: F811
    rng = np.random.default_rng(m * k + n + has_bias)
    x = _rows(rng, m, k)
    weight, weight_scale = (rng.integers(-127, 128, (k, n)).astype(np.int8),
                            (rng.random(n) / 64 + 1e-3).astype(np.float32))
    bias = rng.standard_normal(n).astype(np.float32) if has_bias else None
    inputs = ("x", "w", "s") + (("b",) if has_bias else ())
    op = A.QuantizedMatMul(inputs, ("y",), "test", m=m, n=n, k=k, has_bias=has_bias)
    assert gpu.unsupported_reason(op) is None
    np.testing.assert_array_equal(_run(gpu, op, x, weight, weight_scale, bias),
                                  _integer_reference(x, weight, weight_scale, bias))


@pytest.mark.parametrize("activation", [("relu", ()), ("gelu", ()), ("clip", (-0.5, 0.5))], ids=lambda a: a[0])
def test_gpu_quantized_matmul_epilogue_activations(gpu, activation):  # noqa: F811
    """The activation applied to the dequantized sum with the bias: relu and clip exactly, gelu to
    float32 rounding (its formula's evaluation order is the kernel's own)."""
    m, k, n = 21, 50, 70
    rng = np.random.default_rng(5)
    x = _rows(rng, m, k)
    weight, weight_scale = rng.integers(-127, 128, (k, n)).astype(np.int8), (rng.random(n) / 64 + 1e-3).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    op = A.QuantizedMatMul(("x", "w", "s", "b"), ("y",), "test", m=m, n=n, k=k, has_bias=True, activation=activation)
    got = _run(gpu, op, x, weight, weight_scale, bias)
    ref = _integer_reference(x, weight, weight_scale, bias)
    name, params = activation
    if name == "gelu":
        ref = np.vectorize(cpu_activations.gelu_value, otypes=[np.float32])(ref)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, np.maximum(ref, 0) if name == "relu" else np.clip(ref, *map(np.float32, params)))


@pytest.mark.parametrize("m,k,n", SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in SHAPES])
def test_gpu_prequantized_matmul_is_onnxruntimes_unfused_product(gpu, m, k, n):  # noqa: F811
    """Already quantized uint8 rows with one scale and zero point read at each run (0, 131, 255), any
    int8 weight (-128 included): ONNX Runtime's unfused float operations bit for bit."""
    rng = np.random.default_rng(m + k * n)
    weight = rng.integers(-128, 128, (k, n)).astype(np.int8)
    weight[0, 0] = -128
    weight_scale = (rng.random(n) / 64 + 1e-3).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    runs = []
    for x_scale, zero in ((0.0173, 131), (2.5, 0), (1e-3, 255)):
        q = rng.integers(0, 256, (m, k)).astype(np.uint8)
        q[0, 0], q[-1, -1] = 0, 255
        runs.append((q, np.float32(x_scale), zero))
    op = A.QuantizedMatMul(("q", "w", "s", "x_scale", "x_zero", "b"), ("y",), "test", dtype=A.UINT8, m=m, n=n,
                           k=k, has_bias=True, prequantized=True)
    assert gpu.unsupported_reason(op) is None
    results, scheme = _run_prequantized(gpu, op, runs, weight, weight_scale, bias)
    assert scheme.startswith("int8"), scheme
    for got, (q, x_scale, zero) in zip(results, runs):
        np.testing.assert_array_equal(got, _unfused_dequantized_product(q, zero, weight, x_scale, weight_scale, bias))
