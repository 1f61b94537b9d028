"""The model catalog: YAML specs shipped in the package, plus user directories."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path

import yaml

from ..wire import ModelNotFound
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
    def load(cls, extra_dirs: Iterable[Path] = (), *, bundled: bool = True) -> Catalog:
        specs: list[ModelSpec] = []
        if bundled:
            root = resources.files(__package__) / "models"
            for entry in sorted(root.iterdir(), key=lambda e: e.name):
                if entry.name.endswith((".yaml", ".yml")):
                    specs.append(_parse(entry.read_text(), entry.name))
        for d in extra_dirs:
            for f in sorted(Path(d).glob("*.y*ml")):
                specs.append(_parse(f.read_text(), str(f)))
        return cls(specs)

    def get(self, model_id: str) -> ModelSpec:
        try:
            return self._specs[model_id]
        except KeyError:
            known = ", ".join(sorted(self._specs)) or "none"
            raise ModelNotFound(
                f"unknown model {model_id!r}; this server serves: {known}", field="model"
            ) from None

    def __contains__(self, model_id: object) -> bool:
        return model_id in self._specs

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def restrict(self, ids: Iterable[str]) -> Catalog:
        return Catalog(self.get(i) for i in ids)


def _parse(text: str, where: str) -> ModelSpec:
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a model spec must be a mapping")
    try:
        return ModelSpec.from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


__all__ = [
    "DEFAULT_MODEL",
    "Catalog",
    "CostModel",
    "ModelSpec",
    "Profile",
    "is_present",
    "resolve",
]
