"""Scheme selection: which algorithm each compute op uses (paper Section 3.2, first form).

The session calls :func:`select_schemes` once; every backend then builds the kernel the scheme
names. Convolutions choose between depthwise, 1x1-as-GEMM and im2col+GEMM here; the cost-based
Winograd and Strassen choices (paper Eq. 2-3 and 9) plug into the same step.
"""
from __future__ import annotations

import dataclasses

from .. import atomic as A


def conv_scheme(op: A.Conv2D) -> str:
    """The algorithm for one convolution, from its geometry alone."""
    if op.groups > 1 and op.groups == op.in_channels == op.out_channels:
        return "depthwise"
    if op.kernel == (1, 1) and op.strides == (1, 1) and op.pads == (0, 0) and op.in_hw == op.out_hw:
        return "gemm1x1"
    return "im2col"


def select_schemes(ops: list[A.AtomicOp]) -> list[A.AtomicOp]:
    """Return the ops with their ``scheme`` fields decided."""
    chosen = []
    for op in ops:
        if isinstance(op, A.Conv2D):
            op = dataclasses.replace(op, scheme=conv_scheme(op))
        chosen.append(op)
    return chosen
