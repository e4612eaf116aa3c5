"""The exceptions a user of gpumnn can catch.

Every error names the thing that went wrong (file, node, op type, input name, backend) so that
a user never has to guess which part of a large model or which API caused it.
"""
from __future__ import annotations


class GpumnnError(Exception):
    """Base class of every error gpumnn raises on purpose."""


class ModelError(GpumnnError):
    """The model file does not parse or is not a valid graph."""


class UnsupportedOpError(ModelError):
    """A node uses an op type (or an attribute value) that gpumnn cannot run."""

    def __init__(self, op_type: str, node_name: str, reason: str = "", supported: tuple[str, ...] = ()):
        self.op_type = op_type
        self.node_name = node_name
        self.reason = reason
        self.supported = tuple(sorted(supported))
        msg = f"unsupported op {op_type!r} at node {node_name!r}"
        if reason:
            msg += f": {reason}"
        if self.supported:
            msg += f". Supported op types: {', '.join(self.supported)}"
        super().__init__(msg)


class DataDependentError(UnsupportedOpError):
    """An input a node needs at session creation (a shape, sizes, axes) depends on run-time data.

    ``tensor`` names that input. A session binds the small graph inputs it is computed from (their
    values then key its shape sets); one raised to the caller depends on larger inputs.
    """

    def __init__(self, op_type: str, node_name: str, tensor: str, reason: str):
        self.tensor = tensor
        super().__init__(op_type, node_name, reason)


class InputError(GpumnnError, ValueError):
    """A run or session was given an input with the wrong name, shape or dtype."""


class DeviceArrayError(InputError):
    """A run was given a device array (a DLPack or CUDA-array tensor on a GPU), or asked for
    device outputs, on a backend that takes host arrays only, or a device array it cannot use
    (another GPU); the message says why."""


class BackendUnavailableError(GpumnnError, RuntimeError):
    """A compute API cannot start on this machine; the message says why."""


class UnknownBackendError(GpumnnError, ValueError):
    """A backend name gpumnn does not know (a misspelling); the message lists the known names.
    Never a reason to fall back to the CPU: the name would be wrong on every machine."""


class BackendOptionError(GpumnnError, ValueError):
    """A backend was given an option it does not take, or a value the option does not accept;
    the message names the option and lists the valid ones. Never a reason to fall back to the
    CPU: the same options would be wrong on every machine."""


class SessionClosedError(GpumnnError, RuntimeError):
    """A session (or its backend) was used after ``close()``."""


class DeviceLostError(GpumnnError, RuntimeError):
    """A device stopped answering: a submission did not finish within the session's
    ``submit_timeout`` (the message names the backend, the device and the ops in flight), or the
    driver reported the device lost. The device is marked lost, so later calls on it fail at
    once with the same reason; a new session gets a fresh device where the API can make one."""


class ResourceError(GpumnnError, MemoryError):
    """A model needs more memory than a device (or the host) can give.

    Raised before the session allocates (and, at lowering, before NumPy materialises an index
    map or a folded constant; a NumPy allocation that fails anyway is reported the same way),
    naming the backend or node, the bytes needed, the bytes available and the largest tensor, so that a user can see which input shape or which
    node to shrink. It is also a ``MemoryError``, so code that already guards against
    NumPy running out of memory keeps working.
    """


class InternalError(GpumnnError, RuntimeError):
    """gpumnn itself went wrong: an exception its own code did not mean to raise (a KeyError in a
    lowering, an IndexError in an optimisation pass) escaped while it handled a model.

    Not a :class:`ModelError`: the model is not at fault, so a caller (or a test) that treats model
    errors as clean refusals does not take a bug for one. The cause is chained (``__cause__``).
    """

    def __init__(self, where: str, exc: BaseException):
        self.where = where
        super().__init__(f"internal error in gpumnn while {where}: {type(exc).__name__}: {exc}. This is a bug "
                         "in gpumnn, not a fault of the model: please report it, with the model (or the smallest "
                         "one that shows it) and this message")
