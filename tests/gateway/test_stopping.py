"""A server that stops with requests in flight (``--stop-grace``): they have the grace to
finish; those still waiting then get a 503 with Retry-After, a started stream its error
event and its end. Before, uvicorn cancelled them at the grace's end: a plain-text 500
("Internal Server Error") and a stream cut off with neither. A gateway over a memory
queue with a stand-in worker, on loopback port 0."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from fleetserve.catalog import Catalog, ModelSpec
from fleetserve.gateway import Gateway
from fleetserve.gateway.wiring import Hooks
from fleetserve.lifecycle import shutdown, start_http
from fleetserve.metrics import Metrics
from fleetserve.queue import MemoryQueue
from fleetserve.settings import Settings
from fleetserve.wire import Encoding, Reply

MODEL = "gen/stub"
GRACE_S = 0.5


@dataclass
class Stopping:
    url: str
    queue: MemoryQueue
    stop: asyncio.Event  # set: the server stops


@pytest.fixture
async def stopping() -> AsyncIterator[Stopping]:
    spec = ModelSpec(id=MODEL, family="generate", runtime="torch", sources=("/nowhere",))
    settings = Settings.load(overrides={"port": 0, "retry_after": 3.0})
    queue = MemoryQueue(16, 1.0)
    await queue.start()
    gw = Gateway(settings, Catalog([spec]), queue, Metrics(), hooks=Hooks(ready=lambda: True))
    server, task, port = await start_http(gw, "127.0.0.1", 0, settings, GRACE_S)
    stop = asyncio.Event()

    async def stopper() -> None:
        await stop.wait()
        gw.stopping = True  # as the processes do at their stop
        await shutdown(server, [task])

    stopped = asyncio.create_task(stopper())
    yield Stopping(f"http://127.0.0.1:{port}", queue, stop)
    stop.set()
    await stopped
    await queue.close()


async def queued_in(queue: MemoryQueue) -> None:
    async with asyncio.timeout(10):
        while queue.depth(MODEL) == 0:
            await asyncio.sleep(0.005)


async def test_a_request_still_waiting_when_the_grace_ends_gets_503_with_retry_after(
    stopping: Stopping,
) -> None:
    async with httpx.AsyncClient(timeout=30) as c:
        call = asyncio.create_task(c.post(f"{stopping.url}/v1/generate/{MODEL}", json={}))
        await queued_in(stopping.queue)  # no worker: it waits
        t0 = time.monotonic()
        stopping.stop.set()
        r = await call
    assert time.monotonic() - t0 < GRACE_S + 5
    assert r.status_code == 503 and r.headers["retry-after"] == "3"
    error = r.json()["error"]
    assert error["code"] == "unavailable" and "stopping" in error["message"]


async def test_a_started_stream_gets_its_error_event_and_its_end(stopping: Stopping) -> None:
    async def worker() -> None:  # one chunk, then it would go on for long
        for msg in await stopping.queue.pull([MODEL], 1 << 20, 5):
            first = Reply(b'data: {"n": 0}\n\n', Encoding.JSON, final=False)
            await stopping.queue.reply(msg, first)
            await asyncio.sleep(60)

    task = asyncio.create_task(worker())
    events = []
    async with httpx.AsyncClient(timeout=30) as c:
        body = {"prompt": "hi", "stream": True}
        async with c.stream("POST", f"{stopping.url}/v1/generate/{MODEL}", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    events.append(line)
                    stopping.stop.set()  # after the first chunk
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert events[0] == 'data: {"n": 0}' and len(events) == 2
    error = json.loads(events[1].removeprefix("data:"))["error"]
    assert error["code"] == "unavailable" and "stopping" in error["message"]


@pytest.mark.parametrize("stopping", [False, True])
async def test_only_a_stops_cancel_is_answered_503_any_other_goes_on_up(stopping: bool) -> None:
    spec = ModelSpec(id=MODEL, family="generate", runtime="torch", sources=("/nowhere",))
    queue = MemoryQueue(16, 1.0)
    await queue.start()
    gw = Gateway(Settings.load(overrides={"port": 0}), Catalog([spec]), queue, Metrics(),
                 hooks=Hooks(ready=lambda: True))  # fmt: skip
    gw.stopping = stopping
    scope = {"type": "http", "method": "POST", "path": f"/v1/generate/{MODEL}", "headers": [],
             "query_string": b""}  # fmt: skip
    messages = [{"type": "http.request", "body": b"{}", "more_body": False}]
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the client stays
        raise AssertionError("unreachable")

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    call = asyncio.create_task(gw(scope, receive, send))
    await queued_in(queue)  # published: it waits for a worker
    call.cancel()
    if stopping:
        await call  # answered, and ended there
        assert sent[0]["status"] == 503
    else:
        with pytest.raises(asyncio.CancelledError):
            await call
        assert sent == []
    await queue.close()
