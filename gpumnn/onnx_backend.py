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

A prepared model (:class:`GpumnnRep`) creates one gpumnn session per set of input shapes it is
run with (a session is prepared for fixed shapes), on its backend only (``fallback=False``),
and closes them in :meth:`GpumnnRep.close` or when it is collected.

Inputs that fix shapes. A session needs at creation every value that decides a shape (a
Reshape's target, Resize's scales or sizes, Slice's starts, ...). A plain ``Net.session`` refuses
a graph *input* in that role (:class:`DataDependentError`), since it is prepared before any data
is seen. Here each run brings its data, so the Rep does what MNN's ``resizeSession`` does for
content-dependent shapes: the small graph inputs such a value is computed from (up to
:data:`BIND_LIMIT` elements each) are bound to the values of that run, and the session is
prepared for those values, kept and reused while they repeat; a run with other values gets a
session of its own. A large input in that role stays refused.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, namedtupledict

from .backends import REGISTRY, check_name, probe
from .errors import BackendUnavailableError, DataDependentError, InputError, ModelError, SessionClosedError
from .ir import node_reads
from .net import Net, load
from .frontend.opsets import MAX_OPSET
from .runtime.session import Session

#: keyword arguments of prepare() that go to gpumnn.load and to Net.session
LOAD_OPTIONS = ("optimize",)
SESSION_OPTIONS = ("record", "threads", "max_concurrent_runs")
#: the most elements a graph input may have to be bound per run as a shape-determining value
BIND_LIMIT = 1024
#: sessions a model keeps for distinct input shapes / bound values; the least recently used beyond
#: this are closed, so a caller feeding ever new shapes does not pile up devices and pools
MAX_SESSIONS = 8


class GpumnnRep(BackendRep):
    """A loaded model bound to one gpumnn backend; ``run`` takes inputs in graph-input order (or by name)."""

    def __init__(self, net: Net, backend: str, session_options: Mapping[str, Any] | None = None):
        self.net = net
        self.backend = backend
        self.session_options = dict(session_options or {})
        self.input_names = [v.name for v in net.inputs]
        self.output_names = [v.name for v in net.outputs]
        self._sessions: OrderedDict[tuple, Session] = OrderedDict()
        self._lock = threading.Lock()
        #: graph inputs found to decide shapes: bound to each run's values (see the module docstring)
        self.bound_inputs: set[str] = set()

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        feeds = self._feeds(inputs)
        shapes = {name: np.shape(value) for name, value in feeds.items()}
        while True:
            bound = {name: feeds[name] for name in self.bound_inputs if name in feeds}
            try:
                session = self.session_for(shapes, bound)
                break
            except DataDependentError as exc:
                wanted = {name for name in self._inputs_behind(exc.tensor) - self.bound_inputs
                          if name in feeds and np.size(feeds[name]) <= BIND_LIMIT}
                if not wanted:
                    raise
                with self._lock:  # replaced, not changed in place: other threads may be reading it
                    self.bound_inputs = self.bound_inputs | wanted
        try:
            results = session.run({name: value for name, value in feeds.items() if name not in bound})
        except SessionClosedError:  # evicted by another thread's shapes meanwhile: prepare it again
            return self.run(inputs, **kwargs)
        return namedtupledict("Outputs", self.output_names)(*[results[name] for name in self.output_names])

    def session_for(self, shapes: Mapping[str, Sequence[int]],
                    values: Mapping[str, np.ndarray] | None = None) -> Session:
        """The session prepared for these input shapes and these values of the bound inputs
        (created on first use, then kept); bound inputs are constants of that session."""
        values = {name: np.asarray(value, order="C") for name, value in (values or {}).items()}  # 0-d stays 0-d
        key = (tuple((name, tuple(int(d) for d in shapes[name])) for name in self.input_names if name not in values),
               tuple((name, values[name].dtype.str, values[name].shape, values[name].tobytes())
                     for name in sorted(values)))
        with self._lock:
            session = self._sessions.get(key)
            if session is not None:
                self._sessions.move_to_end(key)
                return session
        # prepared outside the lock: other threads' cached shapes need not wait for this one
        net = self.net if not values else self._net_with_constants(values)
        fresh = net.session(backend=self.backend, input_shapes=dict(key[0]), fallback=False, **self.session_options)
        evicted = []
        with self._lock:
            session = self._sessions.setdefault(key, fresh)
            if session is fresh:
                while len(self._sessions) > MAX_SESSIONS:
                    evicted.append(self._sessions.popitem(last=False)[1])
            else:
                evicted.append(fresh)  # another thread prepared the same shapes first
        for old in evicted:
            old.close()  # waits for its runs in flight
        return session

    def _net_with_constants(self, values: Mapping[str, np.ndarray]) -> Net:
        """The loaded model with the graph inputs in ``values`` turned into constants of those values."""
        graph = self.net.graph.copy()
        graph.inputs = [v for v in graph.inputs if v.name not in values]
        graph.initializers.update(values)
        return Net(graph, self.net.optimizations, self.net.source)

    def _inputs_behind(self, tensor: str) -> set[str]:
        """The graph inputs ``tensor`` is computed from (itself, if it is one)."""
        producers = self.net.graph.producers()
        inputs, seen, todo = set(self.input_names), set(), [tensor]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in producers:
                todo.extend(node_reads(producers[name]))  # a subgraph's outer reads too
        return seen & inputs

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
        """Close every session this model created (idempotent)."""
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), OrderedDict()
        for session in sessions:
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
