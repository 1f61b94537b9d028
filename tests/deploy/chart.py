"""Rendering the Helm chart for the deploy tests: helm_python (Helm v4's SDK) offline.

The official NATS chart is a dependency that no chart repository here can serve, so
``charts/`` stays empty: ``helm_python.lint`` reports it as a warning and ``render``
renders this chart's own templates without the subchart (no NATS manifests). Nothing is
vendored or faked: what the tests check of NATS is the values handed to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "fleetserve"
helm = pytest.importorskip("helm_python", reason="helm-python-sdk is not installed")


def values_file(name: str) -> dict[str, Any]:
    data = yaml.safe_load((CHART / name).read_text())
    assert isinstance(data, dict)
    return data


def render(values: dict[str, Any] | None = None, namespace: str = "ml") -> dict[str, str]:
    """Template path -> rendered text (``helm template demo ... -n ml``)."""
    with helm.Chart.load(CHART) as chart:
        out: dict[str, str] = chart.render(values, name="demo", namespace=namespace)
    return out


def manifests(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every object the chart renders (NOTES.txt left out)."""
    docs: list[dict[str, Any]] = []
    for path, text in render(values).items():
        if path.endswith(".txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]
