"""The cpu backend's static int8 convolution: ``QuantizedConv2D`` (QNNPACK's operator, ONNX
Runtime's fused QDQ Conv), on the register tiles of ``int8.py``.

``im2col``: each parallel task packs the windows of MR output pixels into rows of bytes (packed
im2col: padding holds x's zero point, so it adds nothing once the zero point's share ``zero *
colsum`` is taken off) and runs them by every panel of the weight on the path's tile
(``vpdpbusd`` on VNNI hosts). The tile multiplies unsigned bytes by signed ones, so int8
activations are read with their top bit flipped (``x ^ 0x80 = x + 128``, the zero point moved by
128 with them), which changes no difference ``x - zero``. Where a group's channels are laid
pixel-major and each pixel's are whole words of the tile (``runs_indirect``), the windows are not
packed (``_conv_indirect``, QNNPACK's indirection buffer): a table made at execution creation holds,
per MR output pixels and tap, the offset of each pixel's row in the planes (padding at a row of the
zero point), and the tile reads each row's K bytes tap by tap through it; on every such convolution
measured, ResNet-18's 3x3s and stride-2 1x1s on each vector path, it outran the packed rows or tied
with them: the tile reads through the table as fast as packed rows, and the packing is saved
(bench/RESULTS.md, "the indirection buffer against packed im2col"). ``gemm1x1`` (a direct product):
the tile turned round, the weight's rows broadcast and NR pixels of each NCHW plane the vector operand, so
that a tile's result is stored as NCHW holds it (``_conv_pixels``), where the output has at least
as many channels as the input or the planes are large; a product's rows (1x1 planes: a Gemm, or a
1x1 convolution on channels-last activations) each requantized straight into its row (``_conv_rows``); others
go the im2col way. Undilated windows over a few input channels (an image's first convolution,
``runs_stem``) run on the tile too, their rows packed from words made once per input row
(``_conv_stem``: each window row's columns padded to whole words of the tile, so that a pixel's
row is a few word copies, not a byte per tap); it writes NCHW planes or, ``out_channels_last``,
NHWC rows for channels-last readers. ``depthwise``, and dilated windows over a few input channels (``runs_direct``):
the direct kernel, vector loops over each input plane zero-padded, split by stride phase and
flattened, so that each tap reads it at a constant offset (sums in float32, exact for the integers
of any window up to 514 taps, else int32); depthwise ones on the smallest planes
(``runs_channels_last``) channels-last inside, a vector over a block of channels per tap, since
there a plane is too few outputs to pay each row's loops, and at stride 1 with rows as wide as the
input's (``runs_flat``) over each plane flattened without padding columns, the reads past a row's
ends taken off after; a ``channels_last`` one (the activations NHWC between int8 ops, decided by
``gpumnn.scheduler.precision.int8_channels_last``) reads each pixel's channels as they lie: where
they are whole vectors, each output row in one pass straight from the 8-bit rows, the taps' weight
vectors in registers and the epilogue fused (``_conv_depthwise_nhwc_fused``, an LLVM intrinsic per
row), else through a widened scratch (``_conv_depthwise_nhwc``). All end in the requantizing epilogue
of the contract: ``clip(rint(float32(acc) * multiplier) + zero, lo, hi)``, a float multiplier as
ONNX Runtime's, chosen over a fixed-point one (TFLite's and QNNPACK's Q31 multiplier and shift) by
measurement: on the same sums it costs under half of either on AVX-512 and on AVX2 and stays within
one step of the exact rounding (bench/requantize.py; bench/RESULTS.md, "fixed-point requantization").

8-bit tensors are read and written through uint8 views, int8 ones' bytes included (a value's
low byte is the same either way), so one compiled kernel serves every combination of types.
"""
from __future__ import annotations

import types as types_module

import numpy as np

from ... import atomic as A
from ..base import KernelWork
from . import int8 as cpu_int8, jit as cpu_jit, parallel as cpu_parallel
from .reference import strided, typed

numba = cpu_jit.numba
if numba is not None:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic
else:  # never called without Numba
    def intrinsic(fn):
        return fn
MR, NR = cpu_int8.MR, cpu_int8.NR
#: added (as an exclusive or) to an int8 byte to make it the uint8 the tile reads
SIGN_FLIP = 0x80
#: below this many channels per group, im2col reads x in place rather than pixel-major planes
FEW_CHANNELS = 16
#: a 1x1 convolution's planes of this many pixels or more run on the turned tile, whichever side is wider
LARGE_PLANE = 8192
#: the direct kernel's parallel tasks at most, each with its scratch planes
DIRECT_TASKS = 64
#: the direct kernel's output channels of one group are shared among at most this many tasks (each
#: fills the group's planes again)
DIRECT_SPLITS = 8
#: the taps the direct kernel sums in one vector loop
DIRECT_READS = 5
#: the outputs the direct kernel sums over all taps before the next ones (its sums and reads in L1)
DIRECT_CHUNK = 1024
#: the most taps (channels by window) of a convolution that is not depthwise that the direct kernel sums
DIRECT_TAPS = 32
#: a depthwise convolution's output planes of at most this many pixels run channels-last
CHANNELS_LAST_PIXELS = 7 * 7
#: the channels one task of the channels-last depthwise kernel takes (the width of its vector loops)
CHANNEL_BLOCK = 64
#: the taps one vector loop of the channels-last depthwise kernel sums (each tap two arrays read: more
#: than three, and LLVM's run-time checks that they do not overlap the sums leave the loop scalar)
CHANNELS_LAST_READS = 3


def pack_conv_weight(weight: np.ndarray, groups: int, pairs: bool) -> tuple[np.ndarray, np.ndarray]:
    """int8 ``weight`` [OC, C/groups, KH, KW] as the tile's panels per group (``int8.pack_weight``
    of each group's [KH * KW * C/groups, OC/groups] matrix, K in (kh, kw, c) order as the packed
    rows hold it, stacked: [groups, ...]) and its column sums int32 [OC]."""
    oc = weight.shape[0]
    per_group = oc // groups
    panels, sums = [], []
    for g in range(groups):
        rows = weight[g * per_group:(g + 1) * per_group].transpose(0, 2, 3, 1).reshape(per_group, -1)
        packed, colsum = cpu_int8.pack_weight(np.ascontiguousarray(rows.T), pairs)
        panels.append(packed)
        sums.append(colsum)
    return np.ascontiguousarray(np.stack(panels)), np.concatenate(sums).astype(np.int32)


def epilogue_columns(op: A.QuantizedConv2D, columns: int, colsum: np.ndarray, bias: np.ndarray,
                     multiplier: np.ndarray, flip: int) -> tuple[np.ndarray, np.ndarray]:
    """Per column of each group's panels (``columns`` of them, zeros past its output channels):
    what the epilogue adds to the tile's sum, ``bias - zero * colsum`` (int32, ``zero`` the byte
    the tile reads for x's zero point), and the multiplier (float32): [groups * columns] each."""
    groups, per_group = op.groups, op.out_channels // op.groups
    shifts = np.zeros((groups, columns), np.int32)
    scales = np.zeros((groups, columns), np.float32)
    zero = op.x_zero_point + flip
    total = bias.astype(np.int64) - zero * colsum.astype(np.int64)
    shifts[:, :per_group] = total.reshape(groups, per_group).astype(np.int32)  # wraps as the int32 sum does
    scales[:, :per_group] = multiplier.reshape(groups, per_group)
    return shifts.reshape(-1), scales.reshape(-1)


def _requantized(acc, multiplier, zero, lo, hi):
    """One int32 sum through the contract's epilogue, as the integer to store."""
    value = np.rint(np.float32(acc) * multiplier) + np.float32(zero)
    return np.int32(min(max(value, np.float32(lo)), np.float32(hi)))


def _conv_packed(x, planes, rows, panels, shifts, scales, out, geometry, flip, x_zero, y_zero, lo, hi):
    """QuantizedConv2D by packed im2col on the tile: x uint8 [N, C, H, W], out uint8 [N, OC, OH*OW]
    (either may be strided), ``geometry`` = (KH, KW, SH, SW, PH, PW, DH, DW, OH, OW). One parallel
    task per MR output pixels packs their windows into rows (a copy of ``rows`` [MR, K padded],
    K in (kh, kw, c) order) and runs them by every panel, so that a convolution is one parallel
    region. With many channels per group and a window wider than 1x1, the group's channels are
    first laid pixel-major in ``planes`` [H*W, C/groups], so that each tap of a window row is one
    contiguous copy (where each pixel's channels are whole words of the tile, ``_conv_indirect``
    reads the planes in place instead). ``shifts`` and ``scales`` are per column of the panels
    (``epilogue_columns``)."""
    kh_, kw_, sh, sw, ph, pw, dh, dw, oh_, ow_ = geometry
    images, channels, height, width = x.shape
    groups = panels.shape[0]
    per_group = channels // groups
    out_per_group = out.shape[1] // groups
    pixels = oh_ * ow_
    zero = x_zero + flip  # the zero point as the byte the tile reads
    row_tiles = -(-pixels // MR)
    panel_count = panels.shape[1]
    pointwise = kh_ == 1 and kw_ == 1 and sh == 1 and sw == 1 and ph == 0 and pw == 0
    use_planes = not pointwise and per_group >= FEW_CHANNELS
    for n in range(images):
        for g in range(groups):
            c_first = g * per_group
            if use_planes:
                for ih in numba.prange(height):
                    _pixel_major_row(x, planes, n, c_first, ih, flip)
            group_panels = panels[g]
            for row_tile in numba.prange(row_tiles):
                row0 = row_tile * MR
                count = min(MR, pixels - row0)
                local = rows.copy()  # zeros: the steps past K and the rows past the pixels stay 0
                for r in range(count):
                    oh, ow = (row0 + r) // ow_, (row0 + r) % ow_
                    row = local[r]
                    if pointwise:
                        for c in range(per_group):
                            row[c] = x[n, c_first + c, oh, ow] ^ flip
                        continue
                    for kh in range(kh_):
                        ih = oh * sh - ph + kh * dh
                        for kw in range(kw_):
                            iw = ow * sw - pw + kw * dw
                            k = (kh * kw_ + kw) * per_group
                            inside = 0 <= ih < height and 0 <= iw < width
                            if use_planes:
                                if inside:
                                    row[k:k + per_group] = planes[ih * width + iw]
                                else:
                                    row[k:k + per_group] = zero
                            else:  # a few channels: read in place (copies of a few bytes cost more)
                                for c in range(per_group):
                                    row[k + c] = x[n, c_first + c, ih, iw] ^ flip if inside else zero
                acc = np.empty(MR * NR, np.int32)
                done = np.empty((NR, MR), np.uint8)  # a tile transposed: channel-major, as out is
                for p in range(panel_count):
                    _tile(local, 0, group_panels, p, acc)
                    c0 = g * panel_count * NR + p * NR  # this panel's first column of ``shifts``
                    first = g * out_per_group + p * NR
                    _store_tile(acc, done, shifts[c0:c0 + NR], scales[c0:c0 + NR],
                                out[n, first:first + min(NR, out_per_group - p * NR), row0:row0 + count],
                                y_zero, lo, hi)


def _pixel_major_row(x, planes, n, c_first, ih, flip):
    """Input row ``ih`` of image n's ``planes.shape[1]`` channels from ``c_first`` (x uint8 [N, C, H, W])
    laid pixel-major into ``planes``' rows [ih * W, (ih + 1) * W), as the tile reads them (``flip``)."""
    width = x.shape[3]
    for c in range(planes.shape[1]):
        source = x[n, c_first + c, ih]
        for iw in range(width):
            planes[ih * width + iw, c] = source[iw] ^ flip


def _store_tile(acc, done, shifts, scales, planes, y_zero, lo, hi):
    """A tile's sums ``acc`` [MR * NR] through the epilogue by its columns' ``shifts`` and ``scales``
    [NR] into ``done`` [NR, MR] (the whole tile, a vector loop over its columns; channel-major, as
    out is), then copied into ``planes`` [columns, pixels]: its columns' planes of out at its pixels."""
    for r in range(MR):
        sums = acc[r * NR:(r + 1) * NR]
        for j in range(NR):
            done[j, r] = _requantized(sums[j] + shifts[j], scales[j], y_zero, lo, hi)
    for j in range(planes.shape[0]):
        destination, source = planes[j], done[j]
        for r in range(planes.shape[1]):
            destination[r] = source[r]


#: whether im2col convolutions that ``runs_indirect`` allows read their windows through the
#: indirection table (``_conv_indirect``); tests and bench/int8_indirection.py turn it off to run the
#: packed rows (``_conv_packed``) there
INDIRECT = True


def runs_indirect(op: A.QuantizedConv2D, pairs: bool) -> bool:
    """Whether ``_conv_indirect`` computes an im2col ``op`` (the kernel choice for the windows that are
    not a plain 1x1 product: measured in bench/RESULTS.md, "the indirection buffer against packed
    im2col"): at least FEW_CHANNELS channels per group, so that the group is laid pixel-major anyway,
    whose elements of the tile's type (``pairs``: int16) are whole words of the tile per pixel, so that
    no word of K holds two taps."""
    per_group = op.in_channels // op.groups
    pointwise = op.kernel == (1, 1) and op.strides == (1, 1) and op.pads == (0, 0)
    return (INDIRECT and not pointwise and per_group >= FEW_CHANNELS
            and per_group * (2 if pairs else 1) % cpu_int8.STEP == 0)


def indirection_table(op: A.QuantizedConv2D, itemsize: int) -> np.ndarray:
    """QNNPACK's indirection buffer as offsets, made once per execution: int64 [row tiles, KH * KW, MR],
    per MR output pixels and tap the byte offset of each pixel's input row in ``_conv_indirect``'s
    planes ([H * W + 1, C/groups] of ``itemsize`` bytes, pixel-major); padding, and the pixels past
    the last, at the planes' last row, x's zero point."""
    (kh_, kw_), (sh, sw), (ph, pw), (dh, dw) = op.kernel, op.strides, op.pads, op.dilations
    (height, width), (oh_, ow_) = op.in_hw, op.out_hw
    pixels = oh_ * ow_
    tiles = -(-pixels // MR)
    p = np.arange(tiles * MR)
    kh, kw = np.divmod(np.arange(kh_ * kw_), kw_)
    ih = (p // ow_)[None, :] * sh - ph + kh[:, None] * dh  # [taps, pixels]
    iw = (p % ow_)[None, :] * sw - pw + kw[:, None] * dw
    inside = (ih >= 0) & (ih < height) & (iw >= 0) & (iw < width) & (p < pixels)[None, :]
    row = np.where(inside, ih * width + iw, height * width).astype(np.int64)
    offsets = row * (op.in_channels // op.groups * itemsize)
    return np.ascontiguousarray(offsets.reshape(kh_ * kw_, tiles, MR).transpose(1, 0, 2))


def _conv_indirect(x, planes, table, panels, shifts, scales, out, geometry, flip, x_zero, y_zero, lo, hi):
    """QuantizedConv2D through QNNPACK's indirection buffer (``runs_indirect``): x uint8 [N, C, H, W],
    out uint8 [N, OC, OH*OW] (either may be strided), ``planes`` [H*W + 1, C/groups] of the tile's
    type, ``table`` (``indirection_table``), the panels, shifts and scales as ``_conv_packed``'s.
    Each group's channels are laid pixel-major in ``planes`` (as the tile reads them; the last row,
    x's zero point, is made with the execution), then one parallel task per MR output pixels runs every
    panel on the tile reading each pixel's window tap by tap through its rows of the table: no window
    is copied."""
    images, channels, height, width = x.shape
    groups = panels.shape[0]
    per_group = channels // groups
    out_per_group = out.shape[1] // groups
    pixels = geometry[8] * geometry[9]
    panel_count = panels.shape[1]
    for n in range(images):
        for g in range(groups):
            c_first = g * per_group
            for ih in numba.prange(height):
                _pixel_major_row(x, planes, n, c_first, ih, flip)
            group_panels = panels[g]
            for row_tile in numba.prange(table.shape[0]):
                row0 = row_tile * MR
                count = min(MR, pixels - row0)
                acc = np.empty(MR * NR, np.int32)
                done = np.empty((NR, MR), np.uint8)
                for p in range(panel_count):
                    _indirect_tile(table[row_tile], planes, group_panels, p, acc)
                    c0 = g * panel_count * NR + p * NR
                    first = g * out_per_group + p * NR
                    _store_tile(acc, done, shifts[c0:c0 + NR], scales[c0:c0 + NR],
                                out[n, first:first + min(NR, out_per_group - p * NR), row0:row0 + count],
                                y_zero, lo, hi)


def _conv_rows(x, rows, panels, shifts, scales, out, flip, y_zero, lo, hi):
    """A product's rows by the weight on the tile (a 1x1 convolution of 1x1 planes: a QDQ Gemm or
    MatMul, or a 1x1 convolution on channels-last activations): x uint8 [P, C], out uint8 [P, OC],
    ``panels`` one group's (``pack_conv_weight``), ``shifts`` and ``scales`` per panel column
    (``epilogue_columns``). One parallel task per MR rows copies them (a copy of ``rows`` [MR, K
    padded]) and runs them by every panel, each tile's rows requantized straight into out's rows."""
    pixels, channels = x.shape
    out_channels = out.shape[1]
    row_tiles = -(-pixels // MR)
    panel_count = panels.shape[0]
    for row_tile in numba.prange(row_tiles):
        row0 = row_tile * MR
        count = min(MR, pixels - row0)
        local = rows.copy()  # zeros: the steps past K and the rows past the pixels stay 0
        for r in range(count):
            source, row = x[row0 + r], local[r]
            for c in range(channels):
                row[c] = source[c] ^ flip
        acc = np.empty(MR * NR, np.int32)
        for p in range(panel_count):
            _tile(local, 0, panels, p, acc)
            c0 = p * NR
            width = min(NR, out_channels - c0)
            column_shifts, column_scales = shifts[c0:c0 + NR], scales[c0:c0 + NR]
            for r in range(count):
                sums, destination = acc[r * NR:(r + 1) * NR], out[row0 + r, c0:c0 + width]
                for j in range(width):
                    destination[j] = _requantized(sums[j] + column_shifts[j], column_scales[j], y_zero, lo, hi)


def _conv_pixels(x, weight_rows, panel, lanes, corrections, multiplier, out, flip, y_zero, lo, hi):
    """A 1x1 convolution at stride 1 (``gemm1x1``) with the tile turned round: the weight is the
    broadcast operand, rows of ``weight + 128`` as unsigned bytes ([OC padded to MR, K padded]),
    and NR pixels of each input plane, as signed bytes ``xs = x - 128`` (the byte the tile reads
    less 128), the vector operand (one task's [1, steps, NR, step] of ``lanes``' type, packed as the
    int32 words ``panel`` [steps, NR] of a step's lanes each, a copy per task), so that
    a tile is MR channels by NR pixels and is stored as NCHW holds it. Its sum is
    ``sum_k (w + 128) xs = sum_k w (x - zero) - (128 - zero) sum_k w + 128 sum_k xs``; the first
    correction is a constant per channel (``corrections``, with the bias), the second a sum per
    pixel taken while packing. x uint8 [N, C, H, W], out uint8 [N, OC, H*W]."""
    images, channels, height, width = x.shape
    pixels = height * width
    out_channels = out.shape[1]
    blocks = -(-pixels // NR)
    steps, step = panel.shape[0], 4 // lanes.itemsize  # lanes per word
    bits = 8 * lanes.itemsize
    mask = (1 << bits) - 1
    channel_tiles = -(-out_channels // MR)
    for t in numba.prange(images * blocks):
        n, block = t // blocks, t % blocks
        p0 = block * NR
        count = min(NR, pixels - p0)
        words = panel.copy()  # zeros: the steps past K and the pixels past the plane stay 0
        local = words.view(lanes.dtype).reshape(1, steps, NR, step)
        sums = np.zeros(NR, np.int32)
        whole = channels // step * step if step in (2, 4) else 0
        if step == 4:  # a word's four channels in one vector loop, each word stored once
            for c in range(0, whole, 4):
                word = words[c // 4]
                a, b = x[n, c].reshape(pixels)[p0:p0 + count], x[n, c + 1].reshape(pixels)[p0:p0 + count]
                d, e = x[n, c + 2].reshape(pixels)[p0:p0 + count], x[n, c + 3].reshape(pixels)[p0:p0 + count]
                for j in range(count):
                    v0, v1 = np.int32(a[j] ^ flip) - 128, np.int32(b[j] ^ flip) - 128
                    v2, v3 = np.int32(d[j] ^ flip) - 128, np.int32(e[j] ^ flip) - 128
                    word[j] = (v0 & 255) | ((v1 & 255) << 8) | ((v2 & 255) << 16) | (v3 << 24)
                    sums[j] += v0 + v1 + v2 + v3
        elif step == 2:  # the pair paths: a word's two channels (int16 lanes) in one loop
            for c in range(0, whole, 2):
                word = words[c // 2]
                a, b = x[n, c].reshape(pixels)[p0:p0 + count], x[n, c + 1].reshape(pixels)[p0:p0 + count]
                for j in range(count):
                    v0, v1 = np.int32(a[j] ^ flip) - 128, np.int32(b[j] ^ flip) - 128
                    word[j] = (v0 & 65535) | (v1 << 16)
                    sums[j] += v0 + v1
        for c in range(whole, channels):  # the channels past the last whole word, one lane each
            plane, word = x[n, c].reshape(pixels)[p0:p0 + count], words[c // step]
            shift = (c % step) * bits
            for j in range(count):
                value = np.int32(plane[j] ^ flip) - 128
                word[j] |= (value & mask) << shift
                sums[j] += value
        for j in range(NR):
            sums[j] *= -128
        acc = np.empty(MR * NR, np.int32)
        for ct in range(channel_tiles):
            oc0 = ct * MR
            _tile(weight_rows, oc0, local, 0, acc)
            for r in range(min(MR, out_channels - oc0)):
                oc = oc0 + r
                correction, m = corrections[oc], multiplier[oc]
                row, tile = out[n, oc, p0:p0 + count], acc[r * NR:r * NR + count]
                for j in range(count):
                    row[j] = _requantized(tile[j] + sums[j] + correction, m, y_zero, lo, hi)


def direct_sum_dtype(op: A.QuantizedConv2D) -> np.dtype:
    """The type the direct kernel sums a window in: float32 where every partial sum of its
    products (each at most 255 * 128 in size) is an integer float32 holds exactly, as it is for
    any window up to 514 taps (float products and sums vectorise better than int32 ones), else int32."""
    largest = op.in_channels // op.groups * op.kernel[0] * op.kernel[1] * 255 * 128
    return np.dtype(np.float32 if largest <= 1 << 24 else np.int32)


def runs_direct(op: A.QuantizedConv2D) -> bool:
    """Whether ``_conv_direct`` computes ``op``: a depthwise convolution, or a small window over a
    few input channels (an image's first convolution), whose rows im2col packs a few bytes at a
    time; over DIRECT_TAPS taps the tile's products outrun the direct kernel's."""
    taps = op.in_channels * op.kernel[0] * op.kernel[1]
    return op.scheme == "depthwise" or (op.groups == 1 and op.in_channels < FEW_CHANNELS and op.kernel != (1, 1)
                                        and taps <= DIRECT_TAPS)


def direct_taps(op: A.QuantizedConv2D, weight: np.ndarray) -> np.ndarray:
    """``weight`` [OC, C/groups, KH, KW] as ``_conv_direct``'s taps: [OC, C/groups * KH * KW padded
    to a multiple of DIRECT_READS with zeros] in ``direct_sum_dtype``."""
    flat = weight.reshape(op.out_channels, -1)
    taps = np.zeros((op.out_channels, -(-flat.shape[1] // DIRECT_READS) * DIRECT_READS), direct_sum_dtype(op))
    taps[:, :flat.shape[1]] = flat
    return taps


def _conv_direct(x, taps, bias, multiplier, out, geometry, groups, flip, x_zero, y_zero, lo, hi):
    """QuantizedConv2D summed tap by tap (``runs_direct``): x uint8 [N, C, H, W], ``taps``
    (``direct_taps``), out uint8 [N, OC, OH*OW]. Each input plane, less its zero point and
    zero-padded, is split by stride phase (padded row r, column q in plane ``(r % SH) * SW + q % SW``
    at ``(r // SH) * columns + q // SW``), so that every tap reads one phase plane at a constant
    offset from the output's flattened index: an output channel is a few vector loops of
    DIRECT_READS taps each over the flattened plane (the columns past OW are computed and never
    stored). A parallel task fills the planes of one group of one image and sums a share of its
    output channels (at most DIRECT_SPLITS shares per group, each task with its own scratch)."""
    kh_, kw_, sh, sw, ph, pw, dh, dw, oh_, ow_ = geometry
    images, channels, height, width = x.shape
    out_channels = out.shape[1]
    per_group, out_per_group = channels // groups, out_channels // groups
    window = kh_ * kw_
    zero = np.int32(x_zero + flip)
    flip_byte = np.uint8(flip)
    columns_across = (kw_ - 1) * dw // sw  # the furthest tap's shift within a phase
    columns = ow_ + columns_across
    rows = oh_ + (kh_ - 1) * dh // sh
    span = oh_ * columns  # the flattened outputs, garbage columns included
    length = rows * columns + columns_across
    phases = sh * sw * length  # one input channel's phase planes, one after another
    # per tap (channel, kh, kw) of the padded taps: where its phase plane is read from (the zero
    # taps past the window read the first plane)
    offsets = np.zeros(taps.shape[1], np.int64)
    for k in range(per_group * window):
        a, b = (k % window // kw_) * dh, (k % window % kw_) * dw
        offsets[k] = k // window * phases + ((a % sh) * sw + b % sw) * length + (a // sh) * columns + b // sw
    # where each input row and each column phase's first input column go in the phase planes (-1:
    # a row that no output reads), so that the widening loops are all that runs per row
    row_at = np.full(height, -1, np.int64)
    for ih in range(height):
        r = ih + ph
        if r // sh < rows:
            row_at[ih] = (r % sh) * sw * length + (r // sh) * columns
    column_first, column_at, column_count = np.empty(sw, np.int64), np.empty(sw, np.int64), np.empty(sw, np.int64)
    for cp in range(sw):  # this column phase's input columns: iw = first + j * SW
        first = (cp - pw) % sw
        column_first[cp], column_at[cp] = first, cp * length + (first + pw) // sw
        column_count[cp] = max(0, min((width - first + sw - 1) // sw, columns - (first + pw) // sw))
    splits = min(out_per_group, DIRECT_SPLITS)
    share = -(-out_per_group // splits)
    items = images * groups * splits
    tasks = min(items, DIRECT_TASKS)
    for task in numba.prange(tasks):
        # flat (1D views of a 1D array are contiguous to LLVM); the padding stays zero: only the
        # inside is written
        phase = np.zeros(per_group * phases, taps.dtype)
        acc = np.empty(span, taps.dtype)
        for item in range(task, items, tasks):
            n, g, split = item // (groups * splits), item // splits % groups, item % splits
            for ci in range(per_group):
                plane = phase[ci * phases:(ci + 1) * phases]
                for ih in range(height):
                    if row_at[ih] < 0:
                        continue
                    read = x[n, g * per_group + ci, ih]
                    for cp in range(sw):
                        at = row_at[ih] + column_at[cp]
                        widened, source = plane[at:at + column_count[cp]], read[column_first[cp]:]
                        # indices known not to be negative, and constant strides: LLVM vectorises the loads
                        if sw == 1:
                            for j in range(widened.shape[0]):
                                widened[j] = np.int32(source[j] ^ flip_byte) - zero
                        elif sw == 2:
                            for j in range(widened.shape[0]):
                                widened[j] = np.int32(source[j * 2] ^ flip_byte) - zero
                        else:
                            for j in range(widened.shape[0]):
                                widened[j] = np.int32(source[j * sw] ^ flip_byte) - zero
            first_oc = g * out_per_group + split * share
            for oc in range(first_oc, g * out_per_group + min((split + 1) * share, out_per_group)):
                weights = taps[oc]
                # DIRECT_READS views per loop: past eight, LLVM's run-time checks that they do not
                # overlap acc are too many for it and the loop stays scalar; offset indices would not
                # vectorise either. A chunk of the outputs at a time, so that its sums stay in L1
                for i0 in range(0, span, DIRECT_CHUNK):
                    part = acc[i0:min(i0 + DIRECT_CHUNK, span)]
                    for k in range(0, taps.shape[1], DIRECT_READS):
                        size = part.shape[0]
                        a0, a1, a2, a3, a4 = (offsets[k] + i0, offsets[k + 1] + i0, offsets[k + 2] + i0,
                                              offsets[k + 3] + i0, offsets[k + 4] + i0)
                        v0, v1, v2 = phase[a0:a0 + size], phase[a1:a1 + size], phase[a2:a2 + size]
                        v3, v4 = phase[a3:a3 + size], phase[a4:a4 + size]
                        w0, w1, w2, w3, w4 = weights[k], weights[k + 1], weights[k + 2], weights[k + 3], weights[k + 4]
                        if k == 0:
                            for i in range(part.shape[0]):
                                part[i] = v0[i] * w0 + v1[i] * w1 + v2[i] * w2 + v3[i] * w3 + v4[i] * w4
                        else:
                            for i in range(part.shape[0]):
                                part[i] += v0[i] * w0 + v1[i] * w1 + v2[i] * w2 + v3[i] * w3 + v4[i] * w4
                start, m = bias[oc], multiplier[oc]
                for oh in range(oh_):
                    row, sums = out[n, oc, oh * ow_:(oh + 1) * ow_], acc[oh * columns:oh * columns + ow_]
                    for ow in range(ow_):
                        row[ow] = _requantized(np.int32(sums[ow]) + start, m, y_zero, lo, hi)


#: the output rows one task of the stem kernel (``_conv_stem``) packs and multiplies
STEM_BAND = 4
#: the most steps of K (elements of a packed row) the stem kernel takes for an NCHW output (a 7x7
#: window on 3 channels is 168): deeper windows go the im2col way
STEM_DEPTH = 256


def stem_width(op: A.QuantizedConv2D) -> int:
    """The columns of each (channel, window row) that ``_conv_stem`` packs: the window's width padded
    to whole words of the tile (the taps past it weigh 0)."""
    return -(-op.kernel[1] // cpu_int8.STEP) * cpu_int8.STEP


def runs_stem(op: A.QuantizedConv2D) -> bool:
    """Whether ``_conv_stem`` computes ``op`` with an NCHW output: a window wider than 1x1, undilated,
    over a few input channels (an image's first convolution: RGB or grey in) whose packed rows, each
    window row's columns padded to whole words, are at most STEM_DEPTH elements. An
    ``out_channels_last`` op (NHWC output; undilated, one group) always takes it."""
    return (op.groups == 1 and op.in_channels < FEW_CHANNELS and op.kernel != (1, 1) and op.dilations == (1, 1)
            and op.in_channels * op.kernel[0] * stem_width(op) <= STEM_DEPTH)


def stem_panels(op: A.QuantizedConv2D, weight: np.ndarray, pairs: bool) -> tuple[np.ndarray, np.ndarray]:
    """``weight`` [OC, C, KH, KW] as ``_conv_stem``'s panels, K in (c, kh, kw) order with each window
    row padded with zero weights to ``stem_width`` columns (``int8.pack_weight``), and its column sums."""
    padded = np.zeros((op.out_channels, op.in_channels, op.kernel[0], stem_width(op)), np.int8)
    padded[..., :op.kernel[1]] = weight
    panels, colsum = cpu_int8.pack_weight(np.ascontiguousarray(padded.reshape(op.out_channels, -1).T), pairs)
    return panels, colsum


def _conv_stem(x, padded, words, packed, panels, shifts, scales, out, geometry, flip, x_zero, y_zero, lo, hi):
    """QuantizedConv2D over a few input channels (``runs_stem``) on the tile: x uint8 [N, C, H, W],
    out uint8 [N, OC, OH*OW] or, where ``geometry``'s last flag says channels-last, [N, OH*OW, OC].
    A parallel task takes a band of STEM_BAND output rows of one image: it copies the input rows they
    read into ``padded`` ([C, rows, columns] of the tile's type, a copy per task; the borders hold x's
    zero point), makes ``words`` of them (uint32 [C, rows, columns]: at column q, the tile's word of
    the elements from q on), so that packing each output pixel's row of ``packed`` (the tile's words
    [band pixels padded to MR, K / 4]: per (channel, window row) ``stem_width`` consecutive columns)
    is a strided copy of words, and runs MR rows at a time by every panel, requantizing each tile
    into out's rows (NHWC) or planes (NCHW). ``shifts`` and ``scales`` are per column of the panels
    (``epilogue_columns``)."""
    kh_, kw_, sh, sw, ph, pw, dh, dw, oh_, ow_, channels_last = geometry
    images, channels, height, width = x.shape
    out_channels = out.shape[2] if channels_last else out.shape[1]
    columns = padded.shape[2]
    per_word = 4 // padded.itemsize  # elements of the tile's type one word holds
    row_words = packed.shape[1] // (channels * kh_)  # words of one (channel, window row)
    zero = x_zero + flip  # the zero point as the byte the tile reads
    panel_count = panels.shape[0]
    bands = -(-oh_ // STEM_BAND)
    for task in numba.prange(images * bands):
        n, band = task // bands, task % bands
        oh0 = band * STEM_BAND
        oh1 = min(oh_, oh0 + STEM_BAND)
        rows_used = (oh1 - oh0 - 1) * sh + kh_
        local = np.empty_like(padded)  # every row a band reads is written whole
        local_words = np.empty_like(words)  # the last columns' words, past any window, are never read
        rows = np.empty_like(packed)  # the rows past the band's pixels are summed and never stored
        for c in range(channels):
            for r in range(rows_used):
                ih = oh0 * sh - ph + r
                line = local[c, r]
                if ih < 0 or ih >= height:
                    for i in range(columns):
                        line[i] = zero
                else:
                    for i in range(pw):
                        line[i] = zero
                    source, inside = x[n, c, ih], line[pw:pw + width]
                    for i in range(width):
                        inside[i] = source[i] ^ flip
                    for i in range(pw + width, columns):
                        line[i] = zero
                word_line = local_words[c, r]
                if per_word == 4:
                    for i in range(columns - 3):
                        word_line[i] = (np.uint32(line[i]) | (np.uint32(line[i + 1]) << 8)
                                        | (np.uint32(line[i + 2]) << 16) | (np.uint32(line[i + 3]) << 24))
                else:
                    for i in range(columns - 1):
                        word_line[i] = np.uint32(line[i]) | (np.uint32(line[i + 1]) << 16)
        pixels = (oh1 - oh0) * ow_
        for c in range(channels):
            for kh in range(kh_):
                for j in range(row_words):
                    at = (c * kh_ + kh) * row_words + j
                    for oh in range(oh1 - oh0):
                        source = local_words[c, oh * sh + kh, j * per_word:]
                        target = rows[oh * ow_:(oh + 1) * ow_, at]
                        for ow in range(ow_):
                            target[ow] = source[ow * sw]
        first = oh0 * ow_
        acc = np.empty(MR * NR, np.int32)
        # NCHW: the band's pixels requantized pixel-major here, then each channel's run of its plane
        done = np.empty((0 if channels_last else rows.shape[0], out_channels), np.uint8)
        for row0 in range(0, pixels, MR):
            count = min(MR, pixels - row0)
            for q in range(panel_count):
                _tile(rows.view(np.uint8), row0, panels, q, acc)
                c0 = q * NR
                columns_here = min(NR, out_channels - c0)
                column_shifts, column_scales = shifts[c0:c0 + NR], scales[c0:c0 + NR]
                for r in range(count):
                    sums = acc[r * NR:(r + 1) * NR]
                    if channels_last:
                        destination = out[n, first + row0 + r, c0:c0 + columns_here]
                    else:
                        destination = done[row0 + r, c0:c0 + columns_here]
                    for j in range(columns_here):
                        destination[j] = _requantized(sums[j] + column_shifts[j], column_scales[j], y_zero, lo, hi)
        if not channels_last:
            for oc in range(out_channels):
                plane = out[n, oc, first:first + pixels]
                for p in range(pixels):
                    plane[p] = done[p, oc]


def runs_rows(op: A.QuantizedConv2D) -> bool:
    """Whether ``_conv_rows`` computes ``op``: a product's rows (a 1x1 convolution of 1x1 planes,
    one group), each row's channels contiguous in and out."""
    return op.in_hw == (1, 1) and op.out_hw == (1, 1) and op.kernel == (1, 1) and op.groups == 1


def runs_channels_last(op: A.QuantizedConv2D) -> bool:
    """Whether ``_conv_depthwise_channels_last`` computes ``op``: a depthwise convolution of one
    output channel per input channel whose output planes have at most CHANNELS_LAST_PIXELS pixels,
    where a vector over channels per tap outruns the direct kernel's few short loops per plane."""
    return (op.scheme == "depthwise" and op.out_channels == op.in_channels
            and op.out_hw[0] * op.out_hw[1] <= CHANNELS_LAST_PIXELS)


def channels_last_taps(op: A.QuantizedConv2D, weight: np.ndarray) -> np.ndarray:
    """A depthwise ``weight`` [C, 1, KH, KW] as ``_conv_depthwise_channels_last``'s taps: per block
    of CHANNEL_BLOCK channels, [KH * KW padded to a multiple of CHANNELS_LAST_READS, CHANNEL_BLOCK]
    in ``direct_sum_dtype`` (zeros in the padding): [blocks, taps, CHANNEL_BLOCK]."""
    channels, window = op.out_channels, op.kernel[0] * op.kernel[1]
    blocks = -(-channels // CHANNEL_BLOCK)
    taps = np.zeros((blocks * CHANNEL_BLOCK, -(-window // CHANNELS_LAST_READS) * CHANNELS_LAST_READS),
                    direct_sum_dtype(op))
    taps[:channels, :window] = weight.reshape(channels, window)
    return np.ascontiguousarray(taps.reshape(blocks, CHANNEL_BLOCK, -1).transpose(0, 2, 1))


def _conv_depthwise_channels_last(x, taps, bias, multiplier, out, geometry, flip, x_zero, y_zero, lo, hi):
    """A depthwise QuantizedConv2D (``runs_channels_last``) channels-last inside: x uint8 [N, C, H, W],
    ``taps`` (``channels_last_taps``), out uint8 [N, C, OH*OW]. A parallel task takes a block of
    CHANNEL_BLOCK channels of one image, lays them less the zero point in a zero-padded scratch
    [padded rows * padded columns, CHANNEL_BLOCK], sums each output pixel as vector loops over the
    block's channels, CHANNELS_LAST_READS taps each, requantizes the pixel's channels into a
    pixel-major scratch and at last writes the block's NCHW planes from it. The lanes past the last
    channel are computed and never stored."""
    kh_, kw_, sh, sw, ph, pw, dh, dw, oh_, ow_ = geometry
    images, channels, height, width = x.shape
    blocks, taps_padded, block = taps.shape
    window = kh_ * kw_
    rows = (oh_ - 1) * sh + (kh_ - 1) * dh + 1  # the padded input's rows and columns any output reads
    columns = (ow_ - 1) * sw + (kw_ - 1) * dw + 1
    pixels = oh_ * ow_
    zero = np.int32(x_zero + flip)
    flip_byte = np.uint8(flip)
    # each tap's offset in the scratch from its output pixel's first tap (the zero taps past the
    # window read the first tap's place)
    offsets = np.zeros(taps_padded, np.int64)
    for k in range(window):
        offsets[k] = ((k // kw_) * dh * columns + (k % kw_) * dw) * block
    filled_rows = min(height, rows - ph)
    filled_columns = min(width, columns - pw)
    items = images * blocks
    tasks = min(items, DIRECT_TASKS)
    for task in numba.prange(tasks):
        padded = np.zeros(rows * columns * block, taps.dtype)  # the border stays zero: only the inside is written
        acc = np.empty(block, taps.dtype)
        requantized = np.empty(pixels * block, np.uint8)
        for item in range(task, items, tasks):
            n, b = item // blocks, item % blocks
            c0 = b * block
            count = min(block, channels - c0)
            for ih in range(filled_rows):
                for iw in range(filled_columns):
                    at = ((ih + ph) * columns + pw + iw) * block
                    pixel = padded[at:at + count]
                    for c in range(count):
                        pixel[c] = np.int32(x[n, c0 + c, ih, iw] ^ flip_byte) - zero
            weights = taps[b]
            block_bias, block_multiplier = bias[c0:c0 + count], multiplier[c0:c0 + count]
            for oh in range(oh_):
                for ow in range(ow_):
                    start = (oh * sh * columns + ow * sw) * block
                    for k in range(0, taps_padded, CHANNELS_LAST_READS):
                        a0, a1, a2 = start + offsets[k], start + offsets[k + 1], start + offsets[k + 2]
                        v0, v1, v2 = padded[a0:a0 + block], padded[a1:a1 + block], padded[a2:a2 + block]
                        w0, w1, w2 = weights[k], weights[k + 1], weights[k + 2]
                        if k == 0:
                            for i in range(block):
                                acc[i] = v0[i] * w0[i] + v1[i] * w1[i] + v2[i] * w2[i]
                        else:
                            for i in range(block):
                                acc[i] += v0[i] * w0[i] + v1[i] * w1[i] + v2[i] * w2[i]
                    p = oh * ow_ + ow
                    done = requantized[p * block:(p + 1) * block]
                    for c in range(count):
                        done[c] = _requantized(np.int32(acc[c]) + block_bias[c], block_multiplier[c], y_zero, lo, hi)
            for c in range(count):
                plane_out = out[n, c0 + c]
                for p in range(pixels):
                    plane_out[p] = requantized[p * block + c]


#: the output rows one task of the channels-last (NHWC) depthwise kernel sums (its scratch holds the
#: input rows they read)
NHWC_BAND = 8
#: up to this many channels, the channels-last depthwise kernel takes them all in one block (its
#: widening and requantizing then one loop per row)
NHWC_WHOLE = 160
#: about how many sums of consecutive output pixels (by the block's channels) one vector loop of the
#: channels-last depthwise kernel takes: long enough that each loop's set-up is paid over many sums
NHWC_CHUNK = 4096


#: the channels the fused channels-last depthwise kernel (``_nhwc_fused_row``) takes per vector: one
#: AVX-512 register of float32 (two AVX2 ones); an op whose channels are a multiple of it takes it
NHWC_LANES = 16
#: whether the channels-last depthwise kernel runs fused (``_conv_depthwise_nhwc_fused``) where an op
#: allows (tests turn it off to check the vector loops that serve the other channel counts)
NHWC_FUSED = True
#: whether the fused kernel keeps a window's columns in registers from one pixel to the next at stride
#: and dilation 1 (tests turn it off to check the reads of whole windows there too)
NHWC_SLIDING = True


def _fused_row_codegen(kernel_h: int, kernel_w: int, signed: bool, lanes: int, sliding: int):
    """The codegen of ``_nhwc_fused_row`` for a ``kernel_h`` x ``kernel_w`` window over 8-bit values
    (``signed``: int8, else uint8) in float32 vectors of ``lanes`` channels. For each ``lanes``
    channels, the taps' weight vectors, the shift and the multiplier are loaded once; then each output
    pixel of the row reads the window's bytes straight from the input rows (widened and converted in
    registers), sums their products, and requantizes the sum into its bytes of the output row:
    ``clip(rint(float32(int32(sum) + shift) * multiplier) + y_zero, lo, hi)``. Window columns past a
    row's ends hold the zero point. ``sliding`` (the stride, below the window's width, at dilation 1;
    0 otherwise): each pixel reads and converts only the last ``sliding`` columns of its window and
    keeps the others from the pixel before it, in registers; otherwise each reads its whole window. The sums are exact integers in float32, so the order of the
    additions changes nothing."""
    def codegen(context, builder, signature, args):
        i8, i32, i64, f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
        vector = ir.VectorType(f32, lanes)
        integers = ir.VectorType(i32, lanes)
        bytes_type = ir.VectorType(i8, lanes)
        module = builder.module

        def function(name, arguments):
            return module.globals.get(name) or ir.Function(module, ir.FunctionType(vector, arguments), name)
        fmuladd = function(f"llvm.fmuladd.v{lanes}f32", [vector] * 3)
        rint = function(f"llvm.rint.v{lanes}f32", [vector])
        rows_address, weights_address, shifts_address, multipliers_address, out_address, channels, width, \
            out_width, stride, pad, dilation, first_inside, end_inside, x_zero, y_zero, lo, hi = args

        def splat(value):
            one = builder.insert_element(ir.Constant(vector, ir.Undefined), value, ir.Constant(i32, 0))
            return builder.shuffle_vector(one, ir.Constant(vector, ir.Undefined), ir.Constant(integers, [0] * lanes))
        rows_pointer = builder.inttoptr(rows_address, i64.as_pointer())
        rows = [builder.inttoptr(builder.load(builder.gep(rows_pointer, [ir.Constant(i64, r)])), i8.as_pointer())
                for r in range(kernel_h)]
        weights = builder.inttoptr(weights_address, f32.as_pointer())
        shifts = builder.inttoptr(shifts_address, i32.as_pointer())
        multipliers = builder.inttoptr(multipliers_address, f32.as_pointer())
        out = builder.inttoptr(out_address, i8.as_pointer())
        padding_value = splat(builder.sitofp(x_zero, f32))
        y_zero_vector, lo_vector, hi_vector = (splat(builder.sitofp(v, f32)) for v in (y_zero, lo, hi))
        zero64 = ir.Constant(i64, 0)
        entry = builder.block
        channel_loop = builder.append_basic_block("nhwc.channels")
        pixel_loop = builder.append_basic_block("nhwc.pixels")
        inside_block = builder.append_basic_block("nhwc.inside")
        edge_block = builder.append_basic_block("nhwc.edge")
        join_block = builder.append_basic_block("nhwc.requantize")
        channel_next = builder.append_basic_block("nhwc.channels.next")
        done = builder.append_basic_block("nhwc.done")
        builder.cbranch(builder.and_(builder.icmp_signed(">", channels, zero64),
                                     builder.icmp_signed(">", out_width, zero64)), channel_loop, done)

        def vector_at(pointer, index, kind):
            return builder.load(builder.bitcast(builder.gep(pointer, [index]), kind.as_pointer()), align=4)

        def column_values(column, c0, checked):
            """The window's values in input column ``column`` (one vector per window row), the zero
            point where ``checked`` and the column is past a row's ends."""
            valid = builder.and_(builder.icmp_signed(">=", column, zero64), builder.icmp_signed("<", column, width))
            read = builder.select(valid, column, zero64) if checked else column  # a column past the ends reads 0
            at = builder.add(builder.mul(read, channels), c0)
            values = []
            for row in rows:
                raw = builder.load(builder.bitcast(builder.gep(row, [at]), bytes_type.as_pointer()), align=1)
                value = builder.sitofp(raw, vector) if signed else builder.uitofp(raw, vector)
                values.append(builder.select(valid, value, padding_value) if checked else value)
            return values

        def window_sum(window, tap_weights):
            total = None
            for kh in range(kernel_h):
                for kw in range(kernel_w):
                    value, weight = window[kw][kh], tap_weights[kh * kernel_w + kw]
                    total = builder.fmul(value, weight) if total is None else builder.call(fmuladd, [value, weight, total])
            return total

        builder.position_at_end(channel_loop)
        c0 = builder.phi(i64)
        c0.add_incoming(zero64, entry)
        tap_weights = [vector_at(weights, builder.add(builder.mul(channels, ir.Constant(i64, k)), c0), vector)
                       for k in range(kernel_h * kernel_w)]
        shift = vector_at(shifts, c0, integers)
        multiplier = vector_at(multipliers, c0, vector)
        kept_columns = kernel_w - sliding  # of a window, those the next pixel's window holds too
        if sliding:  # the columns pixel 0 does not read itself, as they enter its window
            first_history = [column_values(builder.sub(ir.Constant(i64, kw), pad), c0, True)
                             for kw in range(kept_columns)]
        builder.branch(pixel_loop)

        builder.position_at_end(pixel_loop)
        p = builder.phi(i64)
        p.add_incoming(zero64, channel_loop)
        if sliding:
            history = [[builder.phi(vector) for _ in range(kernel_h)] for _ in range(kept_columns)]
            for kept, first in zip(history, first_history):
                for value, initial in zip(kept, first):
                    value.add_incoming(initial, channel_loop)
        first_column = builder.sub(builder.mul(p, stride), pad)
        if sliding:
            new_columns = [builder.add(first_column, ir.Constant(i64, kw)) for kw in range(kept_columns, kernel_w)]
            inside = builder.and_(builder.icmp_signed(">=", new_columns[0], zero64),
                                  builder.icmp_signed("<", new_columns[-1], width))
        else:
            inside = builder.and_(builder.icmp_signed(">=", p, first_inside), builder.icmp_signed("<", p, end_inside))
        builder.cbranch(inside, inside_block, edge_block)

        def columns_of_window(checked):
            if sliding:
                return [column_values(column, c0, checked) for column in new_columns]
            return [column_values(builder.add(first_column, builder.mul(dilation, ir.Constant(i64, kw))), c0, checked)
                    for kw in range(kernel_w)]
        builder.position_at_end(inside_block)
        inside_columns = columns_of_window(False)
        builder.branch(join_block)
        builder.position_at_end(edge_block)
        edge_columns = columns_of_window(True)
        builder.branch(join_block)

        builder.position_at_end(join_block)
        window = []
        for inside_column, edge_column in zip(inside_columns, edge_columns):
            merged = []
            for inside_value, edge_value in zip(inside_column, edge_column):
                value = builder.phi(vector)
                value.add_incoming(inside_value, inside_block)
                value.add_incoming(edge_value, edge_block)
                merged.append(value)
            window.append(merged)
        if sliding:
            window = history + window
            for kept, following_value in zip(history, window[sliding:]):
                for value, new in zip(kept, following_value):
                    value.add_incoming(new, join_block)
        total = window_sum(window, tap_weights)
        shifted = builder.sitofp(builder.add(builder.fptosi(total, integers), shift), vector)
        value = builder.fadd(builder.call(rint, [builder.fmul(shifted, multiplier)]), y_zero_vector)
        value = builder.select(builder.fcmp_ordered("<", value, lo_vector), lo_vector, value)
        value = builder.select(builder.fcmp_ordered(">", value, hi_vector), hi_vector, value)
        stored = builder.trunc(builder.fptosi(value, integers), bytes_type)
        destination = builder.gep(out, [builder.add(builder.mul(p, channels), c0)])
        builder.store(stored, builder.bitcast(destination, bytes_type.as_pointer()), align=1)
        following = builder.add(p, ir.Constant(i64, 1))
        p.add_incoming(following, join_block)
        builder.cbranch(builder.icmp_signed("<", following, out_width), pixel_loop, channel_next)

        builder.position_at_end(channel_next)
        c1 = builder.add(c0, ir.Constant(i64, lanes))
        c0.add_incoming(c1, channel_next)
        builder.cbranch(builder.icmp_signed("<", c1, channels), channel_loop, done)

        builder.position_at_end(done)
        return context.get_dummy_value()
    return codegen


_FUSED_ROWS: dict[tuple[int, int, bool, int], object] = {}


def fused_row_intrinsic(kernel_h: int, kernel_w: int, signed: bool, sliding: int):
    """``_nhwc_fused_row`` for this window, input type and way of reading (``_fused_row_codegen``;
    ``sliding`` the stride, or 0: ``fused_sliding``), made once: one output row of a channels-last
    depthwise convolution, summed and requantized in one pass. Arguments, by address or as integers:
    the input rows' addresses (int64 [kernel_h]: a row of the zero point's bytes where the window is
    above or below the input), the weights (float32 [taps, channels]), the shifts (int32 [channels]:
    bias less the zero point's share), the multipliers (float32 [channels]), the output row; channels
    (a multiple of NHWC_LANES), the input's width, the output's width, the horizontal stride, padding
    and dilation, the output pixels whose window lies inside the row ([first_inside, end_inside)),
    x's and y's zero points, lo and hi."""
    key = (kernel_h, kernel_w, signed, sliding)
    if key not in _FUSED_ROWS:
        def typer(typingctx, rows_address, weights_address, shifts_address, multipliers_address, out_address,
                  channels, width, out_width, stride, pad, dilation, first_inside, end_inside, x_zero, y_zero, lo, hi):
            return types.void(*[types.intp] * 17), _fused_row_codegen(kernel_h, kernel_w, signed, NHWC_LANES, sliding)
        typer.__name__ = typer.__qualname__ = fused_name("_nhwc_fused_row", (kernel_h, kernel_w), signed, sliding)
        _FUSED_ROWS[key] = intrinsic(typer)
    return _FUSED_ROWS[key]


def fused_name(prefix: str, kernel: tuple[int, int], signed: bool, sliding: int) -> str:
    """The name of a fused row function or kernel of this variant (Numba's disk cache tells them apart by it)."""
    return f"{prefix}_{kernel[0]}x{kernel[1]}_{'s8' if signed else 'u8'}{f'_sliding{sliding}' if sliding else ''}"


def fused_sliding(op: A.QuantizedConv2D) -> int:
    """How many new columns each output pixel of the fused kernel reads, keeping the rest of its window
    from the pixel before: its stride, where that is below the window's width at dilation 1 (and
    NHWC_SLIDING); 0 (each reads its whole window) otherwise."""
    stride, width = op.strides[1], op.kernel[1]
    return stride if NHWC_SLIDING and op.dilations[1] == 1 and stride < width else 0


def runs_nhwc_fused(op: A.QuantizedConv2D) -> bool:
    """Whether a ``channels_last`` depthwise ``op`` runs fused (``_conv_depthwise_nhwc_fused``): float32
    sums exact (``direct_sum_dtype``) and its channels whole vectors of NHWC_LANES."""
    return NHWC_FUSED and direct_sum_dtype(op) == np.float32 and op.out_channels % NHWC_LANES == 0


def fused_nhwc_operands(op: A.QuantizedConv2D, weight: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A depthwise ``weight`` [C, 1, KH, KW] and int32 ``bias`` as ``_nhwc_fused_row`` reads them: the
    taps' weights float32 [KH * KW, C], and the shifts int32 [C], ``bias - x_zero * sum(weights)``
    (wrapping as the int32 sum does), so that the raw bytes are summed and the zero point's share
    taken off once."""
    channels, window = op.out_channels, op.kernel[0] * op.kernel[1]
    taps = weight.reshape(channels, window)
    shifts = bias.astype(np.int64) - op.x_zero_point * taps.sum(axis=1, dtype=np.int64)
    return np.ascontiguousarray(taps.T.astype(np.float32)), shifts.astype(np.int32)


def _conv_depthwise_nhwc_fused(x, weights, shifts, multiplier, zero_row, out, geometry, x_zero, y_zero, lo, hi):
    """A ``channels_last`` depthwise QuantizedConv2D (``runs_nhwc_fused``) with no scratch: x uint8
    [N, H, W, C] and out uint8 [N, OH*OW, C], both contiguous; ``weights`` and ``shifts``
    (``fused_nhwc_operands``); ``zero_row`` a row of x's zero point's bytes [W * C], read for the
    window's rows above and below the input. Each parallel task takes a run of output rows (of all
    images), each row one ``_fused_row`` call that sums and requantizes it."""
    kh_, kw_, sh, sw, ph, pw, dh, dw, oh_, ow_ = geometry
    images, height, width, channels = x.shape
    first_inside = min(-(-pw // sw), ow_)
    end_inside = max(first_inside, min(ow_, (width - 1 - (kw_ - 1) * dw + pw) // sw + 1))
    row_bytes = width * channels
    items = images * oh_
    tasks = min(items, DIRECT_TASKS)
    for task in numba.prange(tasks):
        rows = np.empty(kh_, np.int64)
        for item in range(task * items // tasks, (task + 1) * items // tasks):
            n, oh = item // oh_, item % oh_
            for kh in range(kh_):
                ih = oh * sh - ph + kh * dh
                rows[kh] = x.ctypes.data + (n * height + ih) * row_bytes if 0 <= ih < height else zero_row.ctypes.data
            _fused_row(rows.ctypes.data, weights.ctypes.data, shifts.ctypes.data, multiplier.ctypes.data,
                       out.ctypes.data + item * ow_ * channels, channels, width, ow_, sw, pw, dw, first_inside,
                       end_inside, x_zero, y_zero, lo, hi)


def nhwc_block(channels: int) -> int:
    """The channels one task of ``_conv_depthwise_nhwc`` takes: all of them up to NHWC_WHOLE, else
    the widest multiple of 16 up to CHANNEL_BLOCK that divides them (no partial block), else CHANNEL_BLOCK."""
    if channels <= NHWC_WHOLE:
        return channels
    for block in range(CHANNEL_BLOCK, 15, -16):
        if channels % block == 0:
            return block
    return CHANNEL_BLOCK


def nhwc_taps(op: A.QuantizedConv2D, weight: np.ndarray) -> np.ndarray:
    """A depthwise ``weight`` [C, 1, KH, KW] as ``_conv_depthwise_nhwc``'s taps: per block of
    ``nhwc_block`` channels, each tap's weights repeated for the output pixels one vector loop takes
    (about NHWC_CHUNK sums, at most a row's), [blocks, KH * KW padded to a multiple of
    CHANNELS_LAST_READS, pixels, block] in ``direct_sum_dtype`` (zeros in the padding and past the
    last channel)."""
    channels, window, block = op.out_channels, op.kernel[0] * op.kernel[1], nhwc_block(op.out_channels)
    blocks = -(-channels // block)
    taps = np.zeros((blocks * block, -(-window // CHANNELS_LAST_READS) * CHANNELS_LAST_READS), direct_sum_dtype(op))
    taps[:channels, :window] = weight.reshape(channels, window)
    per_block = taps.reshape(blocks, block, -1).transpose(0, 2, 1)  # [blocks, taps, block]
    pixels = min(op.out_hw[1], max(1, NHWC_CHUNK // block))
    return np.ascontiguousarray(np.broadcast_to(per_block[:, :, None, :], (blocks, per_block.shape[1], pixels, block)))


def _conv_depthwise_nhwc(x, taps, bias, multiplier, out, geometry, flip, x_zero, y_zero, lo, hi):
    """A ``channels_last`` depthwise QuantizedConv2D: x uint8 [N, H, W, C], ``taps`` (``nhwc_taps``),
    bias and multiplier repeated for each output pixel of a row ([OW * C]), out uint8 [N, OH*OW, C]. A parallel task takes a block of channels of one image over a band of
    NHWC_BAND output rows: it widens the input rows the band reads, less the zero point, into a
    zero-padded scratch [rows, column phase (by stride), columns of the phase, block], so that one
    tap over consecutive output pixels of a row reads one contiguous run of values; an output row is
    then vector loops over the taps' length of sums (``nhwc_taps``), CHANNELS_LAST_READS taps each;
    the row is requantized into out's rows (one loop over the row where the block is every channel).
    The ops whose channels are whole vectors run fused instead (``_conv_depthwise_nhwc_fused``)."""
    kh_, kw_, sh, sw, ph, pw, dh, dw, oh_, ow_ = geometry
    images, height, width, channels = x.shape
    blocks, taps_padded, chunk_pixels, block = taps.shape
    chunk = chunk_pixels * block
    length = ow_ * block
    window = kh_ * kw_
    columns = (ow_ - 1) * sw + (kw_ - 1) * dw + 1  # the padded input's columns any output reads
    phase_columns = -(-columns // sw)
    row_size = sw * phase_columns * block
    band_rows = (NHWC_BAND - 1) * sh + (kh_ - 1) * dh + 1
    bands = -(-oh_ // NHWC_BAND)
    zero = np.int32(x_zero + flip)
    flip_byte = np.uint8(flip)
    offsets = np.zeros(taps_padded, np.int64)  # the zero taps past the window read the first tap's place
    for k in range(window):
        kh, kw = k // kw_, k % kw_
        offsets[k] = kh * dh * row_size + (((kw * dw) % sw) * phase_columns + (kw * dw) // sw) * block
    filled = min(width, columns - pw)  # the input columns any output reads
    whole_rows = sw == 1 and block == channels and filled == width
    items = images * blocks * bands
    tasks = min(items, DIRECT_TASKS)
    for task in numba.prange(tasks):
        padded = np.zeros(band_rows * row_size, taps.dtype)  # its padding columns are never written: they stay 0
        acc = np.zeros(length, taps.dtype)
        for item in range(task, items, tasks):
            n, rest = item // (blocks * bands), item % (blocks * bands)
            b, band = rest // bands, rest % bands
            c0 = b * block
            count = min(block, channels - c0)
            oh0 = band * NHWC_BAND
            oh1 = min(oh_, oh0 + NHWC_BAND)
            first_row = oh0 * sh - ph  # the input row of the scratch's first row
            used_rows = (oh1 - oh0 - 1) * sh + (kh_ - 1) * dh + 1
            for r in range(used_rows):
                ih = first_row + r
                row = padded[r * row_size:(r + 1) * row_size]
                if ih < 0 or ih >= height:
                    row[:] = 0
                elif whole_rows:  # the input row is one run of the scratch row, past its left padding
                    source, inside = x[n, ih].reshape(width * channels), row[pw * block:(pw + width) * block]
                    for i in range(width * channels):
                        inside[i] = np.int32(source[i] ^ flip_byte) - zero
                else:
                    for iw in range(filled):
                        col = iw + pw
                        at = ((col % sw) * phase_columns + col // sw) * block
                        pixel, source = row[at:at + count], x[n, ih, iw, c0:c0 + count]
                        for c in range(count):
                            pixel[c] = np.int32(source[c] ^ flip_byte) - zero
            weights = taps[b]
            for oh in range(oh0, oh1):
                base = (oh - oh0) * sh * row_size
                for first in range(0, length, chunk):
                    span = min(chunk, length - first)
                    sums = acc[first:first + span]
                    for k in range(0, taps_padded, CHANNELS_LAST_READS):
                        a0, a1, a2 = base + first + offsets[k], base + first + offsets[k + 1], base + first + offsets[k + 2]
                        v0, v1, v2 = padded[a0:a0 + span], padded[a1:a1 + span], padded[a2:a2 + span]
                        w0, w1, w2 = weights[k].reshape(chunk), weights[k + 1].reshape(chunk), weights[k + 2].reshape(chunk)
                        if k == 0:
                            for i in range(span):
                                sums[i] = v0[i] * w0[i] + v1[i] * w1[i] + v2[i] * w2[i]
                        else:
                            for i in range(span):
                                sums[i] += v0[i] * w0[i] + v1[i] * w1[i] + v2[i] * w2[i]
                if block == channels:  # the whole row of out, one loop
                    done = out[n, oh * ow_:(oh + 1) * ow_].reshape(length)
                    for i in range(length):
                        done[i] = _requantized(np.int32(acc[i]) + bias[i], multiplier[i], y_zero, lo, hi)
                else:
                    block_bias, block_multiplier = bias[c0:c0 + count], multiplier[c0:c0 + count]
                    for ow in range(ow_):
                        done, sums = out[n, oh * ow_ + ow, c0:c0 + count], acc[ow * block:ow * block + count]
                        for c in range(count):
                            done[c] = _requantized(np.int32(sums[c]) + block_bias[c], block_multiplier[c],
                                                   y_zero, lo, hi)


def runs_flat(op: A.QuantizedConv2D) -> bool:
    """Whether ``_conv_depthwise_flat`` computes ``op``: a depthwise convolution at stride 1 whose
    output rows are as wide as its input rows (the horizontal padding "same"), so that a plane is
    summed flattened, rows unpadded, with no loop per row."""
    (kh, kw), (ph, pw), (dh, dw) = op.kernel, op.pads, op.dilations
    return (op.scheme == "depthwise" and op.out_channels == op.in_channels and op.strides == (1, 1)
            and 2 * pw == (kw - 1) * dw and op.out_hw[1] == op.in_hw[1])


def _conv_depthwise_flat(x, taps, bias, multiplier, out, geometry, flip, x_zero, y_zero, lo, hi):
    """A depthwise QuantizedConv2D (``runs_flat``): x uint8 [N, C, H, W], ``taps`` (``direct_taps``),
    out uint8 [N, C, OH*W]. Each input plane, less its zero point, is one contiguous run in a scratch
    with zero rows above and below and no padding columns, so that a tap reads it at a constant
    offset from the flattened output index and a plane is a few vector loops (DIRECT_READS taps
    each) with no loop per row; the taps that reach past a row's ends read the neighbouring row's
    pixels there, which are then taken off those outputs' sums, border column by border column (the
    sums stay exact: every output still sums exactly the window's products)."""
    kh_, kw_, sh, sw, ph, pw, dh, dw, oh_, ow_ = geometry
    images, channels, height, width = x.shape
    window = kh_ * kw_
    span = oh_ * width
    zero = np.int32(x_zero + flip)
    flip_byte = np.uint8(flip)
    inside = pw + ph * width  # where the plane's first pixel goes in the scratch
    length = pw + (oh_ - 1 + (kh_ - 1) * dh) * width + width + (kw_ - 1) * dw - pw
    offsets = np.zeros(taps.shape[1], np.int64)
    for k in range(window):
        offsets[k] = pw + (k // kw_) * dh * width + (k % kw_) * dw - pw
    items = images * channels
    tasks = min(items, DIRECT_TASKS)
    for task in numba.prange(tasks):
        flat = np.zeros(length, taps.dtype)  # the zero rows stay zero: only the plane is written
        acc = np.empty(span, taps.dtype)
        for item in range(task, items, tasks):
            n, c = item // channels, item % channels
            plane = x[n, c].reshape(height * width)
            widened = flat[inside:inside + height * width]
            for i in range(widened.shape[0]):
                widened[i] = np.int32(plane[i] ^ flip_byte) - zero
            weights = taps[c]
            for k in range(0, taps.shape[1], DIRECT_READS):
                a0, a1, a2, a3, a4 = offsets[k], offsets[k + 1], offsets[k + 2], offsets[k + 3], offsets[k + 4]
                v0, v1, v2 = flat[a0:a0 + span], flat[a1:a1 + span], flat[a2:a2 + span]
                v3, v4 = flat[a3:a3 + span], flat[a4:a4 + span]
                w0, w1, w2, w3, w4 = weights[k], weights[k + 1], weights[k + 2], weights[k + 3], weights[k + 4]
                if k == 0:
                    for i in range(span):
                        acc[i] = v0[i] * w0 + v1[i] * w1 + v2[i] * w2 + v3[i] * w3 + v4[i] * w4
                else:
                    for i in range(span):
                        acc[i] += v0[i] * w0 + v1[i] * w1 + v2[i] * w2 + v3[i] * w3 + v4[i] * w4
            for kw in range(kw_):  # the reads past a row's ends, taken off again, a window column at a time
                shift = kw * dw - pw
                first, last = (0, -shift) if shift < 0 else (width - shift, width)
                for ow in range(max(first, 0), min(last, width)):
                    for oh in range(oh_):
                        at = oh * width + ow
                        wrong = weights[0] - weights[0]  # a zero of the sums' type
                        for kh in range(kh_):
                            k = kh * kw_ + kw
                            wrong += flat[at + offsets[k]] * weights[k]
                        acc[at] -= wrong
            start, m = bias[c], multiplier[c]
            plane_out = out[n, c]
            for i in range(span):
                plane_out[i] = _requantized(np.int32(acc[i]) + start, m, y_zero, lo, hi)


_COMPILED: dict[tuple[str, str, bool], object] = {}


def _specialised(fn, path: str):
    """``fn`` with ``path``'s tile as ``_tile`` and the epilogue inlined: a
    function of its own name (for Numba's disk cache), as in ``int8._product_for``."""
    scope = dict(globals(), _tile=numba.njit(inline="always")(cpu_int8._TILES[path][0]),
                 _indirect_tile=numba.njit(inline="always")(cpu_int8.indirect_tile(path)),
                 _requantized=numba.njit(inline="always")(_requantized))

    def own(function, name):
        made = types_module.FunctionType(function.__code__, scope, name, function.__defaults__, function.__closure__)
        made.__qualname__ = name
        made.__doc__ = function.__doc__
        return made
    scope["_store_tile"] = numba.njit(inline="always")(own(_store_tile, f"_store_tile_{path}"))
    scope["_pixel_major_row"] = numba.njit(inline="always")(_pixel_major_row)
    return own(fn, f"{fn.__name__}_{path}")


def _kernel(fn, path: str, parallel: bool):
    """``fn`` on ``path``'s tile as a parallel region (cached on disk) or a one-thread loop."""
    key = (fn.__name__, path, parallel)
    if key not in _COMPILED:
        made = _specialised(fn, path)
        if parallel:
            _COMPILED[key] = cpu_parallel.compiled_region(made, error_model="numpy", fastmath=False)
        else:
            _COMPILED[key] = numba.njit(error_model="numpy", boundscheck=False, nogil=True)(made)
    return _COMPILED[key]


def _fused_kernel(kernel: tuple[int, int], signed: bool, sliding: int, parallel: bool):
    """``_conv_depthwise_nhwc_fused`` with the row intrinsic of this window, input type and way of
    reading (a function of its own name, for Numba's disk cache), as a parallel region or a one-thread loop."""
    name = fused_name("_conv_depthwise_nhwc_fused", kernel, signed, sliding)
    key = (name, "", parallel)
    if key not in _COMPILED:
        fn = _conv_depthwise_nhwc_fused
        scope = dict(globals(), _fused_row=fused_row_intrinsic(*kernel, signed, sliding))
        made = types_module.FunctionType(fn.__code__, scope, name, fn.__defaults__, fn.__closure__)
        made.__qualname__ = name
        made.__doc__ = fn.__doc__
        if parallel:
            _COMPILED[key] = cpu_parallel.compiled_region(made, error_model="numpy", fastmath=False)
        else:
            _COMPILED[key] = numba.njit(error_model="numpy", boundscheck=False, nogil=True)(made)
    return _COMPILED[key]


def _bytes(handle) -> np.ndarray:
    """A handle's 8-bit buffer seen as uint8 (int8 bytes as they are)."""
    buffer = typed(handle)
    return buffer.view(np.uint8) if buffer.dtype != np.uint8 else buffer


def _views(op: A.QuantizedConv2D, ins, outs) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """x as uint8 [N, C, H, W] and out as uint8 [N, OC, OH*OW] views ([N, H, W, C] and [N, OH*OW, OC]
    for a ``channels_last`` op, out [N, OH*OW, OC] for an ``out_channels_last`` one), and the geometry tuple."""
    n, c, (h, w), oc, (oh, ow) = op.batch, op.in_channels, op.in_hw, op.out_channels, op.out_hw
    x_bytes, out_bytes = _bytes(ins[0]), _bytes(outs[0])
    if op.channels_last:
        x = x_bytes[ins[0].offset:ins[0].offset + n * c * h * w].reshape(n, h, w, c)
        out = out_bytes[outs[0].offset:outs[0].offset + n * oc * oh * ow].reshape(n, oh * ow, oc)
        return x, out, (*op.kernel, *op.strides, *op.pads, *op.dilations, oh, ow)
    x = x_bytes[ins[0].offset:ins[0].offset + n * c * h * w].reshape(n, c, h, w)
    out = out_bytes[outs[0].offset:outs[0].offset + n * oc * oh * ow]
    out = out.reshape(n, oh * ow, oc) if op.out_channels_last else out.reshape(n, oc, oh * ow)
    return x, out, (*op.kernel, *op.strides, *op.pads, *op.dilations, oh, ow)


def quantized_conv_sums(op: A.QuantizedConv2D, x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The contract's sums of QuantizedConv2D in NumPy, before the epilogue: x [N, C, H, W] int8/uint8
    -> acc int64 [N, OC, OH*OW]."""
    n, c, (h, w), oc, (oh, ow) = op.batch, op.in_channels, op.in_hw, op.out_channels, op.out_hw
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = op.kernel, op.strides, op.pads, op.dilations
    shifted = x.reshape(n, c, h, w).astype(np.int64) - op.x_zero_point
    need_h, need_w = (oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1
    padded = np.pad(shifted, ((0, 0), (0, 0), (ph, max(0, need_h - ph - h)), (pw, max(0, need_w - pw - w))))
    columns = np.stack([padded[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
                        for i in range(kh) for j in range(kw)], axis=2)  # [N, C, KH*KW, OH, OW]
    groups, per_group, out_per_group = op.groups, c // op.groups, oc // op.groups
    acc = np.empty((n, oc, oh * ow), np.int64)
    for g in range(groups):
        window = columns[:, g * per_group:(g + 1) * per_group].reshape(n, per_group * kh * kw, oh * ow)
        rows = weight[g * out_per_group:(g + 1) * out_per_group].reshape(out_per_group, -1).astype(np.int64)
        acc[:, g * out_per_group:(g + 1) * out_per_group] = np.einsum("ok,nkp->nop", rows, window)
    return acc + bias.reshape(1, oc, 1).astype(np.int64)


def quantized_conv_reference(op: A.QuantizedConv2D, x: np.ndarray, weight: np.ndarray, bias: np.ndarray,
                             multiplier: np.ndarray) -> np.ndarray:
    """The contract's QuantizedConv2D in NumPy (int64 sums): x [N, C, H, W] int8/uint8 -> out
    [N, OC, OH, OW] of ``op.out_dtype``."""
    acc = quantized_conv_sums(op, x, weight, bias)
    scaled = np.rint(acc.astype(np.float32) * multiplier.reshape(1, op.out_channels, 1).astype(np.float32))
    result = np.clip(scaled + np.float32(op.y_zero_point), op.lo, op.hi)
    return result.astype(op.out_dtype).reshape(op.batch, op.out_channels, *op.out_hw)


def make_quantized_conv2d(op: A.QuantizedConv2D, ins, outs, engine, made_once) -> KernelWork:
    """The cpu execution of ``op``: the compiled kernel of its scheme (a region on several threads)
    where Numba runs, else the NumPy reference. ``made_once(handle, recipe, make)`` shares packed
    weights between run states."""
    weight = typed(ins[1])[ins[1].offset:ins[1].offset + ins[1].size].reshape(
        op.out_channels, op.in_channels // op.groups, *op.kernel)
    bias = strided(ins[2], 0, (op.out_channels,), (1,))
    multiplier = strided(ins[3], 0, (op.out_channels,), (1,))
    flip = SIGN_FLIP if op.dtype == A.INT8 else 0
    if not engine.jit:
        x = typed(ins[0])[ins[0].offset:ins[0].offset + ins[0].size]
        out = typed(outs[0])[outs[0].offset:outs[0].offset + outs[0].size]

        def reference() -> None:
            if op.channels_last:  # the same sums on the NCHW views of both
                planes = x.reshape(op.batch, *op.in_hw, op.in_channels).transpose(0, 3, 1, 2)
                out[:] = quantized_conv_reference(op, planes, weight, bias, multiplier).transpose(0, 2, 3, 1).reshape(-1)
            elif op.out_channels_last:
                out[:] = quantized_conv_reference(op, x, weight, bias, multiplier).transpose(0, 2, 3, 1).reshape(-1)
            else:
                out[:] = quantized_conv_reference(op, x, weight, bias, multiplier).reshape(-1)
        return KernelWork((reference,), "int8 NumPy")
    x, out, geometry = _views(op, ins, outs)
    path = cpu_int8.current_path()
    parallel = engine.regions > 1 and op.macs() >= 1 << 16
    arguments = (op.x_zero_point, op.y_zero_point, op.lo, op.hi)

    def depthwise(function, taps, name: str, bias=bias, multiplier=multiplier, geometry=geometry) -> KernelWork:
        """One of the depthwise kernels bound once to this op's views and taps."""
        kernel = cpu_jit.bind(_kernel(function, "portable", parallel), x, taps, bias, multiplier, out, geometry,
                              flip, *arguments)

        def run() -> None:
            kernel(x, taps, bias, multiplier, out, geometry, flip, *arguments)
        return KernelWork((run,), f"int8 depthwise {name}{' region' if parallel else ''}")
    if op.channels_last:
        row_pixels = op.out_hw[1]
        if runs_nhwc_fused(op):
            return _fused_nhwc_work(op, x, out, weight, bias, multiplier, geometry, parallel)
        return depthwise(_conv_depthwise_nhwc, nhwc_taps(op, weight), "nhwc", np.tile(bias, row_pixels),
                         np.tile(multiplier, row_pixels))
    if runs_channels_last(op):
        return depthwise(_conv_depthwise_channels_last, channels_last_taps(op, weight), "channels-last")
    if runs_flat(op):
        return depthwise(_conv_depthwise_flat, direct_taps(op, weight), "flat")
    if op.out_channels_last or runs_stem(op):
        return _stem_work(op, x, out, weight, bias, multiplier, flip, path, parallel, made_once, ins[1])
    if runs_direct(op):
        taps = direct_taps(op, weight)
        kernel = cpu_jit.bind(_kernel(_conv_direct, "portable", parallel), x, taps, bias, multiplier, out,
                              geometry, op.groups, flip, *arguments)

        def run_direct() -> None:
            kernel(x, taps, bias, multiplier, out, geometry, op.groups, flip, *arguments)
        return KernelWork((run_direct,), f"int8 direct{' region' if parallel else ''}")
    pairs = cpu_int8._TILES[path][1]
    # the turned tile where planes of at least NR pixels fill its vectors and the output has at least
    # as many channels as the input: it packs every input byte once per block of pixels, the rows'
    # tile stores every output byte transposed, so each takes the side with fewer bytes; and on
    # planes of LARGE_PLANE pixels or more, where the rows' tile gathers each pixel's bytes from
    # planes so far apart that every byte is a cache miss
    pixels = op.out_hw[0] * op.out_hw[1]
    if op.scheme == "gemm1x1" and op.groups == 1 and x.flags.c_contiguous and pixels >= NR \
            and (op.out_channels >= op.in_channels or pixels >= LARGE_PLANE):
        return _pixels_work(op, x, out, weight, bias, multiplier, flip, path, pairs, parallel, made_once, ins[1])
    panels, colsum = made_once(ins[1], "int16 pair conv panels" if pairs else "int8 conv panels",
                               lambda: pack_conv_weight(weight, op.groups, pairs))
    shifts, scales = epilogue_columns(op, panels.shape[1] * NR, colsum, bias, multiplier, flip)
    if runs_rows(op):
        rows = np.zeros((MR, panels.shape[2] * panels.shape[4]), np.int16 if pairs else np.uint8)
        x_rows = _bytes(ins[0])[ins[0].offset:ins[0].offset + op.batch * op.in_channels].reshape(op.batch, -1)
        out_rows = _bytes(outs[0])[outs[0].offset:outs[0].offset + op.batch * op.out_channels].reshape(op.batch, -1)
        group_panels = panels[0]
        kernel = cpu_jit.bind(_kernel(_conv_rows, path, parallel), x_rows, rows, group_panels, shifts, scales,
                              out_rows, flip, op.y_zero_point, op.lo, op.hi)

        def run_rows() -> None:
            kernel(x_rows, rows, group_panels, shifts, scales, out_rows, flip, op.y_zero_point, op.lo, op.hi)
        return KernelWork((run_rows,), f"int8 rows {cpu_int8.PATH_NAMES[path]}{' region' if parallel else ''}")
    if runs_indirect(op, pairs):
        return _indirect_work(op, x, out, panels, shifts, scales, flip, path, pairs, parallel, geometry)
    # one task's rows, copied by each (zeros); the pair paths read the bytes widened to int16
    rows = np.zeros((MR, panels.shape[2] * panels.shape[4]), np.int16 if pairs else np.uint8)
    pointwise = op.kernel == (1, 1) and op.strides == (1, 1) and op.pads == (0, 0)
    few = op.in_channels // op.groups < FEW_CHANNELS
    planes = np.empty((0, 0) if pointwise or few else (x.shape[2] * x.shape[3], op.in_channels // op.groups),
                      rows.dtype)
    kernel = cpu_jit.bind(_kernel(_conv_packed, path, parallel), x, planes, rows, panels, shifts, scales, out,
                          geometry, flip, *arguments)

    def run() -> None:
        kernel(x, planes, rows, panels, shifts, scales, out, geometry, flip, *arguments)
    return KernelWork((run,), f"int8 {op.scheme} {cpu_int8.PATH_NAMES[path]}{' region' if parallel else ''}")


def _indirect_work(op, x, out, panels, shifts, scales, flip, path, pairs, parallel, geometry):
    """The execution of an im2col convolution by ``_conv_indirect``: its planes and indirection table
    made here, once."""
    dtype = np.dtype(np.int16 if pairs else np.uint8)
    planes = np.empty((op.in_hw[0] * op.in_hw[1] + 1, op.in_channels // op.groups), dtype)
    planes[-1] = op.x_zero_point + flip  # the padding's row, as the tile reads x; runs write only the rows above
    table = indirection_table(op, dtype.itemsize)
    arguments = (flip, op.x_zero_point, op.y_zero_point, op.lo, op.hi)
    kernel = cpu_jit.bind(_kernel(_conv_indirect, path, parallel), x, planes, table, panels, shifts, scales, out,
                          geometry, *arguments)

    def run() -> None:
        kernel(x, planes, table, panels, shifts, scales, out, geometry, *arguments)
    return KernelWork((run,), f"int8 {op.scheme} indirect {cpu_int8.PATH_NAMES[path]}{' region' if parallel else ''}")


def _stem_work(op, x, out, weight, bias, multiplier, flip, path, parallel, made_once, weight_handle):
    """The execution of a convolution over a few input channels by ``_conv_stem``."""
    if op.groups != 1 or op.dilations != (1, 1):
        raise ValueError(f"QuantizedConv2D {op.source!r}: the stem kernel takes one group and no dilation")
    pairs = cpu_int8._TILES[path][1]
    panels, colsum = made_once(weight_handle, "int16 pair stem panels" if pairs else "int8 stem panels",
                               lambda: stem_panels(op, weight, pairs))
    shifts, scales = epilogue_columns(op, panels.shape[0] * NR, colsum, bias, multiplier, flip)
    (kh, kw), (sh, sw), (ph, pw), (oh, ow) = op.kernel, op.strides, op.pads, op.out_hw
    wide = stem_width(op)
    dtype = np.int16 if pairs else np.uint8
    padded = np.zeros((op.in_channels, (STEM_BAND - 1) * sh + kh, max((ow - 1) * sw + wide, pw + op.in_hw[1])), dtype)
    band_pixels = -(-min(STEM_BAND, oh) * ow // MR) * MR
    words = np.zeros(padded.shape, np.uint32)
    packed = np.zeros((band_pixels, op.in_channels * kh * wide * np.dtype(dtype).itemsize // 4), np.uint32)
    geometry = (*op.kernel, *op.strides, *op.pads, *op.dilations, oh, ow, bool(op.out_channels_last))
    arguments = (flip, op.x_zero_point, op.y_zero_point, op.lo, op.hi)
    kernel = cpu_jit.bind(_kernel(_conv_stem, path, parallel), x, padded, words, packed, panels, shifts, scales, out,
                          geometry, *arguments)

    def run() -> None:
        kernel(x, padded, words, packed, panels, shifts, scales, out, geometry, *arguments)
    layout = " nhwc" if op.out_channels_last else ""
    return KernelWork((run,), f"int8 stem{layout} {cpu_int8.PATH_NAMES[path]}{' region' if parallel else ''}")


def _fused_nhwc_work(op, x, out, weight, bias, multiplier, geometry, parallel):
    """The execution of a ``channels_last`` depthwise op by ``_conv_depthwise_nhwc_fused`` (its taps and
    shifts are a few floats per channel: made per execution)."""
    weights, shifts = fused_nhwc_operands(op, weight, bias)
    signed = op.dtype == A.INT8
    zero_row = np.full(x.shape[2] * x.shape[3], op.x_zero_point, np.int16).astype(np.int8 if signed else np.uint8)
    zero_row = zero_row.view(np.uint8)
    arguments = (op.x_zero_point, op.y_zero_point, op.lo, op.hi)
    sliding = fused_sliding(op)
    kernel = cpu_jit.bind(_fused_kernel(op.kernel, signed, sliding, parallel), x, weights, shifts, multiplier, zero_row, out,
                          geometry, *arguments)

    def run() -> None:
        kernel(x, weights, shifts, multiplier, zero_row, out, geometry, *arguments)
    return KernelWork((run,), f"int8 depthwise nhwc fused{' sliding' if sliding else ''}{' region' if parallel else ''}")


def pack_weight_rows(weight: np.ndarray, pairs: bool) -> tuple[np.ndarray, np.ndarray]:
    """A 1x1 convolution's int8 weight [OC, C, 1, 1] as the turned tile's broadcast rows,
    ``weight + 128`` ([OC padded to MR, C padded to 4]: uint8, or int16 for the pair paths; zeros
    in the padding), and its row sums int32 [OC]."""
    oc, c = weight.shape[:2]
    rows = np.zeros((-(-oc // MR) * MR, -(-c // cpu_int8.STEP) * cpu_int8.STEP), np.int16 if pairs else np.uint8)
    rows[:oc, :c] = weight.reshape(oc, c).astype(np.int16) + 128
    return rows, weight.reshape(oc, c).sum(axis=1, dtype=np.int32)


def _pixels_work(op, x, out, weight, bias, multiplier, flip, path, pairs, parallel, made_once, weight_handle):
    """The execution of a 1x1 convolution at stride 1 by ``_conv_pixels``."""
    rows, row_sums = made_once(weight_handle, "int16 pair pixel rows" if pairs else "int8 pixel rows",
                               lambda: pack_weight_rows(weight, pairs))
    zero = op.x_zero_point + flip  # the byte the tile reads for x's zero point
    corrections = (bias.astype(np.int64) - (zero - 128) * row_sums.astype(np.int64)).astype(np.int32)
    lanes = np.empty(0, np.int16 if pairs else np.int8)
    panel = np.zeros((rows.shape[1] * lanes.itemsize // 4, NR), np.int32)
    arguments = (op.y_zero_point, op.lo, op.hi)
    kernel = cpu_jit.bind(_kernel(_conv_pixels, path, parallel), x, rows, panel, lanes, corrections, multiplier, out,
                          flip, *arguments)

    def run() -> None:
        kernel(x, rows, panel, lanes, corrections, multiplier, out, flip, *arguments)
    return KernelWork((run,), f"int8 gemm1x1 pixels {cpu_int8.PATH_NAMES[path]}{' region' if parallel else ''}")
