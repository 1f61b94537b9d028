"""What a request holds in the gateway, called as an ASGI app over a memory queue with a
stand-in worker (no model): its request memory, from its first chunk to its last reply
byte, and its X-Keep-Alive hold on the tenant's count (review of issue 22)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fleetserve.catalog import Catalog, ModelSpec
from fleetserve.gateway import Gateway
from fleetserve.gateway.wiring import Hooks
from fleetserve.metrics import Metrics
from fleetserve.queue import MemoryQueue
from fleetserve.settings import Settings
from fleetserve.wire import Encoding, Reply

MODEL = "stub/embed"
CHUNK = 64 * 1024


class Call:
    """One request's ASGI conversation: the chunks it sends, what came back."""

    def __init__(self, chunks: list[bytes], headers: dict[str, str] | None = None) -> None:
        self.chunks = chunks
        self.headers = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        self.taken = 0  # chunks the gateway has read
        self.status = 0
        self.body = b""
        self.held_at_send: list[int] = []  # request memory held as each body part went out

    async def run(self, gw: Gateway, path: str) -> Call:
        scope: dict[str, Any] = {
            "type": "http",
            "method": "POST",
            "path": path,
            "query_string": b"",
            "headers": [(b"content-type", b"application/json"), *self.headers],
        }

        async def receive() -> dict[str, Any]:
            if self.taken >= len(self.chunks):
                await asyncio.Event().wait()  # the client waits for its reply
            self.taken += 1
            more = self.taken < len(self.chunks)
            return {"type": "http.request", "body": self.chunks[self.taken - 1], "more_body": more}

        async def send(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                self.status = msg["status"]
            else:
                self.held_at_send.append(gw.request_memory.held)
                self.body += msg.get("body", b"")

        await gw(scope, receive, send)
        return self


def gateway(queue: MemoryQueue, **overrides: Any) -> Gateway:
    spec = ModelSpec(id=MODEL, family="dense", runtime="torch", sources=("/nowhere",))
    settings = Settings.load(overrides={"port": 0, **overrides})
    return Gateway(settings, Catalog([spec]), queue, Metrics(), hooks=Hooks(ready=lambda: True))


@pytest.fixture
async def queue() -> AsyncIterator[MemoryQueue]:
    q = MemoryQueue(16, 1.0)
    await q.start()
    yield q
    await q.close()


async def answer(queue: MemoryQueue, *, wait: asyncio.Event | None = None) -> None:
    """A stand-in worker: each request gets ``{}`` (after ``wait``, when given)."""
    while True:
        for msg in await queue.pull([MODEL], 1 << 30, 5):
            if wait is not None:
                await wait.wait()
            await queue.reply(msg, Reply(b"{}", Encoding.JSON))


def chunked(size: int) -> list[bytes]:
    """A JSON encode body of about ``size`` bytes, in chunks (no Content-Length)."""
    text = b"word " * (size // 5)
    body = b'{"inputs": ["' + text + b'"]}'
    return [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)]


async def test_a_chunked_body_is_held_to_the_request_memory_as_it_arrives(
    queue: MemoryQueue,
) -> None:
    """Before: a body with no Content-Length reserved nothing until the whole of it was
    read (up to max_body_bytes, 16 MiB, per request), so a chunked upload got around
    --request-memory; now it is refused within the chunk that goes over the budget."""
    gw = gateway(queue, request_memory="1MiB")
    chunks = chunked(2 << 20)  # 2 MiB: 14 MiB held at 7x, in 32 chunks
    call = await Call(chunks).run(gw, f"/v1/encode/{MODEL}")
    assert call.status == 413 and b"request_memory" in call.body, call.body
    assert call.taken <= 3, call.taken  # 1 MiB / 7 is the 3rd chunk: the rest never read
    assert gw.request_memory.held == 0
    # with others holding most of the budget, the same is a 503 (it would fit alone)
    gw = gateway(queue, request_memory="4MiB")
    other = gw.request_memory.reservation()
    other.grow(400_000)  # 2.8 MB of 4 MiB
    call = await Call(chunked(300_000)).run(gw, f"/v1/encode/{MODEL}")
    assert call.status == 503 and b"request_memory" in call.body, call.body
    other.release()
    assert gw.request_memory.held == 0


async def test_request_memory_is_held_until_the_reply_is_sent(queue: MemoryQueue) -> None:
    """Before: the reservation was given back before the 200's bytes were sent (a slow
    client kept the reply's memory, counted nowhere)."""
    gw = gateway(queue)
    worker = asyncio.create_task(answer(queue))
    try:
        call = await Call(chunked(10_000)).run(gw, f"/v1/encode/{MODEL}")
    finally:
        worker.cancel()
    assert call.status == 200, call.body
    assert call.held_at_send and all(held > 0 for held in call.held_at_send), call.held_at_send
    assert gw.request_memory.held == 0  # given back once sent


async def test_a_keep_alive_hold_stays_when_the_request_times_out_after_its_publish(
    queue: MemoryQueue,
) -> None:
    """Before: a 504 (or a hang-up) after the publish undid the tenant's hold, though the
    worker had applied the keep-alive: a tenant capped at 1 kept any number of models
    alive by letting its requests time out."""
    gw = gateway(queue, max_kept_alive_per_tenant=1)
    headers = {"x-keep-alive": "60", "x-request-timeout": "0.2", "x-tenant": "acme"}
    call = await Call([b'{"inputs": ["hi"]}'], headers).run(gw, f"/v1/encode/{MODEL}")
    assert call.status == 504, call.body  # no worker: it waited in the queue
    assert list(gw.keep_alives.held("acme")) == [MODEL]


async def test_a_failed_request_undoes_only_its_own_hold(queue: MemoryQueue) -> None:
    """Before: undo put back the snapshot taken when its request began, wiping the hold
    a concurrent request of the same tenant had taken on the model since."""
    gw = gateway(queue)
    k = gw.keep_alives
    first = k.grant("acme", MODEL, 60.0, None, timeout=30.0)
    second = k.grant("acme", MODEL, 60.0, None, timeout=30.0)
    k.undo(first)  # never published; the second is under way
    assert list(k.held("acme")) == [MODEL]
    k.kept(second)  # published: a worker keeps the model alive for it
    third = k.grant("acme", MODEL, 60.0, None, timeout=30.0)
    k.undo(third)
    assert list(k.held("acme")) == [MODEL]  # the second's hold is still there
    lone = k.grant("beta", MODEL, 60.0, None, timeout=30.0)
    k.undo(lone)
    assert k.held("beta") == {}
