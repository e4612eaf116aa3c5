"""Lowering of Resize: nearest and linear / cubic sampling (separable, as MatMuls with host-built
weights where that is cheaper)."""
from __future__ import annotations

import numpy as np

from ... import atomic as A
from ...errors import ModelError, UnsupportedOpError
from ...ir import Node
from ..context import LoweringContext
from ..registry import lowers
from ..emit import emit_binary, norm_axis


RESIZE_COORDS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric",
                 "tf_crop_and_resize")


def _resize_geometry(ctx: LoweringContext, node: Node, shape: tuple[int, ...]):
    """(output sizes, scale factors, roi as (start, end) per axis) of a Resize, with ``axes`` and
    ``keep_aspect_ratio_policy`` applied as the ONNX reference does."""
    rank = len(shape)
    axes = node.attr("axes")
    axes = list(range(rank)) if axes is None else [norm_axis(int(a), rank, node) for a in axes]
    if len(set(axes)) != len(axes):
        raise ModelError(f"node {node.name!r} (Resize): axes {axes} repeat an axis")

    def given(i: int, what: str) -> np.ndarray | None:
        if len(node.inputs) <= i or not node.inputs[i]:
            return None
        value = np.asarray(ctx.const(node.inputs[i], node, what), dtype=np.float64).reshape(-1)
        return value if value.size else None
    roi, scales, sizes = given(1, "roi"), given(2, "scales"), given(3, "sizes")
    for what, values, length in (("scales", scales, len(axes)), ("sizes", sizes, len(axes)),
                                 ("roi", roi, 2 * len(axes))):
        if values is not None and values.size != length:
            raise ModelError(f"node {node.name!r} (Resize): {values.size} {what} for {len(axes)} resized axes")
    factors, out = [1.0] * rank, list(shape)
    if sizes is not None:
        for a, size in zip(axes, sizes):
            out[a] = int(size)
            factors[a] = size / shape[a] if shape[a] else 1.0
        policy = node.attr("keep_aspect_ratio_policy", "stretch")
        if policy in ("not_larger", "not_smaller"):
            scale = (min if policy == "not_larger" else max)(factors[a] for a in axes)
            for a in axes:
                factors[a], out[a] = scale, int(scale * shape[a] + 0.5)
        elif policy != "stretch":
            raise ModelError(f"node {node.name!r} (Resize): keep_aspect_ratio_policy {policy!r} is not one of "
                             "stretch, not_larger, not_smaller")
    elif scales is not None:
        if not all(np.isfinite(scales)):
            raise ModelError(f"node {node.name!r} (Resize): scales {list(scales)} must be finite")
        for a, factor in zip(axes, scales):
            factors[a], out[a] = float(factor), int(np.floor(shape[a] * factor))
    else:
        raise UnsupportedOpError("Resize", node.name, "neither scales nor sizes is given")
    rois = [(0.0, 1.0)] * rank
    if roi is not None:
        for i, a in enumerate(axes):
            rois[a] = (float(roi[i]), float(roi[len(axes) + i]))
    return out, factors, rois


@lowers("Resize")
def lower_resize(ctx: LoweringContext, node: Node, opset: int) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    if len(shape) != 4:
        raise UnsupportedOpError("Resize", node.name, f"only 4D NCHW inputs are supported, got {list(shape)}")
    mode = node.attr("mode", "nearest")
    coord = node.attr("coordinate_transformation_mode", "half_pixel")
    if mode not in ("nearest", "linear", "cubic"):
        raise UnsupportedOpError("Resize", node.name, f"mode {mode!r} is not supported (nearest, linear, cubic)")
    if coord not in RESIZE_COORDS:
        raise UnsupportedOpError("Resize", node.name, f"coordinate_transformation_mode {coord!r} is not supported")
    if node.attr("exclude_outside", 0) and mode != "cubic":
        raise ModelError(f"node {node.name!r} (Resize): exclude_outside applies to mode 'cubic' only, "
                         f"not {mode!r} (ONNX Runtime refuses it too)")
    out, factors, rois = _resize_geometry(ctx, node, shape)
    if out[:2] != list(shape[:2]):
        raise UnsupportedOpError("Resize", node.name, "resizing the batch or channel axis is not supported")
    if min(out) < 0 or not all(np.isfinite(factors)) or min(factors) <= 0:
        raise ModelError(f"node {node.name!r} (Resize): output sizes {out} (scales {factors}) must be positive")
    if min(shape) < 1 or min(out) < 1:
        raise UnsupportedOpError("Resize", node.name, f"resizing an empty tensor ({list(shape)} to {out}) is not supported")
    nearest_mode = node.attr("nearest_mode", "round_prefer_floor")
    antialias = bool(node.attr("antialias", 0)) and mode != "nearest"
    # the Resize kernels sample 2 taps at the coordinates of sampling.resize_axis; the rest are matrix
    # products (half_pixel_symmetric too: the ONNX reference picks its taps from the coordinate in a way
    # that rounds differently from the kernels' tables at exact integers, and axis_weights follows it)
    if mode == "cubic" or antialias or node.attr("exclude_outside", 0) or coord in ("tf_crop_and_resize",
                                                                                    "half_pixel_symmetric"):
        _resize_by_matmul(ctx, node, shape, out, factors, rois, mode, coord, nearest_mode, antialias)
        return
    ctx.emit(A.Resize((x,), (node.outputs[0],), node.name, planes=shape[0] * shape[1], in_hw=tuple(shape[2:]),
                      out_hw=(out[2], out[3]), scales=(factors[2], factors[3]), mode=mode, coord=coord,
                      nearest_mode=nearest_mode), out)


def _resize_by_matmul(ctx: LoweringContext, node: Node, shape, out, factors, rois, mode: str, coord: str,
                      nearest_mode: str, antialias: bool) -> None:
    """Resize as separable matrix products: ``X @ Ww^T`` along the width, then ``Wh @ .`` along the
    height, with the ``[out, in]`` weight matrices of :func:`axis_weights` as constants.

    Exact for every mode and tap count (cubic, antialias, exclude_outside, tf_crop_and_resize),
    on every backend's MatMul. Outputs whose crop coordinate falls outside the input get zero
    rows, and the extrapolation value is added there afterwards.
    """
    from ...numerics.sampling import axis_weights
    n, c, h, w = shape
    oh, ow = out[2], out[3]
    options = dict(nearest_mode=nearest_mode, cubic_coeff_a=float(node.attr("cubic_coeff_a", -0.75)),
                   exclude_outside=bool(node.attr("exclude_outside", 0)), antialias=antialias)
    wh, outside_h = axis_weights(h, oh, factors[2], mode, coord, roi=rois[2], **options)
    ww, outside_w = axis_weights(w, ow, factors[3], mode, coord, roi=rois[3], **options)

    def weights(matrix: np.ndarray, hint: str) -> str:
        name = ctx.temp(node, hint)
        ctx.set_const(name, np.ascontiguousarray(matrix, dtype=np.float32))
        return name
    current, cur_w = node.inputs[0], w
    if not (ow == w and np.array_equal(ww, np.eye(w))):
        rows = ctx.temp(node, "rows")
        ctx.alias(rows, current, (n * c * h, w))
        along_w = ctx.temp(node, "resized_w")
        ctx.emit(A.MatMul((rows, weights(ww.T, "width_weights")), (along_w,), node.name, m=n * c * h, n=ow, k=w),
                 (n * c * h, ow))
        current, cur_w = along_w, ow
    if not (oh == h and np.array_equal(wh, np.eye(h))):
        planes = ctx.temp(node, "planes")
        ctx.alias(planes, current, (n * c, h, cur_w))
        along_h = ctx.temp(node, "resized_h")
        ctx.emit(A.MatMul((weights(wh, "height_weights"), planes), (along_h,), node.name, batch=n * c, m=oh,
                          n=cur_w, k=h, a_batch_stride=0, b_batch_stride=h * cur_w), (n * c, oh, cur_w))
        current = along_h
    extrapolated = outside_h[:, None] | outside_w[None, :]
    value = float(node.attr("extrapolation_value", 0.0))
    if value != 0.0 and extrapolated.any():
        resized = ctx.temp(node, "resized")
        ctx.alias(resized, current, out)
        emit_binary(ctx, node, "add", resized, weights(np.where(extrapolated, value, 0.0), "extrapolation"),
                    node.outputs[0])
    else:
        ctx.alias(node.outputs[0], current, out)
