"""The cpu backend's engine decisions (``gpumnn.backends.cpu.engines``): which kernel each op
family gets, and into how many pieces, on each engine at the current thresholds. Pure: no kernel
is built, no Numba needed."""
from __future__ import annotations

import pytest

from gpumnn import atomic as A
from gpumnn.backends.cpu import engines
from gpumnn.backends.cpu import tiles as cpu_tiles
from gpumnn.backends.cpu.engines import Choice, Engine


NUMPY = Engine(jit=False, regions=0, threads=1)
THREADS = Engine(jit=False, regions=0, threads=2)  # NumPy kernels on two Python threads
JIT = Engine(jit=True, regions=0, threads=2)  # compiled loops on two Python threads
REGIONS = Engine(jit=True, regions=2, threads=2)  # native regions of two threads
MANY = Engine(jit=True, regions=16, threads=16)  # native regions of sixteen threads


def conv(c: int, hw: int, oc: int, k: int = 3, scheme: str = "im2col", groups: int = 1, stride: int = 1,
         batch: int = 1) -> A.Conv2D:
    out = (hw + 2 * (k // 2) - k) // stride + 1
    return A.Conv2D(("x", "w"), ("y",), "conv", batch=batch, in_channels=c, in_hw=(hw, hw), out_channels=oc,
                    out_hw=(out, out), kernel=(k, k), strides=(stride, stride), pads=(k // 2, k // 2),
                    groups=groups, scheme=scheme)


def pool(op: str, c: int, hw: int, k: int, stride: int = 1, pad: int = 0) -> A.Pool2D:
    out = (hw + 2 * pad - k) // stride + 1
    return A.Pool2D(("x",), ("y",), "pool", op=op, channels=c, in_hw=(hw, hw), out_hw=(out, out), kernel=(k, k),
                    strides=(stride, stride), pads=(pad,) * 4)


# (engine, op, constant weights, expected)
CONV = [
    # Winograd: the register tile in regions; on the Python threads, chunks from PARALLEL_MIN_MACS
    (REGIONS, conv(16, 8, 16, scheme="winograd"), True, ("winograd_region", 2)),
    (JIT, conv(16, 8, 16, scheme="winograd"), True, ("winograd", 1)),
    (THREADS, conv(64, 56, 64, scheme="winograd"), True, ("winograd", 2)),
    (NUMPY, conv(64, 56, 64, scheme="winograd"), True, ("winograd", 1)),
    # depthwise: shared from REGION_MIN_WINDOWS in regions, DEPTHWISE_PARALLEL_MIN on threads
    (REGIONS, conv(32, 56, 32, scheme="depthwise", groups=32), True, ("depthwise_region", 2)),
    (REGIONS, conv(8, 8, 8, scheme="depthwise", groups=8), True, ("depthwise_region", 1)),
    (MANY, conv(32, 56, 32, scheme="depthwise", groups=32), True, ("depthwise_region", 6)),  # 903 K windows
    (MANY, conv(8, 8, 8, scheme="depthwise", groups=8), True, ("depthwise_region", 1)),
    (JIT, conv(32, 56, 32, scheme="depthwise", groups=32), True, ("depthwise_compiled", 2)),
    (JIT, conv(8, 8, 8, scheme="depthwise", groups=8), True, ("depthwise_compiled", 1)),
    (THREADS, conv(32, 56, 32, scheme="depthwise", groups=32), True, ("depthwise", 2)),
    (NUMPY, conv(32, 56, 32, scheme="depthwise", groups=32), True, ("depthwise", 1)),
    # 1x1 as a GEMM: parts are the threads for each group's product (REGION_MIN_MACS, PARALLEL_MIN_MACS)
    (REGIONS, conv(256, 56, 512, k=1, scheme="gemm1x1"), True, ("gemm1x1_region", 2)),  # 512 KB of weights
    (REGIONS, conv(16, 8, 16, k=1, scheme="gemm1x1"), False, ("gemm1x1_region", 1)),
    # few pixels on constant weights: the pointwise tiles, shared from POINTWISE_SHARED_MACS
    (REGIONS, conv(16, 8, 16, k=1, scheme="gemm1x1"), True, ("pointwise_region", 1)),
    (REGIONS, conv(96, 4, 576, k=1, scheme="gemm1x1"), True, ("pointwise_region", 2)),
    (REGIONS, conv(96, 9, 576, k=1, scheme="gemm1x1"), True, ("pointwise_region", 2)),  # 81 pixels, 216 KB
    (REGIONS, conv(512, 7, 1024, k=1, scheme="gemm1x1"), True,  # under 256 pixels: any weights; on 7x7 from 256
     ("packed_region" if cpu_tiles.WIDE_IN_PLACE else "pointwise_region", 2)),  # channels the 16-float in-place tile's
    (REGIONS, conv(160, 7, 960, k=1, scheme="gemm1x1"), True, ("pointwise_region", 2)),  # ... not under 256 channels
    (REGIONS, conv(512, 6, 512, k=1, scheme="gemm1x1"), True, ("pointwise_region", 2)),  # ... nor 36 pixels in 42 rows
    (REGIONS, conv(512, 15, 512, k=1, scheme="gemm1x1"), True, ("pointwise_region", 2)),  # 225 pixels
    (REGIONS, conv(512, 16, 1024, k=1, scheme="gemm1x1"), True, ("gemm1x1_region", 2)),  # 256: past the weight bytes
    (REGIONS, conv(256, 5, 256, k=1, scheme="gemm1x1"), True, ("pointwise_region", 2)),  # at it
    (REGIONS, conv(1024, 3, 1024, k=1, scheme="gemm1x1"), True, ("pointwise_region", 2)),  # few pixels: any weights
    (REGIONS, conv(64, 4, 64, k=1, scheme="gemm1x1", groups=2), True, ("gemm1x1_region", 1)),  # grouped: BLAS
    # more pixels, any number, on weights of at most POINTWISE_MAX_WEIGHT_BYTES
    (REGIONS, conv(16, 24, 72, k=1, scheme="gemm1x1"), True, ("pointwise_region", 2)),  # 576 pixels, 4.6 KB
    (REGIONS, conv(72, 12, 24, k=1, scheme="gemm1x1"), True, ("pointwise_region", 1)),
    (REGIONS, conv(64, 12, 128, k=1, scheme="gemm1x1"), True, ("pointwise_region", 2)),  # 32 KB
    (REGIONS, conv(256, 12, 256, k=1, scheme="gemm1x1"), True, ("pointwise_region", 2)),  # 256 KB: at it
    (REGIONS, conv(257, 17, 256, k=1, scheme="gemm1x1"), True, ("gemm1x1_region", 2)),  # past it, on 289 pixels
    (REGIONS, conv(64, 14, 384, k=1, scheme="gemm1x1"), True, ("pointwise_region", 2)),  # MobileNet-v2's 14x14
    (REGIONS, conv(16, 25, 16, k=1, scheme="gemm1x1"), True, ("pointwise_region", 1)),  # 625 pixels
    (REGIONS, conv(32, 112, 64, k=1, scheme="gemm1x1"), True, ("pointwise_region", 2)),  # MobileNet-v1's first, 8 KB
    (REGIONS, conv(512, 28, 256, k=1, scheme="gemm1x1"), True, ("gemm1x1_region", 2)),  # 512 KB: past the bytes
    (REGIONS, conv(16, 24, 72, k=1, scheme="gemm1x1"), False, ("gemm1x1_region", 2)),  # run-time weights
    (REGIONS, conv(16, 12, 72, k=1, scheme="gemm1x1"), False, ("gemm1x1_region", 1)),  # ... below REGION_MIN_MACS
    (JIT, conv(64, 56, 64, k=1, scheme="gemm1x1"), True, ("gemm1x1", 1)),
    # one pixel (squeeze-excitation's 1x1 convolutions): one compiled loop, on constant weights only
    (REGIONS, conv(576, 1, 144, k=1, scheme="gemm1x1"), True, ("small_product", 1)),
    (REGIONS, conv(576, 1, 144, k=1, scheme="gemm1x1"), False, ("gemm1x1_region", 1)),
    (REGIONS, conv(576, 1, 576, k=1, scheme="gemm1x1"), True, ("pointwise_region", 1)),  # past SMALL_PRODUCT_MACS, not POINTWISE_SHARED_MACS
    (REGIONS, conv(576, 1, 1024, k=1, scheme="gemm1x1"), True, ("pointwise_region", 2)),  # past both
    (NUMPY, conv(576, 1, 144, k=1, scheme="gemm1x1"), True, ("gemm1x1", 1)),
    (JIT, conv(256, 28, 256, k=1, scheme="gemm1x1"), True, ("gemm1x1", 2)),
    (JIT, conv(256, 28, 256, k=1, scheme="gemm1x1", groups=4), True, ("gemm1x1", 1)),  # each group's product is small
    # im2col: the register tile on constant weights from IN_PLACE_MIN_DEPTH (windows read in place) or
    # PACKED_MIN_DEPTH (a strided 1x1's, packed), BLAS below or on run-time weights
    (REGIONS, conv(64, 56, 64), True, ("packed_region", 2)),
    (MANY, conv(64, 56, 64), True, ("packed_region", 16)),  # 116 M multiply-adds: every thread
    (MANY, conv(64, 10, 64), True, ("packed_region", 14)),  # 3.7 M: half REGION_MIN_MACS a thread
    (MANY, conv(64, 5, 64), True, ("packed_region", 3)),  # 0.9 M
    (REGIONS, conv(64, 56, 64), False, ("im2col_region", 2)),
    (REGIONS, conv(48, 56, 64), True, ("packed_region", 2)),  # depth 432, in place
    # a 1x1 window, depth 128: read in place by the 16-float tile (AVX-512), else BLAS below PACKED_MIN_DEPTH
    (REGIONS, conv(128, 56, 256, k=1, stride=2), True,
     ("packed_region" if cpu_tiles.WIDE_IN_PLACE else "im2col_region", 2)),
    (REGIONS, conv(512, 28, 1024, k=1, stride=2), True, ("packed_region", 2)),  # ... depth 512
    # few input channels on constant weights, stride 1 along rows: the tapped tiles up to TAPPED_MAX_DEPTH
    (REGIONS, conv(16, 56, 64), True, ("tapped_region", 2)),  # depth 144
    (REGIONS, conv(16, 56, 64), False, ("im2col_region", 2)),
    (REGIONS, conv(8, 56, 16, stride=2), True, ("packed_region", 2)),  # stride 2 along columns: the tile
    (REGIONS, conv(8, 28, 16, stride=2), True, ("packed_region", 1)),  # ... below REGION_MIN_MACS: one thread
    (REGIONS, conv(16, 8, 16), True, ("packed_region", 1)),  # rows narrower than the tapped tiles
    (REGIONS, conv(16, 8, 16), False, ("im2col_region", 1)),  # run-time weights: BLAS
    (REGIONS, conv(64, 56, 64, groups=2), True, ("im2col_rows", 2)),  # grouped: the Python threads
    (JIT, conv(64, 56, 64), True, ("im2col_rows", 2)),
    (THREADS, conv(16, 8, 16), True, ("im2col_rows", 1)),
    (THREADS, conv(96, 6, 128), True, ("im2col_columns", 1)),  # fewer pixels than channels
    (THREADS, conv(512, 7, 1024), True, ("im2col_columns", 2)),
    (NUMPY, conv(64, 56, 64), True, ("im2col_rows", 1)),
    # few input channels (a stem) on constant weights in regions: the direct rows, shared from DIRECT_SHARED_MACS
    (REGIONS, conv(3, 224, 32, stride=2), True, ("direct_region", 2)),
    (REGIONS, conv(3, 20, 4), True, ("direct_region", 1)),
    (REGIONS, conv(1, 64, 16, k=7), True, ("direct_region", 2)),
    (REGIONS, conv(3, 224, 32, stride=2), False, ("im2col_region", 2)),  # run-time weights
    (REGIONS, conv(5, 56, 16), True, ("tapped_region", 2)),  # past MAX_IN_CHANNELS: the tapped tiles
    (REGIONS, conv(3, 64, 16, stride=3), True, ("packed_region", 1)),  # a column stride of 3: im2col, one thread
    (REGIONS, conv(3, 14, 16), True, ("masked_region", 1)),  # rows shorter than ROW_WIDTH: the masked rows
    (REGIONS, conv(4, 56, 16, groups=2), True, ("im2col_rows", 1)),  # grouped
    (JIT, conv(3, 224, 32, stride=2), True, ("im2col_rows", 1)),  # no regions
]


def test_an_op_is_shared_by_as_many_threads_as_get_half_a_threshold_each():
    t = engines.REGION_MIN_MACS
    assert [REGIONS.shared(work, t) for work in (t - 1, t, 100 * t)] == [1, 2, 2]
    assert [MANY.shared(work, t) for work in (t - 1, t, t + t // 2, 4 * t, 8 * t, 100 * t)] == [1, 2, 3, 8, 16, 16]


@pytest.mark.parametrize("engine, op, constant, expected", CONV)
def test_conv(engine, op, constant, expected):
    assert engine.conv(op, constant) == expected


R, P = engines.REGION_MIN_MACS, engines.PARALLEL_MIN_MACS
# (engine, macs, float32, vector, expected[, plain: a layout small_product takes])
MATMUL = [
    (REGIONS, 1024, True, True, ("vector_region", 2)),
    (REGIONS, engines.SMALL_PRODUCT_MACS - 1, True, False, ("small_product", 1), True),  # plain and small: one loop
    (JIT, engines.SMALL_PRODUCT_MACS - 1, True, True, ("small_product", 1), True),
    (REGIONS, engines.SMALL_PRODUCT_MACS, True, False, ("gemm_region", 1), True),
    # few rows by constant weights: the row tiles (M rows given), past ROW_TILES_MAX_ROWS BLAS's blocks
    (REGIONS, R, True, False, ("row_tiles_region", 2), True, engines.ROW_TILES_MAX_ROWS),
    (REGIONS, R - 1, True, False, ("gemm_region", 1), True, 40),  # below REGION_MIN_MACS: BLAS's one call
    (REGIONS, R, True, False, ("gemm_region", 2), True, engines.ROW_TILES_MAX_ROWS + 1),
    (REGIONS, R, True, False, ("gemm_region", 2), False, 40),  # not plain (alpha, a bias per row)
    (JIT, R, True, False, ("gemm", 1), True, 40),  # no regions
    (NUMPY, 1024, True, False, ("gemm", 1), True),  # no compiled loops
    (REGIONS, R, True, False, ("gemm_region", 2)),
    (REGIONS, R - 1, True, False, ("gemm_region", 1)),
    (REGIONS, P, False, False, ("gemm", 2)),  # not float32: the Python threads
    (JIT, 1024, True, True, ("gemm", 1)),
    (JIT, P, True, False, ("gemm", 2)),
    (JIT, P - 1, True, False, ("gemm", 1)),
    (THREADS, P, True, False, ("gemm", 2)),
    (NUMPY, P, True, False, ("gemm", 1)),
]


@pytest.mark.parametrize("case", MATMUL)
def test_matmul(case):
    engine, macs, float32, vector, expected, *plain = case
    assert engine.matmul(macs, float32, vector, *plain) == expected


# (engine, op, float32, expected)
POOL = [
    (REGIONS, pool("avg", 2048, 8, 8), True, ("mean_rows_region", 2)),
    (REGIONS, pool("avg", 256, 7, 7), True, ("mean_rows_region", 1)),  # below REGION_MIN_ELEMENTS
    (REGIONS, pool("avg", 2048, 8, 8), False, ("global", 1)),
    (REGIONS, pool("max", 2048, 8, 8), True, ("max_rows_region", 2)),
    (REGIONS, pool("max", 256, 8, 8), True, ("max_rows_region", 1)),  # below REGION_MIN_ELEMENTS
    (REGIONS, pool("max", 2048, 8, 8), False, ("global", 1)),
    (JIT, pool("avg", 2048, 8, 8), True, ("global", 1)),
    (REGIONS, pool("max", 64, 112, 3, 2, 1), True, ("pool3x3_region", 2)),
    (REGIONS, pool("max", 4, 8, 3, 1, 1), True, ("pool3x3_region", 1)),
    (JIT, pool("max", 64, 112, 3, 2, 1), True, ("pool3x3", 2)),
    (JIT, pool("avg", 4, 8, 3, 1, 1), True, ("pool3x3", 1)),
    (JIT, pool("max", 64, 112, 3, 2, 1), False, ("separable", 1)),
    (JIT, pool("max", 64, 112, 2, 2), True, ("pool_tiles", 1)),  # windows that tile the input
    (REGIONS, pool("avg", 64, 112, 4, 4), True, ("pool_tiles", 1)),
    (JIT, pool("max", 64, 112, 2, 2), False, ("separable", 1)),
    (JIT, pool("max", 64, 112, 2, 1), True, ("separable", 1)),  # overlapping windows
    (NUMPY, pool("max", 64, 112, 2, 2), True, ("separable", 1)),
    (THREADS, pool("max", 64, 112, 3, 2, 1), True, ("separable", 1)),
    (NUMPY, pool("avg", 2048, 8, 8), True, ("global", 1)),
]


@pytest.mark.parametrize("engine, op, float32, expected", POOL)
def test_pool(engine, op, float32, expected):
    assert engine.pool(op, float32) == expected


#: max pooling of 8-bit elements: compiled rows (plane spans on the Python threads from 2^18 input
#: elements), NumPy's passes without the compiled loops, global windows as NumPy's one reduction
BYTE_POOL = [
    (JIT, pool("max", 64, 112, 3, 2, 1), ("max_bytes", 2)),
    (REGIONS, pool("max", 4, 8, 3, 2, 1), ("max_bytes", 1)),
    (JIT, pool("max", 64, 8, 8), ("global", 1)),
    (NUMPY, pool("max", 64, 112, 3, 2, 1), ("separable", 1)),
]


@pytest.mark.parametrize("engine, op, expected", BYTE_POOL)
def test_byte_max_pool(engine, op, expected):
    assert engine.pool(op, False, True) == expected


E = engines.REGION_MIN_ELEMENTS


@pytest.mark.parametrize("engine, size, fusable, expected", [
    (REGIONS, E, True, ("sum_region", 2)),
    (REGIONS, E - 1, True, ("sum_region", 1)),
    (REGIONS, E, False, ("numpy", 1)),
    (JIT, E, True, ("numpy", 1)),
    (NUMPY, E, True, ("numpy", 1)),
])
def test_elementwise(engine, size, fusable, expected):
    assert engine.elementwise(size, fusable) == expected


@pytest.mark.parametrize("engine, rows, size, fits, expected", [
    (REGIONS, 128, E // 128, True, ("rows_region", 2)),
    (REGIONS, 1, 1000, True, ("rows_region", 1)),
    (REGIONS, 128, E // 128, False, ("numpy", 1)),
    (JIT, 128, E // 128, True, ("numpy", 1)),
])
def test_rows(engine, rows, size, fits, expected):
    assert engine.rows(rows, size, fits) == expected


def test_winograd_gate_and_the_fallback_off_regions():
    assert REGIONS.winograd_pays() == engines.WINOGRAD_PAYS["regions"]
    assert JIT.winograd_pays() == NUMPY.winograd_pays() == engines.WINOGRAD_PAYS["threads"]
    # the regions' kernel transforms on the register tiles; the threads' BLAS transforms by Eq. 2
    assert REGIONS.winograd_transform_tiles() == (cpu_tiles.SQUARE, cpu_tiles.ROW, cpu_tiles.MR)
    assert JIT.winograd_transform_tiles() is None and NUMPY.winograd_transform_tiles() is None
    assert REGIONS.without_regions() == JIT
    # a 1x1 convolution whose layout a region cannot take falls back to the threads' choice
    op = conv(256, 28, 256, k=1, scheme="gemm1x1")
    assert REGIONS.without_regions().conv(op, True) == Choice("gemm1x1", 2)


def test_thresholds_are_read_when_choosing(monkeypatch):
    """Tests patch a threshold on ``engines``; the next choice reads it."""
    monkeypatch.setattr(engines, "PACKED_ANY_DEPTH_MACS", 0)
    monkeypatch.setattr(engines, "IN_PLACE_MIN_DEPTH", 1 << 30)
    assert REGIONS.conv(conv(16, 8, 16), True).kernel == "im2col_region"
    monkeypatch.setattr(engines, "IN_PLACE_MIN_DEPTH", 1)
    assert REGIONS.conv(conv(16, 8, 16), True).kernel == "packed_region"
    monkeypatch.setattr(engines, "PARALLEL_MIN_MACS", 0)
    assert THREADS.matmul(1, True, False) == ("gemm", 2)


def test_relaid_weights_and_recurrence():
    """Few rows by weights stored transposed read a copy laid [K, N]; a run of LSTM steps puts its
    directions on a region's threads where there are several and regions, else one loop."""
    assert REGIONS.relaid_weights(engines.RELAID_MAX_ROWS) and not REGIONS.relaid_weights(engines.RELAID_MAX_ROWS + 1)
    assert REGIONS.recurrence(2) == Choice("lstm_sequence_region", 2)
    assert REGIONS.recurrence(1) == JIT.recurrence(2) == Choice("lstm_sequence")


@pytest.mark.parametrize("lanes", [8, 16])
def test_pointwise_tiles_broadcast_pixels_on_small_images_and_under_large_weights_on_a_few_dozen(lanes, monkeypatch):
    """The pixels are the tiles' vector operand from ``POINTWISE_FEW_PIXELS`` on, except, with 8-float
    vectors, under weights past ``POINTWISE_MAX_WEIGHT_BYTES`` on fewer than ``POINTWISE_BROADCAST_MAX_PIXELS``."""
    monkeypatch.setattr(engines.cpu_tiles, "PIXEL_LANES", lanes)
    few, big, many = engines.POINTWISE_FEW_PIXELS, engines.POINTWISE_MAX_WEIGHT_BYTES, engines.POINTWISE_BROADCAST_MAX_PIXELS
    rows = engines.Engine.pointwise_pixels_in_rows
    assert not rows(few - 1, 1024) and not rows(few - 1, big + 4) and rows(few, 1024) and rows(many - 1, big)
    assert rows(many, big + 4)
    assert rows(few, big + 4) == rows(many - 1, big + 4) == (lanes == 16)


def test_excitation_choice():
    """A squeeze-excitation block is one call where its pool would not be shared, on as many
    threads as its larger product's ``EXCITATION_SHARED_MACS`` gives; off the compiled loops, never."""
    small, shared = engines.REGION_MIN_ELEMENTS // 2, engines.EXCITATION_SHARED_MACS
    assert REGIONS.excitation(small, shared - 1) == 1 and REGIONS.excitation(small, shared) == 2
    assert REGIONS.excitation(engines.REGION_MIN_ELEMENTS, 10) == 0
    assert JIT.excitation(small, shared) == 1 and NUMPY.excitation(small, 10) == 0


def test_raster_choice():
    """Many small regions in one compiled loop; few regions, large copies or no compiled loops: NumPy."""
    n, big = engines.RASTER_LOOP_MIN_REGIONS, engines.RASTER_LOOP_MAX_ELEMENTS
    assert REGIONS.raster(n, big) == JIT.raster(n, 10) == Choice("regions_loop")
    assert REGIONS.raster(n - 1, 10) == REGIONS.raster(n, big + 1) == NUMPY.raster(n, 10) == Choice("numpy")


def test_the_regions_winograd_gate_leaves_few_input_channels_to_the_tapped_tiles():
    """On the regions, Winograd from 32 input channels on (``WINOGRAD_PAYS``): a 16-channel 3x3 at
    40x40 (yolox_nano's, SqueezeNet's first expand at 55x55) is none of its tiles' and goes to the
    tapped tiles; 32 channels at 20x20 (yolox_nano's next) still take it."""
    from types import SimpleNamespace

    from gpumnn.scheduler import schemes

    min_tiles, min_channels, min_saving = REGIONS.winograd_pays()
    backend = SimpleNamespace(winograd_min_tiles=min_tiles, winograd_min_channels=min_channels,
                              winograd_min_saving=min_saving, winograd_per_image=False,
                              winograd_transform_tiles=REGIONS.winograd_transform_tiles())
    for few in (conv(16, 40, 16), conv(16, 55, 64)):
        assert not any(schemes.winograd_kernel_pays(backend, few, tile) for tile in range(2, 7))
        assert REGIONS.conv(few, True).kernel == "tapped_region"
    assert any(schemes.winograd_kernel_pays(backend, conv(32, 20, 32), tile) for tile in range(2, 7))


def test_the_regions_winograd_gate_follows_the_im2col_tile():
    """Where the in-place im2col tile holds two 16-float vectors a row (AVX-512) it multiplies
    faster than Winograd's 8-float products, so ResNet's 3x3 on 512 channels at 7x7 (F(2) saves
    1.59 times) stays on it; the larger planes' (64 channels at 56x56, 256 at 14x14) take Winograd
    on either target."""
    from types import SimpleNamespace

    from gpumnn.scheduler import schemes

    min_tiles, min_channels, min_saving = REGIONS.winograd_pays()
    wide = cpu_tiles.WIDE_IN_PLACE
    assert min_saving == (1.7 if wide else 1.5)
    backend = SimpleNamespace(winograd_min_tiles=min_tiles, winograd_min_channels=min_channels,
                              winograd_min_saving=min_saving, winograd_per_image=True,
                              winograd_transform_tiles=REGIONS.winograd_transform_tiles())
    for op, takes in ((conv(512, 7, 512), not wide), (conv(64, 56, 64), True), (conv(256, 14, 256), True)):
        assert any(schemes.winograd_kernel_pays(backend, op, tile) for tile in range(2, 7)) == takes
