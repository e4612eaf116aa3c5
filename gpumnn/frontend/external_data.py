"""ONNX external data, read only from inside the model's folder.

A tensor stored as external data names a file by a ``location`` relative to the model. Read
naively, a model could make gpumnn read any file the user can (``../../etc/passwd``, an absolute
path, a symlink in the folder that points elsewhere) into a weight, where an output could leak it.
ONNX Runtime refuses such models, and so does gpumnn, whichever ``onnx`` version is installed
(older ones read any location): the model is parsed without its external data, every location is
validated here (:func:`check_locations`), and only then are the bytes read with
``onnx.external_data_helper`` (which, where recent, validates again).

A model given as bytes or as a ModelProto has no folder to resolve locations against; one that
still holds external references is refused rather than resolved against the working directory.
"""
from __future__ import annotations

import os
from pathlib import Path, PureWindowsPath

import onnx
from onnx import external_data_helper as edh

from ..errors import ModelError


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Every tensor of the model (initializers, attribute tensors, subgraphs) stored externally."""
    return [t for t in edh._get_all_tensors(model) if edh.uses_external_data(t)]


def _location(tensor: onnx.TensorProto) -> str:
    try:
        return edh.ExternalDataInfo(tensor).location
    except ValueError as exc:  # negative offset or length
        raise ModelError(f"tensor {tensor.name!r} has invalid external data: {exc}") from None


def check_locations(model: onnx.ModelProto, base_dir: str | os.PathLike) -> None:
    """Raise ModelError naming tensor and location for any external data outside ``base_dir``.

    The location must be relative, and the file it resolves to, symlinks followed, must lie
    inside the model's folder (its real path); a location may name a subfolder.
    """
    root = Path(base_dir).resolve()
    for tensor in external_tensors(model):
        location = _location(tensor)
        where = f"tensor {tensor.name!r} stores its data at external location {location!r}"
        if not location:
            raise ModelError(f"tensor {tensor.name!r} is marked as external data but names no location")
        if os.path.isabs(location) or PureWindowsPath(location).is_absolute() or PureWindowsPath(location).drive:
            raise ModelError(f"{where}, an absolute path; a location must be relative, to a file inside the "
                             f"model's folder {str(root)!r} (ONNX Runtime refuses this too)")
        target = (root / location).resolve()
        if target != root and root not in target.parents:
            raise ModelError(f"{where}, which resolves to {str(target)!r}, outside the model's folder "
                             f"{str(root)!r}; refused (ONNX Runtime refuses this too)")


def load_external_data(model: onnx.ModelProto, base_dir: str | os.PathLike) -> None:
    """Check every location, then read the external bytes into the model's tensors."""
    check_locations(model, base_dir)
    for tensor in external_tensors(model):
        location = _location(tensor)
        try:
            edh.load_external_data_for_tensor(tensor, os.fspath(base_dir))
        except Exception as exc:  # missing file, offset/length past its end, onnx's own path checks
            raise ModelError(f"external data of tensor {tensor.name!r} at location {location!r} cannot be "
                             f"read: {exc}") from None


def refuse_unresolvable(model: onnx.ModelProto, source: str) -> None:
    """ModelError for external references in a model that has no folder (bytes, a ModelProto)."""
    tensors = external_tensors(model)
    if tensors:
        tensor = tensors[0]
        raise ModelError(f"tensor {tensor.name!r} of {source} stores its data at external location "
                         f"{_location(tensor)!r}, but a model given in memory has no folder to resolve it "
                         f"against; load the model from its .onnx file instead")


__all__ = ["check_locations", "external_tensors", "load_external_data", "refuse_unresolvable"]
