"""Payload offload over JetStream: bodies by reference, cleaned up, missing ones dead-lettered."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator

import pytest

from fleetserve.cluster import NatsServer
from fleetserve.queue import JetStreamQueue, StreamOptions
from fleetserve.queue.offload import OffloadingQueue
from fleetserve.storage import MemoryStore, Offload
from fleetserve.wire import Encoding, Envelope, Reply, Task

_n = itertools.count()


def env(deadline_in: float = 30) -> Envelope:
    now = time.time()
    return Envelope(
        request_id=f"off-{next(_n)}",
        model="m/a",
        task=Task.ENCODE,
        content_type=Encoding.MSGPACK,
        accept=Encoding.MSGPACK,
        cost_hint=1,
        deadline=now + deadline_in,
        enqueued_at=now,
    )


@pytest.fixture
async def pair(nats_server: NatsServer) -> AsyncIterator[tuple[OffloadingQueue, MemoryStore]]:
    store = MemoryStore()
    js = JetStreamQueue(nats_server.url, StreamOptions(prefix=f"off{next(_n)}", storage="memory"))
    q = OffloadingQueue(js, Offload(store, threshold=1024))
    await q.start()
    yield q, store
    await q.close()


async def test_large_bodies_and_results_travel_by_reference_and_are_deleted(
    pair: tuple[OffloadingQueue, MemoryStore],
) -> None:
    q, store = pair
    big = bytes(range(256)) * 8192  # 2 MiB: over NATS's default max payload
    pending = await q.publish(env(), big)
    assert len(store) == 1
    [msg] = await q.pull(["m/a"], budget=10, timeout=1)
    assert msg.body == big and msg.payload is not None
    await q.reply(msg, Reply(big[::-1], Encoding.MSGPACK))
    await q.ack(msg)
    reply = await pending.wait(5)
    assert reply.body == big[::-1] and reply.payload is None
    assert len(store) == 0  # both objects deleted when the request completed


async def test_small_bodies_stay_inline(pair: tuple[OffloadingQueue, MemoryStore]) -> None:
    q, store = pair
    pending = await q.publish(env(), b"small")
    [msg] = await q.pull(["m/a"], budget=10, timeout=1)
    assert msg.payload is None and len(store) == 0
    await q.reply(msg, Reply(b"ok"))
    assert (await pending.wait(5)).body == b"ok"


async def test_a_missing_payload_is_dead_lettered_with_a_reason(
    pair: tuple[OffloadingQueue, MemoryStore],
) -> None:
    q, _ = pair
    pending = await q.inner.publish(env(), b"", payload="req/never-stored-in")
    assert await q.pull(["m/a"], budget=10, timeout=0.3) == []
    reply = await pending.wait(5)
    assert reply.error is not None and reply.error["error"]["field"] == "payload"
    js = q.inner
    assert isinstance(js, JetStreamQueue) and js.dlq is not None
    [entry] = await js.dlq.list_entries()
    assert entry.reason.startswith("payload missing") and "never-stored" in entry.reason
