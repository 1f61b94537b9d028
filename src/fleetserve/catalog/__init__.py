"""The model catalog: YAML specs shipped in the package, plus user directories."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path

import yaml

from ..wire import ModelNotFound
from ..wire.suggest import did_you_mean
from ..yamlio import load_yaml
from .complete import Locate, complete_present, locator
from .sources import is_present, resolve
from .spec import CostModel, ModelSpec, Profile

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


class Catalog:
    """Model specs by id. Later entries (user directories) override bundled ones."""

    def __init__(self, specs: Iterable[ModelSpec] = ()) -> None:
        self._specs: dict[str, ModelSpec] = {}
        for s in specs:
            self._specs[s.id] = s

    @classmethod
    def load(
        cls,
        extra_dirs: Iterable[Path] = (),
        *,
        bundled: bool = True,
        weights: Locate | None = None,
    ) -> Catalog:
        """The bundled specs, then each of ``extra_dirs`` (``--catalog``) in order.

        Everything is validated here, at start: a directory that does not exist, a file
        that is not YAML, an unknown key or value is a one-line ``ValueError`` naming
        the file and the key. Each spec whose weights ``weights`` finds on this machine
        (default: the default caches, ``complete.locator()``) gets the keys it left out
        from its model's own files (``complete.py``)."""
        where = weights or locator()
        specs: list[ModelSpec] = []
        if bundled:
            root = resources.files(__package__) / "models"
            for entry in sorted(root.iterdir(), key=lambda e: e.name):
                if entry.name.endswith((".yaml", ".yml")):
                    specs.append(_parse(entry.read_text(), entry.name))
        for d in extra_dirs:
            specs.extend(_parse(_read(f), str(f)) for f in _spec_files(Path(d).expanduser()))
        return cls(complete_present(s, where) for s in cls(specs))

    def get(self, model_id: str) -> ModelSpec:
        try:
            return self._specs[model_id]
        except KeyError:
            known = ", ".join(sorted(self._specs)) or "none"
            hint = did_you_mean(model_id, self._specs) or ";"
            raise ModelNotFound(
                f"unknown model {model_id!r}{hint} known models: {known}", field="model"
            ) from None

    def __contains__(self, model_id: object) -> bool:
        return model_id in self._specs

    def __iter__(self) -> Iterator[ModelSpec]:
        """A snapshot: a hot add or remove meanwhile never breaks a loop over it."""
        return iter(list(self._specs.values()))

    def __len__(self) -> int:
        return len(self._specs)

    def restrict(self, ids: Iterable[str]) -> Catalog:
        return Catalog(self.get(i) for i in ids)

    def add(self, spec: ModelSpec) -> None:
        """Serve ``spec`` from now on (a hot add: the caller checked that its id is new)."""
        self._specs[spec.id] = spec

    def discard(self, model_id: str) -> None:
        """Serve ``model_id`` no longer (a hot remove); nothing if it is not here."""
        self._specs.pop(model_id, None)


def read_spec(f: Path) -> ModelSpec:
    """One spec file, validated as ``Catalog.load`` does: a one-line ``ValueError``
    naming the file and the key (the catalog directory's watcher reads files here)."""
    return _parse(_read(f), str(f))


def spec_files(d: Path) -> list[Path]:
    """The spec files (``*.yaml``, ``*.yml``) of catalog directory ``d``."""
    return _spec_files(d)


def _spec_files(d: Path) -> list[Path]:
    hint = "--catalog (FLEETSERVE_CATALOG) takes a directory of model spec *.yaml files"
    if not d.exists():
        raise ValueError(f"catalog directory {d} does not exist; {hint}")
    if not d.is_dir():
        raise ValueError(f"catalog directory {d} is not a directory; {hint}")
    return sorted(f for f in d.glob("*.y*ml") if f.suffix in (".yaml", ".yml"))


def _read(f: Path) -> str:
    try:
        return f.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ValueError(f"{f}: cannot read the model spec: {reason}") from None


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _parse(text: str, where: str) -> ModelSpec:
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or exc
        raise ValueError(f"{where}: {at}invalid YAML: {_one_line(problem)}") from None
    if data is None:
        raise ValueError(f"{where}: the file is empty; a model spec needs at least id and sources")
    try:
        return ModelSpec.from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{where}: {_one_line(exc)}") from None


__all__ = [
    "DEFAULT_MODEL",
    "Catalog",
    "CostModel",
    "Locate",
    "ModelSpec",
    "Profile",
    "is_present",
    "read_spec",
    "resolve",
    "spec_files",
]
