"""Which device a backend's ``device=`` option names: one rule for every API.

``None`` takes the preferred device (the lowest rank: a GPU before a CPU implementation, then
the API's own order), an integer (or a string of digits) an index into the API's list, a kind
word the API defines (OpenCL's "gpu", "cpu", "accelerator") the first device of that kind, and
any other string the first device whose name contains it, ignoring case. A name that matches
nothing, or an index out of range, is an error that lists the devices there are.
"""
from __future__ import annotations

from typing import Mapping, Sequence


def choose_device(device: str | int | None, names: Sequence[str], api: str, ranks: Sequence[int] | None = None,
                  kinds: Mapping[str, Sequence[int]] | None = None, error: type[Exception] = RuntimeError) -> int:
    """The index into ``names`` that ``device`` names (see the module docstring). ``ranks``
    (default: all equal) orders the preferred device; ``kinds`` maps a kind word to the indices
    of the devices of that kind; ``error`` is the exception type raised."""
    listing = "; ".join(f"{i}: {n}" for i, n in enumerate(names))
    if not names:
        raise error(f"no {api} device")
    if device is None:
        order = sorted(range(len(names)), key=lambda i: (ranks[i] if ranks else 0, i))
        return order[0]
    if isinstance(device, int) or (isinstance(device, str) and device.strip().isdigit()):
        index = int(device)
        if not 0 <= index < len(names):
            raise error(f"{api} device index {index} out of range; devices: {listing}")
        return index
    wanted = str(device).lower()
    if kinds and wanted in kinds:
        if kinds[wanted]:
            return kinds[wanted][0]
        raise error(f"no {api} device of kind {wanted!r}; devices: {listing}")
    for i, name in enumerate(names):
        if wanted in name.lower():
            return i
    raise error(f"no {api} device matches {device!r}; devices: {listing}")


__all__ = ["choose_device"]
