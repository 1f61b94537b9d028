"""Payload offload over JetStream: bodies by reference, cleaned up, missing ones dead-lettered."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fleetserve.cluster import NatsServer
from fleetserve.queue import JetStreamQueue, StreamOptions
from fleetserve.queue.base import Message
from fleetserve.queue.offload import OffloadingQueue
from fleetserve.queue.offload_consumer import OffloadingConsumer
from fleetserve.storage import FileStore, MemoryStore, Offload
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
    pending = await q.publisher.publish(env(), b"", payload="req/never-stored-in")
    assert await q.pull(["m/a"], budget=10, timeout=0.3) == []
    reply = await pending.wait(5)
    assert reply.error is not None and reply.error["error"]["field"] == "payload"
    js = q.consumer
    assert isinstance(js, JetStreamQueue) and js.dlq is not None
    [entry] = await js.dlq.list_entries()
    assert entry.reason.startswith("payload missing") and "never-stored" in entry.reason


class _Inner:
    """Hands out ``msgs`` once; records what is put back."""

    def __init__(self, msgs: list[Message]) -> None:
        self.msgs = msgs
        self.naked: list[Message] = []

    async def pull(self, *args: object, **kwargs: object) -> list[Message]:
        msgs, self.msgs = self.msgs, []
        return msgs

    async def nak(self, msg: Message, delay: float = 0.0) -> None:
        self.naked.append(msg)


def _offloaded(n: int) -> list[Message]:
    return [Message(env(), b"", i, payload=f"req/m{i}-in") for i in range(n)]


async def test_one_store_outage_puts_the_rest_of_the_pull_back_untried(tmp_path: Path) -> None:
    """Before, each message of the pull tried the store in turn (each waiting out its
    own timeout while the store hung) before it was put back."""
    store = FileStore(tmp_path)
    tried: list[str] = []

    async def away(key: str) -> bytes:
        tried.append(key)
        raise OSError("the disk went away")

    store.get = away  # type: ignore[method-assign]
    inline = Message(env(), b"inline", 99)
    inner = _Inner([*_offloaded(3), inline])
    q = OffloadingConsumer(inner, Offload(store, threshold=0))  # type: ignore[arg-type]
    assert await q.pull(["m/a"], budget=10, timeout=0) == [inline]
    assert len(tried) == 1 and len(inner.naked) == 3


async def test_a_bug_reading_a_body_raises_and_puts_the_pull_back(tmp_path: Path) -> None:
    """Before, any exception (a bug too) was taken for a store outage and swallowed."""
    store = FileStore(tmp_path)

    async def broken(key: str) -> bytes:
        raise KeyError("a bug")

    store.get = broken  # type: ignore[method-assign]
    inline = Message(env(), b"inline", 99)
    inner = _Inner([inline, *_offloaded(2)])
    q = OffloadingConsumer(inner, Offload(store, threshold=0))  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        await q.pull(["m/a"], budget=10, timeout=0)
    assert len(inner.naked) == 3  # the inline one taken before it, too
