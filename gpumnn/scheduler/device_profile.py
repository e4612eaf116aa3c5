"""Device profiles: a device's calibrations and planning facts in one JSON file, so that schemes,
ops and estimated milliseconds can be worked out on a machine that lacks the device.

A profile holds, per backend measured on the device, its :class:`~.calibration.Calibration` and
what the scheme step reads of the backend (:class:`PlanningTarget`: the kernels it has, the
schemes they build, the rewrites the cost model may choose and their limits). ``gpumnn calibrate
--save-profile FILE`` writes one; ``gpumnn plan MODEL --backend B --profile FILE`` plans the model
for that device with no session on it. The profiles of devices gpumnn was measured on are kept
in ``gpumnn/scheduler/profiles/`` (:func:`bundled`).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from .. import atomic as A
from ..errors import GpumnnError
from .calibration import Calibration

#: bump when the file's layout changes
VERSION = 1

#: where the profiles of devices gpumnn was measured on are kept
BUNDLED = Path(__file__).resolve().parent / "profiles"


class ProfileError(GpumnnError, ValueError):
    """A profile that cannot be read, or lacks what was asked of it."""


@dataclass(frozen=True)
class PlanningTarget:
    """What the scheme step (:func:`.schemes.select_schemes`) and the rewrite
    (:func:`gpumnn.geometry.fast.expand_schemes`) read of a backend, without the backend."""

    name: str
    kernel_table: Mapping[type, None]
    schemes: Mapping[type, frozenset[str]]
    cost_model_expansions: frozenset[str]
    winograd_min_tiles: int = 0
    winograd_min_channels: int = 0
    winograd_min_saving: float = 0.0
    winograd_rewrite_max_tile: int | None = None
    winograd_per_image: bool = False
    winograd_transform_tiles: tuple[int, int, int] | None = None
    #: the schemes whose kernels add a Conv2D's residual (:func:`.schemes.fuse_residuals`)
    residual_schemes: Mapping[type, frozenset[str]] = field(default_factory=dict)
    #: byte alignment of tensor offsets in the backend's pool (where a concatenation's inputs may start)
    alignment: int = 256

    @classmethod
    def of(cls, backend: Any) -> "PlanningTarget":
        return cls(backend.name, {t: None for t in backend.kernel_table}, dict(backend.schemes),
                   frozenset(backend.cost_model_expansions), backend.winograd_min_tiles,
                   backend.winograd_min_channels, backend.winograd_min_saving, backend.winograd_rewrite_max_tile,
                   backend.winograd_per_image, backend.winograd_transform_tiles, dict(backend.residual_schemes),
                   int(backend.alignment))

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kernel_table": sorted(t.__name__ for t in self.kernel_table),
                "schemes": {t.__name__: sorted(s) for t, s in self.schemes.items()},
                "cost_model_expansions": sorted(self.cost_model_expansions),
                "winograd_min_tiles": self.winograd_min_tiles, "winograd_min_channels": self.winograd_min_channels,
                "winograd_min_saving": self.winograd_min_saving,
                "winograd_rewrite_max_tile": self.winograd_rewrite_max_tile,
                "winograd_per_image": self.winograd_per_image,
                "winograd_transform_tiles": (None if self.winograd_transform_tiles is None
                                             else list(self.winograd_transform_tiles)),
                "residual_schemes": {t.__name__: sorted(s) for t, s in self.residual_schemes.items()},
                "alignment": self.alignment}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PlanningTarget":
        def op_type(name: str) -> type:
            found = getattr(A, name, None)
            if not (isinstance(found, type) and issubclass(found, A.AtomicOp)):
                raise ProfileError(f"unknown atomic op {name!r} (a profile from another gpumnn version?)")
            return found
        return cls(data["name"], {op_type(n): None for n in data["kernel_table"]},
                   {op_type(n): frozenset(s) for n, s in data["schemes"].items()},
                   frozenset(data["cost_model_expansions"]), int(data["winograd_min_tiles"]),
                   int(data["winograd_min_channels"]), float(data["winograd_min_saving"]),
                   data["winograd_rewrite_max_tile"],
                   # profiles written before the field: the cpu backend's kernels went image by image then too
                   bool(data.get("winograd_per_image", data["name"] == "cpu")),
                   # profiles written before the field: the gate priced the transforms by Eq. 2
                   None if data.get("winograd_transform_tiles") is None
                   else tuple(int(v) for v in data["winograd_transform_tiles"]),
                   # profiles written before the field: every backend's Conv2D kernels add a residual
                   # now (cpu, both OpenCL C families, GLSL where a shader binds five buffers, which
                   # the GPUs profiled do)
                   {op_type(n): frozenset(s) for n, s in data.get(
                       "residual_schemes", {"Conv2D": data["schemes"].get("Conv2D", ())}).items()},
                   # profiles written before the field: the largest alignment a backend asks for
                   int(data.get("alignment", 256)))


@dataclass(frozen=True)
class DeviceProfile:
    """Per backend name, the calibration and the planning facts measured on one machine."""

    machine: str
    calibrations: Mapping[str, Calibration]
    targets: Mapping[str, PlanningTarget]
    saved_at: float = 0.0

    def target(self, backend: str) -> PlanningTarget:
        if backend not in self.targets:
            raise ProfileError(f"the profile of {self.machine} has no {backend!r} backend "
                               f"(it has {', '.join(sorted(self.targets)) or 'none'})")
        return self.targets[backend]


def save(path: str | Path, machine: str, backends: list[tuple[Calibration, Any]]) -> Path:
    """Write the profile of ``machine``: each (calibration, backend or PlanningTarget) pair."""
    entries = []
    for calibration, backend in backends:
        target = backend if isinstance(backend, PlanningTarget) else PlanningTarget.of(backend)
        entries.append({"calibration": asdict(calibration), "planning": target.as_dict()})
    path = Path(path)
    path.write_text(json.dumps({"gpumnn_device_profile": VERSION, "machine": machine, "saved_at": time.time(),
                                "backends": entries}, indent=1) + "\n")
    return path


def load(path: str | Path) -> DeviceProfile:
    """The profile in ``path`` (a file, or the name of a bundled one), or a ProfileError."""
    path = Path(path)
    if not path.exists() and (BUNDLED / path.name).exists():
        path = BUNDLED / path.name
    elif not path.exists() and (BUNDLED / f"{path.name}.json").exists():
        path = BUNDLED / f"{path.name}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ProfileError(f"cannot read the device profile {path}: {exc}") from exc
    if data.get("gpumnn_device_profile") != VERSION:
        raise ProfileError(f"{path} is not a gpumnn device profile of version {VERSION}")
    try:
        calibrations, targets = {}, {}
        for entry in data["backends"]:
            cal = entry["calibration"]
            calibration = Calibration(**{f.name: cal[f.name] for f in fields(Calibration) if f.name in cal})
            calibrations[calibration.backend] = calibration
            targets[calibration.backend] = PlanningTarget.from_dict(entry["planning"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"the device profile {path} is incomplete: {exc}") from exc
    return DeviceProfile(data["machine"], calibrations, targets, float(data.get("saved_at", 0.0)))


def bundled() -> list[Path]:
    """The profiles kept with gpumnn."""
    return sorted(BUNDLED.glob("*.json"))


__all__ = ["BUNDLED", "DeviceProfile", "PlanningTarget", "ProfileError", "bundled", "load", "save"]
