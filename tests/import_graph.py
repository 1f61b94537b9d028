"""The import graph of src/fleetserve, read with `ast`, and what is wrong with it.

Every `import` and `from ... import` counts, wherever it stands: at module level, in a
function, under `if TYPE_CHECKING:`. A deferred import still says that one module needs
another, so it closes a cycle as surely as a top-level one. Only modules of ours are
nodes; `from pkg import name` is an edge to `pkg.name` when that is a submodule, and to
`pkg` (its `__init__`) otherwise.

`python -m tests.test_imports` prints them with the layer order of that test.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "fleetserve"


@dataclass(frozen=True)
class Edge:
    """One import statement: who imports whom, and where."""

    source: str
    target: str
    line: int


def module_files(src: Path = SRC) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its `__init__.py`)."""
    out: dict[str, Path] = {}
    for path in sorted((src / ROOT).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _base(module: str, is_package: bool, level: int) -> str:
    """The package a relative import of `level` dots in `module` starts from."""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    return ".".join(parts[: len(parts) - (level - 1)])


def _targets(node: ast.AST, module: str, is_package: bool, known: Iterable[str]) -> list[str]:
    names = set(known)
    if isinstance(node, ast.Import):
        found = []
        for alias in node.names:
            name = alias.name
            while name and name not in names:
                name = name.rpartition(".")[0]
            if name:
                found.append(name)
        return found
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = _base(module, is_package, node.level)
        package = f"{base}.{node.module}" if node.module else base
    else:
        package = node.module or ""
    if package not in names:
        return []
    return [
        f"{package}.{alias.name}" if f"{package}.{alias.name}" in names else package
        for alias in node.names
    ]


def build(src: Path = SRC) -> list[Edge]:
    """Every import between two modules of ours, self-imports left out."""
    files = module_files(src)
    edges: list[Edge] = []
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _targets(node, module, is_package, files):
                    if target != module:
                        edges.append(Edge(module, target, node.lineno))
    return edges


def adjacency(edges: Iterable[Edge]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for e in edges:
        out.setdefault(e.source, set()).add(e.target)
        out.setdefault(e.target, set())
    return out


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(iter(children), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def levels(graph: Mapping[str, set[str]]) -> int:
    """The longest chain of imports, counted in modules, each cycle as one module."""
    component = {m: m for m in graph}
    for members in cycles(graph):
        for m in members:
            component[m] = members[0]
    condensed: dict[str, set[str]] = {c: set() for c in component.values()}
    for m, targets in graph.items():
        condensed[component[m]].update(component[t] for t in targets)
    for c, targets in condensed.items():
        targets.discard(c)
    depth: dict[str, int] = {}

    def height(node: str) -> int:
        if node not in depth:
            depth[node] = 0  # no cycles remain in the condensed graph
            depth[node] = 1 + max((height(t) for t in condensed[node]), default=0)
        return depth[node]

    return max((height(c) for c in condensed), default=0)


def entry_module(entry: str) -> tuple[str, bool]:
    """The module a layer-table entry names, and whether it covers that module only:
    ``worker`` is the package and everything in it, ``worker.cores`` one module,
    ``gateway.__init__`` the package's own module only, ``__init__`` fleetserve's."""
    if entry == "__init__":
        return ROOT, True
    if entry.endswith(".__init__"):
        return f"{ROOT}.{entry.removesuffix('.__init__')}", True
    return f"{ROOT}.{entry}", False


def layer_of(module: str, layers: Sequence[Sequence[str]]) -> int | None:
    """The index of the layer whose most specific entry holds ``module``."""
    best: tuple[int, int] | None = None
    for rank, members in enumerate(layers):
        for entry in members:
            name, exact = entry_module(entry)
            inside = module == name or (not exact and module.startswith(name + "."))
            weight = len(name) + exact  # the package's own module beats the package
            if inside and (best is None or weight > best[0]):
                best = (weight, rank)
    return None if best is None else best[1]


def upward(edges: Iterable[Edge], layers: Sequence[Sequence[str]]) -> list[Edge]:
    """The imports from a module to one in a higher layer."""
    out = []
    for e in edges:
        source, target = layer_of(e.source, layers), layer_of(e.target, layers)
        if source is not None and target is not None and target > source:
            out.append(e)
    return sorted(set(out), key=lambda e: (e.source, e.target, e.line))
