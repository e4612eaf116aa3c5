"""gpumnn's import graph has no cycle, and no module imports from a layer above its own.

The graph is read with ``ast`` from the sources (nothing is imported): every ``import`` and
``from ... import`` naming a gpumnn module, relative or absolute, wherever it stands -- at module
level, inside a function (a deferred import is still a dependency) or under ``TYPE_CHECKING``
(a cycle for a type checker is a cycle for a reader). ``from package import name`` is an edge
to ``package.name`` when that is a module, else to ``package`` (its ``__init__``). Importing a
submodule runs its package's ``__init__`` too, but that is not counted as an edge (as in other
import linters): a package may gather its submodules without a cycle.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "gpumnn"

#: lowest first: a module may import from its own layer or a lower one, never a higher one
LAYERS: tuple[tuple[str, ...], ...] = (
    # the data everything shares: errors, the IR, the atomic program, pure maths, a disk cache
    ("gpumnn.errors", "gpumnn.ir", "gpumnn.atomic", "gpumnn.input_shapes", "gpumnn.diskcache", "gpumnn.numerics"),
    # the Backend contract and what runs atomic ops: limits, kernels and their planners, the APIs
    ("gpumnn.backends",),
    # IR at shapes -> atomic program (folds constants on the cpu backend)
    ("gpumnn.geometry",),
    # schemes and their expansion, cost, placement, overlap, memory, resources
    ("gpumnn.scheduler",),
    # ONNX -> IR once (the optimisations lower nodes to compare them)
    ("gpumnn.frontend",),
    # sessions: shape sets, run states, shared constants, device arrays
    ("gpumnn.runtime",),
    # the entry points: gpumnn.load, the ONNX backend API, the command line, the model zoo, Ray Data
    ("gpumnn", "gpumnn.__main__", "gpumnn.cli", "gpumnn.net", "gpumnn.onnx_backend", "gpumnn.tools", "gpumnn.zoo",
     "gpumnn.integrations"),
)

#: inside gpumnn.backends, lowest first; the five API packages do not import one another
BACKEND_LAYERS: tuple[tuple[str, ...], ...] = (
    ("gpumnn.backends.base", "gpumnn.backends.limits", "gpumnn.backends.device_choice", "gpumnn.backends.speed",
     "gpumnn.backends.lanes", "gpumnn.backends.deferred", "gpumnn.backends.waits"),
    ("gpumnn.backends.kernels",),
    ("gpumnn.backends.cpu", "gpumnn.backends.opencl", "gpumnn.backends.cuda", "gpumnn.backends.vulkan", "gpumnn.backends.gl"),
    ("gpumnn.backends",),  # the registry names the API modules as strings only
)
API_PACKAGES = BACKEND_LAYERS[2]


def module_files() -> dict[str, Path]:
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                           for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:  # `import gpumnn.x.y` names gpumnn.x.y
                    target = target.rpartition(".")[0]
                if target.startswith("gpumnn") and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def rank(module: str, layers: tuple[tuple[str, ...], ...]) -> tuple[int, str] | None:
    """(layer, prefix) of the longest prefix naming ``module`` in ``layers`` (``gpumnn`` names
    the package's ``__init__`` alone)."""
    best = None
    for i, prefixes in enumerate(layers):
        for prefix in prefixes:
            if (module == prefix or (prefix != "gpumnn" and module.startswith(prefix + "."))) and (best is None or len(prefix) > len(best[1])):
                best = (i, prefix)
    return best


def test_graph_is_read():
    graph = import_graph()
    assert "gpumnn.backends.base" in graph["gpumnn.backends"]
    assert "gpumnn.geometry.registry" in graph["gpumnn.geometry"]
    assert sum(len(v) for v in graph.values()) > 200


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_every_module_has_a_layer():
    missing = [m for m in import_graph() if rank(m, LAYERS) is None]
    assert not missing, f"modules in no layer of {__name__}.LAYERS: {missing}"


@pytest.mark.parametrize("layers", [LAYERS, BACKEND_LAYERS], ids=["package", "backends"])
def test_no_import_runs_up_the_layers(layers):
    bad = []
    for module, targets in sorted(import_graph().items()):
        mine = rank(module, layers)
        for target in sorted(targets):
            theirs = rank(target, layers)
            if mine is not None and theirs is not None and theirs[0] > mine[0]:
                bad.append(f"{module} (layer {mine[0]}) imports {target} (layer {theirs[0]})")
    assert not bad, "imports from a higher layer:\n" + "\n".join(bad)


def test_backend_apis_do_not_import_one_another():
    bad = []
    for module, targets in sorted(import_graph().items()):
        mine = rank(module, (API_PACKAGES,))
        for target in sorted(targets):
            theirs = rank(target, (API_PACKAGES,))
            if mine and theirs and mine[1] != theirs[1]:
                bad.append(f"{module} imports {target}")
    assert not bad, "\n".join(bad)
