"""Compiled loops for the cpu backend's memory-bound ops, where NumPy needs a pass per step.

NumPy computes one elementwise step per call and per pass over memory, and BLAS only what is a
matrix product. A depthwise convolution is neither: as NumPy calls it costs a padded copy, nine
shifted window copies and a batched product (most of MobileNet-v2's run: bench/RESULTS.md), and
as compiled loops it is one pass that reads each input row into cache once and writes each output
once, with the bias and a clamp activation on the way out. Numba compiles these loops (LLVM, the
host's vector units) when it is installed (``pip install gpumnn[cpu]``); without it the backend
keeps its NumPy kernels, which are the reference these are tested against.

Every kernel releases the GIL (``nogil``): the backend's own threads (``cpu_workers``) run
channel spans of one op side by side, as they run NumPy chunks. Kernels are compiled for the
argument types an execution binds when it is created (``bind``), so a run neither compiles nor
dispatches on types; compiled code is cached on disk by Numba (``cache=True``), stamped with
every module of this package (``_register_package_stamp``), as kernels inline functions across them.

What keeps LLVM from vectorising a loop (measured: bench/RESULTS.md): an index Numba cannot
prove non-negative (``row[i + k]`` gets a wraparound branch), a run-time stride in an index
(``row[i * s]``), a test inside the loop (a stride tested in the row loop), float64 mixed into
float32 arithmetic, and a row loop in a function of its own that Numba does not inline. Hence slices taken outside
loops, a kernel per stride, ``inlined`` row functions and np.float32 scalars. And a loop LLVM
does vectorise runs scalar on fewer elements than its vector width times its interleave (64
floats with AVX-512), which is every row of a small plane: the depthwise rows and their taps are
written as LLVM IR (``row_taps``, ``lane_taps``), their sums in vector registers.
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ... import atomic as A

try:
    import numba
except ImportError as exc:  # gpumnn[cpu] not installed: the NumPy kernels run
    numba = None
    MISSING = f"Numba is not importable ({exc}); install gpumnn[cpu] for compiled cpu kernels"
else:
    MISSING = None
    from llvmlite import ir
    from llvmlite.binding import llvm_version_info as _LLVM_VERSION
    from numba import types
    from numba.extending import intrinsic

#: the cpu package's modules: kernels in one inline functions of others (tiles, activations, rows)
_PACKAGE = Path(__file__).resolve().parent


def _package_stamp() -> str:
    """The freshness of every module in the cpu package, as one stamp."""
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE.glob("*.py")):
        st = path.stat()
        digest.update(f"{path.name}:{st.st_mtime_ns}:{st.st_size};".encode())
    return digest.hexdigest()


def _register_package_stamp() -> bool:
    """Make Numba's disk cache of this package's kernels stale when any module of the package
    changes, not only the kernel's own file (Numba's stamp): a kernel may inline functions of
    another module (GELU into the GEMM region, ``exp_neg`` into the row passes). Registers cache
    locators for the package's files ahead of Numba's own; False (no disk cache then) where this
    Numba's caching internals differ."""
    try:
        from numba.core import caching
        impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
        bases = [getattr(caching, name, None) or getattr(caching, "_" + name)
                 for name in ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")]
        locators = impl._locator_classes
    except (ImportError, AttributeError):
        return False
    if any(getattr(cls, "gpumnn_package", None) == str(_PACKAGE) for cls in locators):
        return True

    def locator(base: type) -> type:
        class PackageLocator(base):
            gpumnn_package = str(_PACKAGE)

            @classmethod
            def from_function(cls, py_func, py_file):
                if Path(py_file).resolve().parent != _PACKAGE:
                    return None
                return super().from_function(py_func, py_file)

            def get_source_stamp(self):
                return _package_stamp()
        return PackageLocator

    locators[:0] = [locator(base) for base in bases]
    return True


#: whether kernels are cached on disk (Numba there, with a stamp over the whole package)
CACHE = numba is not None and _register_package_stamp()

#: FMA contraction only: no ``nnan``/``ninf`` (a clamp to +-inf stands for "no bound" below, and
#: NaNs must pass through as NumPy's kernels pass them)
FAST = {"contract"}


def target_features() -> dict[str, bool]:
    """The CPU features Numba compiles for: those ``NUMBA_CPU_FEATURES`` names where it is set, else
    the host's (``{}`` where Numba is missing or they cannot be read)."""
    if numba is None:
        return {}
    from numba.core import config
    if config.CPU_FEATURES:
        return {flag[1:]: flag[0] == "+" for flag in config.CPU_FEATURES.split(",") if flag[:1] in "+-"}
    from llvmlite import binding
    try:
        return dict(binding.get_host_cpu_features())
    except RuntimeError:
        return {}


def available() -> bool:
    """Whether the compiled kernels can run (Numba importable)."""
    return numba is not None


def clamp_of(activation: A.Activation) -> tuple[float, float] | None:
    """(lo, hi) for an activation that is a clamp (none, relu, clip), else None: the kernels
    apply a clamp while a value is in a register; other activations run after, as NumPy calls."""
    if activation is None:
        return -math.inf, math.inf
    name, params = activation
    if name == "relu":
        return 0.0, math.inf
    if name == "clip":
        return float(params[0]), float(params[1])
    return None


def compiled(fn: Callable, **options: Any) -> Callable:
    """``fn`` as a Numba function with this module's options (``options`` add or override, e.g.
    ``error_model``); the plain function where Numba is missing (never called then)."""
    if numba is None:
        return fn
    options = {"nogil": True, "fastmath": FAST, "boundscheck": False, **options}
    try:
        return numba.njit(cache=CACHE, **options)(fn)
    except RuntimeError:  # no writable place for Numba's cache (a read-only install): compile per process
        return numba.njit(**options)(fn)


def _kernel(fn: Callable) -> Callable:
    """``fn`` compiled with this module's options (``compiled``)."""
    return compiled(fn)


def inlined(fn: Callable) -> Callable:
    """``fn`` inlined into its callers by Numba (in its IR, before LLVM): the loops in a row
    function called as a function of its own ran several times slower than written out in the caller."""
    return numba.njit(inline="always", fastmath=FAST, boundscheck=False)(fn) if numba else fn


def bind(kernel: Callable, *args: Any) -> Callable[..., None]:
    """``kernel`` compiled for these arguments' types (from the on-disk cache where Numba has it),
    as its machine-code entry point: calling it skips the dispatcher's type checks."""
    signature = tuple(numba.typeof(a) for a in args)
    kernel.compile(signature)
    return kernel.overloads[signature].entry_point


# -- depthwise convolution --------------------------------------------------------------------
# x [C, H, W], w [C, KH, KW], bias [C], out [C, OH, OW], all float32; then the kernel's two
# scratch arrays (``depthwise_kernel`` gives the shapes: allocated zeroed once per thread when the
# execution is created, never in a run; the loops write only where input lands, so the zero border
# stays; a kernel that needs one ignores the other); the geometry (sh, sw, dh, dw); pt, pl: top
# and left padding (bottom and right follow from the output size); lo, hi: the clamp. One
# signature for all of them (SWISH_KERNELS take a hard-swish flag after it), so that one
# parallel region (``cpu_parallel.depthwise_spans``) runs any of them. Each channel's zero-bordered
# plane (or, channels innermost, a block of channels') is built in the scratch (in L1/L2), then
# every output row is computed whole from it; ``depthwise_masked`` and ``depthwise_bands`` read
# the rows in place instead.

@inlined
def _tap_tables(w, row_step, column_step):
    """Per-call tables for ``row_taps``: each tap's offset from an output row's first read, for
    rows ``row_step`` floats apart and columns ``column_step`` (dilations folded into the steps),
    and a row for a channel's weights (``_channel_weights``)."""
    kh, kw = w.shape[1], w.shape[2]
    offsets = np.empty(kh * kw, np.int64)
    for ky in range(kh):
        for kx in range(kw):
            offsets[ky * kw + kx] = ky * row_step + kx * column_step
    return offsets, np.empty(kh * kw, np.float32)


@inlined
def _channel_weights(w, c, weights):
    """Channel c's weights as one row, taps in row-major order."""
    kw = w.shape[2]
    for ky in range(w.shape[1]):
        for kx in range(kw):
            weights[ky * kw + kx] = w[c, ky, kx]


@inlined
def _into_plane(channel, plane, pt, pl):
    """A channel [H, W] copied into its zero-bordered plane at (pt, pl)."""
    w = channel.shape[1]
    for iy in range(channel.shape[0]):
        copy_row(plane[iy + pt, pl:pl + w], channel[iy])


def _tap_row(width: int, stride: int):
    """``tap_row(dst, n, src, offsets, weights, taps, bias, lo, hi)`` as a Numba intrinsic (LLVM
    IR; addresses as integers, ``offsets`` int64 counts of floats): dst[i] = clamp(bias + sum
    over t < taps of weights[t] * src[offsets[t] + i stride]) to [lo, hi] for i < n, ``width``
    outputs at a time with their sums in a vector register across the taps; the last ``width``
    end at n (recomputing a few, so ``dst`` must not overlap ``src``); n >= ``width``. At stride
    2 a tap loads 2 ``width`` floats and keeps the even ones (one float past its last read). A
    clamp passes NaN.
    LLVM leaves Numba's loops over rows shorter than its vector width times its interleave
    (64 floats on AVX-512) scalar, and they are most of a small plane's rows."""
    @intrinsic
    def kernel(typingctx, dst_address, n, src_address, offsets_address, weights_address, taps, bias, lo, hi):
        def codegen(context, builder, signature, args):
            f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
            vector = ir.VectorType(f32, width)
            dst, src, weights = (builder.inttoptr(args[i], f32.as_pointer()) for i in (0, 2, 4))
            n, offsets, taps = args[1], builder.inttoptr(args[3], i64.as_pointer()), args[5]
            zeros = ir.Constant(ir.VectorType(i32, width), [0] * width)

            def splat(scalar):
                one = builder.insert_element(ir.Constant(vector, ir.Undefined), scalar, ir.Constant(i32, 0))
                return builder.shuffle_vector(one, ir.Constant(vector, ir.Undefined), zeros)
            bias, lo, hi = splat(args[6]), splat(args[7]), splat(args[8])
            last = builder.sub(n, ir.Constant(i64, width))
            wide = ir.VectorType(f32, width * stride)
            evens = ir.Constant(ir.VectorType(i32, width), [lane * stride for lane in range(width)])
            entry = builder.block
            block, taps_loop, stored, done = (builder.append_basic_block(f"row.{name}")
                                              for name in ("block", "taps", "stored", "done"))
            builder.branch(block)

            builder.position_at_end(block)
            start = builder.phi(i64)
            start.add_incoming(ir.Constant(i64, 0), entry)
            at = builder.select(builder.icmp_signed("<", start, last), start, last)
            at_src = builder.gep(src, [builder.mul(at, ir.Constant(i64, stride))])
            builder.branch(taps_loop)

            builder.position_at_end(taps_loop)
            tap, total = builder.phi(i64), builder.phi(vector)
            tap.add_incoming(ir.Constant(i64, 0), block)
            total.add_incoming(bias, block)
            offset = builder.load(builder.gep(offsets, [tap]), align=8)
            values = builder.load(builder.bitcast(builder.gep(at_src, [offset]), wide.as_pointer()), align=4)
            if stride > 1:
                values = builder.shuffle_vector(values, ir.Constant(wide, ir.Undefined), evens)
            weight = splat(builder.load(builder.gep(weights, [tap]), align=4))
            # contract only: LLVM fuses the pair into an FMA where the host has one
            updated = builder.fadd(total, builder.fmul(weight, values, flags=("contract",)), flags=("contract",))
            following = builder.add(tap, ir.Constant(i64, 1))
            tap.add_incoming(following, taps_loop)
            total.add_incoming(updated, taps_loop)
            builder.cbranch(builder.icmp_signed("<", following, taps), taps_loop, stored)

            builder.position_at_end(stored)
            clamped = builder.select(builder.fcmp_ordered("<", updated, lo), lo, updated)
            clamped = builder.select(builder.fcmp_ordered(">", clamped, hi), hi, clamped)
            builder.store(clamped, builder.bitcast(builder.gep(dst, [at]), vector.as_pointer()), align=4)
            start.add_incoming(builder.add(at, ir.Constant(i64, width)), stored)
            builder.cbranch(builder.icmp_signed("<", at, last), block, done)

            builder.position_at_end(done)
            return context.get_dummy_value()
        return types.void(*[types.intp] * 6, types.float32, types.float32, types.float32), codegen
    return kernel


#: The vector widths ``row_taps`` runs a row at: the widest that fits the row
TAP_ROW_WIDTHS = (16, 8)
if numba is not None:
    _tap_row16, _tap_row8, _tap_row16_s2, _tap_row8_s2 = (_tap_row(width, stride) for stride in (1, 2)
                                                          for width in TAP_ROW_WIDTHS)


@inlined
def row_taps(dst, src, offsets, weights, taps, bias, lo, hi, stride):
    """dst[i] = clamp(bias + sum over t < taps of weights[t] * src[offsets[t] + i stride]) to
    [lo, hi] for i < dst.shape[0], where ``src`` holds every tap's reads (float32; ``offsets``
    int64; ``stride`` 1 or 2, and at 2 one float more after the last read): ``_tap_row``'s
    vectors where the row is 8 or more long, a scalar loop below."""
    n = dst.shape[0]
    d, a, o, g = dst.ctypes.data, src.ctypes.data, offsets.ctypes.data, weights.ctypes.data
    if n >= 16 and stride == 1:
        _tap_row16(d, n, a, o, g, taps, bias, lo, hi)
    elif n >= 16:
        _tap_row16_s2(d, n, a, o, g, taps, bias, lo, hi)
    elif n >= 8 and stride == 1:
        _tap_row8(d, n, a, o, g, taps, bias, lo, hi)
    elif n >= 8:
        _tap_row8_s2(d, n, a, o, g, taps, bias, lo, hi)
    else:
        for i in range(n):
            v = bias
            for t in range(taps):
                v += weights[t] * src[offsets[t] + i * stride]
            dst[i] = min(max(v, lo), hi)


#: ``copy_row``'s one tap: a copy is a row of taps of weight 1 added to -0.0, exact for every
#: value and sign of zero
_COPY_OFFSETS, _COPY_WEIGHTS = np.zeros(1, np.int64), np.ones(1, np.float32)
_NEGATIVE_ZERO, _INF = np.float32(-0.0), np.float32(np.inf)


@inlined
def copy_row(dst, src):
    """dst[:] = src[:dst.shape[0]] in vectors (``row_taps``): Numba's loop over a row shorter
    than LLVM's vector width times its interleave copied it an element at a time."""
    row_taps(dst, src, _COPY_OFFSETS, _COPY_WEIGHTS, 1, _NEGATIVE_ZERO, -_INF, _INF, 1)


@_kernel
def depthwise3x3_s1_flat(x, w, bias, out, plane, acc, geometry, pt, pl, lo, hi):
    """Stride 1 on a small plane: the zero-bordered plane is one flat row, and so is the output
    at the plane's width (two columns of each row computed and dropped), copied out after: one
    row of taps per channel instead of one per output row; slower where the plane is not in L1
    (measured: bench/RESULTS.md)."""
    oh, ow = out.shape[1], out.shape[2]
    width = plane.shape[1]
    flat = plane.reshape(plane.size)
    offsets, weights = _tap_tables(w, width, 1)
    for c in range(x.shape[0]):
        _into_plane(x[c], plane, pt, pl)
        _channel_weights(w, c, weights)
        row_taps(acc, flat, offsets, weights, 9, bias[c], lo, hi, 1)
        for oy in range(oh):
            src, dst = acc[oy * width:], out[c, oy]
            for ox in range(ow):
                dst[ox] = src[ox]


@_kernel
def depthwise_any(x, w, bias, out, plane, acc, geometry, pt, pl, lo, hi):
    """Any kernel size, stride and dilation: a tap at a time into a row accumulator."""
    kh, kw = w.shape[1], w.shape[2]
    sh, sw, dh, dw = geometry
    for c in range(x.shape[0]):
        _into_plane(x[c], plane, pt, pl)
        for oy in range(out.shape[1]):
            acc[:] = bias[c]
            for ky in range(kh):
                row = plane[oy * sh + ky * dh]
                for kx in range(kw):
                    tap = w[c, ky, kx]
                    shifted = row[kx * dw:]
                    for ox in range(acc.shape[0]):
                        acc[ox] += tap * shifted[ox * sw]
            o = out[c, oy]
            for ox in range(acc.shape[0]):
                o[ox] = min(max(acc[ox], lo), hi)


@_kernel
def depthwise_rows(x, w, bias, out, plane, acc, geometry, pt, pl, lo, hi):
    """Any kernel size, row stride and dilation, a column stride of 1 or 2 (3x3, 5x5, 1-D): each
    output row a row of taps (``row_taps``) over the zero-bordered plane's rows; at column
    stride 2 the plane is a column wider than the windows read."""
    kh, kw = w.shape[1], w.shape[2]
    sh, sw, dh, dw = geometry
    width = plane.shape[1]
    flat = plane.reshape(plane.size)
    offsets, weights = _tap_tables(w, dh * width, dw)
    for c in range(x.shape[0]):
        _into_plane(x[c], plane, pt, pl)
        _channel_weights(w, c, weights)
        for oy in range(out.shape[1]):
            row_taps(out[c, oy], flat[oy * sh * width:], offsets, weights, kh * kw, bias[c], lo, hi, sw)


#: Channels a lane block of ``depthwise_channels_last`` holds: ``lane_taps``' vector of sums
LANES = 16


def _lane_taps(pixels: int):
    """``lane_taps(src, step, offsets, weights, weight_step, taps, bias, acc)`` as a Numba
    intrinsic (LLVM IR; addresses as integers, steps and ``offsets`` int64 counts of floats): for
    each of ``pixels`` output pixels p, acc[p LANES:(p + 1) LANES] = bias[0:LANES] + the sum over
    t < taps of weights[t weight_step:... + LANES] * src[p step + offsets[t]:... + LANES], the sums
    held in vector registers across the taps. Numba's own loop over LANES kept them in memory,
    LLVM runs a loop of fewer elements than its vector width times its interleave scalar, and
    several pixels make independent multiply-add chains that share each weight load."""
    @intrinsic
    def kernel(typingctx, src_address, step, offsets_address, weights_address, weight_step, taps, bias_address,
               acc_address):
        def codegen(context, builder, signature, args):
            f32, i64 = ir.FloatType(), ir.IntType(64)
            vector = ir.VectorType(f32, LANES)
            src, weights, bias, acc = (builder.inttoptr(args[i], f32.as_pointer()) for i in (0, 3, 6, 7))
            step, offsets, weight_step, taps = args[1], builder.inttoptr(args[2], i64.as_pointer()), args[4], args[5]

            def at(base, index):
                return builder.bitcast(builder.gep(base, [index]), vector.as_pointer())
            start = builder.load(at(bias, ir.Constant(i64, 0)), align=4)
            pixel_srcs = [builder.gep(src, [builder.mul(step, ir.Constant(i64, p))]) for p in range(pixels)]
            entry = builder.block
            loop, done = builder.append_basic_block("taps.loop"), builder.append_basic_block("taps.done")
            builder.cbranch(builder.icmp_signed(">", taps, ir.Constant(i64, 0)), loop, done)

            builder.position_at_end(loop)
            tap = builder.phi(i64)
            totals = [builder.phi(vector) for _ in range(pixels)]
            tap.add_incoming(ir.Constant(i64, 0), entry)
            for total in totals:
                total.add_incoming(start, entry)
            offset = builder.load(builder.gep(offsets, [tap]), align=8)
            weight = builder.load(at(weights, builder.mul(tap, weight_step)), align=4)
            updated = []
            for total, pixel_src in zip(totals, pixel_srcs):
                values = builder.load(at(pixel_src, offset), align=4)
                # contract only: LLVM fuses the pair into an FMA where the host has one
                updated.append(builder.fadd(total, builder.fmul(weight, values, flags=("contract",)),
                                            flags=("contract",)))
            following = builder.add(tap, ir.Constant(i64, 1))
            tail = builder.block
            tap.add_incoming(following, tail)
            for total, u in zip(totals, updated):
                total.add_incoming(u, tail)
            builder.cbranch(builder.icmp_signed("<", following, taps), loop, done)

            builder.position_at_end(done)
            results = [builder.phi(vector) for _ in updated]  # every phi first, at the block's top
            for p, (result, u) in enumerate(zip(results, updated)):
                result.add_incoming(start, entry)
                result.add_incoming(u, tail)
                builder.store(result, at(acc, ir.Constant(i64, p * LANES)), align=4)
            return context.get_dummy_value()
        return types.void(*[types.intp] * 8), codegen
    return kernel


#: Output pixels ``depthwise_channels_last`` sums at once: independent chains to cover the
#: multiply-add's latency
LANE_PIXELS = 4
if numba is not None:
    lane_taps, lane_taps_one = _lane_taps(LANE_PIXELS), _lane_taps(1)


@_kernel
def depthwise_channels_last(x, w, bias, out, plane, acc, geometry, pt, pl, lo, hi):
    """Any kernel size, stride and dilation with the channels innermost, LANES at a time: each
    block of LANES channels copied into a zero-bordered [rows x columns, LANES] plane, then each
    output pixel's LANES sums run over the taps in vector registers (``lane_taps``, into ``acc``).
    ``w`` and ``bias`` are views of ``lane_table``'s rows, which run LANES floats past the last
    channel: the weights of a tap lie along the channels, read LANES at a time. A plane of a few
    pixels leaves a per-channel loop rows of a few elements, which run scalar."""
    cs, h, wd = x.shape[0], x.shape[1], x.shape[2]
    kh, kw = w.shape[1], w.shape[2]
    oh, ow = out.shape[1], out.shape[2]
    sh, sw, dh, dw = geometry
    taps = kh * kw
    weight_step = w.strides[2] // 4
    width = max(wd + pl, (ow - 1) * sw + (kw - 1) * dw + 1)  # the plane's columns, as ``depthwise_kernel`` sizes it
    offsets = np.empty(taps, np.int64)
    for ky in range(kh):
        for kx in range(kw):
            offsets[ky * kw + kx] = (ky * dh * width + kx * dw) * LANES
    for c0 in range(0, cs, LANES):
        n = min(LANES, cs - c0)  # lanes past n hold a previous block's values: computed, never stored
        for lane in range(n):
            for iy in range(h):
                src = x[c0 + lane, iy]
                for ix in range(wd):
                    plane[(iy + pt) * width + ix + pl, lane] = src[ix]
        weights, biases = w.ctypes.data + c0 * w.strides[0], bias.ctypes.data + 4 * c0
        for oy in range(oh):
            for ox0 in range(0, ow, LANE_PIXELS):
                count = min(LANE_PIXELS, ow - ox0)
                src = plane.ctypes.data + 4 * (oy * sh * width + ox0 * sw) * LANES
                if count == LANE_PIXELS:
                    lane_taps(src, sw * LANES, offsets.ctypes.data, weights, weight_step, taps, biases, acc.ctypes.data)
                else:
                    for p in range(count):
                        lane_taps_one(src + 4 * p * sw * LANES, 0, offsets.ctypes.data, weights, weight_step, taps,
                                      biases, acc.ctypes.data + 4 * p * LANES)
                for p in range(count):
                    for lane in range(n):
                        out[c0 + lane, oy, ox0 + p] = min(max(acc[p * LANES + lane], lo), hi)


def lane_table(weight: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``depthwise_channels_last``'s weights and bias: a table [taps + 1, C + LANES] (each tap's
    weights along the channels, then the bias, zeros past channel C), and the views of it the
    kernel takes in place of w [C, KH, KW] and bias [C]."""
    c, kh, kw = weight.shape
    table = np.zeros((kh * kw + 1, c + LANES), np.float32)
    row = table.shape[1] * 4
    weights = np.lib.stride_tricks.as_strided(table, shape=(c, kh, kw), strides=(4, kw * row, row))
    fill_lane_table(table, weight, bias)
    return table, weights, table[kh * kw, :c]


def fill_lane_table(table: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> None:
    """``weight`` [C, KH, KW] and ``bias`` [C] into ``lane_table``'s table."""
    c = weight.shape[0]
    table[:-1, :c] = weight.reshape(c, -1).T
    table[-1, :c] = bias


# -- depthwise rows read in place under lane masks ------------------------------------------------

#: Output columns ``masked_row`` computes at once: a vector of sums per channel
MASKED_LANES = 16
#: Channels ``depthwise_masked`` sums at once (independent multiply-add chains that cover the
#: multiply-add's latency and share each mask), then fewer for the last ones
MASKED_CHAINS = (8, 4, 1)


def clamped_ir(builder, value, lo, hi):
    """LLVM IR: ``value`` clamped to [lo, hi] lane by lane, a NaN kept (as NumPy's clip keeps it)."""
    value = builder.select(builder.fcmp_ordered("<", value, lo), lo, value)
    return builder.select(builder.fcmp_ordered(">", value, hi), hi, value)


def hard_swish_ir(builder, value):
    """LLVM IR: value * clamp(value / 6 + 1/2, 0, 1) lane by lane, as ``cpu_activations.hard_swish_value``."""
    def constant(number):
        return ir.Constant(value.type, [number] * value.type.count)
    gate = builder.fadd(builder.fmul(value, constant(1.0 / 6.0)), constant(0.5))
    return builder.fmul(value, clamped_ir(builder, gate, constant(0.0), constant(1.0)))


def _masked_memory(builder, name, vector, arguments):
    """A call of LLVM's ``llvm.masked.load`` or ``llvm.masked.store`` on ``vector``: lanes off
    the mask are neither read (a load gives the pass-through value) nor written, so a row's reads
    may start before the input and run past it. The LLVM 22 that llvmlite is built on here takes
    no alignment argument; earlier releases take one after the pointer."""
    i1 = ir.IntType(1)
    mask = ir.VectorType(i1, vector.count)
    pointer = vector.as_pointer()
    if name == "load":
        signature = [pointer, mask, vector]
        returns = vector
    else:
        signature = [vector, pointer, mask]
        returns = ir.VoidType()
    if _LLVM_VERSION[0] < 22:
        signature.insert(1 if name == "load" else 2, ir.IntType(32))
        arguments = list(arguments)
        arguments.insert(1 if name == "load" else 2, ir.Constant(ir.IntType(32), 4))
    suffix = f"v{vector.count}f32.p0" if _LLVM_VERSION[0] >= 15 else f"v{vector.count}f32.p0v{vector.count}f32"
    full = f"llvm.masked.{name}.{suffix}"
    module = builder.module
    function = module.globals.get(full) or ir.Function(module, ir.FunctionType(returns, signature), full)
    return builder.call(function, arguments)


def _masked_row(chains: int, stride: int, shared: bool):
    """``masked_row(dst, dst_step, src, src_step, rows, row_step, kw, dw, col0, width, count,
    weights, weight_step, bias, lo, hi, flags)`` as a Numba intrinsic (LLVM IR; addresses as
    integers, steps in floats): for each of ``chains`` output rows k (``dst``, ``weights`` and
    ``bias`` each a step further on; ``src`` too, unless ``shared``: then every chain reads the
    same input rows, loaded once), dst[i] for i < count (<= MASKED_LANES) = start + sum over
    r < rows, kx < kw of weights[r kw + kx] * src[r row_step + col0 + kx dw + i stride], where
    start is bias[0], or dst[i] itself where ``flags`` has MASKED_ADD; where it has MASKED_FINISH,
    clamped to [lo, hi] before the store, and hard-swished where it has MASKED_SWISH. Each tap
    reads the row where it lies under a mask of the columns inside [0, width): the zero padding
    is the masked lanes, so no zero-bordered plane is copied. The sums stay in vector registers
    across the taps, ``chains`` independent multiply-add chains."""
    lanes = MASKED_LANES

    @intrinsic
    def kernel(typingctx, dst_address, dst_step, src_address, src_step, rows, row_step, kw, dw, col0, width, count,
               weights_address, weight_step, bias_address, lo, hi, flags):
        def codegen(context, builder, signature, args):
            f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
            vector, wide = ir.VectorType(f32, lanes), ir.VectorType(f32, lanes * stride)
            (dst, src, weights, bias) = (builder.inttoptr(args[i], f32.as_pointer()) for i in (0, 2, 11, 13))
            dst_step, src_step, rows, row_step, kw, dw = (args[i] for i in (1, 3, 4, 5, 6, 7))
            col0, width, count, weight_step, flags = (args[i] for i in (8, 9, 10, 12, 16))

            def splat(scalar, of):
                one = builder.insert_element(ir.Constant(of, ir.Undefined), scalar, ir.Constant(i32, 0))
                return builder.shuffle_vector(one, ir.Constant(of, ir.Undefined),
                                              ir.Constant(ir.VectorType(i32, of.count), [0] * of.count))

            def flag(bit):
                return builder.icmp_signed("!=", builder.and_(flags, ir.Constant(i64, bit)), ir.Constant(i64, 0))
            index_vector = ir.VectorType(i32, lanes * stride)
            iota = ir.Constant(index_vector, list(range(lanes * stride)))
            width32 = splat(builder.trunc(width, i32), index_vector)
            reads = splat(builder.trunc(builder.mul(count, ir.Constant(i64, stride)), i32), index_vector)
            in_reads = builder.icmp_signed("<", iota, reads)
            evens = ir.Constant(ir.VectorType(i32, lanes), [lane * stride for lane in range(lanes)])
            zero_wide = ir.Constant(wide, [0.0] * (lanes * stride))
            out_lanes = ir.VectorType(i32, lanes)
            store_mask = builder.icmp_signed("<", ir.Constant(out_lanes, list(range(lanes))),
                                             splat(builder.trunc(count, i32), out_lanes))
            outputs = [builder.bitcast(builder.gep(dst, [builder.mul(dst_step, ir.Constant(i64, k))]),
                                       vector.as_pointer()) for k in range(chains)]
            adding = flag(MASKED_ADD)
            starts = []
            for k in range(chains):
                biased = splat(builder.load(builder.gep(bias, [ir.Constant(i64, k)]), align=4), vector)
                # the partial sums of an earlier call; masked: lanes past count may lie past the output
                partial = _masked_memory(builder, "load", vector, [outputs[k], store_mask,
                                                                   ir.Constant(vector, [0.0] * lanes)])
                starts.append(builder.select(adding, partial, biased))

            entry = builder.block
            row_loop, tap_loop, row_end, done = (builder.append_basic_block(f"masked.{name}")
                                                 for name in ("row", "tap", "row_end", "done"))
            builder.cbranch(builder.icmp_signed(">", rows, ir.Constant(i64, 0)), row_loop, done)

            builder.position_at_end(row_loop)
            r = builder.phi(i64)
            row_totals = [builder.phi(vector) for _ in range(chains)]
            r.add_incoming(ir.Constant(i64, 0), entry)
            for total, start in zip(row_totals, starts):
                total.add_incoming(start, entry)
            row_src = builder.gep(src, [builder.mul(r, row_step)])
            row_weights = builder.gep(weights, [builder.mul(r, kw)])
            builder.branch(tap_loop)

            builder.position_at_end(tap_loop)
            kx = builder.phi(i64)
            totals = [builder.phi(vector) for _ in range(chains)]
            kx.add_incoming(ir.Constant(i64, 0), row_loop)
            for total, row_total in zip(totals, row_totals):
                total.add_incoming(row_total, row_loop)
            column = builder.add(col0, builder.mul(kx, dw))
            columns = builder.add(iota, splat(builder.trunc(column, i32), index_vector))
            inside = builder.and_(builder.icmp_signed(">=", columns, ir.Constant(index_vector, [0] * (lanes * stride))),
                                  builder.icmp_signed("<", columns, width32))
            mask = builder.and_(inside, in_reads)

            def tap_values(k):
                at = builder.gep(row_src, [builder.add(builder.mul(src_step, ir.Constant(i64, k)), column)])
                values = _masked_memory(builder, "load", wide, [builder.bitcast(at, wide.as_pointer()), mask,
                                                                zero_wide])
                if stride > 1:
                    values = builder.shuffle_vector(values, ir.Constant(wide, ir.Undefined), evens)
                return values
            values = tap_values(0) if shared else None
            updated = []
            for k, total in enumerate(totals):
                tap_weight = builder.load(builder.gep(row_weights, [builder.add(
                    builder.mul(weight_step, ir.Constant(i64, k)), kx)]), align=4)
                # contract only: LLVM fuses the pair into an FMA where the host has one
                product = builder.fmul(splat(tap_weight, vector), values if shared else tap_values(k),
                                       flags=("contract",))
                updated.append(builder.fadd(total, product, flags=("contract",)))
            following = builder.add(kx, ir.Constant(i64, 1))
            kx.add_incoming(following, tap_loop)
            for total, u in zip(totals, updated):
                total.add_incoming(u, tap_loop)
            builder.cbranch(builder.icmp_signed("<", following, kw), tap_loop, row_end)

            builder.position_at_end(row_end)
            next_r = builder.add(r, ir.Constant(i64, 1))
            r.add_incoming(next_r, row_end)
            for total, u in zip(row_totals, updated):
                total.add_incoming(u, row_end)
            builder.cbranch(builder.icmp_signed("<", next_r, rows), row_loop, done)

            builder.position_at_end(done)
            results = [builder.phi(vector) for _ in range(chains)]
            for result, start, u in zip(results, starts, updated):
                result.add_incoming(start, entry)
                result.add_incoming(u, row_end)
            lo_v, hi_v = splat(args[14], vector), splat(args[15], vector)
            finishing, swishing = flag(MASKED_FINISH), flag(MASKED_SWISH)
            for result, output in zip(results, outputs):
                value = clamped_ir(builder, result, lo_v, hi_v)
                value = builder.select(swishing, hard_swish_ir(builder, value), value)
                _masked_memory(builder, "store", vector, [builder.select(finishing, value, result), output,
                                                          store_mask])
            return context.get_dummy_value()
        return types.void(*[types.intp] * 14, types.float32, types.float32, types.intp), codegen
    return kernel


#: ``masked_row``'s flags: start from the output's partial sums (not the bias); clamp (the last
#: call on them); and hard-swish after the clamp
MASKED_ADD, MASKED_FINISH, MASKED_SWISH = 1, 2, 4
#: Output channels ``conv_masked`` sums at once, reading each input row once for all of them
SHARED_CHAINS = (16, 8, 4, 1)
if numba is not None:
    _masked_rows = {(chains, stride, False): _masked_row(chains, stride, False)
                    for stride in (1, 2) for chains in MASKED_CHAINS}
    _masked_rows.update({(chains, stride, True): _masked_row(chains, stride, True)
                         for stride in (1, 2) for chains in SHARED_CHAINS})
    (_masked8, _masked4, _masked1, _masked8_s2, _masked4_s2, _masked1_s2) = (
        _masked_rows[(chains, stride, False)] for stride in (1, 2) for chains in MASKED_CHAINS)
    (_shared16, _shared8, _shared4, _shared1, _shared16_s2, _shared8_s2, _shared4_s2, _shared1_s2) = (
        _masked_rows[(chains, stride, True)] for stride in (1, 2) for chains in SHARED_CHAINS)


@inlined
def masked_row(chains, stride, shared, dst, dst_step, src, src_step, rows, row_step, kw, dw, col0, width, count,
               weights, weight_step, bias, lo, hi, flags):
    """``_masked_row`` for ``chains`` (one of MASKED_CHAINS, or of SHARED_CHAINS where
    ``shared``) output rows at column ``stride`` 1 or 2."""
    if shared:
        if stride == 1:
            if chains == 16:
                _shared16(dst, dst_step, src, src_step, rows, row_step, kw, dw, col0, width, count, weights,
                          weight_step, bias, lo, hi, flags)
            elif chains == 8:
                _shared8(dst, dst_step, src, src_step, rows, row_step, kw, dw, col0, width, count, weights,
                         weight_step, bias, lo, hi, flags)
            elif chains == 4:
                _shared4(dst, dst_step, src, src_step, rows, row_step, kw, dw, col0, width, count, weights,
                         weight_step, bias, lo, hi, flags)
            else:
                _shared1(dst, dst_step, src, src_step, rows, row_step, kw, dw, col0, width, count, weights,
                         weight_step, bias, lo, hi, flags)
        elif chains == 16:
            _shared16_s2(dst, dst_step, src, src_step, rows, row_step, kw, dw, col0, width, count, weights,
                         weight_step, bias, lo, hi, flags)
        elif chains == 8:
            _shared8_s2(dst, dst_step, src, src_step, rows, row_step, kw, dw, col0, width, count, weights,
                        weight_step, bias, lo, hi, flags)
        elif chains == 4:
            _shared4_s2(dst, dst_step, src, src_step, rows, row_step, kw, dw, col0, width, count, weights,
                        weight_step, bias, lo, hi, flags)
        else:
            _shared1_s2(dst, dst_step, src, src_step, rows, row_step, kw, dw, col0, width, count, weights,
                        weight_step, bias, lo, hi, flags)
    elif stride == 1:
        if chains == 8:
            _masked8(dst, dst_step, src, src_step, rows, row_step, kw, dw, col0, width, count, weights,
                     weight_step, bias, lo, hi, flags)
        elif chains == 4:
            _masked4(dst, dst_step, src, src_step, rows, row_step, kw, dw, col0, width, count, weights,
                     weight_step, bias, lo, hi, flags)
        else:
            _masked1(dst, dst_step, src, src_step, rows, row_step, kw, dw, col0, width, count, weights,
                     weight_step, bias, lo, hi, flags)
    elif chains == 8:
        _masked8_s2(dst, dst_step, src, src_step, rows, row_step, kw, dw, col0, width, count, weights,
                    weight_step, bias, lo, hi, flags)
    elif chains == 4:
        _masked4_s2(dst, dst_step, src, src_step, rows, row_step, kw, dw, col0, width, count, weights,
                    weight_step, bias, lo, hi, flags)
    else:
        _masked1_s2(dst, dst_step, src, src_step, rows, row_step, kw, dw, col0, width, count, weights,
                    weight_step, bias, lo, hi, flags)


@inlined
def _masked_chains(left, shared):
    """The most chains ``masked_row`` takes at once that ``left`` channels fill."""
    if shared and left >= 16:
        return 16
    return 8 if left >= 8 else 4 if left >= 4 else 1


@_kernel
def depthwise_masked(x, w, bias, out, plane, acc, geometry, pt, pl, lo, hi, swish):
    """Any kernel size, row stride and dilation, a column stride of 1 or 2: each output row in
    blocks of MASKED_LANES columns, MASKED_CHAINS channels at a time, its taps read from ``x`` in
    place under lane masks (``masked_row``), the bias, clamp and (``swish``) hard-swish applied
    before the masked store. No zero-bordered plane (``plane`` and ``acc`` are unused): on small
    planes copying it in, and out for channels innermost, cost more than the taps."""
    cs = x.shape[0]
    c0 = 0
    while c0 < cs:
        chains = _masked_chains(cs - c0, False)
        _masked_channel_rows(x[c0:c0 + chains], w[c0:c0 + chains], bias[c0:c0 + chains], out[c0:c0 + chains],
                             geometry, pt, pl, lo, hi, MASKED_FINISH | (MASKED_SWISH if swish else 0), chains, False,
                             0, out.shape[1])
        c0 += chains


@inlined
def _masked_channel_rows(x, w, bias, out, geometry, pt, pl, lo, hi, flags, chains, shared, oy0, oy1):
    """Output rows [oy0, oy1) of ``chains`` output channels (``masked_row``): ``w`` [chains, KH,
    KW] over x's channel k (not ``shared``) or over the one plane ``x`` [1, H, W] (``shared``)."""
    h, wd = x.shape[1], x.shape[2]
    kh, kw = w.shape[1], w.shape[2]
    ow = out.shape[2]
    sh, sw, dh, dw = geometry
    x_channel, x_row = (0 if shared else x.strides[0] // 4), x.strides[1] // 4
    out_channel, out_row = out.strides[0] // 4, out.strides[1] // 4
    w_channel = w.strides[0] // 4
    for oy in range(oy0, oy1):
        iy0 = oy * sh - pt
        ky0 = 0 if iy0 >= 0 else (-iy0 + dh - 1) // dh
        ky1 = min(kh, (h - 1 - iy0) // dh + 1) if h - 1 - iy0 >= 0 else 0
        rows = ky1 - ky0 if ky1 > ky0 else 0
        first = iy0 + ky0 * dh if rows > 0 else 0
        src = x.ctypes.data + 4 * first * x_row
        weights = w.ctypes.data + 4 * ky0 * kw
        for ox0 in range(0, ow, MASKED_LANES):
            count = min(MASKED_LANES, ow - ox0)
            dst = out.ctypes.data + 4 * (oy * out_row + ox0)
            masked_row(chains, sw, shared, dst, out_channel, src, x_channel, rows, dh * x_row, kw, dw, ox0 * sw - pl,
                       wd, count, weights, w_channel, bias.ctypes.data, lo, hi, flags)


@_kernel
def conv_masked(x, w, bias, out, geometry, pt, pl, lo, hi, swish, oy0, oy1):
    """A convolution over few input channels (a network's stem: 3 channels of an image): output
    rows [oy0, oy1) of ``out`` [OC, OH, OW], ``w`` [OC, C, KH, KW] contiguous, SHARED_CHAINS output
    channels at a time summing each input channel's taps (``masked_row``, each row it reads loaded
    once for all of them and read in place under lane masks), then the next input channel onto
    the partial sums; the bias first, the clamp and (``swish``) hard-swish with the last."""
    oc, c = out.shape[0], x.shape[0]
    o0 = 0
    while o0 < oc:
        chains = _masked_chains(oc - o0, True)
        for ci in range(c):
            flags = (MASKED_ADD if ci > 0 else 0) | (
                MASKED_FINISH | (MASKED_SWISH if swish else 0) if ci == c - 1 else 0)
            _masked_channel_rows(x[ci:ci + 1], w[o0:o0 + chains, ci], bias[o0:o0 + chains], out[o0:o0 + chains],
                                 geometry, pt, pl, lo, hi, flags, chains, True, oy0, oy1)
        o0 += chains


# -- depthwise bands: several output rows per pass over the input rows ----------------------------

#: Output rows ``depthwise_bands`` computes at once (a band): each input row's taps are loaded once
#: for every row of the band that reads them
BAND_ROWS = 3
#: Channels ``depthwise_bands`` sums at once, then one at a time for the last ones
BAND_CHAINS = (4, 1)


def _band_rows(chains: int, rows: int, stride: int, lanes: int):
    """``band_rows(dst, dst_channel, dst_row, src, src_channel, src_row, iy0, iy1, r0, sh, kh, kw,
    col0, width, count, weights, weight_channel, bias, lo, hi, swish)`` as a Numba intrinsic (LLVM
    IR; addresses as integers, steps in floats): ``rows`` output rows of ``chains`` channels, each
    output row oy (< rows) of channel k dst[k dst_channel + oy dst_row + i] for i < count (<=
    ``lanes``) = clamp(bias[k] + the sum over input rows iy in [iy0, iy1) with ky = iy - r0 - oy
    sh in [0, kh), and kx < kw, of weights[k weight_channel + ky kw + kx] * src[k src_channel + iy
    src_row + col0 + kx + i stride]) to [lo, hi], hard-swished where ``swish``. Each input row's
    tap is loaded once, under a mask of the columns inside [0, width) (the zero padding), for every
    output row of the band that reads it; the rows x chains sums stay in vector registers."""

    @intrinsic
    def kernel(typingctx, dst_address, dst_channel, dst_row, src_address, src_channel, src_row, iy0, iy1, r0, sh,
               kh, kw, col0, width, count, weights_address, weight_channel, bias_address, lo, hi, swish):
        def codegen(context, builder, signature, args):
            f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
            vector, wide = ir.VectorType(f32, lanes), ir.VectorType(f32, lanes * stride)
            dst, src, weights, bias = (builder.inttoptr(args[i], f32.as_pointer()) for i in (0, 3, 15, 17))
            dst_channel, dst_row, src_channel, src_row, iy0, iy1, r0, sh, kh, kw = args[1:3] + args[4:12]
            col0, width, count, weight_channel, swish = args[12], args[13], args[14], args[16], args[20]

            def constant(value):
                return ir.Constant(i64, value)

            def splat(scalar, of):
                one = builder.insert_element(ir.Constant(of, ir.Undefined), scalar, ir.Constant(i32, 0))
                return builder.shuffle_vector(one, ir.Constant(of, ir.Undefined),
                                              ir.Constant(ir.VectorType(i32, of.count), [0] * of.count))
            index_vector = ir.VectorType(i32, lanes * stride)
            iota = ir.Constant(index_vector, list(range(lanes * stride)))
            width32 = splat(builder.trunc(width, i32), index_vector)
            in_reads = builder.icmp_signed("<", iota, splat(builder.trunc(builder.mul(count, constant(stride)), i32),
                                                            index_vector))
            evens = ir.Constant(ir.VectorType(i32, lanes), [lane * stride for lane in range(lanes)])
            zero_wide = ir.Constant(wide, [0.0] * (lanes * stride))
            out_lanes = ir.VectorType(i32, lanes)
            store_mask = builder.icmp_signed("<", ir.Constant(out_lanes, list(range(lanes))),
                                             splat(builder.trunc(count, i32), out_lanes))
            channel_srcs = [builder.gep(src, [builder.mul(src_channel, constant(k))]) for k in range(chains)]
            channel_weights = [builder.gep(weights, [builder.mul(weight_channel, constant(k))]) for k in range(chains)]
            starts = [splat(builder.load(builder.gep(bias, [constant(k)]), align=4), vector) for k in range(chains)]

            entry = builder.block
            row_loop, tap_loop, row_end, done = (builder.append_basic_block(f"band.{name}")
                                                 for name in ("row", "tap", "row_end", "done"))
            builder.cbranch(builder.icmp_signed("<", iy0, iy1), row_loop, done)

            # the input row iy: which output rows of the band read it, and at which kernel row
            builder.position_at_end(row_loop)
            iy = builder.phi(i64)
            iy.add_incoming(iy0, entry)
            row_sums = [[builder.phi(vector) for _ in range(rows)] for _ in range(chains)]
            for k in range(chains):
                for oy in range(rows):
                    row_sums[k][oy].add_incoming(starts[k], entry)
            kys = [builder.sub(builder.sub(iy, r0), builder.mul(sh, constant(oy))) for oy in range(rows)]
            reads = [builder.and_(builder.icmp_signed(">=", ky, constant(0)), builder.icmp_signed("<", ky, kh))
                     for ky in kys]
            row_srcs = [builder.gep(s, [builder.add(builder.mul(iy, src_row), col0)]) for s in channel_srcs]
            tap_weights = [[builder.gep(w, [builder.mul(ky, kw)]) for ky in kys] for w in channel_weights]
            builder.branch(tap_loop)

            builder.position_at_end(tap_loop)
            kx = builder.phi(i64)
            kx.add_incoming(constant(0), row_loop)
            sums = [[builder.phi(vector) for _ in range(rows)] for _ in range(chains)]
            for k in range(chains):
                for oy in range(rows):
                    sums[k][oy].add_incoming(row_sums[k][oy], row_loop)
            columns = builder.add(iota, splat(builder.trunc(builder.add(col0, kx), i32), index_vector))
            inside = builder.and_(builder.icmp_signed(">=", columns, ir.Constant(index_vector, [0] * (lanes * stride))),
                                  builder.icmp_signed("<", columns, width32))
            mask = builder.and_(inside, in_reads)
            values = []
            for k in range(chains):
                at = builder.bitcast(builder.gep(row_srcs[k], [kx]), wide.as_pointer())
                loaded = _masked_memory(builder, "load", wide, [at, mask, zero_wide])
                if stride > 1:
                    loaded = builder.shuffle_vector(loaded, ir.Constant(wide, ir.Undefined), evens)
                values.append(loaded)
            updated = [list(s) for s in sums]
            for oy in range(rows):  # an output row the input row does not reach skips its multiply-adds
                before = builder.block
                taps, after = builder.append_basic_block(f"band.taps{oy}"), builder.append_basic_block(f"band.next{oy}")
                builder.cbranch(reads[oy], taps, after)
                builder.position_at_end(taps)
                added = []
                for k in range(chains):
                    weight = builder.load(builder.gep(tap_weights[k][oy], [kx]), align=4)
                    # contract only: LLVM fuses the pair into an FMA where the host has one
                    product = builder.fmul(splat(weight, vector), values[k], flags=("contract",))
                    added.append(builder.fadd(updated[k][oy], product, flags=("contract",)))
                builder.branch(after)
                builder.position_at_end(after)
                for k in range(chains):
                    merged = builder.phi(vector)
                    merged.add_incoming(updated[k][oy], before)
                    merged.add_incoming(added[k], taps)
                    updated[k][oy] = merged
            following = builder.add(kx, constant(1))
            tap_end = builder.block
            kx.add_incoming(following, tap_end)
            for k in range(chains):
                for oy in range(rows):
                    sums[k][oy].add_incoming(updated[k][oy], tap_end)
            builder.cbranch(builder.icmp_signed("<", following, kw), tap_loop, row_end)

            builder.position_at_end(row_end)
            next_iy = builder.add(iy, constant(1))
            iy.add_incoming(next_iy, row_end)
            for k in range(chains):
                for oy in range(rows):
                    row_sums[k][oy].add_incoming(updated[k][oy], row_end)
            builder.cbranch(builder.icmp_signed("<", next_iy, iy1), row_loop, done)

            builder.position_at_end(done)
            results = [[builder.phi(vector) for _ in range(rows)] for _ in range(chains)]  # every phi first
            lo_v, hi_v = splat(args[18], vector), splat(args[19], vector)
            swishing = builder.icmp_signed("!=", swish, constant(0))
            for k in range(chains):
                for oy in range(rows):
                    result = results[k][oy]
                    result.add_incoming(starts[k], entry)
                    result.add_incoming(updated[k][oy], row_end)
                    value = clamped_ir(builder, result, lo_v, hi_v)
                    value = builder.select(swishing, hard_swish_ir(builder, value), value)
                    at = builder.gep(dst, [builder.add(builder.mul(dst_channel, constant(k)),
                                                       builder.mul(dst_row, constant(oy)))])
                    _masked_memory(builder, "store", vector, [value, builder.bitcast(at, vector.as_pointer()),
                                                              store_mask])
            return context.get_dummy_value()
        return types.void(*[types.intp] * 18, types.float32, types.float32, types.intp), codegen
    return kernel


#: The vector widths of ``depthwise_bands``' column blocks: MASKED_LANES, and half of it for a block
#: of at most that many columns (a narrow row, or a row's last columns), where the wider vector
#: would leave most of its lanes idle
BAND_LANES = (MASKED_LANES, MASKED_LANES // 2)
#: Channels ``depthwise_bands`` sums at once where every row fits the narrower vectors: twice as
#: many sums of half the width in the registers, so that each call's fixed cost covers more
NARROW_CHAINS = 8
if numba is not None:
    (_band4x1, _band4x2, _band4x3, _band1x1, _band1x2, _band1x3,
     _band4x1_s2, _band4x2_s2, _band4x3_s2, _band1x1_s2, _band1x2_s2, _band1x3_s2,
     _half4x1, _half4x2, _half4x3, _half1x1, _half1x2, _half1x3,
     _half4x1_s2, _half4x2_s2, _half4x3_s2, _half1x1_s2, _half1x2_s2, _half1x3_s2) = (
        _band_rows(chains, rows, stride, lanes) for lanes in BAND_LANES for stride in (1, 2)
        for chains in BAND_CHAINS for rows in range(1, BAND_ROWS + 1))
    _half8x1, _half8x2, _half8x3, _half8x1_s2, _half8x2_s2, _half8x3_s2 = (
        _band_rows(NARROW_CHAINS, rows, stride, BAND_LANES[1]) for stride in (1, 2) for rows in range(1, BAND_ROWS + 1))


@inlined
def band_rows(chains, rows, stride, dst, dst_channel, dst_row, src, src_channel, src_row, iy0, iy1, r0, sh, kh, kw,
              col0, width, count, weights, weight_channel, bias, lo, hi, swish):
    """``_band_rows`` for ``chains`` (one of BAND_CHAINS) channels' ``rows`` (1 to BAND_ROWS)
    output rows at column ``stride`` 1 or 2, ``count`` columns: in vectors of BAND_LANES[1] lanes
    where they fit, else of BAND_LANES[0]."""
    a = (dst, dst_channel, dst_row, src, src_channel, src_row, iy0, iy1, r0, sh, kh, kw, col0, width, count,
         weights, weight_channel, bias, lo, hi, swish)
    if count <= BAND_LANES[1]:
        _half_band_rows(chains, rows, stride, a)
    elif stride == 1:
        if chains == 4:
            if rows == 3:
                _band4x3(*a)
            elif rows == 2:
                _band4x2(*a)
            else:
                _band4x1(*a)
        elif rows == 3:
            _band1x3(*a)
        elif rows == 2:
            _band1x2(*a)
        else:
            _band1x1(*a)
    elif chains == 4:
        if rows == 3:
            _band4x3_s2(*a)
        elif rows == 2:
            _band4x2_s2(*a)
        else:
            _band4x1_s2(*a)
    elif rows == 3:
        _band1x3_s2(*a)
    elif rows == 2:
        _band1x2_s2(*a)
    else:
        _band1x1_s2(*a)


@_kernel
def _half_band_rows(chains, rows, stride, a):
    """``band_rows``' vectors of BAND_LANES[1] lanes, on its arguments ``a``: a function of its own,
    so that LLVM lays out and allocates the registers of the wider vectors' loops without these."""
    if chains == NARROW_CHAINS:
        if stride == 1:
            if rows == 3:
                _half8x3(*a)
            elif rows == 2:
                _half8x2(*a)
            else:
                _half8x1(*a)
        elif rows == 3:
            _half8x3_s2(*a)
        elif rows == 2:
            _half8x2_s2(*a)
        else:
            _half8x1_s2(*a)
    elif stride == 1:
        if chains == 4:
            if rows == 3:
                _half4x3(*a)
            elif rows == 2:
                _half4x2(*a)
            else:
                _half4x1(*a)
        elif rows == 3:
            _half1x3(*a)
        elif rows == 2:
            _half1x2(*a)
        else:
            _half1x1(*a)
    elif chains == 4:
        if rows == 3:
            _half4x3_s2(*a)
        elif rows == 2:
            _half4x2_s2(*a)
        else:
            _half4x1_s2(*a)
    elif rows == 3:
        _half1x3_s2(*a)
    elif rows == 2:
        _half1x2_s2(*a)
    else:
        _half1x1_s2(*a)


@_kernel
def depthwise_bands(x, w, bias, out, plane, acc, geometry, pt, pl, lo, hi, swish):
    """Dilation 1, any kernel size and row stride, a column stride of 1 or 2: the output in bands of
    up to BAND_ROWS rows and MASKED_LANES columns, BAND_CHAINS channels at a time (``band_rows``),
    each input row's taps read in place under lane masks once for every row of the band, the bias,
    clamp and (``swish``) hard-swish applied before the masked store. ``plane`` and ``acc`` are
    unused. ``w`` [C, KH, KW] and ``bias`` contiguous."""
    cs, h, wd = x.shape[0], x.shape[1], x.shape[2]
    kh, kw = w.shape[1], w.shape[2]
    oh, ow = out.shape[1], out.shape[2]
    sh, sw = geometry[0], geometry[1]
    x_channel, x_row = x.strides[0] // 4, x.strides[1] // 4
    out_channel, out_row = out.strides[0] // 4, out.strides[1] // 4
    w_channel = kh * kw
    most = NARROW_CHAINS if ow <= BAND_LANES[1] else BAND_CHAINS[0]
    c0 = 0
    while c0 < cs:
        chains = most if cs - c0 >= most else BAND_CHAINS[0] if cs - c0 >= BAND_CHAINS[0] else 1
        src = x.ctypes.data + 4 * c0 * x_channel
        weights, biases = w.ctypes.data + 4 * c0 * w_channel, bias.ctypes.data + 4 * c0
        oy0 = 0
        while oy0 < oh:
            rows = min(BAND_ROWS, oh - oy0)
            r0 = oy0 * sh - pt
            iy0, iy1 = max(0, r0), min(h, r0 + (rows - 1) * sh + kh)
            for ox0 in range(0, ow, MASKED_LANES):
                count = min(MASKED_LANES, ow - ox0)
                dst = out.ctypes.data + 4 * ((c0 * out_channel) + oy0 * out_row + ox0)
                band_rows(chains, rows, sw, dst, out_channel, out_row, src, x_channel, x_row, iy0, iy1, r0, sh, kh, kw,
                          ox0 * sw - pl, wd, count, weights, w_channel, biases, lo, hi, swish)
            oy0 += rows
        c0 += chains


#: ``depthwise_channels_last`` takes kernels other than 3x3 on an output of at most this many
#: pixels (past it, ``depthwise_rows`` at a column stride of 1 or 2, else ``depthwise_any``),
#: unless its rows fill ``row_taps``' widest vector (a 1-D convolution's)
CHANNELS_LAST_MAX_PIXELS = 64
#: ``depthwise_masked`` takes kernels other than 3x3 whose output rows are at least this long and
#: at most MASKED_LANES (narrower rows leave most of its vector idle, channels innermost fill theirs)
MASKED_MIN_ROW = 6
#: ``depthwise_bands`` takes convolutions of dilation 1, a column stride of 1 or 2 and more than one
#: kernel row (a 1-D window's rows share no taps) whose output rows are at least this long (narrower
#: rows leave most of its vectors idle), on planes of any size
BANDS_MIN_ROW = MASKED_MIN_ROW
#: the depthwise kernels that take a hard-swish flag after ``hi`` (applied in their registers)
SWISH_KERNELS = (depthwise_masked, depthwise_bands)
#: a stride-1 plane of at most this many elements (it and the flat output: 32 KiB, an L1) runs
#: as one flat row (``depthwise3x3_s1_flat``)
FLAT_PLANE_MAX = 4096


def depthwise_kernel(op: A.Conv2D, masked: bool = True) -> tuple[Callable, list[tuple[int, ...]], tuple[int, int, int, int]]:
    """The depthwise kernel for this convolution's geometry, the shapes of the two per-thread
    scratch arrays it takes after ``out``, and its geometry argument (sh, sw, dh, dw)."""
    (h, w), (oh, ow), (kh, kw) = op.in_hw, op.out_hw, op.kernel
    (sh, sw), (dh, dw), (pt, pl) = op.strides, op.dilations, op.pads[:2]
    plane = (max(h + pt, (oh - 1) * sh + (kh - 1) * dh + 1), max(w + pl, (ow - 1) * sw + (kw - 1) * dw + 1))
    geometry, unused = (sh, sw, dh, dw), (1,)
    three = (kh, kw) == (3, 3) and op.dilations == (1, 1) and op.strides in ((1, 1), (2, 2))
    if masked and sw in (1, 2) and op.dilations == (1, 1) and kh > 1 and ow >= BANDS_MIN_ROW:
        return depthwise_bands, [(1, 1), unused], geometry
    if masked and sw in (1, 2) and not three and MASKED_MIN_ROW <= ow <= MASKED_LANES:
        return depthwise_masked, [(1, 1), unused], geometry
    if three and op.strides == (1, 1) and plane[0] * plane[1] <= FLAT_PLANE_MAX:
        return depthwise3x3_s1_flat, [plane, ((oh - 1) * plane[1] + ow,)], geometry
    if sw in (1, 2) and (three or oh * ow > CHANNELS_LAST_MAX_PIXELS or ow >= TAP_ROW_WIDTHS[0]):
        return depthwise_rows, [(plane[0], plane[1] + sw - 1), unused], geometry
    if oh * ow <= CHANNELS_LAST_MAX_PIXELS:
        return depthwise_channels_last, [(plane[0] * plane[1], LANES), (LANE_PIXELS * LANES,)], geometry
    return depthwise_any, [plane, (ow,)], geometry


# -- pooling windows that tile the input ---------------------------------------------------------

@inlined
def _pool_tiles_rows(x, out, is_max, kh, kw, scale):
    """``pool_tiles``' loops, inlined with ``is_max`` a constant."""
    ow = out.shape[2]
    for c in range(x.shape[0]):
        for oy in range(out.shape[1]):
            o = out[c, oy]
            for ky in range(kh):
                r = x[c, oy * kh + ky]
                first = ky == 0
                if kw == 1:
                    if first:
                        for ox in range(ow):
                            o[ox] = r[ox]
                    elif is_max:
                        for ox in range(ow):
                            o[ox] = max(o[ox], r[ox])
                    else:
                        for ox in range(ow):
                            o[ox] += r[ox]
                elif kw == 2:
                    if first and is_max:
                        for ox in range(ow):
                            o[ox] = max(r[2 * ox], r[2 * ox + 1])
                    elif first:
                        for ox in range(ow):
                            o[ox] = r[2 * ox] + r[2 * ox + 1]
                    elif is_max:
                        for ox in range(ow):
                            o[ox] = max(o[ox], max(r[2 * ox], r[2 * ox + 1]))
                    else:
                        for ox in range(ow):
                            o[ox] += r[2 * ox] + r[2 * ox + 1]
                else:
                    for ox in range(ow):
                        v = r[ox * kw] if first else (max(o[ox], r[ox * kw]) if is_max else o[ox] + r[ox * kw])
                        for kx in range(1, kw):
                            v = max(v, r[ox * kw + kx]) if is_max else v + r[ox * kw + kx]
                        o[ox] = v
            if not is_max:
                for ox in range(ow):
                    o[ox] *= scale


@_kernel
def pool_tiles(x, out, is_max, kh, kw, scale):
    """Windows that tile the input (stride = window, no padding: VGG's, CRNN's and U-Net's 2x2
    and 2x1, a 1-D CNN's 1x2): out[c, oy, ox] = the max (``is_max``) or the sum times ``scale`` of
    window (oy, ox), one pass over the window's rows per output row, the two columns of a
    2-wide window read at literal offsets (a loop that vectorises), for x [C, H, W], out [C, OH, OW].
    ``is_max`` is a constant in each copy of the loops, as in ``pool3x3``."""
    if is_max:
        _pool_tiles_rows(x, out, True, kh, kw, scale)
    else:
        _pool_tiles_rows(x, out, False, kh, kw, scale)


# -- Winograd's output tiles ---------------------------------------------------------------------

@_kernel
def winograd_place(y, bias, out, s0, s1, tiles_w, lo, hi, epilogue):
    """out[o, r nh + i, q nw + j] = y[i, j, o, t - s0] for the tiles t in [s0, s1) (tile t is tile
    row r = t // tiles_w, column q = t % tiles_w) of the output tiles ``y`` [nh, nw, O, tiles],
    clipped at the output's edges, with clamp(. + bias[o]) to [lo, hi] where ``epilogue``, in one
    pass. A span may start and end inside a tile row. The transforms themselves stay BLAS products:
    as loops over a channel's tiles in L1 they measured slower (bench/RESULTS.md), their rows of
    100 tiles too short to amortise a loop."""
    nh, nw, channels = y.shape[0], y.shape[1], y.shape[2]
    oh, ow = out.shape[1], out.shape[2]
    for o in range(channels):
        b = bias[o]
        s = s0
        while s < s1:  # the span's part in each tile row
            r, q0 = s // tiles_w, s % tiles_w
            q1 = min(tiles_w, q0 + s1 - s)
            for i in range(min(nh, oh - r * nh)):
                row = out[o, r * nh + i]
                for j in range(min(nw, ow - q0 * nw)):
                    count = min(q1, (ow - 1 - j) // nw + 1) - q0  # tiles whose column j is inside
                    dst, src = row[q0 * nw + j:], y[i, j, o, s - s0:]
                    if epilogue:
                        for k in range(count):
                            dst[k * nw] = min(max(src[k] + b, lo), hi)
                    else:
                        for k in range(count):
                            dst[k * nw] = src[k]
            s += q1 - q0


# -- epilogues and pooling ------------------------------------------------------------------------

@_kernel
def bias_clamp(out, bias, r0, r1, c0, c1, lo, hi):
    """out[r, c] = clamp(out[r, c] + bias[r]) on rows [r0, r1) and columns [c0, c1) of a GEMM's
    output [O, pixels]: one pass where NumPy makes two or three (add, then clip's max and min)."""
    for r in range(r0, r1):
        b = bias[r]
        row = out[r, c0:c1]
        for i in range(c1 - c0):
            row[i] = min(max(row[i] + b, lo), hi)


@inlined
def _pool3x3_same_planes(x, out, scale, v, is_max):
    """``pool3x3_same``'s loops, inlined with ``is_max`` a constant."""
    channels, size = x.shape
    w = size // scale.shape[0]
    n = size - 2 * w  # the rows with a row above and below
    sf = scale.reshape(size)
    for c in range(channels):
        xf, of = x[c], out[c]
        above, middle, below, inner = xf[0:], xf[w:], xf[2 * w:], v[w:]
        second_last, last, v_last = xf[size - 2 * w:], xf[size - w:], v[size - w:]
        if is_max:
            for i in range(n):
                inner[i] = max(max(above[i], middle[i]), below[i])
            for j in range(w):
                v[j] = max(xf[j], middle[j])
                v_last[j] = max(second_last[j], last[j])
        else:
            for i in range(n):
                inner[i] = above[i] + middle[i] + below[i]
            for j in range(w):
                v[j] = xf[j] + middle[j]
                v_last[j] = second_last[j] + last[j]
        left, centre, right, o_inner, s_inner = v[0:], v[1:], v[2:], of[1:], sf[1:]
        if is_max:
            for i in range(size - 2):
                o_inner[i] = max(max(left[i], centre[i]), right[i])
            for r in range(0, size, w):
                of[r] = max(v[r], v[r + 1])
                of[r + w - 1] = max(v[r + w - 2], v[r + w - 1])
        else:
            for i in range(size - 2):
                o_inner[i] = (left[i] + centre[i] + right[i]) * s_inner[i]
            for r in range(0, size, w):
                of[r] = (v[r] + v[r + 1]) * sf[r]
                of[r + w - 1] = (v[r + w - 2] + v[r + w - 1]) * sf[r + w - 1]


@_kernel
def pool3x3_same(x, out, scale, v, is_max):
    """3x3 windows at stride 1 with one of padding on every side (out the input's size), on
    channels as flat planes x, out [C, H W] (H, W >= 2): per channel, the column sums (or maxima)
    of three rows into ``v`` [>= H W] as one loop over the plane, their sums (or maxima) along
    the row as another, times ``scale`` (flat) for a mean, then each row's first and last column
    again without the neighbour the flat loop took from the next or previous row. Four loops over
    a plane instead of two per row, which at 17x17 or 8x8 spent their time starting. ``is_max``
    is a constant in each copy of the loops, as in ``pool3x3``."""
    if is_max:
        _pool3x3_same_planes(x, out, scale, v, True)
    else:
        _pool3x3_same_planes(x, out, scale, v, False)


@_kernel
def _pool3x3_edge_row(x, c, y0, span, dst, is_max):
    """``pool3x3``'s combined row where its window reaches into the padding: the input rows inside,
    a pass each. A function of its own: written inside the row loop, its loops kept LLVM from
    vectorizing the inner rows' (measured: bench/RESULTS.md, s16)."""
    h = x.shape[1]
    first = True
    for i in range(3):
        iy = y0 + i
        if iy < 0 or iy >= h:
            continue
        src = x[c, iy, :span]
        if first:
            for j in range(span):
                dst[j] = src[j]
            first = False
        elif is_max:
            for j in range(span):
                dst[j] = max(dst[j], src[j])
        else:
            for j in range(span):
                dst[j] += src[j]


@inlined
def _pool3x3_rows(x, out, scale, row, is_max, sh, sw, pt, pl):
    """``pool3x3``'s loops, inlined with ``is_max`` a constant."""
    h, w = x.shape[1], x.shape[2]
    ow = out.shape[2]
    span = min(w, row.shape[0] - pl)  # input columns some window reads
    dst = row[pl:pl + span]
    for c in range(x.shape[0]):
        for oy in range(out.shape[1]):
            y0 = sh * oy - pt
            if y0 >= 0 and y0 + 2 < h:
                a, b, d = x[c, y0, :span], x[c, y0 + 1, :span], x[c, y0 + 2, :span]
                if is_max:
                    for j in range(span):
                        dst[j] = max(max(a[j], b[j]), d[j])
                else:
                    for j in range(span):
                        dst[j] = a[j] + b[j] + d[j]
            else:  # a window row in the padding: the rows inside, a pass each
                _pool3x3_edge_row(x, c, y0, span, dst, is_max)
            o, factor = out[c, oy], scale[oy]
            if is_max and sw == 1:
                for ox in range(ow):
                    o[ox] = max(max(row[ox], row[ox + 1]), row[ox + 2])
            elif sw == 1:
                for ox in range(ow):
                    o[ox] = (row[ox] + row[ox + 1] + row[ox + 2]) * factor[ox]
            elif is_max and sw == 2:
                for ox in range(ow):
                    o[ox] = max(max(row[2 * ox], row[2 * ox + 1]), row[2 * ox + 2])
            elif sw == 2:
                for ox in range(ow):
                    o[ox] = (row[2 * ox] + row[2 * ox + 1] + row[2 * ox + 2]) * factor[ox]
            elif is_max:
                for ox in range(ow):
                    o[ox] = max(max(row[sw * ox], row[sw * ox + 1]), row[sw * ox + 2])
            else:
                for ox in range(ow):
                    o[ox] = (row[sw * ox] + row[sw * ox + 1] + row[sw * ox + 2]) * factor[ox]


@_kernel
def pool3x3(x, out, scale, row, is_max, sh, sw, pt, pl):
    """3x3 windows row by row, at any stride: the three input rows of output row oy combined
    column-wise into the padded ``row`` (one loop over the three where all are inside the input;
    a pass per row at the top and bottom edges), then out[ox] = combine(row[sw ox], row[sw ox + 1],
    row[sw ox + 2]) (a loop per literal stride 1 and 2, which vectorises; a run-time stride runs
    scalar), times scale[oy] for a mean. ``row`` [(OW - 1) sw + 3] is the caller's scratch, filled
    once with the border value (-inf for a max, 0 for a sum): the loops write it only where input
    lands. Faster than nine taps read from rows split by stride phase. ``is_max`` is a constant in
    each copy of the loops (``_pool3x3_rows``): tested inside them, it slowed them (measured:
    bench/RESULTS.md, s16). Stride 1 at the input's size goes to ``pool3x3_same``: rows of 17 or
    8 spend their time starting loops."""
    if is_max:
        _pool3x3_rows(x, out, scale, row, True, sh, sw, pt, pl)
    else:
        _pool3x3_rows(x, out, scale, row, False, sh, sw, pt, pl)


# -- Raster ----------------------------------------------------------------------------------------

@_kernel
def raster_regions(src, dst, table):
    """Every region of a Raster as 32-bit words, ``src`` and ``dst`` flat int32 views of their
    buffers: row i of ``table`` [R, 2 + 3 * RANK] is (source offset, destination offset, the
    RANK sizes, the RANK source strides, the RANK destination strides), offsets counted from the
    buffers' first word. A Raster gathering many small pieces (an LSTM's steps into Y) paid
    NumPy's fixed cost per piece."""
    for i in range(table.shape[0]):
        row = table[i]
        n0, n1, n2, n3 = row[2], row[3], row[4], row[5]
        s0, s1, s2, s3 = row[6], row[7], row[8], row[9]
        d0, d1, d2, d3 = row[10], row[11], row[12], row[13]
        for a in range(n0):
            for b in range(n1):
                for c in range(n2):
                    s = row[0] + a * s0 + b * s1 + c * s2
                    d = row[1] + a * d0 + b * d1 + c * d2
                    if s3 == 1 and d3 == 1:
                        dst[d:d + n3] = src[s:s + n3]
                    else:
                        for e in range(n3):
                            dst[d + e * d3] = src[s + e * s3]


# -- Resize ----------------------------------------------------------------------------------------
# x [planes, H, W] -> out [planes, OH, OW], float32; each axis' sampling (``numerics.sampling.resize_axis``):
# the source index of every output (nearest), or its two neighbours and the right one's weight (linear).
# NumPy's ``take`` along the middle and last axes, and the linear mode's dozen temporaries, cost
# several times the copy (an FPN neck's 2x upsampling: bench/RESULTS.md).

@_kernel
def resize_nearest(x, rows, cols, out):
    """out[p, i, j] = x[p, rows[i], cols[j]]."""
    for p in range(out.shape[0]):
        for i in range(out.shape[1]):
            src, dst = x[p, rows[i]], out[p, i]
            for j in range(out.shape[2]):
                dst[j] = src[cols[j]]


@_kernel
def resize_linear(x, rows_lo, rows_hi, row_frac, cols_lo, cols_hi, col_frac, out):
    """Bilinear: each output from its four neighbours, along the width first, then the height."""
    one = np.float32(1)
    for p in range(out.shape[0]):
        for i in range(out.shape[1]):
            top, bottom, dst = x[p, rows_lo[i]], x[p, rows_hi[i]], out[p, i]
            fh = row_frac[i]
            for j in range(out.shape[2]):
                lo, hi, fw = cols_lo[j], cols_hi[j], col_frac[j]
                upper = top[lo] * (one - fw) + top[hi] * fw
                lower = bottom[lo] * (one - fw) + bottom[hi] * fw
                dst[j] = upper * (one - fh) + lower * fh


# -- Gather ----------------------------------------------------------------------------------------

@_kernel
def gather_rows(data, indices, out):
    """out[o, c, :] = data[o, indices[c], :] for data [outer, axis, inner] and out [outer, count,
    inner], a negative index counted from the axis' end and one still out of range clamped to it
    (the Gather op's contract): an embedding lookup in one pass, where NumPy's took a converted
    copy of the indices, two passes to fix them and its ``take``."""
    axis = data.shape[1]
    for c in range(indices.shape[0]):
        i = np.int64(indices[c])
        if i < 0:
            i += axis
        i = min(max(i, 0), axis - 1)
        for o in range(data.shape[0]):
            for e in range(data.shape[2]):  # element by element: a slice assignment per row cost more than its copy
                out[o, c, e] = data[o, i, e]
