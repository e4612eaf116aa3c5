"""Input shapes against what a model declares: which dims are fixed, which a run may choose.

A graph input's dims are *static* (a positive integer the model fixes) or *symbolic* (a name, or
unknown). A session accepts any size for a symbolic dim -- each new set of input shapes is
prepared once and cached (:mod:`gpumnn.runtime.shape_set_cache`) -- and refuses, naming the dim, a size that
differs from a static one. These checks live here, once, for ``Net.session``'s ``input_shapes``
and for the arrays ``Session.run`` is given alike.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from .errors import InputError
from .ir import Graph, ValueInfo

#: A set of input shapes as the session's caches key it: (name, shape) in graph-input order, and
#: (name, shape, (dtype, bytes)) for an input whose values decide shapes.
ShapeKey = tuple[tuple, ...]


def is_static(dim: object) -> bool:
    """Whether the model fixes this dim (a positive integer), rather than leaving it to the run."""
    return isinstance(dim, int) and not isinstance(dim, bool) and dim > 0


def fully_static(info: ValueInfo) -> bool:
    """Whether every dim of the input is fixed by the model (so no shape need be given)."""
    return info.shape is not None and all(is_static(d) for d in info.shape)


def missing_shape_hint(info: ValueInfo) -> str:
    """Why a shape is needed and the three ways to give it (Python argument, a run, the command line)."""
    example = ",".join(str(d) if is_static(d) else "N" for d in info.shape) if info.shape is not None else "N,..."
    return (f"input {info.name!r} has no fixed shape ({info.describe()}); give it with "
            f"input_shapes={{{info.name!r}: (...)}} when creating the session, by running the session once "
            f"with an input of that shape, or on the command line with "
            f"`gpumnn run MODEL --shape {info.name}={example}`")


def check_input_shape(info: ValueInfo, shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` as a tuple of ints, after checking it against the input's declared rank and static
    dims; raises InputError naming the input, the dim and what the model expects."""
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise InputError(f"input {info.name!r}: negative dimension in {list(shape)}")
    if info.shape is None:
        return shape
    if len(shape) != len(info.shape):
        raise InputError(f"input {info.name!r}: shape {list(shape)} has rank {len(shape)}, the model "
                         f"expects rank {len(info.shape)} ({info.describe()})")
    for axis, (got, want) in enumerate(zip(shape, info.shape)):
        if is_static(want) and got != want:
            expected = [d if is_static(d) else (d or "?") for d in info.shape]
            raise InputError(f"input {info.name!r}: shape {list(shape)} does not match the model's "
                             f"{info.describe()}: dimension {axis} is fixed at {want} by the model, got {got} "
                             f"(expected {expected}; only symbolic dimensions may change between runs)")
    return shape


def declared_shapes(graph: Graph, given: Mapping[str, Sequence[int]] | None) -> dict[str, tuple[int, ...]] | None:
    """The given shapes completed with the model's static ones, checked; None when some input
    has symbolic dims and no given shape (the session then waits for its first run)."""
    given = dict(given or {})
    expected = {v.name: v for v in graph.inputs}
    unknown = sorted(set(given) - set(expected))
    if unknown:
        raise InputError(f"input_shapes names unknown input(s) {unknown}; the model's inputs are "
                         f"{[v.describe() for v in graph.inputs]}")
    shapes = {}
    for name, info in expected.items():
        if name in given:
            shapes[name] = check_input_shape(info, given[name])
        elif fully_static(info):
            shapes[name] = tuple(info.shape)
        else:
            return None
    return shapes


def resolve_input_shapes(graph: Graph, given: Mapping[str, Sequence[int]] | None) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for every graph input: the user's, else the model's static ones; raises
    InputError (saying how to give it) for an input with symbolic dims and no shape given."""
    shapes = declared_shapes(graph, given)
    if shapes is None:
        given = dict(given or {})
        info = next(v for v in graph.inputs if v.name not in given and not fully_static(v))
        raise InputError(missing_shape_hint(info))
    return shapes


def shape_key(graph: Graph, shapes: Mapping[str, Sequence[int]],
              values: Mapping[str, np.ndarray] | None = None) -> ShapeKey:
    """The cache key of a complete set of input shapes and the values of inputs that decide shapes."""
    values = values or {}
    key = []
    for v in graph.inputs:
        entry: tuple = (v.name, tuple(int(d) for d in shapes[v.name]))
        if v.name in values:
            array = np.ascontiguousarray(values[v.name], dtype=v.dtype)
            entry += ((array.dtype.str, array.tobytes()),)
        key.append(entry)
    return tuple(key)


def key_shapes(key: ShapeKey) -> dict[str, tuple[int, ...]]:
    """The input shapes of a key."""
    return {entry[0]: entry[1] for entry in key}


def key_values(key: ShapeKey) -> dict[str, np.ndarray]:
    """The values a key holds (of inputs that decide shapes)."""
    return {name: np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)
            for name, shape, *rest in key for dtype, data in rest}


__all__ = ["ShapeKey", "check_input_shape", "declared_shapes", "fully_static", "is_static", "key_shapes", "key_values",
           "missing_shape_hint", "resolve_input_shapes", "shape_key"]
