"""Backend registry: which compute APIs exist, which can start here, and why not.

Backends are imported lazily so that a missing optional binding (pyopencl, vulkan, moderngl,
cupy) only disables that backend, with the import error as the stated reason.
"""
from __future__ import annotations

import difflib
import importlib
from typing import Any

from ..errors import BackendOptionError, BackendUnavailableError, UnknownBackendError
from .base import Backend, BackendInfo, Execution, TensorHandle

#: name -> (module, class). The order is the order of preference for reports and "all".
REGISTRY: dict[str, tuple[str, str]] = {
    "cpu": ("gpumnn.backends.cpu.backend", "CpuBackend"),
    "opencl": ("gpumnn.backends.opencl.backend", "OpenCLBackend"),
    "vulkan": ("gpumnn.backends.vulkan.backend", "VulkanBackend"),
    "gl": ("gpumnn.backends.gl.backend", "GLBackend"),
    "cuda": ("gpumnn.backends.cuda.backend", "CudaBackend"),
}

#: how to install a backend's binding, where more than ``pip install gpumnn[NAME]`` needs saying
INSTALL_HINTS: dict[str, str] = {
    "cuda": "pip install 'gpumnn[cuda]' (CuPy for CUDA 12, which CUDA 12 and 13 drivers run), or "
            "'gpumnn[cuda13]' (CuPy for CUDA 13, a CUDA 13 driver)",
}

_probe_cache: dict[str, str | None] = {}


def check_name(name: object) -> str:
    """``name`` if it is a backend gpumnn knows, else UnknownBackendError listing the known ones."""
    if isinstance(name, str) and name in REGISTRY:
        return name
    close = difflib.get_close_matches(str(name).lower(), list(REGISTRY), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UnknownBackendError(f"unknown backend {name!r}{hint}; known backends: {', '.join(REGISTRY)}")


def backend_class(name: str) -> type[Backend]:
    """The class implementing backend ``name``; raises UnknownBackendError for a name gpumnn does
    not know, BackendUnavailableError if it cannot import."""
    check_name(name)
    module_name, class_name = REGISTRY[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise BackendUnavailableError(f"backend {name!r} is not implemented in this version of gpumnn") from exc
        raise BackendUnavailableError(
            f"backend {name!r} needs the Python package {exc.name!r}: {INSTALL_HINTS.get(name, f'pip install gpumnn[{name}]')}"
        ) from exc
    except ImportError as exc:  # the package is there but does not load (a missing shared library, ...)
        raise BackendUnavailableError(f"backend {name!r} cannot import its binding: {exc}") from exc
    return getattr(module, class_name)


def create_backend(name: str, **options: Any) -> Backend:
    """Start backend ``name`` or raise BackendUnavailableError saying why it cannot start (or
    BackendOptionError for an option it does not take)."""
    cls = backend_class(name)
    try:
        return cls(**options)
    except (BackendUnavailableError, BackendOptionError):
        raise
    except Exception as exc:  # a driver error, no device, ...: say which API and why
        raise BackendUnavailableError(f"backend {name!r} cannot start: {type(exc).__name__}: {exc}") from exc


def probe(name: str) -> str | None:
    """None if backend ``name`` can start on this machine, else the reason it cannot (cached);
    UnknownBackendError for a name gpumnn does not know."""
    check_name(name)
    if name not in _probe_cache:
        try:
            create_backend(name).close()
            _probe_cache[name] = None
        except BackendUnavailableError as exc:
            _probe_cache[name] = str(exc)
    return _probe_cache[name]


def available_backends() -> list[str]:
    """Names of the backends that can start on this machine, in registry order."""
    return [name for name in REGISTRY if probe(name) is None]


__all__ = ["Backend", "BackendInfo", "Execution", "TensorHandle", "REGISTRY", "available_backends",
           "backend_class", "check_name", "create_backend", "probe"]
