"""JetStream-only behaviour of the fine-tuning queue: redelivery after a dead worker,
in-progress acks, malformed messages, several worker processes on one consumer."""

from __future__ import annotations

import itertools
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import nats
import pytest

from fleetserve.cluster import NatsServer
from fleetserve.lora.jobs import JetStreamJobQueue, JobRef, Lease
from fleetserve.lora.jobs.queue_js import CONSUMER, _nats
from fleetserve.wire import Unavailable

Open = Callable[..., Awaitable[JetStreamJobQueue]]
_prefixes = itertools.count()


@pytest.fixture
async def open_queue(nats_server: NatsServer) -> AsyncIterator[Open]:
    """Opens queues on one fresh prefix, each on its own connection, as separate worker
    processes would."""
    prefix = f"jobj{next(_prefixes)}"
    made: list[tuple[Any, JetStreamJobQueue]] = []

    async def open_(ack_wait: float = 1.0, **kw: Any) -> JetStreamJobQueue:
        nc = await nats.connect(nats_server.url)
        kw.setdefault("prefix", prefix)
        q = await JetStreamJobQueue.open(nc, ack_wait=ack_wait, storage="memory", **kw)
        made.append((nc, q))
        return q

    yield open_
    for _, q in made:
        await q.close()
    for stream in {q.stream for _, q in made}:
        await made[0][0].jetstream().delete_stream(stream)
    for nc, _ in made:
        await nc.close()


async def take(queue: JetStreamJobQueue, timeout: float = 2.0) -> Lease:
    lease = await queue.take(timeout)
    assert lease is not None, "nothing came"
    return lease


async def test_the_stream_and_consumer_are_as_documented(open_queue: Open) -> None:
    q = await open_queue(prefix=f"my.jobs{next(_prefixes)}", max_queued=7, ack_wait=4.0)
    assert q.stream.startswith("MY_JOBS") and q.stream.endswith("_TRAIN")
    info = await q._js.stream_info(q.stream)
    assert info.config.subjects == [f"{q.prefix}.train"]
    assert info.config.retention == "workqueue" and info.config.max_msgs == 7
    assert info.config.discard == "new"
    consumer = await q._js.consumer_info(q.stream, CONSUMER)
    assert consumer.config.ack_policy == "explicit" and consumer.config.ack_wait == 4.0
    assert consumer.config.max_deliver == -1 and consumer.config.max_ack_pending >= 7


async def test_an_unsettled_job_goes_to_another_worker_after_ack_wait(open_queue: Open) -> None:
    dying, other = await open_queue(ack_wait=1.0), await open_queue(ack_wait=1.0)
    r = JobRef("acme", "ftjob-1")
    await dying.submit(r)
    lease = await take(dying)  # ... and its worker dies: no progress, no ack
    assert lease.deliveries == 1
    start = time.monotonic()
    again = await take(other, timeout=5.0)
    assert (again.ref, again.deliveries) == (r, 2)
    assert time.monotonic() - start >= 0.8  # not before ack_wait
    await again.done()
    assert await other.take(1.5) is None


async def test_progress_keeps_the_job(open_queue: Open) -> None:
    holder, other = await open_queue(ack_wait=1.0), await open_queue(ack_wait=1.0)
    await holder.submit(JobRef("acme", "ftjob-long"))
    lease = await take(holder)
    end = time.monotonic() + 3 * holder.ack_wait
    while time.monotonic() < end:
        # the other worker polls for a third of ack_wait, then the holder shows progress
        assert await other.take(holder.ack_wait / 3) is None
        await lease.progress()
    await lease.done()


async def test_a_malformed_message_is_dropped(
    open_queue: Open, caplog: pytest.LogCaptureFixture
) -> None:
    q = await open_queue(ack_wait=0.5)
    await q._js.publish(q.subject, b"garbage", stream=q.stream)
    r = JobRef("acme", "ftjob-real")
    await q.submit(r)
    with caplog.at_level(logging.WARNING, logger="fleetserve.lora.jobs"):
        lease = await take(q)
    assert (lease.ref, lease.deliveries) == (r, 1)
    assert any("malformed" in rec.getMessage() for rec in caplog.records)
    await lease.done()
    assert await q.take(1.2) is None  # the garbage was not left to be redelivered
    assert (await q._js.stream_info(q.stream)).state.messages == 0


async def test_a_reopened_queue_shares_the_consumer(open_queue: Open) -> None:
    one, two = await open_queue(), await open_queue()
    assert one.stream == two.stream
    refs = [JobRef("acme", f"ftjob-{i}") for i in range(3)]
    for r in refs:
        await one.submit(r)
    got = []
    for q in (two, one, two):  # each job goes to exactly one of the workers
        lease = await take(q)
        got.append(lease.ref)
        await lease.done()
    assert got == refs
    info = await two._js.stream_info(two.stream)
    assert info.state.consumer_count == 1 and info.state.messages == 0


async def test_close_leaves_the_connection_open(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        q = await JetStreamJobQueue.open(nc, prefix=f"jobj{next(_prefixes)}", storage="memory")
        await q.close()
        await q.close()
        assert nc.is_connected
        with pytest.raises(Unavailable, match="closed"):
            await q.submit(JobRef("acme", "ftjob-late"))
        await nc.jetstream().delete_stream(q.stream)
    finally:
        await nc.close()


def test_without_nats_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "nats" or m.startswith("nats.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "nats", None)
    with pytest.raises(Unavailable, match=r"install the nats extra.*fleetserve\[nats\]"):
        _nats()
