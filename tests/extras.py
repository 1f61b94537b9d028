"""Skips for a missing optional extra, decided without importing it.

A module-level ``pytest.importorskip("sentence_transformers")`` imported it (with
torch, transformers, scikit-learn and pandas: ~4 CPU-seconds) in every process that
collects the suite, whichever of them runs the file."""

from __future__ import annotations

import importlib.util

import pytest


def missing(*modules: str) -> list[str]:
    """Those of ``modules`` that are not installed (nothing is imported)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def needs(*modules: str, extra: str) -> pytest.MarkDecorator:
    """Skip where any of ``modules`` (of the named extra) is not installed."""
    gone = missing(*modules)
    reason = f"the {extra} extra is not installed ({', '.join(gone)})"
    return pytest.mark.skipif(bool(gone), reason=reason)


TRAIN = ("torch", "sentence_transformers", "peft", "datasets", "pytrec_eval")


__all__ = ["TRAIN", "missing", "needs"]
