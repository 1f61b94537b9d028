"""Readiness that means something: a distributed gateway is ready once a worker is, with
the pinned models it serves; before that, ``/readyz`` and requests' 503s say why, and
a 503 carries the estimate as Retry-After."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from fleetserve.catalog import Catalog, ModelSpec
from fleetserve.gateway import Gateway
from fleetserve.gateway.readiness import not_ready
from fleetserve.gateway.wiring import Hooks
from fleetserve.lifecycle import shutdown, start_http
from fleetserve.metrics import Metrics
from fleetserve.queue import MemoryQueue
from fleetserve.settings import Settings
from fleetserve.wire.heartbeat import Heartbeat, ModelBeat

PINNED = ModelSpec(id="a/pinned", family="dense", runtime="torch", sources=("/x",), pinned=True)
LAZY = ModelSpec(id="a/lazy", family="dense", runtime="torch", sources=("/x",))
CATALOG = Catalog([PINNED, LAZY])


def beat(wid: str, ready: bool, *models: str) -> Heartbeat:
    return Heartbeat(id=wid, ready=ready, models={m: ModelBeat() for m in models})


def test_ready_needs_the_queue_a_ready_worker_and_the_pinned_models() -> None:
    assert not_ready(False, CATALOG, [beat("w0", True, PINNED.id)]) == "not connected to the queue"
    assert not_ready(True, CATALOG, []) == "no worker is ready yet"
    assert not_ready(True, CATALOG, [beat("w0", False)]) == "no worker is ready yet (1 starting)"
    # the ready worker serves only the lazy model; the one with the pinned one is loading
    loading = [beat("w0", True, LAZY.id), beat("w1", False, PINNED.id)]
    assert not_ready(True, CATALOG, loading) == "pinned models still loading: a/pinned"
    assert not_ready(True, CATALOG, [*loading, beat("w2", True, PINNED.id)]) == ""
    # a pinned model no live worker serves holds nobody back (workers split the catalog)
    assert not_ready(True, CATALOG, [beat("w0", True, LAZY.id)]) == ""


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[str, list[str]]]:
    """A gateway whose process is not ready: it says why and when."""
    reason = ["tuning a/pinned for this machine (--tune quick), about 42 s left"]
    hooks = Hooks(ready=lambda: not reason[0], not_ready=lambda: reason[0],
                  ready_in=lambda: 42.0 if reason[0] else None)  # fmt: skip
    queue = MemoryQueue(16, 1.0)
    await queue.start()
    gw = Gateway(Settings.load(overrides={"port": 0}), CATALOG, queue, Metrics(), hooks=hooks)
    server, task, port = await start_http(gw, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{port}", reason
    await shutdown(server, [task])
    await queue.close()


async def test_not_ready_says_why_and_when(gateway: tuple[str, list[str]]) -> None:
    url, reason = gateway
    async with httpx.AsyncClient(base_url=url) as c:
        r = await c.get("/readyz")
        assert r.status_code == 503 and r.json() == {"ready": False, "reason": reason[0]}
        r = await c.post(f"/v1/encode/{LAZY.id}", json={"inputs": ["hi"]})
        assert r.status_code == 503 and r.headers["retry-after"] == "42"
        assert r.json()["error"]["message"] == f"not ready: {reason[0]}"
        reason[0] = ""
        assert (await c.get("/readyz")).json() == {"ready": True}
