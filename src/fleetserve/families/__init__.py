"""Model families: small adapters over a runtime."""

from __future__ import annotations

from pathlib import Path

from ..catalog import ModelSpec
from ..runtimes import Runtime
from .base import FamilyAdapter, Prepared


def create_adapter(spec: ModelSpec, runtime: Runtime, path: Path) -> FamilyAdapter:
    if spec.family == "dense":
        from .dense import DenseAdapter

        return DenseAdapter(spec, runtime, path)
    raise ValueError(f"model {spec.id}: unknown family {spec.family!r}; available: dense")


__all__ = ["FamilyAdapter", "Prepared", "create_adapter"]
