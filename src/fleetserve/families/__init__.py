"""Model families: small adapters over a runtime.

Each family lives in its own module and is imported only when a model of that
family is loaded, so an optional dependency (Pillow, llguidance) is needed only by
the models that use it.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from ..catalog import ModelSpec
from ..runtimes import Runtime
from ..wire import Task
from .base import FamilyAdapter, Prepared

# family name -> "module:Class", relative to this package
FAMILIES: dict[str, str] = {
    "dense": "dense:DenseAdapter",
    "sparse": "sparse:SparseAdapter",
    "multivector": "multivector:MultiVectorAdapter",
    "cross_encoder": "cross_encoder:CrossEncoderAdapter",
    "ner": "ner:NerAdapter",
    "span_ner": "span_ner:SpanNerAdapter",
    "zero_shot": "zero_shot:ZeroShotAdapter",
    "image": "image:ImageAdapter",
    "generate": "generate:GenerateAdapter",
}


def adapter_class(family: str) -> Any:
    """The adapter class of a family, imported on demand (its heavy imports are not)."""
    target = FAMILIES.get(family)
    if target is None:
        raise ValueError(f"unknown family {family!r}; available: " + ", ".join(sorted(FAMILIES)))
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def family_tasks(family: str) -> frozenset[Task]:
    tasks: frozenset[Task] = adapter_class(family).tasks
    return tasks


def create_adapter(spec: ModelSpec, runtime: Runtime, path: Path) -> FamilyAdapter:
    try:
        cls = adapter_class(spec.family)
    except ValueError as exc:
        raise ValueError(f"model {spec.id}: {exc}") from None
    adapter: FamilyAdapter = cls(spec, runtime, path)
    return adapter


__all__ = [
    "FAMILIES",
    "FamilyAdapter",
    "Prepared",
    "adapter_class",
    "create_adapter",
    "family_tasks",
]
