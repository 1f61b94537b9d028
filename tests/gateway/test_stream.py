"""Streamed replies: chunks travel as ``final=False`` replies and leave as SSE events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from fleetserve.catalog import Catalog, ModelSpec
from fleetserve.gateway import Gateway
from fleetserve.gateway.wiring import Hooks
from fleetserve.lifecycle import shutdown, start_http
from fleetserve.metrics import Metrics
from fleetserve.queue import MemoryQueue
from fleetserve.settings import Settings
from fleetserve.wire import Encoding, InvalidInput, Reply

MODEL = "gen/stub"


def event(n: int) -> bytes:
    return b"data: " + json.dumps({"n": n}).encode() + b"\n\n"


async def serve_stream(queue: MemoryQueue, chunks: int, gate: asyncio.Event | None) -> None:
    """A stand-in worker: for each request, ``chunks`` partial replies, then a final one."""
    while True:
        for msg in await queue.pull([MODEL], 1 << 20, 0.05):
            for i in range(chunks):
                await queue.reply(msg, Reply(event(i), Encoding.JSON, final=False))
                if gate is not None and i == 0:
                    await gate.wait()  # hold the stream open after the first chunk
            await queue.reply(msg, Reply(b"data: [DONE]\n\n", Encoding.JSON))
            await queue.ack(msg)


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[str, MemoryQueue]]:
    spec = ModelSpec(id=MODEL, family="generate", runtime="torch", sources=("/nowhere",))
    settings = Settings.load(overrides={"port": 0})
    queue = MemoryQueue(16, 1.0)
    await queue.start()
    gw = Gateway(settings, Catalog([spec]), queue, Metrics(), hooks=Hooks(ready=lambda: True))
    server, task, port = await start_http(gw, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{port}", queue
    await shutdown(server, [task])
    await queue.close()


async def test_chunks_arrive_in_order_as_sse(gateway: tuple[str, MemoryQueue]) -> None:
    url, queue = gateway
    worker = asyncio.create_task(serve_stream(queue, 3, None))
    body = {"model": MODEL, "messages": [], "stream": True}
    async with (
        httpx.AsyncClient() as c,
        c.stream("POST", url + "/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        text = "".join([t async for t in r.aiter_text()])
    worker.cancel()
    assert text == "".join(e.decode() for e in [event(0), event(1), event(2)]) + "data: [DONE]\n\n"


async def test_the_first_chunk_is_sent_before_the_stream_ends(
    gateway: tuple[str, MemoryQueue],
) -> None:
    url, queue = gateway
    gate = asyncio.Event()
    worker = asyncio.create_task(serve_stream(queue, 2, gate))
    body = {"prompt": "hi", "stream": True}
    async with (
        httpx.AsyncClient() as c,
        c.stream("POST", f"{url}/v1/generate/{MODEL}", json=body) as r,
    ):
        lines = r.aiter_lines()
        first = await asyncio.wait_for(anext(lines), 5)
        assert first == 'data: {"n": 0}'
        gate.set()
        rest = [line async for line in lines if line]
    worker.cancel()
    assert rest == ['data: {"n": 1}', "data: [DONE]"]


async def test_an_error_before_the_first_chunk_is_a_plain_http_error(
    gateway: tuple[str, MemoryQueue],
) -> None:
    url, queue = gateway

    async def refuse() -> None:
        while True:
            for msg in await queue.pull([MODEL], 1 << 20, 0.05):
                err = InvalidInput("bad schema", field="response_format")
                await queue.reply(msg, Reply(content_type=Encoding.JSON, error=err.to_body()))
                await queue.ack(msg)

    worker = asyncio.create_task(refuse())
    body = {"model": MODEL, "messages": [], "stream": True}
    async with httpx.AsyncClient() as c:
        r = await c.post(url + "/v1/chat/completions", json=body)
    worker.cancel()
    assert r.status_code == 400
    assert r.json()["error"]["field"] == "response_format"


async def test_an_error_mid_stream_is_an_sse_error_event(gateway: tuple[str, MemoryQueue]) -> None:
    url, queue = gateway

    async def fail_midway() -> None:
        while True:
            for msg in await queue.pull([MODEL], 1 << 20, 0.05):
                await queue.reply(msg, Reply(event(0), Encoding.JSON, final=False))
                err = InvalidInput("went wrong", field="x")
                await queue.reply(msg, Reply(content_type=Encoding.JSON, error=err.to_body()))
                await queue.ack(msg)

    worker = asyncio.create_task(fail_midway())
    body = {"model": MODEL, "messages": [], "stream": True}
    async with httpx.AsyncClient() as c:
        r = await c.post(url + "/v1/chat/completions", json=body)
    worker.cancel()
    assert r.status_code == 200
    assert r.text.startswith('data: {"n": 0}\n\n')
    assert "event: error\ndata: " in r.text and "went wrong" in r.text
