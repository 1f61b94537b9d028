"""Out of memory in a batch: evict the others, retry once, then run the batch in halves."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from ..conftest import TINY, ServerThread, tiny_settings
from ..hangup import metric
from ..waiting import wait_for

TEXTS = ["the quick brown fox", "jumps over", "the lazy dog", "again and again"]


@pytest.fixture
def server(tiny_catalog: Path) -> Iterator[ServerThread]:
    srv = ServerThread(tiny_settings(tiny_catalog, max_batch_tokens=256)).start()
    yield srv
    srv.stop()


def encode(srv: ServerThread, texts: list[str]) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/encode/{TINY}", json={"inputs": texts}, timeout=30)


def limit_batches(srv: ServerThread, largest: int) -> list[int]:
    """Make the model's forward pass run out of memory above ``largest`` items."""
    assert srv.server is not None
    adapter: Any = srv.server.runners[TINY].family
    real = adapter.forward
    sizes: list[int] = []

    def forward(items: Sequence[Any]) -> Any:
        sizes.append(len(items))
        if len(items) > largest:
            raise MemoryError("cannot allocate the activations")
        return real(items)

    adapter.forward = forward
    return sizes


def test_an_oversized_batch_is_split_and_every_item_answered(server: ServerThread) -> None:
    want = np.asarray(encode(server, TEXTS).json()["embeddings"])
    sizes = limit_batches(server, largest=1)
    r = encode(server, TEXTS)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.asarray(r.json()["embeddings"]), want, atol=1e-6)
    assert sizes[0] == 4 and sizes.count(1) == 4  # 4, then halves down to single items


def test_an_item_that_never_fits_fails_its_own_request_only(server: ServerThread) -> None:
    assert server.server is not None
    runner: Any = server.server.runners[TINY]
    adapter: Any = runner.family
    real = adapter.forward
    sizes: list[int] = []

    def forward(items: Sequence[Any]) -> Any:  # the long text never fits
        sizes.append(len(items))
        if any(len(it) > 12 for it in items):
            raise MemoryError("cannot allocate the activations")
        return real(items)

    adapter.forward = forward
    gate = threading.Event()
    runner._forward.submit(gate.wait, 30)  # hold the compute thread ...
    url = server.url

    def pulled() -> float:  # each request is timed through the queue stage as it is pulled
        return metric(url, "fleetserve_stage_latency_seconds_count", model=TINY, stage="queue")

    def formed(n: int) -> bool:  # ``n`` pulled, and none left waiting for a batch
        return pulled() == n and server.call(lambda: len(runner.waiting)) == 0

    base = pulled()
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(encode, server, ["first"])  # ... with this batch waiting on it
        wait_for(lambda: formed(base + 1), 10, "the first batch to wait on the compute thread")
        short = pool.submit(encode, server, ["a fox"])  # so that these two share the next
        long = pool.submit(encode, server, [" ".join(["the quick brown fox"] * 8)])
        wait_for(lambda: pulled() == base + 3, 10, "the two to reach the worker")
        gate.set()
        ok, bad = short.result(), long.result()
        assert first.result().status_code == 200
    assert ok.status_code == 200, ok.text
    assert bad.status_code == 500 and "MemoryError" in bad.json()["error"]["message"]
    assert sizes[:2] == [1, 2]  # the two shared a batch, which was split
    assert httpx.get(server.url + "/readyz").status_code == 200
    assert httpx.get(server.url + "/healthz").status_code == 200
