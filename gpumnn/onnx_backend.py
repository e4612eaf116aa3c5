"""gpumnn as an ONNX backend (``onnx.backend.base``), the interface the ``onnx`` package's tests drive.

    from gpumnn.onnx_backend import GpumnnBackend, backend_for
    rep = GpumnnBackend.prepare(model)                 # gpumnn.load: checker, opset conversion, IR
    outputs = rep.run([x])                             # a tuple (namedtuple) in graph-output order
    outputs = backend_for("vulkan").run_model(model, [x])

Devices. ``onnx.backend.base.Device`` knows only ``CPU`` and ``CUDA``, and ``BackendTest`` runs
every case with device ``"CPU"`` (and ``"CUDA"``), while gpumnn's APIs all run on this machine. So
a Backend class is bound to one gpumnn backend, which device ``"CPU"`` means: ``GpumnnBackend``
to ``cpu``, ``backend_for(name)`` (a class, since ``BackendTest`` takes a class) to ``name``.
A device may also name a gpumnn backend itself (``"cpu"``, ``"opencl"``, ``"VULKAN"``, ``"gl"``,
case-insensitive); ``"CUDA"`` means gpumnn's ``cuda`` backend. ``supports_device`` says whether
that backend can start here.

A prepared model (:class:`GpumnnRep`) runs on one gpumnn session, on its backend only
(``fallback=False``), created at its first run and closed in :meth:`GpumnnRep.close` or when it
is collected. The session follows each run's input shapes, and the values of small graph inputs
that decide shapes (a Reshape's target, Resize's scales or sizes, Slice's starts, ...), keeping
:data:`MAX_SHAPE_SETS` prepared shape sets (see ``gpumnn.runtime.session``).
"""
from __future__ import annotations

import threading
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, namedtupledict

from .backends import REGISTRY, check_name, probe
from .errors import BackendUnavailableError, InputError, ModelError
from .net import Net, load
from .frontend.opsets import MAX_OPSET
from .runtime.session import Session

#: keyword arguments of prepare() that go to gpumnn.load and to Net.session
LOAD_OPTIONS = ("optimize",)
SESSION_OPTIONS = ("record", "threads", "max_concurrent_runs")
#: prepared shape sets a model's session keeps for distinct input shapes and values; the least
#: recently used beyond this are closed, so a caller feeding ever new shapes does not pile up pools
MAX_SHAPE_SETS = 8


class GpumnnRep(BackendRep):
    """A loaded model bound to one gpumnn backend; ``run`` takes inputs in graph-input order (or by name)."""

    def __init__(self, net: Net, backend: str, session_options: Mapping[str, Any] | None = None):
        self.net = net
        self.backend = backend
        self.session_options = dict(session_options or {})
        self.input_names = [v.name for v in net.inputs]
        self.output_names = [v.name for v in net.outputs]
        self._session: Session | None = None
        self._lock = threading.Lock()

    @property
    def session(self) -> Session:
        """The model's session (created on first use)."""
        with self._lock:
            if self._session is None or self._session.closed:
                self._session = self.net.session(backend=self.backend, fallback=False, shape_cache=MAX_SHAPE_SETS,
                                                 **self.session_options)
            return self._session

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        results = self.session.run(self._feeds(inputs))
        for info in self.net.outputs:  # a 4-bit output (held as int8/uint8) in its ONNX type, as ml_dtypes has it
            if info.declared:
                results[info.name] = results[info.name].astype(
                    helper.tensor_dtype_to_np_dtype(getattr(onnx.TensorProto, info.declared.upper())))
        return namedtupledict("Outputs", self.output_names)(*[results[name] for name in self.output_names])

    def _feeds(self, inputs: Any) -> dict[str, np.ndarray]:
        if isinstance(inputs, Mapping):
            return {name: np.asarray(value) for name, value in inputs.items()}
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        values = list(inputs)
        if len(values) != len(self.input_names):
            raise InputError(f"{len(values)} inputs given; the model takes {len(self.input_names)}: "
                             f"{[v.describe() for v in self.net.inputs]}")
        return {name: np.asarray(value) for name, value in zip(self.input_names, values)}

    def close(self) -> None:
        """Close the model's session (idempotent)."""
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            session.close()

    def __enter__(self) -> "GpumnnRep":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- interpreter shutdown: nothing left to free
            pass


class GpumnnBackend(Backend):
    """The ``onnx.backend.base.Backend`` of gpumnn; device ``"CPU"`` runs on :attr:`backend_name`."""

    #: the gpumnn backend that device "CPU" means for this class (see backend_for)
    backend_name = "cpu"

    @classmethod
    def gpumnn_backend(cls, device: str = "CPU") -> str:
        """The gpumnn backend a device string names; BackendUnavailableError for one it does not."""
        text = str(device).split(":")[0].strip()
        if text.upper() == "CPU":
            return cls.backend_name
        if text.lower() in REGISTRY:
            return text.lower()
        raise BackendUnavailableError(f"unknown device {device!r}: use 'CPU' (gpumnn backend {cls.backend_name!r}) "
                                      f"or a gpumnn backend name ({', '.join(REGISTRY)})")

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device) and not _non_tensor_values(model)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> GpumnnRep:
        """gpumnn.load the model (the ONNX checker, opset conversion, import) for the device's backend."""
        backend = cls.gpumnn_backend(device)
        non_tensors = _non_tensor_values(model) if isinstance(model, onnx.ModelProto) else []
        if non_tensors:
            raise ModelError(f"graph inputs/outputs {non_tensors} are not tensors (sequence, map or optional "
                             "values); gpumnn runs tensors only")
        net = load(model, **{k: kwargs[k] for k in LOAD_OPTIONS if k in kwargs})
        return GpumnnRep(net, backend, {k: kwargs[k] for k in SESSION_OPTIONS if k in kwargs})

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run one node: it becomes a one-node model (at ``opset_version``, default the newest)."""
        names = [name for name in node.input if name]
        arrays = list(inputs.values()) if isinstance(inputs, Mapping) else list(inputs)
        if len(arrays) != len(names):
            raise InputError(f"node {node.name or node.op_type!r} takes {len(names)} inputs {names}; "
                             f"{len(arrays)} given")
        arrays = [np.asarray(a) for a in arrays]
        graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                        for n, a in zip(names, arrays)]
        outputs = [name for name in node.output if name]
        if outputs_info is not None:
            graph_outputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)
                             for n, (dtype, shape) in zip(outputs, outputs_info)]
        else:
            graph_outputs = [helper.make_empty_tensor_value_info(n) for n in outputs]
        graph = helper.make_graph([node], node.name or f"{node.op_type}_node", graph_inputs, graph_outputs)
        opset = int(kwargs.pop("opset_version", MAX_OPSET))
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(node.domain or "", opset)])
        with cls.prepare(model, device, **kwargs) as rep:
            return rep.run(arrays)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            return probe(cls.gpumnn_backend(device)) is None
        except BackendUnavailableError:
            return False


_BOUND: dict[str, type[GpumnnBackend]] = {"cpu": GpumnnBackend}


def backend_for(name: str) -> type[GpumnnBackend]:
    """The Backend class whose device "CPU" runs on gpumnn backend ``name`` (one class per name)."""
    key = str(name).lower()
    check_name(key)
    if key not in _BOUND:  # setdefault: two threads asking at once get the same class
        _BOUND.setdefault(key, type(f"Gpumnn{key.capitalize()}Backend", (GpumnnBackend,),
                                    {"backend_name": key, "__doc__": f"gpumnn on its {key!r} backend (device 'CPU')."}))
    return _BOUND[key]


def _non_tensor_values(model: onnx.ModelProto) -> list[str]:
    """Names of graph inputs and outputs whose type is not a tensor (sequence, map, optional, ...)."""
    return [v.name for v in list(model.graph.input) + list(model.graph.output)
            if v.type.WhichOneof("value") not in (None, "tensor_type")]


# the module-level functions onnx backends conventionally offer
prepare = GpumnnBackend.prepare
run_model = GpumnnBackend.run_model
run_node = GpumnnBackend.run_node
supports_device = GpumnnBackend.supports_device

__all__ = ["GpumnnBackend", "GpumnnRep", "backend_for", "prepare", "run_model", "run_node", "supports_device"]
