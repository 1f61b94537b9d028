"""A request far larger than one batch is sliced into parts that any worker serves
(issue 12, "the remainder put back"), here with one worker pulling its own parts
back from the in-process queue; tests/cluster/test_parts.py kills workers mid-way."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from fleetserve.server import EmbeddedServer
from fleetserve.stack import build_worker
from fleetserve.worker import Worker

from ..conftest import TINY, ServerThread
from .test_failures import serving

TEXTS = [f"sentence number {i} about {'many ' * (i % 7)}things" for i in range(60)]


def embed(srv: ServerThread, texts: list[str]) -> np.ndarray:
    r = httpx.post(f"{srv.url}/v1/encode/{TINY}", json={"inputs": texts}, timeout=30)
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["embeddings"], dtype=np.float32)


def slices(srv: ServerThread) -> float:
    text = httpx.get(f"{srv.url}/metrics", timeout=5).text
    lines = [ln for ln in text.splitlines() if ln.startswith("fleetserve_slices_total")]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)


def on_a_shared_queue(s: EmbeddedServer) -> Worker:
    """The worker on a shared queue, with no publisher for parts."""
    return build_worker(s.stack, s.queue, s.metrics, s.settings, s.tracer, shared_queue=True)


def sharing(s: EmbeddedServer) -> Worker:
    """The worker as `fleetserve worker` builds it: on a shared queue, publishing parts."""
    return build_worker(
        s.stack, s.queue, s.metrics, s.settings, s.tracer, shared_queue=True, publisher=s.queue
    )


def test_a_large_request_is_served_in_parts_in_order(
    tiny_catalog: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(tiny_catalog) as whole:
        expected = embed(whole, TEXTS)
        assert slices(whole) == 0  # alone on its queue: nothing to share
    # a budget of 64 tokens: the 60 sentences would make several parts
    monkeypatch.setattr(EmbeddedServer, "_new_worker", on_a_shared_queue)
    with serving(tiny_catalog, max_batch_tokens=64) as srv:
        np.testing.assert_allclose(embed(srv, TEXTS), expected, rtol=1e-4, atol=1e-5)
        assert slices(srv) == 0  # no publisher to share them through: served whole
    monkeypatch.setattr(EmbeddedServer, "_new_worker", sharing)
    with serving(tiny_catalog, max_batch_tokens=64) as srv:
        assert srv.server is not None and srv.server.worker.shared_queue
        got = embed(srv, TEXTS)
        assert slices(srv) >= 2
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
        # a small request is not sliced
        before = slices(srv)
        np.testing.assert_allclose(embed(srv, TEXTS[:2]), expected[:2], rtol=1e-4, atol=1e-5)
        assert slices(srv) == before
