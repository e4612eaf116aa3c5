"""The cpu backend's ops on 8-bit values besides the convolutions: the static int8 sum
``QuantizedAdd`` (a QDQ model's residual Add between its DequantizeLinear and QuantizeLinear nodes,
ONNX Runtime's QLinearAdd), the global average pooling ``QuantizedGlobalAveragePool`` (int32 sums of
the 8-bit planes, requantized), max pooling of int8 or uint8 elements (a QDQ model's MaxPool) and
``Quantize`` (a QuantizeLinear per tensor of float32 values, in one pass).

The sum's arithmetic is the contract's in float32, operation by operation: the NumPy kernel
computes it in passes over a float32 scratch, the compiled one in one loop with no fused
multiply-add (Numba without ``fastmath``), so both give the float path's bits. The compiled max
pooling takes each output row's window rows' maximum into a row padded with the type's least value,
then the windows along it (3-wide at stride 2, the usual one, with constant offsets, which LLVM
vectorises); NumPy's separable passes are the reference.
"""
from __future__ import annotations

import numpy as np

from ... import atomic as A
from ..base import KernelWork
from . import jit as cpu_jit
from .reference import _on_pool, _spans, typed, view

#: elements from which the compiled sum is cut into spans, one per thread of the backend's pool
PARALLEL_MIN_ELEMENTS = 1 << 15


def quantized_add_reference(op: A.QuantizedAdd, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The contract's QuantizedAdd in NumPy: a, b of ``op.dtype`` -> out of ``op.out_dtype`` (a new array)."""
    total = np.empty(a.shape, np.float32)
    _float_sum_into(op, a, b, total, np.empty(a.shape, np.float32))
    return total.astype(op.out_dtype)


def _float_sum_into(op: A.QuantizedAdd, a: np.ndarray, b: np.ndarray, total: np.ndarray, other: np.ndarray) -> None:
    """``total`` = the requantized sum as integer-valued float32 (``other``: scratch of its shape)."""
    np.subtract(a, np.float32(op.a_zero_point), out=total, dtype=np.float32)  # 8-bit integers: exact in float32
    np.multiply(total, np.float32(op.a_scale), out=total)
    np.subtract(b, np.float32(op.b_zero_point), out=other, dtype=np.float32)
    np.multiply(other, np.float32(op.b_scale), out=other)
    np.add(total, other, out=total)
    np.divide(total, np.float32(op.y_scale), out=total)
    np.rint(total, out=total)
    np.add(total, np.float32(op.y_zero_point), out=total)
    np.clip(total, np.float32(op.lo), np.float32(op.hi), out=total)


def _quantized_sum(a, b, out, a_zero, a_scale, b_zero, b_scale, y_scale, y_zero, lo, hi):
    """The contract's sum over every element of the 1-D arrays: the scales and bounds are float32,
    the zero points integers (``y_zero`` a float32 of one)."""
    for i in range(out.size):
        fa = np.float32(np.int32(a[i]) - a_zero) * a_scale
        fb = np.float32(np.int32(b[i]) - b_zero) * b_scale
        q = np.rint((fa + fb) / y_scale) + y_zero
        out[i] = np.int32(min(max(q, lo), hi))


_compiled_sum = cpu_jit.compiled(_quantized_sum, fastmath=False, error_model="numpy") if cpu_jit.available() else None


def _flat(handle) -> np.ndarray:
    return typed(handle)[handle.offset:handle.offset + handle.size]


def make_quantized_add(op: A.QuantizedAdd, ins, outs, pool, engine) -> KernelWork:
    """The cpu execution of ``op``: the compiled loop (spans on the backend's threads for large
    tensors) where Numba runs, else the NumPy passes."""
    a, b, out = _flat(ins[0]), _flat(ins[1]), _flat(outs[0])
    if not engine.jit:
        total, other = np.empty(op.count, np.float32), np.empty(op.count, np.float32)

        def reference() -> None:
            _float_sum_into(op, a, b, total, other)
            np.copyto(out, total, casting="unsafe")
        return KernelWork((reference,), "int8 NumPy")
    arguments = (np.int32(op.a_zero_point), np.float32(op.a_scale), np.int32(op.b_zero_point),
                 np.float32(op.b_scale), np.float32(op.y_scale), np.float32(op.y_zero_point), np.float32(op.lo),
                 np.float32(op.hi))
    kernel = cpu_jit.bind(_compiled_sum, a, b, out, *arguments)
    parts = pool.threads if op.count >= PARALLEL_MIN_ELEMENTS else 1
    spans = [(a[s:e], b[s:e], out[s:e]) for s, e in _spans(op.count, parts, 64)]

    def chunk(k: int, slot: int) -> None:
        kernel(*spans[k], *arguments)
    return KernelWork((_on_pool(pool, len(spans), chunk),), "int8 compiled")


def quantize_reference(op: A.Quantize, x: np.ndarray) -> np.ndarray:
    """The contract's Quantize in NumPy, the passes the lowering otherwise emits: float32 x -> out of
    ``op.out_dtype`` (a new array)."""
    total = np.divide(x, np.float32(op.y_scale), dtype=np.float32)
    np.rint(total, out=total)
    np.add(total, np.float32(op.y_zero_point), out=total)
    np.clip(total, np.float32(op.lo), np.float32(op.hi), out=total)
    return total.astype(op.out_dtype)


def _quantize_values(x, out, y_scale, y_zero, lo, hi):
    """The contract's Quantize over every element of the 1-D arrays (the scale, zero point and
    bounds float32): one pass, the quotient correctly rounded as NumPy's."""
    for i in range(out.size):
        q = np.rint(x[i] / y_scale) + y_zero
        out[i] = np.int32(min(max(q, lo), hi))


_compiled_quantize = (cpu_jit.compiled(_quantize_values, fastmath=False, error_model="numpy")
                      if cpu_jit.available() else None)


def make_quantize(op: A.Quantize, ins, outs, pool, engine) -> KernelWork:
    """The cpu execution of ``op``: the compiled pass (spans on the backend's threads for large
    tensors) where Numba runs, else the NumPy passes."""
    x, out = _flat(ins[0]), _flat(outs[0])
    if not engine.jit:
        def reference() -> None:
            np.copyto(out, quantize_reference(op, x))
        return KernelWork((reference,), "quantize NumPy")
    arguments = (np.float32(op.y_scale), np.float32(op.y_zero_point), np.float32(op.lo), np.float32(op.hi))
    kernel = cpu_jit.bind(_compiled_quantize, x, out, *arguments)
    parts = pool.threads if op.count >= PARALLEL_MIN_ELEMENTS else 1
    spans = [(x[s:e], out[s:e]) for s, e in _spans(op.count, parts, 64)]

    def chunk(k: int, slot: int) -> None:
        kernel(*spans[k], *arguments)
    return KernelWork((_on_pool(pool, len(spans), chunk),), "quantize compiled")


def _max_pool_rows(x, out, kh, kw, sh, sw, pt, pl, least, padded):
    """Max pooling of the 8-bit planes x [P, H, W] into out [P, OH, OW]: windows kh x kw at strides
    sh, sw from -pt, -pl, clipped to the input; ``padded`` a row of ``pl`` + W + right padding
    elements, the padding filled with ``least`` (the type's least value) here."""
    planes, h, w = x.shape
    oh, ow = out.shape[1], out.shape[2]
    for i in range(padded.size):
        padded[i] = least
    inner = padded[pl:pl + w]
    for p in range(planes):
        for oy in range(oh):
            y0 = oy * sh - pt
            first, stop = max(y0, 0), min(y0 + kh, h)
            src = x[p, first]
            for i in range(w):
                inner[i] = src[i]
            for iy in range(first + 1, stop):
                src = x[p, iy]
                for i in range(w):
                    v = src[i]
                    inner[i] = v if v > inner[i] else inner[i]
            row = out[p, oy]
            if sw == 2 and kw == 3:  # constant offsets: a vector loop
                for ox in range(ow):
                    a, b, c = padded[2 * ox], padded[2 * ox + 1], padded[2 * ox + 2]
                    a = b if b > a else a
                    row[ox] = c if c > a else a
                continue
            for ox in range(ow):
                m = padded[ox * sw]
                for kx in range(1, kw):
                    v = padded[ox * sw + kx]
                    m = v if v > m else m
                row[ox] = m


_compiled_max_pool = cpu_jit.compiled(_max_pool_rows, error_model="numpy") if cpu_jit.available() else None


def make_max_pool_bytes(op: A.Pool2D, ins, outs, pool, parts: int) -> KernelWork:
    """A max Pool2D of int8 or uint8 planes by the compiled rows (``_max_pool_rows``), its planes in
    ``parts`` spans on the backend's threads, each with its own padded row."""
    (h, w), (oh, ow), (kh, kw), (sh, sw) = op.in_hw, op.out_hw, op.kernel, op.strides
    top, left = op.pads[0], op.pads[1]
    planes = op.batch * op.channels
    x, out = view(ins[0]).reshape(planes, h, w), view(outs[0]).reshape(planes, oh, ow)
    least = x.dtype.type(np.iinfo(x.dtype).min)
    width = max(left + w, (ow - 1) * sw + kw)
    spans = [(x[s:e], out[s:e]) for s, e in _spans(planes, parts)]
    rows = [np.empty(width, x.dtype) for _ in spans]
    geometry = tuple(np.int64(v) for v in (kh, kw, sh, sw, top, left))
    kernel = cpu_jit.bind(_compiled_max_pool, *spans[0], *geometry, least, rows[0])

    def chunk(k: int, slot: int) -> None:
        kernel(*spans[k], *geometry, least, rows[k])
    return KernelWork((_on_pool(pool, len(spans), chunk),), "bytes compiled")


def _planes_of(op: A.QuantizedGlobalAveragePool, x: np.ndarray) -> np.ndarray:
    """x as [N, pixels, C]: each image's pixels of its channels (a view, either layout)."""
    if op.channels_last:
        return x.reshape(op.batch, op.pixels, op.channels)
    return x.reshape(op.batch, op.channels, op.pixels).transpose(0, 2, 1)


def quantized_global_average_pool_reference(op: A.QuantizedGlobalAveragePool, x: np.ndarray) -> np.ndarray:
    """The contract's QuantizedGlobalAveragePool in NumPy: x of ``op.dtype`` (either layout, as the op
    reads it) -> out [N, C] of ``op.out_dtype`` (a new array)."""
    sums = _planes_of(op, x).sum(axis=1, dtype=np.int32) - np.int32(op.pixels * op.x_zero_point)
    scaled = np.rint(sums.astype(np.float32) * np.float32(op.multiplier)) + np.float32(op.y_zero_point)
    return np.clip(scaled, np.float32(op.lo), np.float32(op.hi)).astype(op.out_dtype)


def _global_average_rows(x, out, sums, offset, multiplier, y_zero, lo, hi):
    """The contract over x [N, pixels, C] (channels-last, a contiguous row of C per pixel) into
    out [N, C]: each pixel's row added to ``sums`` (int32 [C]), then requantized; ``offset`` is
    ``pixels * x_zero_point`` (int32), the scalars are float32."""
    batch, pixels, channels = x.shape
    for n in range(batch):
        for c in range(channels):
            sums[c] = 0
        for p in range(pixels):
            row = x[n, p]
            for c in range(channels):
                sums[c] += np.int32(row[c])
        for c in range(channels):
            q = np.rint(np.float32(sums[c] - offset) * multiplier) + y_zero
            out[n, c] = np.int32(min(max(q, lo), hi))


def _global_average_planes(x, out, offset, multiplier, y_zero, lo, hi):
    """The contract over x [N, C, pixels] (NCHW, a contiguous plane per channel) into out [N, C]."""
    batch, channels, pixels = x.shape
    for n in range(batch):
        for c in range(channels):
            plane = x[n, c]
            total = np.int32(0)
            for p in range(pixels):
                total += np.int32(plane[p])
            q = np.rint(np.float32(total - offset) * multiplier) + y_zero
            out[n, c] = np.int32(min(max(q, lo), hi))


_compiled_average_rows = cpu_jit.compiled(_global_average_rows, fastmath=False, error_model="numpy") \
    if cpu_jit.available() else None
_compiled_average_planes = cpu_jit.compiled(_global_average_planes, fastmath=False, error_model="numpy") \
    if cpu_jit.available() else None


def make_quantized_global_average_pool(op: A.QuantizedGlobalAveragePool, ins, outs, engine) -> KernelWork:
    """The cpu execution of ``op``: the compiled loop over pixel rows (channels-last) or planes (NCHW)
    where Numba runs, else NumPy (one pass: the output is one element per plane)."""
    x, out = view(ins[0]), view(outs[0]).reshape(op.batch, op.channels)
    if not engine.jit:
        def reference() -> None:
            np.copyto(out, quantized_global_average_pool_reference(op, x))
        return KernelWork((reference,), "int8 NumPy")
    scalars = (np.int32(op.pixels * op.x_zero_point), np.float32(op.multiplier), np.float32(op.y_zero_point),
               np.float32(op.lo), np.float32(op.hi))
    if op.channels_last:
        planes, sums = x.reshape(op.batch, op.pixels, op.channels), np.empty(op.channels, np.int32)
        kernel = cpu_jit.bind(_compiled_average_rows, planes, out, sums, *scalars)

        def rows() -> None:
            kernel(planes, out, sums, *scalars)
        return KernelWork((rows,), "int8 compiled")
    planes = x.reshape(op.batch, op.channels, op.pixels)
    kernel = cpu_jit.bind(_compiled_average_planes, planes, out, *scalars)

    def each_plane() -> None:
        kernel(planes, out, *scalars)
    return KernelWork((each_plane,), "int8 compiled")
