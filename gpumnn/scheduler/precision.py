"""The session's ``precision``: the one place that knows the precisions and what each changes,
and that decides where a statically quantized model computes in int8 (``lowers_static_int8``).

``fp32`` (the default) changes nothing: float32 arithmetic everywhere, no TF32 in any kernel.

``tf32`` changes the kernels, not the program: on cuda the convolution and GEMM tiles multiply on
tensor cores (``mma.sync`` m16n8k8, operands rounded to TF32's 10-bit mantissa, float32 sums;
the backend option ``tf32=True``: :func:`backend_options`). Depthwise convolutions, matrix-vector
products and every other op stay float32. Only cuda has such kernels: a session on any other
backend refuses ``tf32`` (ValueError) rather than run float32 under its name; ops that
placement moves from cuda to the cpu run there in float32. Expect a relative L2 error of about
1e-3 against float32 on a network, checked below ``TOLERANCES``.

``int8`` is MNN's dynamic quantization (seed 004), with no calibration data: every MatMul with a
constant weight becomes a ``QuantizedMatMul`` whose weight is quantized here, once per prepared
shape set, per output column and symmetric in int8, and whose input rows are quantized at run
time (uint8, asymmetric: a row after GELU or ReLU is mostly on one side of 0, so its zero point
keeps a bit that a symmetric int8 row would spend on the empty side). The product sums in int32
and the result is dequantized to float32, so the ops around it are untouched.

``int4`` is ``int8`` with the weights in 4 bits (seed 004's weight groups): each block of
``INT4_BLOCK`` steps of K of a column has its own scale, the values symmetric in [-7, 7], two to a
byte, so the products' weights take about a sixth of their float32 bytes (scales included) where
int8's take a quarter. The rows are quantized as for ``int8``; the sums are exact per block and
added across blocks in float32 (``A.QuantizedMatMul``'s ``block``). Backends without such a kernel
(``Backend.int4_weights``) leave these products to the cpu.

``fp16`` holds weights and activations in float16 (half the bytes) where the session's scheme
backend (its GPU) has float16 kernels, which compute and sum in float32 (``A.FLOAT16_COMPUTE_OPS``):
after schemes are chosen and expanded, :func:`apply_storage_precision` makes float16 every float32
run-time tensor whose writers all have such a kernel there, rewrites those ops onto float16 (their
float weights become float16 constants) and converts (Unary ``identity``) where a float16 tensor
meets an op without one, and where a graph input enters or an output leaves: those stay float32
(an output's writer computes on float16 and its result is converted).
The transforms and products inside a Winograd or Strassen rewrite stay float32: rounding them to
float16 between its stages would add an error per stage (the GPU kernels' own Winograd keeps
them in float32 scratch). A backend with no float16 arithmetic kernels at all (the cpu) runs the
session in float32. On cuda GPUs of compute capability 8.0 and later (:func:`tensor_cores`) the
convolution and GEMM tiles over float16 storage multiply on tensor cores (``mma.sync`` m16n8k16,
float16 operands, float32 sums: the products of float16 values are exact in float32, so the error is
that of the float16 storage, as on the other GPUs); on older GPUs they multiply in float32.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any, Sequence

import numpy as np

from .. import atomic as A
from ..backends.kernels.cl.planner import TENSOR_CORE_CAPABILITY
from ..numerics.int4 import pack_int4
from .expansion import is_rewrite_tensor

#: the values of ``Session``'s ``precision`` option
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "int8", "int4", "fp16")
#: the precisions that quantize the products' weights at session creation (``apply_precision``)
WEIGHT_PRECISIONS: tuple[str, ...] = ("int8", "int4")
#: the precisions that choose kernels instead of rewriting the program: per backend that has such
#: kernels, the backend options that select them
KERNEL_PRECISIONS: dict[str, dict[str, dict[str, Any]]] = {"tf32": {"cuda": {"tf32": True}}}
#: the relative L2 error against float32 (ONNX Runtime's) within which a kernel precision keeps a
#: zoo network's output: TF32 rounds each operand to 2^-11 relative, about 1e-3 on a network; the
#: cuda tests check this bound where a GPU runs them
TOLERANCES: dict[str, float] = {"tf32": 1e-2}
#: the widest value of int8 weights (symmetric: -128 is never used)
INT8_MAX = 127
#: the widest value of int4 weights (symmetric: -8 is never used)
INT4_MAX = 7
#: the steps of K that share one scale of an int4 weight's column (seed 004 groups 32 to 128;
#: the smallest keeps the error lowest, and its scales add a quarter to the 4-bit values' bytes)
INT4_BLOCK = 32


#: the atomic ops a statically quantized model is lowered to (``lowers_static_int8``)
STATIC_INT8_OPS: tuple[type, ...] = (A.QuantizedConv2D, A.QuantizedAdd)


def lowers_static_int8(backend) -> bool:
    """Whether a statically quantized model's convolutions, products and sums (QDQ, QLinearConv,
    QLinearAdd) are lowered to int8 ``QuantizedConv2D`` and ``QuantizedAdd`` ops for ``backend``, the
    session's scheme backend: where it builds both (every backend here). Elsewhere they would run in
    float, on that backend, never moved to the cpu for it. Independent of ``precision``: the model
    itself is quantized."""
    table = getattr(backend, "kernel_table", {})
    return all(op in table for op in STATIC_INT8_OPS)


def int8_channels_last(backend) -> bool:
    """Whether a statically quantized model's 8-bit activations stay channels-last (NHWC) between the
    int8 ops that take them, for ``backend``, the session's scheme backend: where it builds static int8
    ops and says it has the channels-last kernels (the cpu; the GPU backends keep NCHW). The one place
    the layout is decided; the lowering (``lowerings.int8_products``) places the conversions, and an
    image's first convolution writes channels-last activations itself where only such ops read them."""
    return lowers_static_int8(backend) and bool(getattr(backend, "int8_channels_last", False))


def int8_global_average_pool(backend) -> bool:
    """Whether a QDQ model's DequantizeLinear -> GlobalAveragePool -> QuantizeLinear becomes one
    ``QuantizedGlobalAveragePool`` on the 8-bit tensor for ``backend``, the session's scheme backend:
    where it builds static int8 ops and has a kernel for that op (the cpu's compiled rows; opencl, vulkan
    and gl have none and pool in float between the DequantizeLinear and QuantizeLinear). The one place
    this is decided."""
    return lowers_static_int8(backend) and A.QuantizedGlobalAveragePool in getattr(backend, "kernel_table", {})


def one_pass_quantize(backend) -> bool:
    """Whether a QuantizeLinear per tensor of float32 values to int8 or uint8 becomes one ``Quantize``
    op for ``backend``, the session's scheme backend: where it has a kernel for that op (the cpu's
    compiled pass); elsewhere it is the five ops (div, round, add, clip, the conversion) every backend
    runs. The one place this is decided."""
    return A.Quantize in getattr(backend, "kernel_table", {})


def check_precision(precision: str) -> str:
    """``precision`` if it is one gpumnn runs, else ValueError listing those it does."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {', '.join(map(repr, PRECISIONS))}")
    return precision


def backend_options(precision: str, backend: str | Sequence[str]) -> dict[str, Any]:
    """The backend options a session on ``backend`` (as requested: a name, a list, "auto") passes
    its backend for ``precision``: none for a precision that rewrites the program; for a kernel
    precision, its options where the one backend named has those kernels, else ValueError naming
    the backends that have them."""
    kernels = KERNEL_PRECISIONS.get(check_precision(precision))
    if kernels is None:
        return {}
    if isinstance(backend, str) and backend in kernels:
        return dict(kernels[backend])
    having = " or ".join(repr(b) for b in kernels)
    raise ValueError(f"precision={precision!r} runs on backend={having} only (its kernels have it), not "
                     f"backend={backend!r}; precision='fp32' runs there")


def precision_run(precision: str, backends: Sequence[str]) -> str:
    """The precision a session on ``backends`` (those that started) computes in: ``precision``, or
    "fp32" where it is a kernel precision none of them has (its backend fell back to the cpu)."""
    kernels = KERNEL_PRECISIONS.get(precision)
    return "fp32" if kernels is not None and not set(backends) & set(kernels) else precision


def quantize_columns(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``weight`` [K, N] as int8 (symmetric per column, rounding half to even) and its
    float32 scale per column: ``weight ~ int8 * scale``."""
    largest = np.abs(weight).max(axis=0)
    scale = (largest / np.float32(INT8_MAX)).astype(np.float32)
    scale[scale == 0] = np.float32(1)
    quantized = np.clip(np.rint(weight / scale), -INT8_MAX, INT8_MAX).astype(np.int8)
    return quantized, scale


def quantize_blocks(weight: np.ndarray, block: int = INT4_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``weight`` [K, N] as int4 per ``block`` rows of a column (symmetric, rounding half
    to even), packed two rows a byte as ``A.QuantizedMatMul`` reads them (uint8 [ceil(K / 2), N]),
    and the float32 scale per block and column [ceil(K / block), N]."""
    k, n = weight.shape
    blocks = -(-k // block)
    padded = np.zeros((blocks * block, n), np.float32)
    padded[:k] = weight
    grouped = padded.reshape(blocks, block, n)
    scale = (np.abs(grouped).max(axis=1) / np.float32(INT4_MAX)).astype(np.float32)
    scale[scale == 0] = np.float32(1)
    values = np.clip(np.rint(grouped / scale[:, None, :]), -INT4_MAX, INT4_MAX).astype(np.int8).reshape(-1, n)
    return pack_int4(values[:k]), scale


def _quantizable(op: A.AtomicOp, program: A.AtomicProgram) -> bool:
    """Whether ``op`` is a float MatMul of rows by a constant weight that ``QuantizedMatMul`` computes."""
    if not isinstance(op, A.MatMul) or op.dtype != A.FLOAT32 or op.scheme != "gemm":
        return False
    if op.inputs[1] not in program.constants or op.inputs[0] in program.constants:
        return False
    if op.trans_a or op.b_batch_stride != 0 or op.k > A.QUANTIZED_MAX_K:
        return False
    if op.batch > 1 and op.a_batch_stride != op.m * op.k:
        return False  # rows of the batch not side by side
    rows_share_bias = op.bias_strides[0] == 0 or op.batch * op.m == 1  # a single row's stride is never used
    return not op.has_bias or (op.beta == 1.0 and op.bias_strides[1] == 1 and rows_share_bias)


def apply_precision(program: A.AtomicProgram, precision: str) -> A.AtomicProgram:
    """``program`` rewritten for ``precision`` (itself for fp32): see the module docstring."""
    if check_precision(precision) not in WEIGHT_PRECISIONS:
        return program
    block = INT4_BLOCK if precision == "int4" else 0
    constants = dict(program.constants)
    quantized: dict[tuple[str, bool, float], tuple[str, str]] = {}
    ops: list[A.AtomicOp] = []
    for op in program.ops:
        if not _quantizable(op, program):
            ops.append(op)
            continue
        key = (op.inputs[1], op.trans_b, op.alpha)
        if key not in quantized:
            weight = np.asarray(program.constants[op.inputs[1]], np.float32)
            weight = weight.reshape(-1)[:op.k * op.n].reshape((op.n, op.k) if op.trans_b else (op.k, op.n))
            oriented = weight.T if op.trans_b else weight
            values, scale = quantize_blocks(oriented, block) if block else quantize_columns(oriented)
            name = f"{op.inputs[1]}.{precision}{'.t' if op.trans_b else ''}{'' if op.alpha == 1.0 else f'.x{op.alpha!r}'}"
            constants[name] = np.ascontiguousarray(values)
            constants[f"{name}.scale"] = (scale * np.float32(op.alpha)).astype(np.float32)
            quantized[key] = (name, f"{name}.scale")
        weight_name, scale_name = quantized[key]
        inputs = (op.inputs[0], weight_name, scale_name) + ((op.inputs[2],) if op.has_bias else ())
        ops.append(A.QuantizedMatMul(inputs, op.outputs, op.source, m=op.batch * op.m, n=op.n, k=op.k,
                                     has_bias=op.has_bias, activation=op.activation, block=block))
    if not quantized:
        return program
    return dataclasses.replace(program, ops=ops, constants=constants)


def computes_float16(backend: Any) -> bool:
    """Whether ``backend`` has float16 kernels for the products (Conv2D, MatMul): without them an
    fp16 session there runs in float32."""
    return any(A.FLOAT16 in backend.dtypes.get(op, ()) for op in (A.Conv2D, A.MatMul))


def float16_summary(backend: Any) -> str:
    """What ``precision="fp16"`` does on ``backend``, for ``gpumnn info``."""
    if computes_float16(backend):
        if getattr(backend, "float16_tensor_cores", False):
            return ("float16 weights and activations; convolution and GEMM tiles on tensor cores (mma.sync "
                    "m16n8k16, float32 sums), float32 arithmetic in the other kernels")
        cooperative = getattr(backend, "cooperative_gemm", None)
        shape = cooperative.shape(A.FLOAT16) if cooperative is not None else None
        if shape is not None:  # a Vulkan device's cooperative matrices (gpumnn.backends.kernels.glsl.coopmat)
            return (f"float16 weights and activations; convolution and GEMM tiles on cooperative matrices "
                    f"(VK_KHR_cooperative_matrix {shape.m}x{shape.n}x{shape.k}, float32 sums), float32 arithmetic "
                    "in the other kernels")
        capability = getattr(backend, "compute_capability", None)
        if capability is not None:  # a cuda GPU before Ampere
            return (f"float16 weights and activations, float32 arithmetic in the kernels (float16 tensor-core "
                    f"tiles need compute capability {TENSOR_CORE_CAPABILITY['fp16'] / 10:.1f}; this GPU has "
                    f"{capability // 10}.{capability % 10})")
        return "float16 weights and activations, float32 arithmetic in the kernels"
    return f"runs in float32: no float16 kernels{_why_none(backend)}"


def _why_none(backend: Any) -> str:
    """Why a GPU backend has no float16 kernels, as a clause (the GPU kernel family has them, given
    16-bit storage), or nothing for a backend that has none at all (the cpu)."""
    storage = getattr(backend, "narrow_storage", {}).get(2, "")
    if storage.startswith("packed"):
        return f" (float16 tensors {storage}; float16 arithmetic needs 16-bit storage)"
    if getattr(backend, "kernels", None) == "simd":
        return " in its simd family (CPU devices; kernels='tiled' has them)"
    return ""


def _on_float16(op: A.AtomicOp) -> A.AtomicOp:
    """``op`` with float16 storage (its float32 operands and result float16)."""
    if isinstance(op, A.Unary):
        return dataclasses.replace(op, dtype=A.FLOAT16, out_dtype="")
    return dataclasses.replace(op, dtype=A.FLOAT16)


def _float16_capable(op: A.AtomicOp, program: A.AtomicProgram, backend: Any) -> bool:
    """Whether ``op`` computes a float32 result from float32 data that ``backend`` computes on
    float16 storage as well (an exact integer accumulation stays float32: float16 would round its sums)."""
    if op.dtype != A.FLOAT32 or op.output_dtype() != A.FLOAT32 or op.source in program.exact_integer_sources:
        return False
    if isinstance(op, A.Unary) and op.out_dtype not in ("", A.FLOAT32):
        return False
    return backend.unsupported_reason(_on_float16(op)) is None


def apply_storage_precision(program: A.AtomicProgram, precision: str, backend: Any) -> tuple[A.AtomicProgram, list[str]]:
    """``program`` with float16 storage for ``precision="fp16"`` where ``backend`` has the kernels
    (see the module docstring), and lines for the session's report saying what it did; itself
    and no lines for any other precision. Runs after the schemes are expanded, before placement."""
    if check_precision(precision) != "fp16":
        return program, []
    if not computes_float16(backend):
        return program, [f"precision fp16: the {backend.name} backend has no float16 kernels{_why_none(backend)}; "
                         f"the session runs in float32"]
    root = program.storage_of
    kept = {root(n) for n in (*program.inputs, *program.outputs)}
    # a graph output's writer computes on float16 too, its result converted into the float32 output
    outputs = {root(n) for n in program.outputs} - {root(n) for n in program.inputs}
    writers: dict[str, list[A.AtomicOp]] = defaultdict(list)
    for op in program.ops:
        for name in op.outputs:
            writers[root(name)].append(op)
    capable = {id(op) for op in program.ops if _float16_capable(op, program, backend)}
    half = {r for r, ops in writers.items()
            if r not in kept and r not in program.constants and program.storage_dtype_of(r) == A.FLOAT32
            and not is_rewrite_tensor(r) and all(id(op) in capable for op in ops)}
    on_float16 = {id(op) for op in program.ops
                  if id(op) in capable and all(root(n) in half or root(n) in outputs for n in op.outputs)}
    if not on_float16:
        return program, [f"precision fp16: no op here has a float16 kernel on {backend.name}; the session runs "
                         f"in float32"]
    shapes, constants, dtypes = dict(program.shapes), dict(program.constants), dict(program.dtypes)
    for name in shapes:
        if root(name) in half:
            dtypes[name] = np.dtype(np.float16)
    converted: dict[tuple[str, str], str] = {}  # (tensor, dtype) -> its conversion, until the tensor is written again
    ops: list[A.AtomicOp] = []
    added = 0
    kept_float32: dict[str, int] = defaultdict(int)

    def convert(name: str, dtype: str, source: str) -> str:
        nonlocal added
        if (name, dtype) not in converted:
            made = f"{name}.{dtype}"
            shapes[made] = program.shapes[name]
            dtypes[made] = np.dtype(dtype)
            ops.append(A.Unary((name,), (made,), source, dtype=A.FLOAT16 if dtype == A.FLOAT32 else A.FLOAT32,
                               count=int(np.prod(program.shapes[name], dtype=np.int64)), op="identity",
                               out_dtype=dtype))
            converted[(name, dtype)] = made
            added += 1
        return converted[(name, dtype)]

    def float16_constant(name: str) -> str:
        made = f"{name}.float16"
        if made not in constants:
            constants[made] = np.asarray(program.constants[name]).astype(np.float16)
        return made

    for op in program.ops:
        on_half = id(op) in on_float16
        inputs = []
        for name in op.inputs:
            if name in program.constants:
                float32 = program.storage_dtype_of(name) == A.FLOAT32
                inputs.append(float16_constant(name) if on_half and float32 else name)
            elif root(name) in half:
                inputs.append(name if on_half else convert(name, A.FLOAT32, op.source))
            elif on_half and program.storage_dtype_of(name) == A.FLOAT32:
                inputs.append(convert(name, A.FLOAT16, op.source))
            else:
                inputs.append(name)
        if on_half:
            results = tuple(n if root(n) in half else f"{n}.float16" for n in op.outputs)
            ops.append(_on_float16(dataclasses.replace(op, inputs=tuple(inputs), outputs=results)))
            for name, result in zip(op.outputs, results):
                if result != name:
                    shapes[result], dtypes[result] = program.shapes[name], np.dtype(np.float16)
                    ops.append(A.Unary((result,), (name,), op.source, dtype=A.FLOAT16, op="identity",
                                       count=int(np.prod(program.shapes[name], dtype=np.int64)), out_dtype=A.FLOAT32))
                    added += 1
        else:
            conversion = isinstance(op, A.Unary) and op.op == "identity" and op.output_dtype() != op.dtype
            if op.dtype == A.FLOAT32 and id(op) not in capable and not conversion:
                kept_float32[type(op).__name__] += 1
            ops.append(dataclasses.replace(op, inputs=tuple(inputs)))
        written = {root(n) for n in op.outputs}
        for key in [k for k in converted if root(k[0]) in written]:
            del converted[key]
    used = {n for op in ops for n in op.inputs}
    constants = {n: v for n, v in constants.items() if n in used or f"{n}.float16" not in constants}
    lines = [f"precision fp16: {len(on_float16)} of {len(program.ops)} ops on float16 storage ({backend.name}), "
             f"{added} conversions to and from float32 added"]
    if kept_float32:
        lines.append(f"precision fp16: float32 ops (no float16 kernel on {backend.name}): "
                     + ", ".join(f"{k} x{v}" for k, v in sorted(kept_float32.items())))
    return dataclasses.replace(program, ops=ops, shapes=shapes, constants=constants, dtypes=dtypes), lines
