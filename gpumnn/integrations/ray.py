"""Batch inference on Ray Data: a gpumnn session per actor, fed by ``Dataset.map_batches``.

    import ray
    from gpumnn.integrations.ray import Predictor, map_batches

    ds = ray.data.from_numpy(images).rename_columns({"data": "image"})
    out = map_batches(ds, "resnet18.onnx", backend="opencl", actors=2, batch_size=32,
                      input_column="image", output_column="logits")

:class:`Predictor` is the callable class Ray Data runs: its ``__init__`` (once per actor, on
that actor's machine) loads the model and starts a session on the backend named, so each actor
picks its own device; ``__call__`` runs one batch of any size (the session prepares each new batch
size once and keeps it, :mod:`gpumnn.runtime.session`) and returns the batch with the outputs as
new columns, in the batch format Ray gave it (``"numpy"``: a dict of arrays; ``"pandas"``: a
DataFrame, one array per row). :func:`map_batches` is ``Dataset.map_batches`` with an actor pool
of ``actors`` and, for cuda, a GPU per actor. The model travels as a path (read on the worker:
every node must see it) or as the ONNX bytes (shipped to each actor). Mistakes are GpumnnErrors
naming what is wrong: a model path missing on the worker, a column missing from a batch; the
dataset :func:`map_batches` returns raises them to the caller as Ray re-raises a task's error
(``RayTaskError(ModelError)``, an instance of ModelError too).

Ray itself is needed only by :func:`map_batches` (``pip install 'gpumnn[ray]'``); the class is
plain Python, so a batch can be tried with it directly.
"""
from __future__ import annotations

import os
import socket
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import GpumnnError, InputError, ModelError

#: batch formats :class:`Predictor` reads and returns (Ray Data's names)
BATCH_FORMATS = ("numpy", "pandas")


def _names(given: str | Mapping[str, str] | None, model_names: Sequence[str], what: str) -> dict[str, str]:
    """{model name: column}: None maps each name to itself, a str names the only one's column,
    a mapping picks names (checked against the model's)."""
    if given is None:
        return {n: n for n in model_names}
    if isinstance(given, str):
        if len(model_names) != 1:
            raise InputError(f"a single {what} column {given!r} was given, but the model has {len(model_names)} "
                             f"{what}s {list(model_names)}: map each with {{{what} name: column}}")
        return {model_names[0]: given}
    unknown = sorted(set(given) - set(model_names))
    if unknown:
        raise InputError(f"{what} column mapping names {unknown}, which the model does not have; its {what}s are "
                         f"{list(model_names)}")
    return dict(given)


class Predictor:
    """One gpumnn session, for Ray Data's ``map_batches`` as a callable class (or any loop).

    ``model``: an ONNX path (on the worker), the ONNX bytes or a ModelProto. ``backend``: a
    gpumnn backend name (``"cpu"``, ``"opencl"``, ``"vulkan"``, ``"gl"``, ``"cuda"``, or ``"auto"``),
    started in this actor; with ``fallback=False`` (the default) one that cannot start here is an
    error, not a quiet run on the cpu. ``input_column``: the column each model input reads (a
    name for a one-input model, or {input: column}; default: the input's own name).
    ``output_column``: likewise, the columns the outputs go to (a mapping keeps only the outputs
    it names). ``drop_inputs`` leaves the input columns out of the result. Other keywords go to
    ``Net.session`` (``threads``, backend options).
    """

    def __init__(self, model: str | os.PathLike | bytes | Any, backend: str = "cpu", *,
                 input_column: str | Mapping[str, str] | None = None,
                 output_column: str | Mapping[str, str] | None = None, drop_inputs: bool = False,
                 fallback: bool = False, **session_options: Any):
        from ..net import load  # the session's machinery, only where a Predictor is made
        if isinstance(model, (str, os.PathLike)) and not os.path.isfile(model):
            raise ModelError(f"model file {os.fspath(model)!r} does not exist on worker {socket.gethostname()} "
                             f"(pid {os.getpid()}); Ray actors read a model path from their own file system: put "
                             f"it where every node sees it, or pass the model's bytes instead")
        self.net = load(model)
        self.inputs = _names(input_column, [v.name for v in self.net.inputs], "input")
        self.outputs = _names(output_column, [v.name for v in self.net.graph.outputs], "output")
        self.drop_inputs = drop_inputs
        self.session = self.net.session(backend=backend, fallback=fallback, **session_options)
        self.backend = self.session.backend

    def _column(self, batch: Any, column: str) -> np.ndarray:
        columns = list(batch.columns if hasattr(batch, "columns") else batch.keys())
        if column not in columns:
            raise InputError(f"batch has no column {column!r} (its columns: {columns}); name the model input's "
                             f"column with input_column=")
        values = batch[column]
        if hasattr(values, "to_numpy"):  # pandas: one array per row, or a tensor column
            values = values.to_numpy()
        array = np.asarray(values)
        if array.dtype == object:  # rows of arrays: stacked into the batch
            array = np.stack([np.asarray(v) for v in values]) if len(values) else array
        return array

    def __call__(self, batch: Mapping[str, np.ndarray] | Any) -> Mapping[str, np.ndarray] | Any:
        pandas = hasattr(batch, "columns") and hasattr(batch, "iloc")
        if not pandas and not isinstance(batch, Mapping):
            raise InputError(f"a batch must be a dict of arrays (batch_format='numpy') or a pandas DataFrame "
                             f"(batch_format='pandas'), not {type(batch).__name__}")
        feeds = {name: self._column(batch, column) for name, column in self.inputs.items()}
        rows = {len(v) for v in feeds.values()}
        if not rows or min(rows) == 0:
            return batch  # an empty block: nothing to run
        results = self.session.run(feeds)
        kept = {column: results[name] for name, column in self.outputs.items()}
        if pandas:
            out = batch.drop(columns=list(self.inputs.values())) if self.drop_inputs else batch.copy()
            for column, value in kept.items():
                out[column] = list(value) if value.ndim > 1 else value
            return out
        out = {k: v for k, v in batch.items() if not (self.drop_inputs and k in self.inputs.values())}
        out.update(kept)
        return out

    def __del__(self) -> None:
        session = getattr(self, "session", None)
        if session is not None:
            session.close()


class _ActorPredictor(Predictor):
    """The Predictor map_batches starts: an error of its creation is raised by its first batch,
    where Ray keeps its class (a failed ``__init__`` reaches the caller as ActorDiedError, whose
    message alone says what went wrong)."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.failed: GpumnnError | None = None
        try:
            super().__init__(*args, **kwargs)
        except GpumnnError as exc:
            self.failed = exc

    def __call__(self, batch: Any) -> Any:
        if self.failed is not None:
            raise self.failed
        return super().__call__(batch)


def map_batches(dataset: Any, model: str | os.PathLike | bytes | Any, backend: str = "cpu", *, actors: int = 1,
                batch_size: int | None = 32, batch_format: str = "numpy", num_gpus: float | None = None,
                num_cpus: float | None = None, **predictor_options: Any) -> Any:
    """``dataset.map_batches`` with a :class:`Predictor` in each of ``actors`` actors: the dataset
    with the model's outputs as new columns (lazy, as Ray Data is). ``backend="cuda"`` asks each
    actor for a GPU unless ``num_gpus`` says otherwise; ``predictor_options`` are the
    Predictor's (columns, ``threads``, ...)."""
    try:
        import ray.data
    except ImportError as exc:
        raise GpumnnError(f"Ray Data is not installed ({exc}); pip install 'gpumnn[ray]'") from exc
    if batch_format not in BATCH_FORMATS:
        raise InputError(f"batch_format {batch_format!r}: gpumnn's Predictor takes {list(BATCH_FORMATS)}")
    if int(actors) < 1:
        raise ValueError(f"actors must be at least 1, not {actors}")
    if num_gpus is None:
        num_gpus = 1 if backend == "cuda" else 0
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    resources = {"num_gpus": num_gpus} if num_gpus else {}
    if num_cpus is not None:
        resources["num_cpus"] = num_cpus
    out = dataset.map_batches(_ActorPredictor, fn_constructor_args=(model, backend), fn_constructor_kwargs=predictor_options,
                              batch_size=batch_size, batch_format=batch_format,
                              compute=ray.data.ActorPoolStrategy(size=int(actors)), **resources)
    # gpumnn's error (the class too), not Ray Data's UserCodeException: the returned dataset's own context
    out.context.raise_original_map_exception = True
    return out


__all__ = ["BATCH_FORMATS", "Predictor", "map_batches"]
