"""Which arithmetic the GPU families' int8 implicit GEMM (QuantizedConv2D's tiled kernels) uses.

Integer dot products of four packed bytes (one instruction, four multiply-adds) where the device
has them, plain int32 products otherwise. Each backend decides once, at start, from its device's
capability and the ``int8_dot`` option: :func:`choose` gives the instruction its planner builds
with (``Backend.int8_dot``, "" for none) and the sentence ``gpumnn info`` prints
(``Backend.int8_arithmetic``). The depthwise kernel and the CPU-device kernels keep a plain sum
per output whatever the device has.
"""
from __future__ import annotations

import os

from ...errors import BackendOptionError

#: the environment variable a backend's ``int8_dot`` option defaults to
ENV_VARIABLE = "GPUMNN_INT8_DOT"
#: "auto": dot products where the device has them; "off": plain int32 products everywhere
CHOICES = ("auto", "off")

#: how the depthwise kernel computes, whatever the device has
DEPTHWISE = "int32 sums per output in the depthwise kernel"


def int8_dot_option(value: str | None, backend: str) -> str:
    """The ``int8_dot=`` value asked for (unset: ``$GPUMNN_INT8_DOT``, else "auto"), or a
    BackendOptionError naming the valid values."""
    where = "int8_dot="
    if value is None:
        value, where = os.environ.get(ENV_VARIABLE, "").strip().lower() or "auto", f"${ENV_VARIABLE}="
    if value not in CHOICES:
        raise BackendOptionError(f"backend {backend!r}: {where}{value!r} is not one of {', '.join(map(repr, CHOICES))}")
    return value


def choose(option: str, kernels: str, instruction: str, missing: str) -> tuple[str, str]:
    """(the dot-product instruction the implicit GEMM uses, "" for plain int32 products; the
    description for ``gpumnn info``) of a backend building the ``kernels`` family whose device
    offers ``instruction`` ("" where it does not, ``missing`` saying why)."""
    has = f"the device has {instruction}" if instruction else missing
    if kernels != "tiled":
        return "", (f"plain int32 sums, a work item per output: the {kernels} kernels have no implicit GEMM "
                    f"({has}; kernels='tiled' builds one)")
    if not instruction or option == "off":
        why = missing if not instruction else f"int8_dot='off' or ${ENV_VARIABLE}=off; {has}"
        return "", f"plain int32 products in the implicit GEMM ({why}); {DEPTHWISE}"
    return instruction, (f"integer dot products in the implicit GEMM: {instruction}, four int8 products per "
                         f"instruction; {DEPTHWISE}")
