"""The lowering context: what is known about each tensor while a graph is lowered.

Lowering walks the ONNX nodes in order. Each tensor is a :class:`Value` with a concrete shape
and, when it is known at session creation, its constant data. Emitting an atomic op whose
inputs are all constant runs it at once on the NumPy backend (constant folding: Shape ->
Gather -> Concat -> Reshape chains disappear), otherwise the op joins the program.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .. import atomic as A
from ..backends.base import TensorHandle
from ..errors import ModelError
from ..backends.limits import check_host_bytes
from ..ir import Node, node_reads
from .regions import IndexMap


@dataclass
class Value:
    """A tensor during lowering: its shape, dtype and, if known now, its data."""

    shape: tuple[int, ...]
    dtype: np.dtype = field(default_factory=lambda: np.dtype(np.float32))
    const: np.ndarray | None = None

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def size(self) -> int:
        return math.prod(self.shape)  # Python ints: no int64 wrap-around for absurd shapes


@dataclass
class PendingRaster:
    """A reorder op before region compression, so that neighbouring Rasters can fuse."""

    sources: list[str]
    index_map: IndexMap
    output: str
    fill: float | None
    source_node: str


@dataclass
class GraphReads:
    """Who reads and who writes each tensor of the graph being lowered, for a lowering that takes
    the nodes after its own into one op (``LoweringContext.absorb``): the readers of a tensor are
    the nodes that read it, a control-flow node for what its subgraphs read."""

    readers: dict[str, list[Node]]
    producers: dict[str, Node]
    outputs: frozenset

    @classmethod
    def of(cls, graph) -> "GraphReads":
        readers: dict[str, list[Node]] = {}
        producers: dict[str, Node] = {}
        for node in graph.nodes:
            for name in dict.fromkeys(node_reads(node)):
                readers.setdefault(name, []).append(node)
            for name in node.outputs:
                producers[name] = node
        return cls(readers, producers, frozenset(graph.output_names))

    def only_reader(self, name: str) -> Node | None:
        """The one node that reads ``name``, where exactly one does and it is no graph output."""
        found = self.readers.get(name, [])
        return found[0] if len(found) == 1 and name not in self.outputs else None


class LoweringContext:
    """Collects atomic ops, constants and aliases for one graph at fixed input shapes."""

    def __init__(self) -> None:
        self.values: dict[str, Value] = {}
        self.ops: list[A.AtomicOp | PendingRaster] = []
        self.constants: dict[str, np.ndarray] = {}
        self.aliases: dict[str, str] = {}
        self._folder = None
        self._counter = 0
        #: narrow run-time tensor -> its temp converted to the compute dtype (made once, then reused)
        self._computable: dict[str, str] = {}
        #: narrow tensors converted from values they hold exactly (``emit_exact_conversion``)
        self.exact_conversions: set[str] = set()
        self.exact_integer_sources: set[str] = set()  # AtomicProgram.exact_integer_sources
        #: the graph whose nodes are being lowered in order, None when single nodes are (folding)
        self.graph_reads: GraphReads | None = None
        #: the nodes a lowering has already computed as part of an earlier node's op, by id (the
        #: node kept, so that its id is never another node's)
        self.absorbed: dict[int, Node] = {}
        #: whether QDQ convolutions, products and sums are lowered to QuantizedConv2D and QuantizedAdd
        #: (``lowerings.int8_products``): set where the session's scheme backend builds them
        #: (``gpumnn.scheduler.precision.lowers_static_int8``)
        self.int8_ops = False
        #: whether their 8-bit activations stay channels-last (NHWC) between them
        #: (``gpumnn.scheduler.precision.int8_channels_last``)
        self.int8_channels_last = False
        #: whether a QDQ GlobalAveragePool becomes a QuantizedGlobalAveragePool on the 8-bit tensor
        #: (``gpumnn.scheduler.precision.int8_global_average_pool``)
        self.int8_average_pool = False
        #: whether a QuantizeLinear of float32 values per tensor to 8 bits is one Quantize op
        #: (``gpumnn.scheduler.precision.one_pass_quantize``)
        self.one_pass_quantize = False
        #: an 8-bit NCHW tensor -> the channels-last tensor holding the same values, where an int8 op wrote one
        self.channels_last_twins: dict[str, str] = {}
        #: whether some were: ops that nothing reads any more are then dropped at the end of lowering
        self.int8_fused = False

    def absorb(self, *nodes: Node) -> None:
        """Marks ``nodes`` as computed by the op just emitted: ``lower_into`` skips them."""
        self.absorbed.update((id(n), n) for n in nodes)

    # -- values ----------------------------------------------------------------------------
    def value(self, name: str, node: Node | None = None) -> Value:
        try:
            return self.values[name]
        except KeyError:
            where = f" (read by node {node.name!r})" if node else ""
            if not name:
                raise ModelError(f"a required input{where} is empty") from None
            raise ModelError(f"tensor {name!r}{where} has no value") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return self.value(name).shape

    def const(self, name: str, node: Node, what: str) -> np.ndarray:
        """Data of an input that must be known at session creation (e.g. a Reshape's shape)."""
        value = self.value(name, node)
        if value.const is None:
            from ..errors import DataDependentError
            raise DataDependentError(node.op_type, node.name, name, f"{what} ({name!r}) must be a constant "
                                     "or computable from input shapes; it depends on input data")
        return value.const

    def set_const(self, name: str, array: np.ndarray) -> None:
        array = np.asarray(array)
        self._computable.pop(name, None)
        self.values[name] = Value(tuple(int(d) for d in array.shape), array.dtype, array)

    def set_runtime(self, name: str, shape: Sequence[int], dtype=np.float32) -> None:
        """A tensor known at run time only; ``dtype`` is the model's (int64, bool, float16, ...)."""
        self._computable.pop(name, None)
        self.values[name] = Value(tuple(int(d) for d in shape), np.dtype(dtype))

    def dtype(self, name: str) -> np.dtype:
        return self.value(name).dtype

    def temp(self, node: Node, hint: str) -> str:
        self._counter += 1
        return f"{node.name}/{hint}:{self._counter}"

    def runtime_input(self, name: str) -> str:
        """Make sure a tensor an atomic op reads exists at run time (constants become weights in
        their storage dtype: float16, int8 and uint8 as themselves, float32, or int32 when every
        value fits)."""
        value = self.values[name]
        if value.const is not None and name not in self.constants:
            storage = np.dtype(A.storage_dtype(value.const.dtype))
            if storage == np.int32 and value.const.size and value.const.dtype.itemsize > 4:
                lo, hi = int(value.const.min()), int(value.const.max())
                if lo < -2**31 or hi >= 2**31:
                    raise ModelError(f"constant {name!r} ({value.const.dtype}) holds values in [{lo}, {hi}], outside "
                                     "int32: gpumnn keeps integer tensors as int32 on every device")
            self.constants[name] = np.asarray(value.const, dtype=storage, order="C")
        return name

    def alias(self, output: str, source: str, shape: Sequence[int], dtype=None) -> None:
        """``output`` is ``source`` seen with another shape (Reshape, Flatten, Squeeze, ...), or
        as another ``dtype`` held in the same storage dtype (a Cast from int64 to int32). Across
        storage dtypes it is a conversion (a Unary ``identity``) of ``source``."""
        src_value = self.values[source]
        dtype = src_value.dtype if dtype is None else np.dtype(dtype)
        if src_value.const is not None:
            self.set_const(output, src_value.const.reshape(tuple(shape)).astype(dtype, copy=False))
            return
        if A.storage_dtype(dtype) != A.storage_dtype(src_value.dtype):
            converted = self._unique(f"{output}/as_{dtype.name}")
            self.emit(A.Unary((source,), (converted,), "", op="identity", count=src_value.size), src_value.shape,
                      dtype)
            source = converted
        self.aliases[output] = source
        self.set_runtime(output, shape, dtype)

    # -- emission --------------------------------------------------------------------------
    def emit_exact_conversion(self, source: str, out: str, dtype, source_node: str) -> None:
        """Convert ``source`` to ``dtype`` into ``out``, where every value of ``source`` is one that
        ``dtype`` holds exactly (integers in its range, as QuantizeLinear's clip leaves them): a
        round trip through ``out`` and back may then be dropped (``round_trips.py``)."""
        value = self.values[source]
        self.emit(A.Unary((source,), (out,), source_node, op="identity", count=value.size), value.shape, dtype)
        self.exact_conversions.add(out)

    def emit(self, op: A.AtomicOp, out_shape: Sequence[int], out_dtype: np.dtype | None = None) -> None:
        """Add an atomic op with one output, or evaluate it now if its inputs are all constant.

        The op's storage dtypes are set here from the tensors it reads (``op.dtype`` from its
        data input); ``out_dtype`` is the output's dtype as the model has it, by default the data
        input's (bool for comparisons, int64 for indices).

        Only the element-moving ops and the Unary ``identity`` take the narrow storage dtypes
        (see ``gpumnn.atomic``): any other op reads a narrow input through its conversion to the
        compute dtype, and computes a narrow result in the compute dtype into a temp that a
        Unary ``identity`` then converts."""
        inputs = [self.values[n] for n in op.inputs]
        name = op.outputs[0]
        data = inputs[op.data_input].dtype if inputs else np.dtype(np.float32)
        result = np.dtype(out_dtype) if out_dtype is not None else _default_result(op, data)
        if all(v.is_const for v in inputs):
            self.set_const(name, self._fold(op, [v.const for v in inputs], tuple(out_shape), result))
            return
        moved = _narrow_inputs(op, A.storage_dtype(data))
        wide = tuple(n if k in moved else self._computable_input(n, op) for k, n in enumerate(op.inputs))
        if wide != op.inputs:
            op = dataclasses.replace(op, inputs=wide)
            data = self.values[wide[op.data_input]].dtype
        stored = self._stored_dtype(op, data, result)
        if stored is not None:  # computed (or moved) in another storage dtype, then converted
            computed = self._unique(f"{name}/as_{stored}")
            self.emit(dataclasses.replace(op, outputs=(computed,) + op.outputs[1:]), out_shape, np.dtype(stored))
            self.emit(A.Unary((computed,), (name,), op.source, op="identity", count=math.prod(out_shape)),
                      out_shape, result)
            return
        typed = {"dtype": A.storage_dtype(data)}
        if isinstance(op, A.Unary):
            typed["out_dtype"] = A.storage_dtype(result)
        op = dataclasses.replace(op, **typed)
        for input_name in op.inputs:
            self.runtime_input(input_name)
        self.ops.append(op)
        self.set_runtime(name, out_shape, result)

    @staticmethod
    def _stored_dtype(op: A.AtomicOp, data: np.dtype, result: np.dtype) -> str | None:
        """The storage dtype ``op`` must write its result in before a conversion to ``result``'s,
        or None where it writes ``result``'s storage dtype itself."""
        want = A.storage_dtype(result)
        if isinstance(op, A.Unary):
            return A.compute_dtype(want) if op.op != "identity" and want in A.NARROW_DTYPES else None
        natural = dataclasses.replace(op, dtype=A.storage_dtype(data)).output_dtype()
        return natural if natural != want else None

    def unique_name(self, name: str) -> str:
        """``name`` made unique in this lowering (for a tensor a pass adds)."""
        self._counter += 1
        return f"{name}:{self._counter}"

    _unique = unique_name

    def _computable_input(self, name: str, op: A.AtomicOp) -> str:
        """``name`` itself if it is held in a compute dtype, else its conversion to the compute
        dtype (a Unary ``identity``, emitted once per tensor; a constant converted now)."""
        value = self.values[name]
        storage = A.storage_dtype(value.dtype)
        if storage not in A.NARROW_DTYPES:
            return name
        converted = self._computable.get(name)
        if converted is None:
            wide = np.dtype(A.compute_dtype(storage))
            converted = self._unique(f"{name}/as_{wide.name}")
            if value.is_const:  # a constant converts now, never at run time
                self.set_const(converted, value.const.astype(wide))
            else:
                self.emit(A.Unary((name,), (converted,), op.source, op="identity", count=value.size), value.shape,
                          wide)
            self._computable[name] = converted
        return converted

    def emit_raster(self, pending: PendingRaster) -> None:
        """Add a Raster (its index map held reduced: see ``regions.py``)."""
        pending = dataclasses.replace(pending, index_map=pending.index_map.reduced())
        for name in pending.sources:
            self.runtime_input(name)
        self.ops.append(pending)
        dtype = self.values[pending.sources[0]].dtype if pending.sources else np.dtype(np.float32)
        self.set_runtime(pending.output, pending.index_map.shape, dtype)

    def _fold(self, op: A.AtomicOp, arrays: list[np.ndarray], shape, dtype) -> np.ndarray:
        """Run one atomic op on the NumPy backend with arrays of any dtype."""
        if self._folder is None:
            from ..backends.cpu.backend import CpuBackend
            self._folder = CpuBackend(threads=1)
        size = math.prod(shape)
        check_host_bytes(size * np.dtype(dtype).itemsize, f"folding node {op.source!r} into a constant of shape "
                         f"{list(shape)}")
        arrays = [np.ascontiguousarray(a) for a in arrays]
        handles = [TensorHandle(a.reshape(-1), 0, tuple(a.shape), a.dtype.name) for a in arrays]
        out = np.zeros(max(1, size), dtype=dtype)
        out_handle = TensorHandle(out, 0, tuple(shape), out.dtype.name)
        exe = self._folder.create_execution(op, handles, [out_handle])
        self._folder.run_eager([exe])
        return out[:out_handle.size].reshape(shape)


def _narrow_inputs(op: A.AtomicOp, data: str) -> tuple[int, ...]:
    """The positions of ``op``'s inputs it may read in a narrow storage dtype, its data input being
    of storage dtype ``data``: the data it moves (a Unary ``identity`` converts from any storage
    dtype), the 8-bit operands of the int8 ops, the bytes a max pooling compares."""
    if isinstance(op, A.Unary):
        return (0,) if op.op == "identity" else ()
    if isinstance(op, A.Gather):
        return (0,)
    if isinstance(op, A.Select):
        return (1, 2)
    if isinstance(op, A.Scatter):
        return (0, 2) if op.reduction == "none" else ()
    if isinstance(op, A.QuantizedMatMul) and op.prequantized:
        return (0, 1, 4)  # the uint8 x, the int8 weight, the uint8 zero point
    if isinstance(op, A.QuantizedConv2D):
        return (0, 1)  # the 8-bit x and the int8 weight
    if isinstance(op, A.QuantizedAdd):
        return (0, 1)  # both 8-bit operands
    if isinstance(op, A.QuantizedGlobalAveragePool):
        return (0,)  # the 8-bit planes
    if isinstance(op, A.Pool2D) and op.op == "max" and data in (A.INT8, A.UINT8):
        return (0,)  # the largest byte, copied (float16 is pooled as float32 unless precision says)
    return ()


def _default_result(op: A.AtomicOp, data: np.dtype) -> np.dtype:
    """The model-level dtype of an op's output when the lowering does not say: bool for
    comparisons and logic, int64 for indices, else the data input's."""
    if isinstance(op, A.Binary) and op.op in A.BOOL_BINARY_OPS or isinstance(op, A.Unary) and op.op in ("not", "nonzero"):
        return np.dtype(bool)
    if isinstance(op, A.TopK) or isinstance(op, A.Reduce) and op.op in ("argmax", "argmin"):
        return np.dtype(np.int64)
    return np.dtype(data)
