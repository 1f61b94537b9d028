"""The import graph of src/fleetserve has no cycles and points down the layer order.

`LAYERS` is the order, lowest first; `docs/architecture.md` ("Layers") shows the same
table, and a test checks that they agree. Every import counts, function-level and
`TYPE_CHECKING` ones included (see `tests/import_graph.py`).

`python -m tests.test_imports` prints the cycles, the upward imports and the levels.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from .import_graph import (
    ROOT,
    Edge,
    adjacency,
    build,
    cycles,
    entry_module,
    layer_of,
    levels,
    module_files,
    upward,
)

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"

# lowest first: a module may import its own layer and those below it. An entry is a
# package (all of it), a module, `pkg.__init__` (the package's own module) or
# `__init__` (fleetserve's); the most specific entry that holds a module places it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vocabulary", ("wire",)),
    (
        "base",
        (
            "__init__",
            "sdk",
            "settings",
            "settings_fields",
            "settings_limits",
            "settings_background",
            "yamlio",
            "http_limits",
            "lifecycle",
            "aio",
            "metrics",
            "logs",
            "tracing",
            "storage",
            "queue",
            "catalog",
            "cluster.natsd",
            "cluster.presence",
        ),
    ),
    (
        "engines",
        ("families", "runtimes", "lora.mixed", "lora.shapes", "lora.safetensors_header"),
    ),
    ("fleet", ("fleet", "lora")),
    ("serving", ("worker", "gateway")),
    (
        "assembly",
        (
            "assembly",
            "stack",
            "hot_models",
            "catalog_watch",
            "adapters_setup",
            "finetune_setup",
            "gateway_setup",
            "gateway.__init__",
            "gateway.app",
            "dashboard",
            "bench",
            "add",
        ),
    ),
    (
        "processes",
        (
            "server",
            "cluster",
            "worker.process",
            "worker.devices",
            "worker.device_child",
            "gateway.process",
        ),
    ),
    (
        "commands",
        ("cli", "cli_groups", "cli_keys", "cli_lora", "cli_models", "cli_add", "__main__", "ops"),
    ),
)
ORDER = [entries for _, entries in LAYERS]


@functools.cache
def _edges() -> tuple[Edge, ...]:
    """The graph of src/fleetserve, read once per session."""
    return tuple(build())


def _short(module: str) -> str:
    return module.removeprefix(f"{ROOT}.")


def _said(e: Edge) -> str:
    source, target = layer_of(e.source, ORDER), layer_of(e.target, ORDER)
    assert source is not None and target is not None
    return (
        f"{_short(e.source)}:{e.line} -> {_short(e.target)} "
        f"({LAYERS[source][0]} imports {LAYERS[target][0]})"
    )


def test_no_import_cycles() -> None:
    found = cycles(adjacency(_edges()))
    said = ["  " + " <-> ".join(_short(m) for m in c) for c in found]
    assert not found, "import cycles (move the shared piece down a layer):\n" + "\n".join(said)


def test_no_import_points_up_the_layers() -> None:
    up = upward(_edges(), ORDER)
    said = "\n".join("  " + _said(e) for e in up)
    assert not up, f"imports up the layer order (tests/test_imports.py LAYERS):\n{said}"


def test_every_module_has_a_layer() -> None:
    unplaced = [_short(m) for m in module_files() if layer_of(m, ORDER) is None]
    assert not unplaced, f"place these in LAYERS and in docs/architecture.md: {unplaced}"


def test_every_layer_entry_names_a_module_of_ours() -> None:
    modules = module_files()
    stale = [e for entries in ORDER for e in entries if entry_module(e)[0] not in modules]
    assert not stale, f"LAYERS names modules that do not exist: {stale}"
    every = [e for entries in ORDER for e in entries]
    assert len(every) == len(set(every)), "an entry is in two layers"


def _doc_layers(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """The rows of the table under "## Layers": a name, then backquoted paths."""
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[1].startswith("`"):
            continue
        paths = re.findall(r"`([^`]+)`", cells[1])
        entries = tuple(p.removesuffix("/").removesuffix(".py").replace("/", ".") for p in paths)
        rows.append((cells[0], entries))
    return rows


def test_the_architecture_doc_shows_the_same_layers() -> None:
    assert _doc_layers(DOC.read_text()) == [(name, entries) for name, entries in LAYERS]


def test_the_sdk_imports_only_wire() -> None:
    """A client: installed beside servers or apart from them, it needs no server code."""
    sdk = f"{ROOT}.sdk"
    bad = [
        f"{_short(e.source)}:{e.line} -> {_short(e.target)}"
        for e in _edges()
        if e.source.startswith(sdk + ".") or e.source == sdk
        if not e.target.startswith((sdk + ".", f"{ROOT}.wire.")) and e.target != f"{ROOT}.wire"
    ]
    assert not bad, f"sdk/ may import only wire/: {bad}"


# -- the graph builder itself, on a small package --------------------------------------


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / ROOT / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_graph_counts_deferred_relative_and_submodule_imports(tmp_path: Path) -> None:
    src = _package(
        tmp_path,
        {
            "__init__.py": "",
            "low/__init__.py": "X = 1\n",
            "low/leaf.py": "",
            "low/other.py": "from . import leaf\nfrom .. import low\n",
            "high/__init__.py": "",
            "high/top.py": (
                "from typing import TYPE_CHECKING\n"
                "import json\n"
                "from fleetserve.low import X\n"
                "if TYPE_CHECKING:\n    from ..low import other\n"
                "def f():\n    import fleetserve.low.leaf\n"
            ),
        },
    )
    got = {(_short(e.source), _short(e.target)) for e in build(src)}
    assert got == {
        ("low.other", "low.leaf"),  # a submodule by `from . import`
        ("low.other", "low"),  # the package, two dots up
        ("high.top", "low"),  # a name of the package, not a submodule
        ("high.top", "low.other"),  # under TYPE_CHECKING
        ("high.top", "low.leaf"),  # in a function
    }


def test_a_cycle_and_an_upward_import_are_named(tmp_path: Path) -> None:
    src = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from . import b\n",
            "b.py": "def f():\n    from . import a\n",
            "c.py": "from .a import thing\n",
        },
    )
    edges = build(src)
    assert cycles(adjacency(edges)) == [[f"{ROOT}.a", f"{ROOT}.b"]]
    assert levels(adjacency(edges)) == 2  # c, then the cycle a <-> b as one
    up = upward(edges, [["c"], ["a", "b"]])
    assert [(_short(e.source), _short(e.target), e.line) for e in up] == [("c", "a", 1)]


def main() -> None:
    edges = build()
    graph = adjacency(edges)
    found = cycles(graph)
    print(f"{len(graph)} modules, {len({(e.source, e.target) for e in edges})} imports")
    print(f"{len(found)} cycles:")
    for c in found:
        print(f"  ({len(c)}) " + " ".join(_short(m) for m in c))
    up = upward(edges, ORDER)
    pairs = {(e.source, e.target) for e in up}
    print(f"{len(pairs)} upward imports ({len(up)} import statements):")
    for e in up:
        print("  " + _said(e))
    print(f"levels: {levels(graph)}")


if __name__ == "__main__":
    main()
