"""The atomic-op contract: the short list of kernels every backend implements.

MNN's lesson is that O(ops x backends) hand work becomes O(ops + backends) once every ONNX op
is lowered (by ``gpumnn.geometry``) to a few general kernels. This module is that list. Each
atomic op is a frozen dataclass that carries *concrete* sizes (shapes are known at session
creation), so a backend never does shape arithmetic of its own and never sees ONNX.

Conventions shared by all ops:

* Runtime tensors are contiguous, row-major (NCHW for images) and have one of five *storage
  dtypes*: ``float32`` (float32 and float64 tensors), ``int32`` (int16/32/64, uint16/32/64 and
  bool as 0/1, range-checked where values enter), and the narrow ``float16``, ``int8`` and
  ``uint8``, each held in its own size (``ITEMSIZE``). Arithmetic is defined on float32 and int32
  only (``COMPUTE_DTYPES``): the element-moving ops (Raster, Gather, Select, Scatter without a
  reduction) and the Unary ``identity`` (a conversion between any two storage dtypes) also take
  the narrow ones, and lowering converts a narrow tensor to its ``compute_dtype`` before any other
  op reads it (under ``precision="fp16"`` the ops of ``FLOAT16_COMPUTE_OPS`` also take float16
  storage, computing in float32). Every op carries ``dtype``, the storage dtype of its data operand. A backend lists
  the dtypes its kernels take (``Backend.dtypes``); an op it cannot run goes to the CPU. A tensor
  handle points at ``shape`` elements starting at an offset counted in elements of its own dtype
  inside a pool buffer; pools are laid out in bytes, every tensor starting on a 4-byte boundary
  at least (so that an API without 8- or 16-bit storage can hold narrow tensors packed in words).
* ``inputs`` / ``outputs`` are tensor names in the atomic program; the session maps them to
  backend handles. Optional inputs (a bias) are simply absent from ``inputs`` and the op says
  so with a flag.
* ``Activation`` is ``(unary_op_name, params)`` or ``None`` and is applied by the op's epilogue,
  with exactly the semantics of :class:`Unary` (see ``UNARY_OPS``).
* Strided descriptions use exactly ``RANK`` (=4) dimensions; unused leading dims have size 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

RANK = 4

FLOAT32 = "float32"
INT32 = "int32"
FLOAT16 = "float16"
INT8 = "int8"
UINT8 = "uint8"
#: storage dtypes of run-time tensors (see the module docstring)
STORAGE_DTYPES: tuple[str, ...] = (FLOAT32, INT32, FLOAT16, INT8, UINT8)
#: the storage dtypes arithmetic is defined on
COMPUTE_DTYPES: tuple[str, ...] = (FLOAT32, INT32)
#: the storage dtypes held in fewer than 4 bytes an element
NARROW_DTYPES: frozenset[str] = frozenset({FLOAT16, INT8, UINT8})
#: bytes an element of each storage dtype
ITEMSIZE: dict[str, int] = {FLOAT32: 4, INT32: 4, FLOAT16: 2, INT8: 1, UINT8: 1}
#: the atomic ops defined on the narrow storage dtypes (Unary as ``identity`` only, Scatter with
#: reduction ``none`` only): they move elements without arithmetic. The computing ops that read
#: a narrow dtype are a ``prequantized`` QuantizedMatMul (uint8), QuantizedConv2D, QuantizedAdd and
#: QuantizedGlobalAveragePool (uint8 and int8 in and out), each with its own arithmetic, and a max
#: Pool2D on int8 or uint8 (it compares and copies elements); Quantize writes uint8 or int8 from float32
NARROW_OPS: tuple[str, ...] = ("raster", "gather", "select", "scatter", "unary")
#: the computing ops also defined on float16 storage (``precision="fp16"``,
#: ``gpumnn.scheduler.precision``): every float operand and the result are float16, the arithmetic
#: and every sum are float32 inside the kernel. Unary and Binary only where the result is a float
#: (not the comparisons, ``not`` or ``nonzero``)
FLOAT16_COMPUTE_OPS: tuple[str, ...] = ("conv2d", "conv_transpose2d", "matmul", "pool2d", "unary", "binary",
                                        "softmax", "normalize")


def computes_on_float16(op: "AtomicOp") -> bool:
    """Whether ``op`` is a computing op on float16 storage that the contract defines (see
    ``FLOAT16_COMPUTE_OPS``): its ``dtype`` and result float16."""
    return (op.kind in FLOAT16_COMPUTE_OPS and op.dtype == FLOAT16 and op.output_dtype() == FLOAT16
            and not (op.kind == "unary" and getattr(op, "op", "") in ("not", "nonzero")))


def compute_dtype(storage: str) -> str:
    """The storage dtype a tensor of ``storage`` is computed in: float32 for the float types,
    int32 for the integer types."""
    return FLOAT32 if storage in (FLOAT32, FLOAT16) else INT32


#: the model dtypes gpumnn holds (bfloat16, the float8 and 4-bit types and strings it does not)
HELD_DTYPES: tuple[str, ...] = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                                "uint16", "uint32", "uint64", "bool")


#: storage_dtype's answers by the dtype (object or name) it was asked about
_STORAGE_OF: dict = {}


def storage_dtype(dtype) -> str:
    """The storage dtype a model's dtype is held in on every backend: float16, int8 and uint8 as
    themselves, float32 for float32/64, int32 for the other integer types and bool. TypeError for a
    dtype gpumnn does not hold."""
    try:
        return _STORAGE_OF[dtype]  # session preparation asks this thousands of times
    except (KeyError, TypeError):  # not asked yet, or not hashable
        pass
    import numpy as np
    held = np.dtype(dtype)
    if held.name not in HELD_DTYPES:
        raise TypeError(f"gpumnn holds no {held.name} tensors")
    storage = held.name if held.name in NARROW_DTYPES else FLOAT32 if held.kind == "f" else INT32
    try:
        _STORAGE_OF[dtype] = storage  # keys equal to one another name one dtype: one answer
    except TypeError:
        pass
    return storage


def fill_bits(fill: float, dtype: str) -> int:
    """The bits of one element of storage ``dtype`` that a Raster's ``fill`` is stored as, as an
    unsigned integer of ``ITEMSIZE[dtype]`` bytes (kernels that copy elements as bits write this)."""
    import numpy as np
    kind = {INT32: np.int32, INT8: np.int8, UINT8: np.uint8}.get(dtype)
    value = np.array(int(fill), dtype=np.int64).astype(kind) if kind else np.array(fill, dtype=dtype)
    return int(value.view(f"u{ITEMSIZE[dtype]}"))


Activation = tuple[str, tuple[float, ...]] | None

#: Unary ops and the number of float parameters each takes. Semantics (x is the input):
#: identity x; relu max(x,0); leaky_relu(a) x<0 ? a*x : x; clip(lo,hi); sigmoid; tanh; erf;
#: gelu 0.5*x*(1+erf(x/sqrt 2)); hard_sigmoid(a,b) clip(a*x+b,0,1); hard_swish x*clip(x/6+0.5,0,1);
#: exp; log; sqrt; neg; abs; reciprocal; floor; ceil; round (half to even); trunc (toward 0);
#: square; softplus log(1+exp x); elu(a) x<0 ? a*(exp x-1) : x; sign;
#: affine_pow(a,b,p) (a + b*x)^p  (used by LRN's lowering); selu(a,g) g*(x<=0 ? a*(exp x-1) : x);
#: celu(a) max(0,x) + min(0, a*(exp(x/a)-1)); mish x*tanh(softplus x); thresholded_relu(a)
#: x>a ? x : 0; round_f16: to the nearest float16 value (overflow to +-inf), so a Cast to float16
#: rounds as the model says though the tensor is held in float32;
#: not: x==0 ? 1 : 0; nonzero: x!=0 ? 1 : 0 (a Cast to bool; output int32); silu x*sigmoid(x).
#: ``identity`` from one storage dtype to another converts (float to int32 truncates toward 0).
UNARY_OPS: dict[str, int] = {
    "identity": 0, "relu": 0, "leaky_relu": 1, "clip": 2, "sigmoid": 0, "tanh": 0, "erf": 0,
    "gelu": 0, "hard_sigmoid": 2, "hard_swish": 0, "exp": 0, "log": 0, "sqrt": 0, "neg": 0,
    "abs": 0, "reciprocal": 0, "floor": 0, "ceil": 0, "round": 0, "trunc": 0, "square": 0,
    "softplus": 0, "elu": 1, "sign": 0, "affine_pow": 3, "selu": 2, "celu": 1, "mish": 0,
    "thresholded_relu": 1, "round_f16": 0, "not": 0, "nonzero": 0, "silu": 0,
}
#: the unary ops defined on int32 tensors (the rest are float32 only)
INT_UNARY_OPS: frozenset[str] = frozenset({"identity", "relu", "clip", "neg", "abs", "sign", "square", "not",
                                           "nonzero"})

#: Binary ops: add, sub, mul, div, pow, max, min, prelu (a<0 ? a*b : a); mod (the sign of b, as
#: Python's %), fmod (the sign of a, as C's fmod); the comparisons equal, less, less_equal,
#: greater, greater_equal and the logical and, or, xor (of 0/1 operands), whose output is int32
#: 0/1 whatever ``dtype`` is (and take no activation). On int32: div truncates toward zero (a zero
#: divisor gives 0); add, sub, mul wrap around; pow with a negative exponent is 1 / a**|b| truncated
#: toward zero (0 for a base of 0).
BINARY_OPS: tuple[str, ...] = ("add", "sub", "mul", "div", "pow", "max", "min", "prelu", "mod", "fmod",
                               "equal", "less", "less_equal", "greater", "greater_equal", "and", "or", "xor")
#: the binary ops whose output is int32 0/1 (a bool tensor) whatever their operands' dtype
BOOL_BINARY_OPS: frozenset[str] = frozenset({"equal", "less", "less_equal", "greater", "greater_equal",
                                             "and", "or", "xor"})
#: the binary ops defined on int32 operands
INT_BINARY_OPS: frozenset[str] = frozenset(BINARY_OPS) - {"prelu"}

#: Reduce ops; argmax / argmin give the int32 index of the first extreme along the axis.
REDUCE_OPS: tuple[str, ...] = ("sum", "mean", "max", "min", "argmax", "argmin")

#: Stable integer ids kernels use for the names above (their order in the tables).
UNARY_IDS: dict[str, int] = {name: i for i, name in enumerate(UNARY_OPS)}
BINARY_IDS: dict[str, int] = {name: i for i, name in enumerate(BINARY_OPS)}
REDUCE_IDS: dict[str, int] = {name: i for i, name in enumerate(REDUCE_OPS)}


@dataclass(frozen=True)
class AtomicOp:
    """Base of all atomic ops: what it reads and writes, and the ONNX node it came from."""

    kind: ClassVar[str] = "atomic"
    #: which input holds the data whose storage dtype is the op's ``dtype``
    data_input: ClassVar[int] = 0
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    source: str  # name of the ONNX node this op was lowered from (for reports and errors)
    #: storage dtype of the data operand (set by lowering from the tensors the op reads)
    dtype: str = FLOAT32

    def output_dtype(self) -> str:
        """Storage dtype of the op's (first) output."""
        return self.dtype

    def macs(self) -> int:
        """Multiply-accumulates (the paper's MUL) used by the placement cost model."""
        return 0


@dataclass(frozen=True)
class Region:
    """One strided copy of MNN's Raster: ``dst[dst_offset + sum(i*dst_strides)] =
    src[src_offset + sum(i*src_strides)]`` for every index ``i`` in ``size`` (RANK dims).

    ``src`` indexes the Raster op's ``inputs``. Strides may be zero (broadcast) or negative
    (reflection padding). Offsets and strides count elements.
    """

    src: int
    src_offset: int
    src_strides: tuple[int, ...]
    dst_offset: int
    dst_strides: tuple[int, ...]
    size: tuple[int, ...]

    @property
    def count(self) -> int:
        n = 1
        for s in self.size:
            n *= s
        return n


@dataclass(frozen=True)
class Raster(AtomicOp):
    """Data reorder: fill the output with ``fill`` (if not None) then copy every region.

    Transpose, Slice, Concat, Split, Pad, Tile, Expand, Gather with constant indices,
    DepthToSpace ... all become Rasters. Elements are copied as 32-bit words (any ``dtype``);
    ``fill`` is written as the word ``fill_bits(fill, dtype)``.
    """

    kind: ClassVar[str] = "raster"
    out_shape: tuple[int, ...] = ()
    regions: tuple[Region, ...] = ()
    fill: float | None = None


@dataclass(frozen=True)
class Unary(AtomicOp):
    """``out = op(x)`` elementwise over ``count`` elements; x is ``dtype``, out ``out_dtype``
    (empty: the same; int32 for ``nonzero``). ``identity`` between dtypes is a Cast."""

    kind: ClassVar[str] = "unary"
    op: str = "identity"
    params: tuple[float, ...] = ()
    count: int = 0
    out_dtype: str = ""

    def output_dtype(self) -> str:
        return self.out_dtype or self.dtype


@dataclass(frozen=True)
class Binary(AtomicOp):
    """``out[i] = op(a[i . a_strides], b[i . b_strides])`` over ``out_shape`` (RANK dims).

    Broadcasting is expressed by zero strides, so kernels need no broadcasting logic. An
    optional activation is applied to the result (residual Add + Relu fuse into one op).
    """

    kind: ClassVar[str] = "binary"
    op: str = "add"
    out_shape: tuple[int, ...] = (1, 1, 1, 1)
    a_strides: tuple[int, ...] = (0, 0, 0, 0)
    b_strides: tuple[int, ...] = (0, 0, 0, 0)
    activation: Activation = None

    def output_dtype(self) -> str:
        return INT32 if self.op in BOOL_BINARY_OPS else self.dtype


@dataclass(frozen=True)
class Reduce(AtomicOp):
    """Input viewed as ``[outer, size, inner]``; reduce the middle axis -> ``[outer, inner]``."""

    kind: ClassVar[str] = "reduce"
    op: str = "sum"
    outer: int = 1
    size: int = 1
    inner: int = 1

    def output_dtype(self) -> str:
        return INT32 if self.op in ("argmax", "argmin") else self.dtype


@dataclass(frozen=True)
class MatMul(AtomicOp):
    """Batched GEMM: ``out[b] = act(alpha * op(A[b]) @ op(B[b]) + beta * bias)``.

    A is ``[M, K]`` (``[K, M]`` when ``trans_a``) at element offset ``b * a_batch_stride``;
    B is ``[K, N]`` (``[N, K]`` when ``trans_b``) at ``b * b_batch_stride`` (0 = shared
    weights). Output ``[batch, M, N]`` contiguous. Bias (third input when ``has_bias``) element
    ``(m, n)`` is at ``m * bias_strides[0] + n * bias_strides[1]`` (zero strides broadcast).
    """

    kind: ClassVar[str] = "matmul"
    batch: int = 1
    m: int = 1
    n: int = 1
    k: int = 1
    a_batch_stride: int = 0
    b_batch_stride: int = 0
    trans_a: bool = False
    trans_b: bool = False
    alpha: float = 1.0
    beta: float = 1.0
    has_bias: bool = False
    bias_strides: tuple[int, int] = (0, 1)
    activation: Activation = None
    #: ``gemm``, or ``strassen`` (with ``strassen_levels``), chosen by the session's scheme step;
    #: Strassen is rewritten into atomic ops before any backend sees it (``gpumnn.scheduler.expansion``)
    scheme: str = "gemm"
    strassen_levels: int = 0

    def macs(self) -> int:
        return self.batch * self.m * self.n * self.k


#: the largest inner dimension of a QuantizedMatMul: K * 255 * 128 must fit its int32 sums
QUANTIZED_MAX_K = 65536
#: what a QuantizedMatMul's int4 ``block`` is a multiple of: the steps of K one int32 word of the
#: int8 kernels' panels holds
INT4_BLOCK_STEP = 4


@dataclass(frozen=True)
class QuantizedMatMul(AtomicOp):
    """Dynamically quantized product (MNN's dynamic quantization): ``out[M, N]`` float32 from x
    float32 ``[M, K]`` quantized per row at run time and a constant int8 weight ``[K, N]``.

    Inputs: x ``[M, K]``; weight int8 ``[K, N]`` (symmetric, values in [-127, 127]); weight_scale
    float32 ``[N]`` (one per column); bias float32 ``[N]`` when ``has_bias``. Each row m of x is
    quantized to uint8, asymmetric, all arithmetic in float32 and ``rint`` rounding half to even::

        lo = min(0, min_k x[m, k]);  hi = max(0, max_k x[m, k])
        scale[m] = (hi - lo) / 255, or 1 where that is 0
        zero[m] = clip(rint(-lo / scale[m]), 0, 255)
        q[m, k] = clip(rint(x[m, k] / scale[m]) + zero[m], 0, 255)

    The product is exact in int32, ``acc[m, n] = sum_k q[m, k] * weight[k, n]``, and the epilogue
    dequantizes: ``out[m, n] = act(float32(acc[m, n] - zero[m] * colsum[n]) * (scale[m] *
    weight_scale[n]) + bias[n])`` with ``colsum[n] = sum_k weight[k, n]``. x must be finite; K is
    at most ``QUANTIZED_MAX_K``. The session's ``precision="int8"`` rewrites MatMuls with constant
    weights into this op (``gpumnn.scheduler.precision``).

    With ``prequantized`` x is already uint8 (``dtype`` "uint8"), quantized once for the whole
    tensor as ONNX's DynamicQuantizeLinear does: the inputs are x uint8 ``[M, K]``, weight int8
    ``[K, N]`` (any int8 value), weight_scale float32 ``[N]``, x_scale float32 ``[1]``, x_zero_point
    uint8 ``[1]``, then bias when ``has_bias``; ``scale[m]`` and ``zero[m]`` above are x_scale and
    x_zero_point for every row, and the epilogue is the same. That is ONNX Runtime's unfused
    ``Cast(MatMulInteger(x, weight, x_zero_point)) * (x_scale * weight_scale)`` operation for
    operation, so the MatMulInteger lowering rewrites that pattern of ``quantize_dynamic`` models into it.

    With ``block`` > 0 (``precision="int4"``) the weight is int4 with a scale per ``block`` steps
    of K (a multiple of ``INT4_BLOCK_STEP``) and column: the weight input is uint8 ``[ceil(K / 2),
    N]``, two steps of K a byte (step 2i in the low nibble, 2i + 1 in the high one, each a two's
    complement value in [-7, 7]), weight_scale is float32 ``[ceil(K / block), N]``. The sums are
    exact per block, ``acc_b[m, n] = sum_{k in block b} q[m, k] * weight[k, n]`` with ``colsum_b``
    likewise; each is scaled and the blocks added in order, every operation rounded to float32::

        sums[m, n] = sum_b float32(acc_b[m, n]) * weight_scale[b, n]
        weight_sums[n] = sum_b float32(colsum_b[n]) * weight_scale[b, n]
        out[m, n] = act((sums[m, n] - zero[m] * weight_sums[n]) * scale[m] + bias[n])

    so the zero point's share is taken once, not per block.
    """

    kind: ClassVar[str] = "quantized_matmul"
    m: int = 1
    n: int = 1
    k: int = 1
    has_bias: bool = False
    activation: Activation = None
    prequantized: bool = False
    block: int = 0

    def macs(self) -> int:
        return self.m * self.n * self.k

    def output_dtype(self) -> str:
        return FLOAT32

    def bias_input(self) -> int:
        """The position of the bias among the inputs (when ``has_bias``)."""
        return 5 if self.prequantized else 3


@dataclass(frozen=True)
class ConvGeometry(AtomicOp):
    """Fields shared by Conv2D and ConvTranspose2D (NCHW, 2D kernel, groups, fused epilogue)."""

    batch: int = 1
    in_channels: int = 1
    in_hw: tuple[int, int] = (1, 1)
    out_channels: int = 1
    out_hw: tuple[int, int] = (1, 1)
    kernel: tuple[int, int] = (1, 1)
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int] = (0, 0)
    dilations: tuple[int, int] = (1, 1)
    groups: int = 1
    has_bias: bool = False
    activation: Activation = None


@dataclass(frozen=True)
class Conv2D(ConvGeometry):
    """NCHW convolution: inputs x ``[N,C,H,W]``, weight ``[OC, C/groups, KH, KW]``, bias ``[OC]``.

    ``pads`` is (top, left); bottom/right padding is implied by ``out_hw``. ``scheme`` is chosen
    by the session's scheme selection (``gpumnn.scheduler.schemes``, the only place that decides)
    and names the kernel a backend builds: ``im2col`` (the sliding window, correct for any
    geometry, so the default for ops made outside a session), ``gemm1x1``, ``depthwise``; or
    ``winograd`` (with ``winograd_tile``), which is rewritten into atomic ops before any backend
    sees it (``gpumnn.scheduler.expansion``) unless the backend builds it as a kernel of its own (the cpu).

    A residual (last input when ``has_residual``: float32 ``[N, OC, OH, OW]``, the output's shape,
    contiguous) is added by the epilogue, element by element, after the bias and before the
    activation: ``out = act((conv(x) + bias) + residual)``, each sum rounded to float32 in that
    order, so the result equals Conv2D followed by a Binary add of the residual with the
    activation. The scheme step fuses a residual add (``gpumnn.scheduler.schemes.fuse_residuals``,
    the only place that decides) where the backend's kernel for the chosen scheme takes one
    (``Backend.residual_schemes``); the residual never shares memory with the output.
    """

    kind: ClassVar[str] = "conv2d"
    scheme: str = "im2col"
    winograd_tile: int = 0
    has_residual: bool = False

    def macs(self) -> int:
        return (self.batch * self.out_channels * self.out_hw[0] * self.out_hw[1]
                * (self.in_channels // self.groups) * self.kernel[0] * self.kernel[1])


@dataclass(frozen=True)
class QuantizedConv2D(ConvGeometry):
    """Static int8 convolution (ONNX Runtime's fused QDQ Conv and QLinearConv, QNNPACK's operator):
    8-bit NCHW in, 8-bit NCHW out, an int32 sum and a requantizing epilogue.

    Inputs: x ``[N, C, H, W]`` uint8 or int8 (``dtype``); weight int8 ``[OC, C/groups, KH, KW]``
    (symmetric: no zero point); bias int32 ``[OC]``; multiplier float32 ``[OC]`` (x_scale *
    w_scale[oc] / y_scale, per output channel or the same for all)::

        acc[n, oc, p] = bias[oc] + sum over the window of (x - x_zero_point) * weight   (int32;
                        padding adds nothing, as if it held x_zero_point)
        out[n, oc, p] = clip(rint(float32(acc) * multiplier[oc]) + y_zero_point, lo, hi)

    in float32, ``rint`` rounding half to even; ``out`` is ``out_dtype`` (uint8 or int8) and
    ``[lo, hi]`` its range, narrowed where a Relu or Clip before the output's QuantizeLinear is fused.
    A Gemm or MatMul of M rows by a constant weight is this op with a 1x1 kernel on 1x1 planes
    (batch M, C = K, OC = N). Lowering makes it only where the backend that decides schemes builds
    it (``gpumnn.scheduler.precision.lowers_static_int8``). ``has_bias`` and ``activation`` are
    unused: the bias is always an input and the clamp is ``[lo, hi]``. ``scheme`` (``im2col``,
    ``gemm1x1``, ``depthwise``) is chosen by scheme selection from the geometry.

    ``channels_last`` (a depthwise convolution only, on a backend whose ``int8_channels_last`` says
    it builds it): x is ``[N, H, W, C]`` and out ``[N, OH, OW, OC]``, each pixel's channels
    contiguous; the sums are the same. A 1x1 convolution on channels-last activations needs no flag:
    it is the product of their rows (batch N*H*W, 1x1 planes). ``out_channels_last`` (a convolution
    over NCHW x whose readers take channels-last activations: an image's first one, on the same
    backends): x is ``[N, C, H, W]`` and out ``[N, OH, OW, OC]``.
    """

    kind: ClassVar[str] = "quantized_conv2d"
    scheme: str = "im2col"
    x_zero_point: int = 0
    y_zero_point: int = 0
    out_dtype: str = UINT8
    lo: int = 0
    hi: int = 255
    channels_last: bool = False
    out_channels_last: bool = False

    def output_dtype(self) -> str:
        return self.out_dtype

    def macs(self) -> int:
        return (self.batch * self.out_channels * self.out_hw[0] * self.out_hw[1]
                * (self.in_channels // self.groups) * self.kernel[0] * self.kernel[1])


@dataclass(frozen=True)
class RequantizedOp(AtomicOp):
    """An op on 8-bit values whose float32 results are requantized into ``out_dtype`` (uint8 or
    int8): ``rint`` plus ``y_zero_point``, clipped to ``[lo, hi]`` (the type's range, narrowed where a
    Relu or Clip before the output's QuantizeLinear is fused)."""

    y_zero_point: int = 0
    out_dtype: str = UINT8
    lo: int = 0
    hi: int = 255

    def output_dtype(self) -> str:
        return self.out_dtype


@dataclass(frozen=True)
class QuantizedAdd(RequantizedOp):
    """Static int8 sum (ONNX Runtime's fused QDQ Add and QLinearAdd): ``count`` elements of a and b
    (inputs 0 and 1, both ``dtype``: uint8 or int8), each with its own scale and zero point, into
    ``count`` elements of ``out_dtype`` (uint8 or int8)::

        sum = float32(a - a_zero_point) * a_scale + float32(b - b_zero_point) * b_scale
        out = clip(rint(sum / y_scale) + y_zero_point, lo, hi)

    every operation rounded to float32 in the order written (two products, their sum, the quotient,
    no fused multiply-add), ``rint`` rounding half to even: DequantizeLinear, Add and QuantizeLinear
    as the float path computes them, so a kernel that divides correctly rounded gives the float
    path's bits. ``[lo, hi]`` is the output type's range, narrowed where a Relu or Clip before the
    output's QuantizeLinear is fused. The scales are float32 values (positive, finite).
    """

    kind: ClassVar[str] = "quantized_add"
    count: int = 1
    a_scale: float = 1.0
    a_zero_point: int = 0
    b_scale: float = 1.0
    b_zero_point: int = 0
    y_scale: float = 1.0


@dataclass(frozen=True)
class Quantize(RequantizedOp):
    """ONNX's QuantizeLinear per tensor in one pass: ``count`` float32 elements of x (input 0) into
    ``count`` elements of ``out_dtype`` (uint8 or int8)::

        out = clip(rint(x / y_scale) + y_zero_point, lo, hi)

    in float32 (the quotient correctly rounded, ``rint`` rounding half to even), the five ops the
    lowering otherwise writes (div, round, add, clip, the conversion) with the same bits. ``y_scale``
    is a positive, finite float32 value; ``[lo, hi]`` the output type's range. Lowering makes it only
    where the session's scheme backend has a kernel for it (``gpumnn.scheduler.precision.one_pass_quantize``).
    """

    kind: ClassVar[str] = "quantize"
    count: int = 1
    y_scale: float = 1.0


@dataclass(frozen=True)
class QuantizedGlobalAveragePool(RequantizedOp):
    """Static int8 global average pooling (a QDQ model's DequantizeLinear -> GlobalAveragePool ->
    QuantizeLinear): the ``batch * channels`` planes of ``pixels`` elements of x (input 0, ``dtype``:
    uint8 or int8) into one element each of ``out_dtype`` (uint8 or int8)::

        sum = sum over the plane of (x - x_zero_point)          exact, in int32
        out = clip(rint(float32(sum) * multiplier) + y_zero_point, lo, hi)

    ``multiplier`` is the float32 value of ``x_scale / (y_scale * pixels)``, the product rounded to
    float32 and ``rint`` rounding half to even: the float path's mean, to within its own rounding.
    ``channels_last``: x is ``[N, H, W, C]`` (a channels-last int8 producer's), else ``[N, C, H, W]``;
    out is ``[N, C, 1, 1]`` either way (the same elements in the same order). ``[lo, hi]`` is the
    output type's range, narrowed where a Relu or Clip before the QuantizeLinear is fused.
    """

    kind: ClassVar[str] = "quantized_global_average_pool"
    batch: int = 1
    channels: int = 1
    pixels: int = 1
    channels_last: bool = False
    x_zero_point: int = 0
    multiplier: float = 1.0


@dataclass(frozen=True)
class ConvTranspose2D(ConvGeometry):
    """NCHW transposed convolution; weight ``[C, OC/groups, KH, KW]`` (ONNX layout).

    ``out[n, oc, oh, ow] += x[n, c, ih, iw] * w[c, oc', kh, kw]`` where
    ``oh = ih*stride - pad_top + kh*dilation`` (and likewise for w), plus bias.
    """

    kind: ClassVar[str] = "conv_transpose2d"

    def macs(self) -> int:
        return (self.batch * self.in_channels * self.in_hw[0] * self.in_hw[1]
                * (self.out_channels // self.groups) * self.kernel[0] * self.kernel[1])


@dataclass(frozen=True)
class Pool2D(AtomicOp):
    """Max or average pooling over NCHW; windows clipped to the input (padding never wins a
    max). Average divides by the full window when ``count_include_pad`` (the window clipped to
    the padded input) else by the number of real input elements. Max pooling is also defined on
    int32, int8 and uint8 (the largest element, copied; a window of padding only is then the
    type's least value); average pooling on the float dtypes only."""

    kind: ClassVar[str] = "pool2d"
    op: str = "max"
    batch: int = 1
    channels: int = 1
    in_hw: tuple[int, int] = (1, 1)
    out_hw: tuple[int, int] = (1, 1)
    kernel: tuple[int, int] = (1, 1)
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    count_include_pad: bool = False


@dataclass(frozen=True)
class Softmax(AtomicOp):
    """Input viewed as ``[outer, size, inner]``; (log-)softmax along the middle axis."""

    kind: ClassVar[str] = "softmax"
    outer: int = 1
    size: int = 1
    inner: int = 1
    log: bool = False


@dataclass(frozen=True)
class Normalize(AtomicOp):
    """Input viewed as ``[outer, size]``: ``(x - mean) / sqrt(var + eps)`` per row, then
    ``* scale + bias`` (inputs 2 and 3, each ``[size]``) when ``has_affine``. LayerNorm is one
    op; InstanceNorm is this plus a per-channel Binary mul/add."""

    kind: ClassVar[str] = "normalize"
    outer: int = 1
    size: int = 1
    eps: float = 1e-5
    has_affine: bool = False


@dataclass(frozen=True)
class Resize(AtomicOp):
    """Spatial resize of ``[N*C, H, W]`` planes to ``out_hw`` (ONNX Resize semantics).

    ``mode``: ``nearest`` or ``linear``. ``coord``: ``half_pixel``, ``pytorch_half_pixel``,
    ``align_corners``, ``asymmetric``. ``nearest_mode``: ``round_prefer_floor``,
    ``round_prefer_ceil``, ``floor``, ``ceil``. ``scales`` are output/input per axis (h, w).
    Source coordinate: half_pixel (o+0.5)/s-0.5; pytorch_half_pixel same but 0 when the output
    size is 1; align_corners o*(in-1)/(s*in-1) (the unrounded output length, as the ONNX reference;
    0 when out==1); asymmetric o/s. Other modes (cubic, antialias, crops) are lowered to MatMuls.
    """

    kind: ClassVar[str] = "resize"
    planes: int = 1
    in_hw: tuple[int, int] = (1, 1)
    out_hw: tuple[int, int] = (1, 1)
    scales: tuple[float, float] = (1.0, 1.0)
    mode: str = "nearest"
    coord: str = "half_pixel"
    nearest_mode: str = "round_prefer_floor"


@dataclass(frozen=True)
class Gather(AtomicOp):
    """Gather with run-time indices: data ``[outer, axis, inner]``, indices (int32, negative
    counted from the end) ``[count]`` -> out ``[outer, count, inner]``, elements copied as words.
    Out-of-range indices are clamped to the axis (run-time data cannot raise mid-kernel on a
    GPU, so every backend clamps). Gathers with constant indices are Rasters instead;
    GatherElements and GatherND are this op on a flat view with indices computed by Binary ops."""

    kind: ClassVar[str] = "gather"
    outer: int = 1
    axis: int = 1
    inner: int = 1
    count: int = 1


@dataclass(frozen=True)
class Select(AtomicOp):
    """Where: ``out[i] = cond[i . c_strides] != 0 ? a[i . a_strides] : b[i . b_strides]`` over
    ``out_shape`` (RANK dims, zero strides broadcast). Inputs ``(cond int32, a, b)``; a, b and
    out are ``dtype`` and copied as words."""

    kind: ClassVar[str] = "select"
    data_input: ClassVar[int] = 1
    out_shape: tuple[int, ...] = (1, 1, 1, 1)
    c_strides: tuple[int, ...] = (0, 0, 0, 0)
    a_strides: tuple[int, ...] = (0, 0, 0, 0)
    b_strides: tuple[int, ...] = (0, 0, 0, 0)


@dataclass(frozen=True)
class CumSum(AtomicOp):
    """Input viewed as ``[outer, size, inner]``: running sums along the middle axis, from the end
    when ``reverse``, each excluding its own element when ``exclusive`` (ONNX CumSum)."""

    kind: ClassVar[str] = "cumsum"
    outer: int = 1
    size: int = 1
    inner: int = 1
    exclusive: bool = False
    reverse: bool = False


@dataclass(frozen=True)
class TopK(AtomicOp):
    """Input viewed as ``[outer, size, inner]`` -> int32 indices ``[outer, k, inner]`` of the ``k``
    largest (smallest unless ``largest``) elements along the middle axis, in order of value
    (largest first, or smallest first), equal values by lower index first. The values are a
    Gather of these indices, done by the lowering."""

    kind: ClassVar[str] = "topk"
    outer: int = 1
    size: int = 1
    inner: int = 1
    k: int = 1
    largest: bool = True

    def output_dtype(self) -> str:
        return INT32


@dataclass(frozen=True)
class Scatter(AtomicOp):
    """ScatterND / ScatterElements: ``out = data`` (``[rows, inner]``), then for each ``j <
    count``, row ``index[j]`` of out (negative counted from the end, out of range clamped) becomes
    ``updates[j]`` (``reduction`` none) or is combined with it (add, mul, max, min). Inputs
    ``(data, index int32 [count], updates [count, inner])``. With ``none`` and a repeated index
    one of the writes wins (ONNX leaves the order undefined)."""

    kind: ClassVar[str] = "scatter"
    rows: int = 1
    inner: int = 1
    count: int = 1
    reduction: str = "none"


#: The activations of a recurrent cell (ONNX's list for LSTM/GRU/RNN, lower case), by the id
#: kernels use (their order here); each is ``(name, alpha, beta)`` with x the gate's input:
#: relu max(x,0); tanh; sigmoid; affine a*x+b; leakyrelu x<0 ? a*x : x; thresholdedrelu x>a ? x : 0;
#: scaledtanh a*tanh(b*x); hardsigmoid clip(a*x+b,0,1); elu x<0 ? a*(exp x-1) : x;
#: softsign x/(1+|x|); softplus log(1+exp x).
CELL_ACTIVATIONS: tuple[str, ...] = ("relu", "tanh", "sigmoid", "affine", "leakyrelu", "thresholdedrelu",
                                     "scaledtanh", "hardsigmoid", "elu", "softsign", "softplus")
CELL_ACTIVATION_IDS: dict[str, int] = {name: i for i, name in enumerate(CELL_ACTIVATIONS)}
#: the cells RecurrentCell computes: (gate blocks of the projection, activations per direction)
CELLS: dict[str, tuple[int, int]] = {"rnn": (1, 1), "gru": (3, 2), "gru_reset": (3, 1), "lstm": (4, 3)}
#: RecurrentCell's boolean fields in the bit order kernels take them as one flags word
CELL_FLAG_FIELDS: tuple[str, ...] = ("input_forget", "linear_before_reset", "has_recurrent_bias", "has_peephole",
                                     "has_lengths")


@dataclass(frozen=True)
class RecurrentCell(AtomicOp):
    """One time step of ``directions`` LSTM, GRU or RNN cells (ONNX semantics), elementwise.

    Sizes: D = ``directions``, B = ``batch``, H = ``hidden``, G = ``gate_blocks`` (LSTM 4, RNN 1,
    GRU 3 with ``linear_before_reset``, else 2, as for ``gru_reset``). Inputs, in this order, the
    optional ones present by their flags (``input_roles()`` names them):

    * ``gates`` ``[D, B, G*H]``: the recurrent products ``H_{t-1} . R_g^T`` of the first G gates,
      side by side in ONNX's gate order (LSTM i, o, f, c; GRU z, r, h; RNN the one);
    * ``projection``: the input projections ``x . W^T + biases`` of every step, each direction's
      gates (all of them: ``CELLS``) side by side in ONNX's order; gate ``g`` of
      direction ``d`` and batch row ``b`` this step is read at element
      ``x_offsets[d] + b * x_row_stride + g * H + j`` (the cell takes the whole tensor, so the
      step's slice needs no copy);
    * ``state`` ``[S, D, B, H]``: the previous state, ``S`` = 2 for LSTM (H then C), else 1;
    * ``candidate`` ``[D, B, H]`` (``gru`` without ``linear_before_reset``): ``(r . H) . Rh^T``;
    * ``recurrent_bias`` ``[D, H]`` (``gru`` with ``linear_before_reset``, when ``has_recurrent_bias``): Rbh;
    * ``peephole`` ``[D, 3*H]`` (``lstm``, when ``has_peephole``): P in ONNX's order (i, o, f);
    * ``lengths`` int32 ``[B]`` (when ``has_lengths``): the sequence lengths.

    With ``pre_g = clip(x_g + gates_g)`` (``clip`` > 0 bounds it to [-clip, clip]; 0: none) and the
    activations ``f, g, h`` of direction d (``activations[d * A + k]``, A per ``CELLS``):

    * ``rnn``: ``H' = f(pre_0)``;
    * ``lstm``: ``i = f(clip(x_i + gates_i + P_i C))``, ``f = f(clip(x_f + gates_f + P_f C))`` (or
      ``1 - i`` when ``input_forget``), ``c = g(pre_c)``, ``C' = f C + i c``,
      ``o = f(clip(x_o + gates_o + P_o C'))``, ``H' = o h(C')``; output ``[2, D, B, H]`` (H', C');
    * ``gru``: ``z = f(pre_z)``, ``r = f(pre_r)``, ``n = g(clip(x_h + r (gates_h + Rbh)))`` with
      ``linear_before_reset``, else ``n = g(clip(x_h + candidate))``; ``H' = n + z (H - n)``;
    * ``gru_reset``: the output is ``r . H`` with ``r = f(pre_r)`` (the input of the candidate's
      product), ``[D, B, H]``.

    With ``has_lengths``, a batch row whose length is at most ``steps[d]`` (this step's time index
    in direction d) keeps its state: the output is the state input's (``rnn``, ``gru``, ``lstm``).
    """

    kind: ClassVar[str] = "recurrent_cell"
    cell: str = "lstm"
    directions: int = 1
    batch: int = 1
    hidden: int = 1
    x_offsets: tuple[int, ...] = (0,)
    x_row_stride: int = 0
    steps: tuple[int, ...] = (0,)
    #: ``(name, alpha, beta)`` per activation, direction after direction (see ``CELL_ACTIVATIONS``)
    activations: tuple[tuple[str, float, float], ...] = ()
    clip: float = 0.0
    input_forget: bool = False
    linear_before_reset: bool = False
    has_recurrent_bias: bool = False
    has_peephole: bool = False
    has_lengths: bool = False

    @property
    def gate_blocks(self) -> int:
        """Blocks ``[.., H]`` per row of the ``gates`` input (see the class docstring)."""
        if self.cell == "gru_reset" or self.cell == "gru" and not self.linear_before_reset:
            return 2
        return CELLS[self.cell][0]

    @property
    def state_blocks(self) -> int:
        """Blocks ``[D, B, H]`` of the state input: 2 for LSTM (H, C), else 1."""
        return 2 if self.cell == "lstm" else 1

    @property
    def output_blocks(self) -> int:
        return 1 if self.cell == "gru_reset" else self.state_blocks

    def input_roles(self) -> tuple[str, ...]:
        """The names of the inputs this op reads, in ``inputs`` order (see the class docstring)."""
        roles = ["gates", "projection", "state"]
        if self.cell == "gru" and not self.linear_before_reset:
            roles.append("candidate")
        if self.cell == "gru" and self.linear_before_reset and self.has_recurrent_bias:
            roles.append("recurrent_bias")
        if self.cell == "lstm" and self.has_peephole:
            roles.append("peephole")
        if self.has_lengths and self.cell != "gru_reset":
            roles.append("lengths")
        return tuple(roles)

    @property
    def flags(self) -> int:
        """The boolean fields as one word (bit k: ``CELL_FLAG_FIELDS[k]``), as kernels take them."""
        return sum(1 << k for k, name in enumerate(CELL_FLAG_FIELDS) if getattr(self, name))

    def macs(self) -> int:
        return self.directions * self.batch * self.hidden * self.gate_blocks


def recurrent_cell_violation(op: RecurrentCell) -> str | None:
    """Why ``op`` is outside the RecurrentCell contract (its cell, activations, per-direction
    sizes or inputs), or None."""
    if op.cell not in CELLS:
        return f"unknown recurrent cell {op.cell!r}"
    if len(op.activations) != op.directions * CELLS[op.cell][1]:
        return f"{len(op.activations)} activations for {op.directions} {op.cell} direction(s)"
    unknown = [a[0] for a in op.activations if a[0] not in CELL_ACTIVATIONS]
    if unknown:
        return f"unknown recurrent cell activation {unknown[0]!r}"
    if len(op.x_offsets) != op.directions or len(op.steps) != op.directions:
        return f"x_offsets and steps must give one value per direction ({op.directions})"
    if len(op.inputs) != len(op.input_roles()):
        return f"{len(op.inputs)} inputs where the cell reads {', '.join(op.input_roles())}"
    return None


ALL_OPS: tuple[type[AtomicOp], ...] = (
    Raster, Unary, Binary, Reduce, MatMul, QuantizedMatMul, Conv2D, QuantizedConv2D, QuantizedAdd,
    QuantizedGlobalAveragePool, Quantize, ConvTranspose2D, Pool2D, Softmax, Normalize, Resize, Gather, Select, CumSum,
    TopK, Scatter, RecurrentCell,
)


@dataclass
class AtomicProgram:
    """The lowered model: ops in execution order and every runtime tensor's shape.

    ``constants`` hold weights (in their storage dtype, ``STORAGE_DTYPES``) that backends upload
    once. ``aliases`` map a tensor to the tensor whose memory it shares (Reshape/Flatten/Squeeze
    are free views), from ``view_offsets`` bytes in (a concatenation's input written in place
    into its slice of the output; 0 where absent). ``dtypes`` give every run-time tensor's dtype as the model has it (int64,
    bool, float16, ...); ``storage_dtype`` says how it is held.
    """

    ops: list[AtomicOp]
    shapes: dict[str, tuple[int, ...]]
    constants: dict[str, "object"]
    inputs: list[str]
    outputs: list[str]
    aliases: dict[str, str] = field(default_factory=dict)
    #: graph outputs whose values were fully known at session creation (folded constants)
    folded_outputs: dict[str, "object"] = field(default_factory=dict)
    #: the scheme chosen for each convolution and matrix product (``gpumnn.scheduler.schemes.Decision``)
    decisions: list = field(default_factory=list)
    dtypes: dict[str, "object"] = field(default_factory=dict)
    #: nodes whose convolutions sum integer-valued float32 products that must stay exact (an int32
    #: accumulation: QLinearConv, ConvInteger): scheme selection gives them no Winograd, whose
    #: transforms round
    exact_integer_sources: frozenset = frozenset()
    #: bytes from the start of the aliased tensor at which an alias starts (``scheduler.concat``)
    view_offsets: dict[str, int] = field(default_factory=dict)

    def storage_dtype_of(self, name: str) -> str:
        """The storage dtype of a run-time tensor or constant (float32 unless the model says otherwise)."""
        if name in self.constants:
            return storage_dtype(self.constants[name].dtype)
        dtype = self.dtypes.get(name)
        return FLOAT32 if dtype is None else storage_dtype(dtype)

    def nbytes_of(self, name: str) -> int:
        """Bytes a run-time tensor or constant takes in its storage dtype."""
        if name in self.constants:
            return ITEMSIZE[self.storage_dtype_of(name)] * int(getattr(self.constants[name], "size", 1))
        size = 1
        for d in self.shapes[name]:
            size *= int(d)
        return ITEMSIZE[self.storage_dtype_of(name)] * size

    def storage_of(self, name: str) -> str:
        """The tensor that owns the memory ``name`` lives in."""
        while name in self.aliases:
            name = self.aliases[name]
        return name

    def offset_in_storage(self, name: str) -> int:
        """Bytes from the start of ``storage_of(name)`` at which ``name`` starts."""
        offset = 0
        while name in self.aliases:
            offset += self.view_offsets.get(name, 0)
            name = self.aliases[name]
        return offset
