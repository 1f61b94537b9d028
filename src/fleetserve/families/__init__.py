"""Model families: small adapters over a runtime.

Each family lives in its own module and is imported only when a model of that
family is loaded, so an optional dependency (Pillow, llguidance) is needed only by
the models that use it.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ..catalog import ModelSpec
from ..runtimes import Runtime
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


def create_adapter(spec: ModelSpec, runtime: Runtime, path: Path) -> FamilyAdapter:
    target = FAMILIES.get(spec.family)
    if target is None:
        raise ValueError(
            f"model {spec.id}: unknown family {spec.family!r}; available: "
            + ", ".join(sorted(FAMILIES))
        )
    module, _, cls = target.partition(":")
    adapter: FamilyAdapter = getattr(importlib.import_module(f"{__name__}.{module}"), cls)(
        spec, runtime, path
    )
    return adapter


__all__ = ["FAMILIES", "FamilyAdapter", "Prepared", "create_adapter"]
