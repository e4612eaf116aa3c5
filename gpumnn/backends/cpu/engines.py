"""Which of the cpu backend's three engines runs an op, and the thresholds that choose.

The engines: NumPy on the calling thread (the reference), chunks on ``cpu_workers``' Python
threads (NumPy, or ``cpu_jit``'s compiled loops), and ``cpu_parallel``'s native regions. A
backend has an ``Engine`` (what it may use); each op family asks it once, by one method, which
kernel builds the op and into how many pieces to cut it (a ``Choice``). The kernels in
``backend`` only carry the choice out.

The thresholds are read when a choice is made, so a test may patch them on this module. Each was
measured at threads=2 on 2 cores (the figures are in bench/RESULTS.md).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from ... import atomic as A
from . import direct as cpu_direct, tiles as cpu_tiles

#: Bytes one chunk's scratch (im2col columns, depthwise windows) may take; within it, the chunk
#: count (``CHUNKS_PER_THREAD``) decides. Chunks cut to fit L2 were slower: NumPy's cost per call
#: and the GIL handed between threads at every call outweigh the cache misses they save.
CHUNK_BYTES = 4 << 20
#: An op shared between threads is cut into this many chunks per thread: more let a thread the
#: machine slows leave its share to the others, fewer hand the GIL between threads less often
#: and keep each chunk's GEMM wide (narrow column spans run slower per multiply-add).
CHUNKS_PER_THREAD = 1
#: Below this many multiply-adds a convolution or product runs whole on the calling thread:
#: handing chunks to the helpers would cost more than it saves.
PARALLEL_MIN_MACS = 1 << 24
#: A depthwise convolution is shared between threads from this many window elements (channels x
#: taps x output pixels) on: it is bound by passes over memory and per-channel BLAS calls, not by
#: multiply-adds, so the MAC threshold above would keep every one of them on one thread.
DEPTHWISE_PARALLEL_MIN = 1 << 18

#: With ``cpu_parallel``'s native regions a product is shared between threads from this many
#: multiply-adds, a depthwise convolution or pool from this many window elements: a region costs
#: about a tenth of a hand-over to ``cpu_workers``, but it still has a fixed cost, and the next op
#: reads half the output from the other core's cache, so smaller depthwise convolutions ran
#: slower shared than on one thread inside runs (bench/RESULTS.md, s15). Products of half a
#: million multiply-adds (yolox_nano's 3x3s on 5x5) gained shared (s16).
REGION_MIN_MACS = 1 << 19
REGION_MIN_WINDOWS = 1 << 18
#: A float32 product below this many multiply-adds, with its operands' layout plain (``cpu_tiles.small_product``
#: says which), runs as one compiled loop on the calling thread: a region and BLAS's call cost more than it.
SMALL_PRODUCT_MACS = 1 << 17
#: A float32 product of at most this many rows and at least ``REGION_MIN_MACS`` multiply-adds by
#: constant weights runs on the register tile with the weights packed once
#: (``compiled._row_tiles_region``): BLAS packs both operands on every call, and at a few dozen rows
#: (an LSTM's input projection over its time steps) the weights are the larger one. Smaller products
#: ran as fast or faster in runs as BLAS's one call, next to the tile's partial panels
#: (bench/RESULTS.md).
ROW_TILES_MAX_ROWS = 64
#: A product of at most this many rows by constant weights stored transposed ([N, K]: ONNX's Gemm
#: with transB, an LSTM's W) reads a copy of them laid [K, N], made once: BLAS's packing of the
#: transposed layout on every call cost as much as the product itself at such sizes, the row-major
#: layout's about a third as much. More rows share the packing, and the copy is the weights' size.
RELAID_MAX_ROWS = 256
#: A Raster of at least this many regions and at most ``RASTER_LOOP_MAX_ELEMENTS`` elements copies
#: them in one compiled loop (``cpu_jit.raster_regions``), where NumPy's fixed cost per region was
#: most of the work; fewer or larger regions are NumPy's copies.
RASTER_LOOP_MIN_REGIONS = 4
RASTER_LOOP_MAX_ELEMENTS = 1 << 16
#: Bytes of im2col columns one block of a region copies, so that its product reads them from L2.
REGION_COLS_BYTES = 1 << 20
#: im2col's region copies each pixel's windows as one row of its columns ([pixels, C*KH*KW], BLAS
#: reading them transposed) where a window row is a run of at least this many input columns and
#: the stride along columns is past 2: each copy is then a run of the input, not output columns
#: gathered one float at a time (a strided 1-D window such as an STFT's frames).
WINDOW_ROWS_MIN_WIDTH = 16


def window_rows(op: A.Conv2D) -> bool:
    """Whether ``op``'s im2col copy lays the columns a pixel a row (``WINDOW_ROWS_MIN_WIDTH``)."""
    return op.kernel[1] >= WINDOW_ROWS_MIN_WIDTH and op.dilations[1] == 1 and op.strides[1] > 2


#: A convolution on constant weights takes ``cpu_tiles``' register tile (``compiled._packed_conv_region``)
#: from this inner dimension (C*KH*KW) up, BLAS below, where its windows are packed into pixel
#: panels (``packed_in_place``): with a short inner dimension each element's packing weighs more
#: against its multiply-adds ...
PACKED_MIN_DEPTH = 512
#: ... and from this one where the tiles read the windows in place: no packing, the bias and clamp
#: in the tiles' stores, and the 3x3s from 72 deep up ran 12-45% faster than BLAS's product on an
#: im2col copy (bench/RESULTS.md)
IN_PLACE_MIN_DEPTH = 64
#: ... but below this many multiply-adds (on one thread) the tile takes every depth: there BLAS's
#: call and its packing of the weights on every call cost more than the few multiply-adds (1-D
#: convolutions on a few dozen frames).
PACKED_ANY_DEPTH_MACS = 1 << 20


def packed_in_place(op: A.Conv2D) -> bool:
    """Whether ``compiled._packed_conv_region``'s tiles read the windows where they lie rather than
    packed into pixel panels: wherever a window is wider than one tap, so that a depth step's next
    tap is the previous one's neighbour, at any stride. A 1x1 window (a strided 1x1 convolution)
    moves a whole input plane each step: on 8-float vectors its packed panels ran faster, on the
    16-float tile (two vectors of channels a row) reading in place did (bench/RESULTS.md, s20)."""
    return tuple(op.kernel) != (1, 1) or cpu_tiles.WIDE_IN_PLACE


#: A convolution (not 1x1) over at most this many input channels that ``cpu_direct`` does not take
#: (rows under its 16 columns, or run-time weights) and below MASKED_MAX_MACS runs as
#: ``cpu_jit.conv_masked``'s rows of output channels in vector registers, each input row read in
#: place once for 16 of them, no im2col copy; its spans of rows share out from MASKED_SHARED_MACS.
MASKED_MAX_CHANNELS = 4
MASKED_MAX_MACS = 1 << 20
MASKED_SHARED_MACS = 1 << 18
#: A convolution on constant weights with at most this inner dimension (C*KH*KW), stride 1 along
#: columns (any along rows) and output rows of at least ``cpu_tiles.NR`` pixels runs on
#: ``cpu_tiles``' tapped tiles (``compiled._tapped_conv_region``): the input read where it lies, no
#: im2col copy, where the copy and BLAS's product over so short an inner dimension cost more than
#: the multiply-adds.
TAPPED_MAX_DEPTH = 384
#: ... and at stride 2 along columns, from a copy of each row split into its even and odd columns,
#: where the window is wider than one column (a 1x1 window reads one phase of the copy of both),
#: the output rows are whole vectors of the tiles (``cpu_tiles.NARROW``: on 20 columns the pixels
#: the last tile redoes cost more than the im2col copy saves) and from this many multiply-adds:
#: below it the register tile (``PACKED_ANY_DEPTH_MACS``) ran faster.
TAPPED_STRIDE2_MIN_MACS = 1 << 20
#: ``cpu_tiles``' pointwise tiles (``compiled._pointwise_region``) broadcast each pixel against a
#: vector of output channels on images of fewer than this many pixels (``cpu_tiles.NR``: too few to
#: fill the tile's vectors of pixels), and hold the pixels in the vector registers from it on.
POINTWISE_FEW_PIXELS = 16
#: A 1x1 convolution on constant weights runs on the pointwise tiles, not BLAS, on weights of at
#: most this many bytes, at any number of pixels: the tile reads the input in place and applies the
#: activation in registers, where BLAS packs both operands on every call. With the pixels in the
#: vector registers each tile walks its 16 pixels down every input channel, and deep inputs with
#: large weights (MobileNet-v1's 1024 channels on 7x7) ran slower than BLAS ...
POINTWISE_MAX_WEIGHT_BYTES = 1 << 18
#: ... but on images of fewer than this many pixels (14x14 and smaller planes), weights of any size
#: run on the tiles, where BLAS packs the weights again on every call, from memory inside runs
#: (bench/RESULTS.md, s18): with each pixel broadcast (``Engine.pointwise_pixels_in_rows``), a panel
#: of NR output channels in cache while every pixel passes, unless the tiles' pixel vectors are 16
#: floats wide (``cpu_tiles.PIXEL_LANES``), which ran faster than the broadcast at 4x4 to 14x14 (s19).
POINTWISE_BROADCAST_MAX_PIXELS = 256
#: ... but where the in-place im2col tile holds two 16-float vectors a row (AVX-512:
#: ``cpu_tiles.IN_PLACE_COLUMNS``), a 1x1 on at most this many pixels, from
#: POINTWISE_IN_PLACE_MIN_CHANNELS input channels on, whose pixels fill the tile's panels of
#: ``cpu_tiles.IN_PLACE_ROWS`` but for at most a tenth (7x7: seven whole panels) runs on that tile,
#: its pixels broadcast against 32 channels: there deep 1x1s ran faster than on the pointwise
#: tiles; shallow ones, and 4x4, 6x6 and 14x14 planes, slower (bench/RESULTS.md, s20)
POINTWISE_IN_PLACE_MAX_PIXELS = 64
POINTWISE_IN_PLACE_MIN_CHANNELS = 256
#: ... and is shared between the region's threads from this many multiply-adds (a region's entry
#: against the tile's speed on one thread; smaller ones ran slower shared inside runs:
#: bench/RESULTS.md, s15).
POINTWISE_SHARED_MACS = 1 << 19
#: A convolution over at most ``cpu_direct.MAX_IN_CHANNELS`` input channels (a network's stem) on
#: constant weights runs ``cpu_direct``'s rows, not im2col, where ``cpu_direct.takes`` it: its inner
#: dimension (channels x taps) is too short for BLAS and the register tile to pay for the columns.
#: It is shared between the region's threads from this many multiply-adds.
DIRECT_SHARED_MACS = 1 << 18
#: A squeeze-excitation block's products are shared between the region's threads from this many
#: multiply-adds in the larger one: they read their weights from memory on every run, and two
#: threads read them faster than one (bench/RESULTS.md, s18).
EXCITATION_SHARED_MACS = 1 << 16
#: Elementwise ops (a residual sum) and row passes (softmax, normalisation, global average pooling)
#: are shared between the regions' threads from this many elements: a region's cost against a
#: pass over memory.
REGION_MIN_ELEMENTS = 1 << 15
#: floats in a cache line: an elementwise op's span starts on one
CACHE_LINE_FLOATS = 16
#: floats (1 KB) each thread's scratch row starts on a multiple of and fills: rows one cache line,
#: or two, apart still moved back and forth between the cores (the hardware prefetchers fetch a
#: line's neighbours), and two threads ran a 3x3 pool no faster than one; rows 512 bytes apart
#: did not (bench/RESULTS.md, s20)
THREAD_ROW_FLOATS = 256

#: Where the Winograd kernel pays against im2col, per kernel: (output tiles, input channels, how
#: many times fewer multiplications than the sliding window it must make: Eq. 2's C(n) with the
#: transforms; on the register tile, the transforms as it runs them, ``Engine.winograd_transform_tiles``).
#: "regions": ``compiled._winograd_region`` (the register tile); "threads": ``reference._winograd`` (BLAS
#: products on the Python threads). Measured per op inside whole runs (bench/RESULTS.md). On the
#: regions, below 32 input channels the tapped tiles read the input in place (depth 144 over 16
#: channels) and beat Winograd's transforms of so few channels per output. Where the in-place
#: im2col tile holds two 16-float vectors a row (AVX-512: ``cpu_tiles.IN_PLACE_COLUMNS``) it runs
#: faster than Winograd's 8-float products and transforms, and a saving of 1.7 (ResNet's 3x3s on
#: 512 channels at 7x7: 1.59 in F(2)) stays on it (bench/RESULTS.md, s20).
WINOGRAD_PAYS = {"regions": (16, 32, 1.7 if cpu_tiles.WIDE_IN_PLACE else 1.5),
                 "threads": (40, 64, 2.0)}


class Choice(NamedTuple):
    """The kernel that builds an op, and ``parts``: how many pieces it cuts the op into (threads
    for a GEMM's blocks, ``_gemm_blocks``); 1 runs it whole."""

    kernel: str
    parts: int = 1


@dataclasses.dataclass(frozen=True)
class Engine:
    """What a backend may run on: ``jit``, ``cpu_jit``'s compiled loops; ``regions``, threads of
    ``cpu_parallel``'s native regions (0: none); ``threads``, the Python pool's (``cpu_workers``)."""

    jit: bool = False
    regions: int = 0
    threads: int = 1

    def without_regions(self) -> Engine:
        """This engine on the Python threads: where a region cannot take an operand's layout."""
        return dataclasses.replace(self, regions=0)

    def winograd_pays(self) -> tuple[int, int, float]:
        """The scheme step's gate for Winograd (``WINOGRAD_PAYS``): lower on the register tile."""
        return WINOGRAD_PAYS["regions" if self.regions else "threads"]

    def winograd_transform_tiles(self) -> tuple[int, int, int] | None:
        """The register tiles the regions' Winograd kernel transforms on (``cpu_tiles.SQUARE``,
        ``ROW``, ``MR``: ``schemes.winograd_kernel_cost``); None off regions (BLAS transforms)."""
        return (cpu_tiles.SQUARE, cpu_tiles.ROW, cpu_tiles.MR) if self.regions else None

    # -- how many pieces ------------------------------------------------------------------
    def chunks(self, work: int, threshold: int) -> int:
        """Chunks on the Python threads: ``CHUNKS_PER_THREAD`` per thread once ``work`` reaches
        ``threshold``."""
        return self.threads * CHUNKS_PER_THREAD if self.threads > 1 and work >= threshold else 1

    def shared(self, work: int, threshold: int) -> int:
        """Threads of a native region sharing an op: two from ``threshold``, and as many as get half
        a threshold's work each, up to all of them. On two threads: both from ``threshold``. On
        many, an op just past it is not cut into pieces that cost more to hand out than to run."""
        return min(self.regions, max(1, 2 * work // threshold))

    def gemm(self, macs: int, region: bool) -> int:
        """Threads a product of ``macs`` multiply-adds is cut into blocks for (1: one block): the
        region's from ``REGION_MIN_MACS``, else the Python threads' from ``PARALLEL_MIN_MACS``."""
        if region:
            return self.shared(macs, REGION_MIN_MACS)
        return self.threads if macs >= PARALLEL_MIN_MACS else 1

    # -- one decision per op family -------------------------------------------------------
    def conv(self, op: A.Conv2D, constant_weights: bool) -> Choice:
        """The kernel for ``op.scheme`` (the scheme step chose it) on this engine."""
        n, c, oc, g = op.batch, op.in_channels, op.out_channels, op.groups
        (h, w), (oh, ow), (kh, kw) = op.in_hw, op.out_hw, op.kernel
        macs = op.macs()
        if op.scheme == "winograd":
            if self.regions:
                return Choice("winograd_region", self.regions)
            return Choice("winograd", self.chunks(macs, PARALLEL_MIN_MACS))
        if op.scheme == "depthwise":
            windows = n * c * kh * kw * oh * ow
            if self.regions:
                return Choice("depthwise_region", self.shared(windows, REGION_MIN_WINDOWS))
            return Choice("depthwise_compiled" if self.jit else "depthwise", self.chunks(windows, DEPTHWISE_PARALLEL_MIN))
        cg, ocg = c // g, oc // g
        if op.scheme == "gemm1x1":  # parts: threads for each group's product's blocks
            product = ocg * h * w * cg
            if self.jit and h * w == 1 and g == 1 and constant_weights and n * product < SMALL_PRODUCT_MACS:
                return Choice("small_product")  # one pixel (squeeze-excitation's): a vector times the weights
            pointwise = h * w < POINTWISE_BROADCAST_MAX_PIXELS or 4 * cg * ocg <= POINTWISE_MAX_WEIGHT_BYTES
            if self.regions and g == 1 and constant_weights and self.pointwise_in_place(h * w, cg):
                return Choice("packed_region", self.shared(macs, REGION_MIN_MACS))
            if self.regions and g == 1 and constant_weights and pointwise:
                return Choice("pointwise_region", self.shared(product, POINTWISE_SHARED_MACS))
            if self.regions:
                return Choice("gemm1x1_region", self.gemm(product, region=True))
            return Choice("gemm1x1", self.gemm(product, region=False))
        if self.regions and constant_weights and cpu_direct.takes(op):
            return Choice("direct_region", self.shared(macs, DIRECT_SHARED_MACS))
        few_channels = g == 1 and c <= MASKED_MAX_CHANNELS and op.strides[1] in (1, 2) and macs < MASKED_MAX_MACS
        if self.regions and self.jit and few_channels:
            return Choice("masked_region", self.shared(macs, MASKED_SHARED_MACS))
        if self.regions and g == 1 and self.tapped_fits(op, constant_weights):
            return Choice("tapped_region", self.shared(macs, REGION_MIN_MACS))
        if self.regions and g == 1:
            depth = IN_PLACE_MIN_DEPTH if packed_in_place(op) else PACKED_MIN_DEPTH
            packed = constant_weights and (cg * kh * kw >= depth or macs < PACKED_ANY_DEPTH_MACS)
            return Choice("packed_region" if packed else "im2col_region", self.shared(macs, REGION_MIN_MACS))
        # row blocks with their own columns, or (fewer pixels than channels) the columns once
        return Choice("im2col_rows" if oh * ow >= ocg else "im2col_columns", self.chunks(macs, PARALLEL_MIN_MACS))

    @staticmethod
    def pointwise_in_place(pixels: int, channels: int) -> bool:
        """Whether a 1x1 convolution of ``channels`` inputs on ``pixels`` pixels per image (stride 1,
        constant weights) takes the in-place im2col tile (``POINTWISE_IN_PLACE_MIN_CHANNELS``)
        rather than the pointwise tiles."""
        rows = cpu_tiles.IN_PLACE_ROWS
        padded = -(-pixels // rows) * rows
        return (cpu_tiles.WIDE_IN_PLACE and pixels <= POINTWISE_IN_PLACE_MAX_PIXELS
                and channels >= POINTWISE_IN_PLACE_MIN_CHANNELS and 10 * (padded - pixels) <= padded)

    @staticmethod
    def pointwise_pixels_in_rows(pixels: int, weight_bytes: int) -> bool:
        """Whether the pointwise tiles hold an image's pixels in the vector registers (the weights in
        panels of ``cpu_tiles.pointwise_rows`` channels), else its output channels (each pixel
        broadcast): on ``POINTWISE_FEW_PIXELS`` pixels or more, but with 8-float vectors not for
        weights past ``POINTWISE_MAX_WEIGHT_BYTES`` on fewer than ``POINTWISE_BROADCAST_MAX_PIXELS``,
        whose panels of NR channels each stay in cache while every pixel passes."""
        return pixels >= POINTWISE_FEW_PIXELS and (weight_bytes <= POINTWISE_MAX_WEIGHT_BYTES
                                                   or pixels >= POINTWISE_BROADCAST_MAX_PIXELS
                                                   or cpu_tiles.PIXEL_LANES == 16)

    @staticmethod
    def tapped_fits(op: A.Conv2D, constant_weights: bool) -> bool:
        """Whether a sliding-window convolution takes the tapped tiles (``TAPPED_MAX_DEPTH``)."""
        (kh, kw), ow, stride = op.kernel, op.out_hw[1], op.strides[1]
        strided = (stride == 2 and kw > 1 and ow % cpu_tiles.NARROW == 0
                   and op.macs() >= TAPPED_STRIDE2_MIN_MACS)
        return (constant_weights and op.in_channels // op.groups * kh * kw <= TAPPED_MAX_DEPTH
                and (stride == 1 or strided) and ow >= cpu_tiles.NR)

    def matmul(self, macs: int, float32: bool, vector: bool, plain: bool = False, constant_rows: int = 0) -> Choice:
        """A product of ``macs`` multiply-adds; ``vector``: one row times constant weights (a
        classifier's last layer), which the register tile reads once; ``plain``: a layout and
        epilogue ``small_product`` takes; ``constant_rows``: its rows where it is plain with
        constant weights and one image (else 0), which ``ROW_TILES_MAX_ROWS`` weighs. ``parts``:
        threads for its blocks (``_gemm_blocks``; the row tiles' weight panel spans)."""
        if self.jit and float32 and plain and macs < SMALL_PRODUCT_MACS:
            return Choice("small_product")
        if self.regions and float32:
            if vector:
                return Choice("vector_region", self.regions)
            if plain and 0 < constant_rows <= ROW_TILES_MAX_ROWS and macs >= REGION_MIN_MACS:
                return Choice("row_tiles_region", self.gemm(macs, region=True))
            return Choice("gemm_region", self.gemm(macs, region=True))
        return Choice("gemm", self.gemm(macs, region=False))

    def excitation(self, elements: int, macs: int) -> int:
        """Threads a squeeze-excitation block over ``elements`` input values, its larger product
        ``macs`` multiply-adds, runs on as one compiled call (``cpu_excitation``), or 0: not as one
        call. Each of its threads pools every row, so it is one call only where the pool would not
        be shared; its products and scale are shared from ``EXCITATION_SHARED_MACS``."""
        if not self.jit:
            return 0
        if self.regions:
            return self.shared(macs, EXCITATION_SHARED_MACS) if self.shared(elements, REGION_MIN_ELEMENTS) == 1 else 0
        return 1 if self.threads == 1 or elements < REGION_MIN_ELEMENTS else 0

    def recurrence(self, directions: int) -> Choice:
        """A run of LSTM steps recorded together (``cpu_recurrent.lstm_runs``): its directions on a
        region's threads where there are several (no direction reads another's state, so a run's
        steps need no meeting between threads), else one compiled loop on the calling thread."""
        if self.regions and directions > 1:
            return Choice("lstm_sequence_region", min(self.regions, directions))
        return Choice("lstm_sequence")

    def raster(self, regions: int, elements: int) -> Choice:
        """A Raster of ``regions`` regions, ``elements`` elements copied in all, its operands in
        one buffer each: many small regions in one compiled loop, else NumPy's copies."""
        if self.jit and regions >= RASTER_LOOP_MIN_REGIONS and elements <= RASTER_LOOP_MAX_ELEMENTS:
            return Choice("regions_loop")
        return Choice("numpy")

    def relaid_weights(self, rows: int) -> bool:
        """Whether a float32 product of ``rows`` rows by constant weights stored transposed reads
        them from a copy laid [K, N] (``RELAID_MAX_ROWS``)."""
        return rows <= RELAID_MAX_ROWS

    def pool(self, op: A.Pool2D, float32: bool, bytes_: bool = False) -> Choice:
        """Global pooling (a window the input's size), windows that tile the input and 3x3 windows in
        compiled loops, max pooling of 8-bit elements (``bytes_``) in compiled rows (``parts``: plane
        spans), else NumPy's separable passes."""
        (h, w), (oh, ow) = op.in_hw, op.out_hw
        if op.kernel == (h, w) and (oh, ow) == (1, 1) and not any(op.pads):
            if self.regions and op.op in ("avg", "max") and float32:
                kernel = "mean_rows_region" if op.op == "avg" else "max_rows_region"
                return Choice(kernel, self.shared(op.batch * op.channels * h * w, REGION_MIN_ELEMENTS))
            return Choice("global")
        if self.jit and bytes_ and op.op == "max":
            return Choice("max_bytes", min(op.batch * op.channels,
                                           self.chunks(op.batch * op.channels * h * w, DEPTHWISE_PARALLEL_MIN)))
        tiles = op.strides == op.kernel and not any(op.pads) and oh * op.kernel[0] <= h and ow * op.kernel[1] <= w
        if self.jit and float32 and tiles:
            return Choice("pool_tiles")
        if self.jit and float32 and op.kernel == (3, 3):
            windows = op.batch * op.channels * 9 * oh * ow
            if self.regions:
                return Choice("pool3x3_region", self.shared(windows, REGION_MIN_WINDOWS))
            return Choice("pool3x3", self.chunks(windows, DEPTHWISE_PARALLEL_MIN))
        return Choice("separable")

    def resize(self, elements: int) -> Choice:
        """Nearest and linear Resize writing ``elements`` outputs: ``cpu_jit``'s loops where there
        are (``parts``: plane spans on the Python threads), else NumPy's ``take`` and arithmetic."""
        if self.jit:
            return Choice("compiled", self.chunks(elements, DEPTHWISE_PARALLEL_MIN))
        return Choice("numpy")

    def elementwise(self, size: int, fusable: bool) -> Choice:
        """A binary op of ``size`` elements; ``fusable``: a float32 sum or product with a clamp or
        none (a residual connection and its ReLU, squeeze-excitation's scale per channel), one pass in
        a region where its operands' layout allows (a product: a value per row only)."""
        if self.regions and fusable:
            return Choice("sum_region", self.shared(size, REGION_MIN_ELEMENTS))
        return Choice("numpy")

    def rows(self, rows: int, size: int, fits: bool) -> Choice:
        """A row-wise op (softmax, normalisation) on ``rows`` rows of ``size``; ``fits``: float32
        rows the region's loops take. ``parts``: row spans."""
        if self.regions and fits:
            return Choice("rows_region", self.shared(rows * size, REGION_MIN_ELEMENTS))
        return Choice("numpy")
