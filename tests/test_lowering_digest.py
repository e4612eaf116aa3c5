"""Lowering produces the very same atomic programs it produced before it was made faster.

Session preparation is mostly geometry lowering (Raster index maps and their compression into
regions). Speed-ups there must not change a single op, so every lowered program of a corpus --
the zoo models, a CRNN text recogniser (a 32-step bidirectional LSTM), the recurrent and op
cases, and the ``onnx`` package's node tests -- is reduced to a digest of its ops (kind, inputs,
outputs, every field: regions, strides, params), shapes, aliases, dtypes and constants (bytes),
and compared with the digests the previous code gave (``lowering_digests.json``). A case that
could not be lowered records its error type, so refusals are pinned too.

The node tests come from the installed ``onnx``, whose releases add, drop and edit cases: the file
also keeps a digest of each node test's source (model and inputs), and only the cases whose source
is unchanged are compared -- most of them must be, or the file is stale. The other groups are
gpumnn's own and compared in full.

A deliberate change of lowering regenerates the file (review the cases that changed):

    .venv/bin/python tests/test_lowering_digest.py --write
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import sys
import warnings
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpumnn  # noqa: E402
from gpumnn import atomic as A  # noqa: E402
from gpumnn.geometry import lower  # noqa: E402
from gpumnn.errors import DataDependentError  # noqa: E402
from gpumnn.input_shapes import resolve_input_shapes  # noqa: E402
from gpumnn.ir import inputs_behind  # noqa: E402

EXPECTED_FILE = Path(__file__).with_name("lowering_digests.json")


def program_digest(program: A.AtomicProgram) -> str:
    """A digest of everything lowering decides: ops with all their fields, in order, shapes,
    aliases, dtypes, inputs/outputs, constants and folded outputs (names, dtypes, shapes, bytes)."""
    h = hashlib.sha256()

    def add(*parts) -> None:
        h.update(repr(parts).encode())

    def add_array(name: str, array) -> None:
        array = np.ascontiguousarray(array)
        add(name, array.dtype.str, array.shape)
        h.update(array.view(np.uint8).reshape(-1).tobytes() if array.size else b"")

    for op in program.ops:
        add(type(op).__name__, repr(op))
    add(sorted(program.shapes.items()), sorted(program.aliases.items()), list(program.inputs),
        list(program.outputs), sorted((n, np.dtype(d).str) for n, d in program.dtypes.items()))
    for name in sorted(program.constants):
        add_array(name, program.constants[name])
    for name in sorted(program.folded_outputs):
        add_array(name, program.folded_outputs[name])
    return h.hexdigest()[:20]


def case_digest(model: onnx.ModelProto | Callable[[], onnx.ModelProto], shapes=None, feeds=None) -> str:
    """The digest of ``model`` lowered at ``shapes`` (its declared shapes by default), or
    ``error:<type>`` when loading or lowering refuses it. With ``feeds`` (values of every graph
    input), inputs that decide shapes are bound to their values as the ONNX backend binds them."""
    try:
        net = gpumnn.load(model() if callable(model) else model)
        if feeds is None:
            return program_digest(lower(net.graph, resolve_input_shapes(net.graph, shapes)))
        bound: dict = {}
        while True:
            try:
                return program_digest(lower(net.graph, {n: np.shape(v) for n, v in feeds.items()}, bound))
            except DataDependentError as exc:
                wanted = inputs_behind(net.graph, exc.tensor) - set(bound)
                if not wanted:
                    raise
                bound.update({name: np.asarray(feeds[name], order="C") for name in wanted})
    except Exception as exc:  # noqa: BLE001 - the refusal itself is what is pinned
        return f"error:{type(exc).__name__}"


def _zoo_cases() -> Iterator[tuple[str, Callable[[], str]]]:
    from gpumnn import zoo
    for name in zoo.names():
        yield f"zoo/{name}", lambda name=name: case_digest(zoo.build(name), {"input": zoo.input_shape(name)})
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from reshape import symbolic_hw
    for side in ((232, 200), (96, 128)):
        yield (f"zoo/squeezenet1_1@{side[0]}x{side[1]}",
               lambda side=side: case_digest(symbolic_hw(zoo.build("squeezenet1_1")), {"input": (1, 3) + side}))


def _recurrent_cases() -> Iterator[tuple[str, Callable[[], str]]]:
    from test_recurrent import CASES
    from test_text_recognizer import HEIGHT, text_recognizer
    for width in (128, 40):  # 32 and 10 steps of a bidirectional LSTM
        yield f"text_recognizer@{width}", lambda width=width: case_digest(text_recognizer(), {"x": (1, 1, HEIGHT, width)})
    for case in CASES:
        for layout in sorted({0, case.layout}):
            yield f"recurrent/{case.id}/layout{layout}", lambda case=case, layout=layout: case_digest(case.model(layout))


def _op_cases() -> Iterator[tuple[str, Callable[[], str]]]:
    from op_cases import COMPOSITE_CASES, OP_CASES
    for case in OP_CASES:
        yield f"op/{case.id}", lambda case=case: case_digest(case.model(), case.inputs)
    for name, build, shapes in COMPOSITE_CASES:
        yield f"composite/{name}", lambda build=build, shapes=shapes: case_digest(build, shapes)


def _node_cases() -> Iterator[tuple[str, Callable[[], str]]]:
    from onnx.backend.test.loader import load_model_tests
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    for case in cases:
        yield f"node/{case.name}", lambda case=case: case_digest(case.model, feeds=_node_feeds(case))


def node_sources() -> dict[str, str]:
    """Per node test of the installed ``onnx``: a digest of its model and first data set, so that a
    case whose source changed with another onnx release is told apart from a lowering that changed."""
    from onnx.backend.test.loader import load_model_tests
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    sources = {}
    for case in cases:
        h = hashlib.sha256(case.model.SerializeToString(deterministic=True))
        for value in (case.data_sets[0][0] if case.data_sets else []):
            if isinstance(value, np.ndarray) and value.dtype != object:
                h.update(repr((value.dtype.str, value.shape)).encode())
                h.update(np.ascontiguousarray(value).view(np.uint8).reshape(-1).tobytes() if value.size else b"")
            else:
                h.update(repr(value).encode())
        sources[f"{SOURCE}node/{case.name}"] = h.hexdigest()[:20]
    return sources


def _node_feeds(case) -> dict | None:
    """The first data set's inputs by graph-input name (None where they are not all tensors)."""
    inputs = case.data_sets[0][0] if case.data_sets else []
    names = [v.name for v in case.model.graph.input if v.name not in {i.name for i in case.model.graph.initializer}]
    if len(inputs) != len(names) or not all(isinstance(v, np.ndarray) for v in inputs):
        return None
    return dict(zip(names, inputs))


@functools.cache
def all_cases() -> dict[str, Callable[[], str]]:
    cases: dict[str, Callable[[], str]] = {}
    for source in (_zoo_cases, _recurrent_cases, _op_cases, _node_cases):
        for name, digest in source():
            cases[name] = digest
    return cases


def _expected() -> dict[str, str]:
    return json.loads(EXPECTED_FILE.read_text())


GROUPS = ("zoo", "text_recognizer", "recurrent", "op", "composite", "node")
SOURCE = "source/"  # keys of the node tests' source digests in lowering_digests.json
#: of the recorded node tests, the share whose source must be unchanged in the installed onnx
NODE_SOURCES_KEPT = 0.8


@pytest.mark.parametrize("group", GROUPS)
def test_lowered_programs_are_unchanged(group):
    everything = _expected()
    expected = {k: v for k, v in everything.items() if k.split("/")[0].split("@")[0] == group}
    assert expected, f"no expected digests for {group}"
    if group == "node":  # the cases come from the installed onnx: compare those whose source is unchanged
        sources = node_sources()
        same = {k for k in expected if everything.get(SOURCE + k) is not None and everything[SOURCE + k] == sources.get(SOURCE + k)}
        assert len(same) >= NODE_SOURCES_KEPT * len(expected), (
            f"only {len(same)} of {len(expected)} recorded node tests are unchanged in the installed onnx "
            f"{onnx.__version__}: regenerate lowering_digests.json (see the docstring)")
        expected = {k: v for k, v in expected.items() if k in same}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = {name: fn() for name, fn in all_cases().items() if name in expected}
    assert set(got) == set(expected), "cases came or went: regenerate lowering_digests.json (see the docstring)"
    changed = sorted(name for name in expected if got[name] != expected[name])
    assert not changed, f"{len(changed)} lowered programs changed, e.g. {changed[:10]}"


def main() -> None:
    parser = argparse.ArgumentParser(description="print or write the lowering digests")
    parser.add_argument("--write", action="store_true", help=f"write {EXPECTED_FILE.name}")
    args = parser.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        digests = {name: fn() for name, fn in all_cases().items()}
    digests.update(node_sources())
    if args.write:
        EXPECTED_FILE.write_text(json.dumps(digests, indent=0, sort_keys=True) + "\n")
    errors = sum(v.startswith("error:") for v in digests.values())
    print(f"{sum(not k.startswith(SOURCE) for k in digests)} cases ({errors} refused)" + (f", written to {EXPECTED_FILE}" if args.write else ""))


if __name__ == "__main__":
    main()
