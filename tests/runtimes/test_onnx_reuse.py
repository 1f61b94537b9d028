"""An ONNX export's second load reuses the cache, and is faster. Timed, so apart from
test_onnx.py, whose tests run at nice 19 beside the tunes (marker ``soaks``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from fleetserve.runtimes import Head
from fleetserve.runtimes import onnx_export as ox

from .test_onnx import forbid, load, mean, tiny

__all__ = ["tiny"]  # the fixture, shared with test_onnx.py


@pytest.mark.slow
def test_second_load_reuses_the_cache(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t0 = time.perf_counter()
    first = load(tiny, tmp_path)
    cold = time.perf_counter() - t0
    assert first.export is not None
    entry = first.export.entry
    assert entry.parent == tmp_path / "onnx" and entry.name == ox.cache_key(tiny, Head.BASE)
    assert {p.name for p in entry.iterdir()} == {"model.onnx", "meta.json"}
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["head"] == "base" and meta["outputs"] == ["mean", "cls", "hidden"]
    stamp = (entry / "model.onnx").stat().st_mtime_ns
    forbid(monkeypatch, "_export_graph")
    t0 = time.perf_counter()
    second = load(tiny, tmp_path)
    warm = time.perf_counter() - t0
    assert (entry / "model.onnx").stat().st_mtime_ns == stamp
    assert warm < cold
    np.testing.assert_array_equal(mean(second, tiny), mean(first, tiny))
