"""The gateway's span against a stand-in worker on the memory queue (no model): a
client's tracing headers never make a log line, and a streamed reply gets the same
reply events as a unary one."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fleetserve.catalog import Catalog, ModelSpec
from fleetserve.gateway import Gateway
from fleetserve.gateway.wiring import Hooks
from fleetserve.lifecycle import shutdown, start_http
from fleetserve.metrics import Metrics
from fleetserve.queue import MemoryQueue
from fleetserve.settings import Settings
from fleetserve.wire import Encoding, Reply, Task

from .conftest import CLIENT_PARENT, CLIENT_TRACE, gateway_span, traced

MODEL = "gen/stub"
TIMINGS = {"queue_ms": 1.25, "inference_ms": 7.5}


async def stand_in(queue: MemoryQueue) -> None:
    """A worker: a chat streams two chunks then a final reply; anything else gets one."""
    while True:
        for msg in await queue.pull([MODEL], 1 << 20, 0.05):
            if msg.envelope.task is Task.CHAT:
                for i in range(2):
                    chunk = Reply(f"data: {i}\n\n".encode(), Encoding.JSON, final=False)
                    await queue.reply(msg, chunk)
                done = Reply(b"data: [DONE]\n\n", Encoding.JSON, timings=dict(TIMINGS))
                await queue.reply(msg, done)
            else:
                await queue.reply(msg, Reply(b"{}", Encoding.JSON, timings=dict(TIMINGS)))
            await queue.ack(msg)


@pytest.fixture
async def stack() -> AsyncIterator[tuple[str, InMemorySpanExporter]]:
    spec = ModelSpec(id=MODEL, family="generate", runtime="torch", sources=("/nowhere",))
    queue = MemoryQueue(16, 1.0)
    await queue.start()
    tracer, exporter = traced("gw")
    gw = Gateway(
        Settings.load(overrides={"port": 0}),
        Catalog([spec]),
        queue,
        Metrics(),
        hooks=Hooks(ready=lambda: True),
        tracer=tracer,
    )
    server, task, port = await start_http(gw, "127.0.0.1", 0)
    worker = asyncio.create_task(stand_in(queue))
    yield f"http://127.0.0.1:{port}", exporter
    worker.cancel()
    await shutdown(server, [task])
    await queue.close()


OVERLONG = f"{CLIENT_PARENT}-{'a' * 600}"
GOOD_STATE = "fs=1,other=2"


@pytest.mark.parametrize(
    ("parent", "state", "continued", "kept_state"),
    [
        (OVERLONG, None, False, None),  # the SDK warns: traceparent exceeded 512
        (CLIENT_PARENT, "fs=" + "x" * 255 + "," + "gs=" + "y" * 300, True, None),  # > 512
        (CLIENT_PARENT, "=bad,,", True, None),  # the SDK warns: not a w3c member
        (CLIENT_PARENT, ",".join(f"k{i}=v" for i in range(33)), True, None),  # > 32 members
        (CLIENT_PARENT, GOOD_STATE, True, GOOD_STATE),
    ],
    ids=["long-parent", "long-state", "bad-state", "many-members", "good"],
)
async def test_client_tracing_headers_never_make_a_log_line(
    stack: tuple[str, InMemorySpanExporter],
    caplog: pytest.LogCaptureFixture,
    parent: str,
    state: str | None,
    continued: bool,
    kept_state: str | None,
) -> None:
    url, exporter = stack
    rid = uuid.uuid4().hex
    headers = {
        "x-request-id": rid,
        "traceparent": parent,
        **({"tracestate": state} if state else {}),
    }
    with caplog.at_level(logging.WARNING):
        async with httpx.AsyncClient() as c:
            for _ in range(3):  # a warning per request would be a flood
                r = await c.post(
                    f"{url}/v1/generate/{MODEL}", json={"prompt": "hi"}, headers=headers
                )
                assert r.status_code == 200, r.text
    assert [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.WARNING] == []
    span = await asyncio.to_thread(gateway_span, exporter, rid)
    assert (span.context.trace_id == int(CLIENT_TRACE, 16)) is continued
    if continued:
        assert span.parent is not None and span.parent.is_remote
        got = span.context.trace_state.to_header() or None
        assert got == kept_state
    else:
        assert span.parent is None  # a fresh trace


async def test_a_streamed_chat_gets_the_reply_events(
    stack: tuple[str, InMemorySpanExporter],
) -> None:
    url, exporter = stack
    rid = uuid.uuid4().hex
    body: dict[str, Any] = {"model": MODEL, "messages": [], "stream": True}
    async with (
        httpx.AsyncClient() as c,
        c.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers={"x-request-id": rid}
        ) as r,
    ):
        assert r.status_code == 200
        text = "".join([t async for t in r.aiter_text()])
    assert text == "data: 0\n\ndata: 1\n\ndata: [DONE]\n\n"
    span = await asyncio.to_thread(gateway_span, exporter, rid)
    assert span.attributes["http.response.status_code"] == 200
    events = [(e.name, dict(e.attributes or {})) for e in span.events]
    assert events == [
        ("fleetserve.reply.first_chunk", {}),
        ("fleetserve.reply.received", TIMINGS),
    ]
    first, last = span.events
    assert span.start_time <= first.timestamp <= last.timestamp <= span.end_time
