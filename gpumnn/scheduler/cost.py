"""The placement cost model: what one atomic op costs on one backend, and what a copy costs.

The paper's Eq. 5 is ``MUL / FLOPS * 1000 + t_schedule`` (the last term on a GPU only). Costing
every op by its multiplications alone calls a Relu, a Raster or a pooling free, although on every
device here they are bound by memory, not arithmetic. So an op costs a roofline, the larger of
its multiplications at its scheme's kernel (GEMM, matrix-vector, 3x3, 1x1, depthwise or Winograd convolution: a
fixed cost plus the scheme's multiplications at a rate, fitted through two sizes) and the bytes it
reads and writes at the device's bandwidth for its family of memory-bound ops (elementwise,
transcendental, rows, pooling: :func:`stream_of`) plus one dispatch inside a recording (or, for an eager session, one op
submitted and waited for), all measured by :mod:`.calibration`. A run of consecutive
ops on one backend (a *segment*, one recording) adds one submission and wait; a tensor that
crosses backends adds a device -> host read on its source and a host -> device write on its
destination, each ``latency + bytes / bandwidth``. Graph inputs start on the host and graph
outputs end there, so their writes and reads are charged too (where the session does them).

With the paper's constants (no calibration stored) the model is Eq. 5 as printed: no bytes term,
no segment cost, copies at the bandwidth each backend states.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from .. import atomic as A
from . import schemes
from .calibration import STAND_INS, Calibration

#: where graph inputs come from and outputs go: the caller's NumPy arrays
HOST = "host"


def tensor_bytes(program: A.AtomicProgram, name: str) -> int:
    """Bytes of a run-time tensor or constant in its storage dtype."""
    return program.nbytes_of(name)


def op_bytes(program: A.AtomicProgram, op: A.AtomicOp) -> int:
    """Bytes an op reads and writes once each (its memory traffic in the roofline)."""
    return sum(tensor_bytes(program, n) for n in (*op.inputs, *op.outputs))


def kernel_of(op: A.AtomicOp) -> str | None:
    """The calibrated kernel (``Calibration.kernels``) whose cost ``op``'s multiplications follow:
    its scheme's; None for an op that does not multiply."""
    if isinstance(op, A.Conv2D):
        return {"gemm1x1": "conv1x1", "depthwise": "depthwise", "winograd": "winograd"}.get(op.scheme, "conv3x3")
    if isinstance(op, A.ConvTranspose2D):
        return "conv3x3"
    if isinstance(op, A.MatMul) and op.scheme == "gemv":
        return "gemv"
    return "gemm" if op.macs() else None


#: Unary functions that cost many instructions per element (a polynomial, a log or an exp): the
#: ``transcendental`` family of ``Calibration.memory_gbs``
TRANSCENDENTAL = frozenset({"erf", "gelu", "silu", "softplus", "mish", "elu", "selu", "celu", "exp", "log", "tanh",
                            "sigmoid", "affine_pow"})


def stream_of(op: A.AtomicOp) -> str:
    """The memory-bound family (``calibration.STREAMS``) whose bandwidth ``op``'s bytes move at."""
    if isinstance(op, A.Unary) and op.op in TRANSCENDENTAL:
        return "transcendental"
    if isinstance(op, (A.Softmax, A.Normalize, A.Reduce)):
        return "rows"
    if isinstance(op, A.Pool2D):
        return "pool"
    return "elementwise"


def _per_second(amount: float, rate: float) -> float:
    return amount / rate if rate > 0 and math.isfinite(rate) else 0.0


@dataclass(frozen=True)
class CostModel:
    """Costs in milliseconds from each backend's calibration; ``record`` says whether the
    session replays recordings (per-op cost inside a recording, plus a submit per segment) or
    runs eagerly (per-op submit and wait, no segment cost)."""

    calibrations: Mapping[str, Calibration]
    record: bool = True
    #: backends whose device computes on the host's own cores (``BackendInfo.is_gpu`` false): a
    #: segment there overlaps nothing on the host (``overlap.overlapped_ms``)
    host_devices: frozenset[str] = frozenset()

    def op_ms(self, op: A.AtomicOp, backend: str, nbytes: int, out_bytes: int = 0) -> float:
        """One op on ``backend``: roofline of MACs and ``nbytes`` of traffic, plus the dispatch,
        plus a transcendental epilogue (a fused GELU, Sigmoid, ...) over its ``out_bytes`` of
        output: the calibrated kernels end in a ReLU, and erf costs many times more per element."""
        cal = self.calibrations[backend]
        fixed = cal.dispatch_ms if self.record else cal.eager_ms
        cost = fixed + _per_second(nbytes, cal.memory_gbs[stream_of(op)] * 1e9) * 1e3
        kernel = kernel_of(op)
        if kernel is not None:
            kernel_fixed, rate = (cal.kernels.get(kernel) or cal.kernels.get(STAND_INS.get(kernel, ""))
                                  or cal.kernels["conv3x3"])
            multiply = kernel_fixed + _per_second(schemes.scheme_macs(op), rate) * 1e3
            cost = max(cost, multiply if self.record else multiply - cal.dispatch_ms + fixed)
        activation = getattr(op, "activation", None)
        if activation and activation[0] in TRANSCENDENTAL:
            cost += _per_second(2 * out_bytes, cal.memory_gbs["transcendental"] * 1e9) * 1e3
        return cost

    def segment_ms(self, backend: str) -> float:
        """The fixed cost of one segment: submitting its recording and waiting for it."""
        return self.calibrations[backend].submit_ms if self.record else 0.0

    def transfer_ms(self, nbytes: int, source: str, target: str) -> float:
        """Moving ``nbytes`` from ``source`` to ``target`` (either may be :data:`HOST`)."""
        if source == target:
            return 0.0
        cost = 0.0
        if source != HOST:
            cal = self.calibrations[source]
            cost += cal.transfer_ms + _per_second(nbytes, cal.download_gbs * 1e9) * 1e3
        if target != HOST:
            cal = self.calibrations[target]
            cost += cal.transfer_ms + _per_second(nbytes, cal.upload_gbs * 1e9) * 1e3
        return cost

    def sources(self) -> dict[str, str]:
        """Backend -> where its numbers come from (calibrated, quick calibration, paper constants)."""
        return {b: c.source for b, c in self.calibrations.items()}


def cost_table(program: A.AtomicProgram, allowed: list[list[str]], model: CostModel) -> list[dict[str, float]]:
    """Per op, the cost on every backend allowed to run it."""
    table = []
    for op, backends in zip(program.ops, allowed):
        nbytes = op_bytes(program, op)
        out_bytes = tensor_bytes(program, op.outputs[0]) if op.outputs else 0
        table.append({b: model.op_ms(op, b, nbytes, out_bytes) for b in backends})
    return table


__all__ = ["HOST", "CostModel", "cost_table", "op_bytes", "stream_of", "tensor_bytes"]
