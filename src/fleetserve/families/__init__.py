"""Model families: small layers over a runtime.

Each family lives in its own module and is imported only when a model of that
family is loaded, so an optional dependency (Pillow, llguidance) is needed only by
the models that use it.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..runtimes import Runtime
from ..wire import Task
from .base import AnyFamily, Family, Prepared

if TYPE_CHECKING:
    from ..catalog import ModelSpec

# family name -> "module:Class", relative to this package
FAMILIES: dict[str, str] = {
    "dense": "dense:DenseFamily",
    "sparse": "sparse:SparseFamily",
    "multivector": "multivector:MultiVectorFamily",
    "cross_encoder": "cross_encoder:CrossEncoderFamily",
    "ner": "ner:NerFamily",
    "span_ner": "span_ner:SpanNerFamily",
    "zero_shot": "zero_shot:ZeroShotFamily",
    "image": "image:ImageFamily",
    "generate": "generate:GenerateFamily",
}

_SCORE = frozenset({Task.SCORE, Task.RERANK})
# family name -> the tasks its adapter serves, declared here so that routing and the
# catalog never import a family module (a test checks each adapter class agrees)
FAMILY_TASKS: dict[str, frozenset[Task]] = {
    "dense": frozenset({Task.ENCODE, Task.EMBEDDINGS, *_SCORE}),
    "sparse": frozenset({Task.ENCODE, *_SCORE}),
    "multivector": frozenset({Task.ENCODE, *_SCORE}),
    "cross_encoder": _SCORE,
    "ner": frozenset({Task.EXTRACT}),
    "span_ner": frozenset({Task.EXTRACT}),
    "zero_shot": frozenset({Task.EXTRACT}),
    "image": frozenset({Task.ENCODE, Task.SCORE}),
    "generate": frozenset({Task.CHAT, Task.GENERATE}),
}


class FamilyClass(Protocol):
    """A family class: built from a spec, a runtime and the model's directory."""

    tasks: frozenset[Task]

    def __call__(self, spec: ModelSpec, runtime: Runtime, path: Path) -> AnyFamily: ...


def family_class(family: str) -> FamilyClass:
    """The adapter class of a family, imported on demand (its heavy imports are not)."""
    target = FAMILIES.get(family)
    if target is None:
        raise ValueError(f"unknown family {family!r}; available: " + ", ".join(sorted(FAMILIES)))
    module, _, cls = target.partition(":")
    found: FamilyClass = getattr(importlib.import_module(f"{__name__}.{module}"), cls)
    return found


def family_tasks(family: str) -> frozenset[Task]:
    """The tasks a family serves, without importing its module."""
    tasks = FAMILY_TASKS.get(family)
    if tasks is None:
        raise ValueError(f"unknown family {family!r}; available: " + ", ".join(sorted(FAMILIES)))
    return tasks


def create_family(spec: ModelSpec, runtime: Runtime, path: Path) -> AnyFamily:
    try:
        cls = family_class(spec.family)
    except ValueError as exc:
        raise ValueError(f"model {spec.id}: {exc}") from None
    return cls(spec, runtime, path)


__all__ = [
    "FAMILIES",
    "FAMILY_TASKS",
    "AnyFamily",
    "Family",
    "Prepared",
    "create_family",
    "family_class",
    "family_tasks",
]
