"""Resource checks: does a session fit its devices (and lowering fit the host), before allocating.

Two places allocate memory a model's size can make impossible:

* Session creation: each backend's pool (the pool layout) and the constants uploaded to it.
  :func:`check_pool_layouts` compares them with what each backend's ``memory_limits()`` says
  its device can give (available bytes, the largest single allocation), and the backends whose
  memory is the host's RAM together with the host's free RAM.
* Lowering and constant folding (at load and at session creation) materialise NumPy arrays:
  index maps of Rasters (12 bytes per element), folded constants.
  :func:`gpumnn.backends.limits.check_host_bytes` guards them, so that a dimension of 2^40
  stops there too.

Both raise :class:`~gpumnn.errors.ResourceError` naming the backend (or node), the bytes needed,
the bytes available and the largest tensor, instead of NumPy's ``MemoryError``, the kernel's
out-of-memory killer, or a driver's out-of-memory error halfway through creation. The figures
are estimates from below (a backend may add packed weights, drivers their own bookkeeping), so
a session that passes can still run out; one that fails cannot fit.
"""
from __future__ import annotations

from typing import Mapping

from .. import atomic as A
from ..backends.base import Backend
from ..backends.limits import MemoryLimits, describe_bytes, host_memory
from ..errors import ResourceError
from .memory import PoolLayout
from .placement import Placement

#: a tensor's shape and its bytes in its storage dtype
Sized = tuple[tuple[int, ...], int]


def _largest(names: Mapping[str, Sized]) -> tuple[str, tuple[int, ...], int] | None:
    best = None
    for name, (shape, nbytes) in names.items():
        if best is None or nbytes > best[2]:
            best = (name, tuple(shape), nbytes)
    return best


def _describe(largest: tuple[str, tuple[int, ...], int] | None) -> str:
    if largest is None:
        return ""
    name, shape, nbytes = largest
    return f"; largest tensor: {name!r} of shape {list(shape)} ({describe_bytes(nbytes)})"


def backend_needs(program: A.AtomicProgram, placement: Placement, memory: Mapping[str, PoolLayout]
                  ) -> dict[str, tuple[int, dict[str, Sized], dict[str, Sized]]]:
    """Per backend: (pool bytes, {tensor: (shape, bytes)} in the pool, {constant: (shape, bytes)}
    uploaded to it)."""
    constants: dict[str, dict[str, Sized]] = {}
    for op, b in zip(program.ops, placement.op_backends):
        for name in op.inputs:
            if name in program.constants:
                constants.setdefault(b, {})[name] = (tuple(getattr(program.constants[name], "shape", ())),
                                                     program.nbytes_of(name))
    needs = {}
    for b in set(memory) | set(constants):
        layout = memory.get(b)
        tensors = {name: (program.shapes[name], program.nbytes_of(name))
                   for name in (layout.offsets if layout else ()) if name in program.shapes}
        needs[b] = (layout.pool_bytes if layout else 0, tensors, constants.get(b, {}))
    return needs


def check_pool_layouts(program: A.AtomicProgram, placement: Placement, memory: Mapping[str, PoolLayout],
                      backends: Mapping[str, Backend]) -> dict[str, MemoryLimits]:
    """Raise ResourceError if a backend's pool and constants cannot fit its device, or the
    host-memory backends together cannot fit the host. Returns each backend's limits."""
    limits: dict[str, MemoryLimits] = {}
    host_needed: dict[str, int] = {}
    largest_overall = None
    for b, (pool, tensors, constants) in sorted(backend_needs(program, placement, memory).items()):
        lim = limits[b] = backends[b].memory_limits()
        const_bytes = sum(nbytes for _, nbytes in constants.values()) if lim.copies_constants else 0
        needed = pool + const_bytes
        largest = _largest({**tensors, **constants})
        if largest is not None and (largest_overall is None or largest[2] > largest_overall[2]):
            largest_overall = largest
        where = f"backend {b!r} ({backends[b].info.device})"
        moved = [r for r, ob in zip(placement.fallback_reasons, placement.op_backends) if r and ob == b]
        if moved:  # the user asked for another backend: say why these ops came here
            where += f", where {len(moved)} op(s) were placed because {moved[0]}"
        if needed > lim.available:
            raise ResourceError(f"{where}: the session needs {describe_bytes(needed)} (pool {describe_bytes(pool)} + constants "
                                f"{describe_bytes(const_bytes)}); {describe_bytes(lim.available)} available ({lim.source})"
                                + _describe(largest))
        if pool > lim.max_allocation:
            raise ResourceError(f"{where}: the pool layout needs one pool of {describe_bytes(pool)}, more than the largest "
                                f"single allocation the device allows ({describe_bytes(lim.max_allocation)}; {lim.source})"
                                + _describe(_largest(tensors)))
        big = _largest(constants) if lim.copies_constants else None
        if big is not None and big[2] > lim.max_allocation:
            raise ResourceError(f"{where}: constant {big[0]!r} of shape {list(big[1])} needs {describe_bytes(big[2])}, more "
                                f"than the largest single allocation the device allows "
                                f"({describe_bytes(lim.max_allocation)}; {lim.source})")
        if lim.host_memory:
            host_needed[b] = needed
    if len(host_needed) > 1:
        total = sum(host_needed.values())
        _, available, source = host_memory()
        if total > available:
            parts = " + ".join(f"{b} {describe_bytes(n)}" for b, n in sorted(host_needed.items()))
            raise ResourceError(f"backends {sorted(host_needed)} share the host's memory: the session needs "
                                f"{describe_bytes(total)} ({parts}); {describe_bytes(available)} available ({source})"
                                + _describe(largest_overall))
    return limits


def run_states_that_fit(program: A.AtomicProgram, placement: Placement, memory: Mapping[str, PoolLayout],
                        limits: Mapping[str, MemoryLimits], wanted: int) -> int:
    """How many run states fit, from 1 (which :func:`check_pool_layouts` guaranteed) up to
    ``wanted``: each state has pools of its own, while constants are uploaded once."""
    fit = wanted
    for b, (pool, _, constants) in backend_needs(program, placement, memory).items():
        if pool <= 0 or b not in limits:
            continue
        lim = limits[b]
        const_bytes = sum(nbytes for _, nbytes in constants.values()) if lim.copies_constants else 0
        fit = min(fit, max(1, (lim.available - const_bytes) // pool))
    return int(fit)


__all__ = ["backend_needs", "check_pool_layouts", "run_states_that_fit"]
