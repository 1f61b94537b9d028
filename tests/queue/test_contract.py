"""The WorkQueue contract, run against every implementation.

A new implementation (for example JetStream) joins by adding a param to ``IMPLS``;
every test below then runs against it too.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from fleetserve.queue import (
    JetStreamQueue,
    MemoryQueue,
    Message,
    PendingReply,
    StreamOptions,
    WorkQueue,
)
from fleetserve.queue.offload import OffloadingQueue
from fleetserve.storage import MemoryStore, Offload
from fleetserve.wire import DeadlineExceeded, Encoding, Overloaded, Priority, Reply

from .envelopes import env
from .test_local import LocalStack

MakeQueue = Callable[..., Awaitable[WorkQueue]]
_prefixes = itertools.count()


def _memory(request: pytest.FixtureRequest, max_depth: int, retry_after: float) -> WorkQueue:
    return MemoryQueue(max_depth=max_depth, retry_after=retry_after)


def _jetstream(request: pytest.FixtureRequest, max_depth: int, retry_after: float) -> WorkQueue:
    """A real nats-server (session fixture); each queue gets its own streams."""
    server = request.getfixturevalue("nats_server")
    options = StreamOptions(
        prefix=f"contract{next(_prefixes)}", storage="memory", max_depth=max_depth
    )
    return JetStreamQueue(server.url, options, retry_after=retry_after)


def _offloaded(request: pytest.FixtureRequest, max_depth: int, retry_after: float) -> WorkQueue:
    """JetStream with every non-empty body and result sent through a payload store."""
    inner = _jetstream(request, max_depth, retry_after)
    return OffloadingQueue(inner, Offload(MemoryStore(), threshold=0))


def _local(request: pytest.FixtureRequest, max_depth: int, retry_after: float) -> WorkQueue:
    """A device process's client, over a Unix socket, to a local queue on a memory queue."""
    return LocalStack(MemoryQueue(max_depth=max_depth, retry_after=retry_after))


def _local_js(request: pytest.FixtureRequest, max_depth: int, retry_after: float) -> WorkQueue:
    """The same over JetStream, as ``fleetserve worker --devices`` runs it."""
    return LocalStack(_jetstream(request, max_depth, retry_after))


IMPLS = {
    "memory": _memory,
    "jetstream": _jetstream,
    "jetstream+offload": _offloaded,
    "local": _local,
    "local+jetstream": _local_js,
}

_ids = itertools.count()


async def settled(queue: WorkQueue, model: str, expect: int) -> bool:
    """``depth`` is eventually consistent: refresh until it reads ``expect`` (or 2 s)."""
    end = time.monotonic() + 2.0
    while True:
        await queue.refresh([model])
        if queue.depth(model) == expect or time.monotonic() > end:
            return queue.depth(model) == expect
        await asyncio.sleep(0.01)


@pytest.fixture(params=sorted(IMPLS))
async def make_queue(request: pytest.FixtureRequest) -> AsyncIterator[MakeQueue]:
    made: list[WorkQueue] = []

    async def make(max_depth: int = 100, retry_after: float = 1.5) -> WorkQueue:
        q = IMPLS[request.param](request, max_depth, retry_after)
        await q.start()
        made.append(q)
        return q

    yield make
    for q in made:
        await q.close()


@pytest.fixture
async def queue(make_queue: MakeQueue) -> WorkQueue:
    return await make_queue()


async def test_implements_the_protocol(queue: WorkQueue) -> None:
    assert isinstance(queue, WorkQueue)
    assert queue.healthy
    pending = await queue.publish(env(), b"x")
    assert isinstance(pending, PendingReply)


async def test_round_trip_delivers_the_reply(queue: WorkQueue) -> None:
    e = env(cost=3)
    pending = await queue.publish(e, b'{"inputs": ["x"]}')
    [msg] = await queue.pull(["m/a"], budget=100, timeout=1)
    assert msg.envelope == e and msg.body == b'{"inputs": ["x"]}' and msg.attempts == 1
    reply = Reply(body=b"result", content_type=Encoding.MSGPACK, timings={"queue_ms": 1.0})
    await queue.reply(msg, reply)
    await queue.ack(msg)
    got = await pending.wait(1)
    assert got.body == b"result" and got.content_type is Encoding.MSGPACK and got.error is None
    assert await settled(queue, "m/a", 0)


async def test_a_streamed_reply_arrives_chunk_by_chunk_in_order(queue: WorkQueue) -> None:
    pending = await queue.publish(env(), b"x")
    [msg] = await queue.pull(["m/a"], budget=100, timeout=1)
    for i in range(5):
        await queue.reply(msg, Reply(body=b"chunk%d" % i, final=False))
    await queue.reply(msg, Reply(body=b"end"))
    await queue.ack(msg)
    got = [(r.body, r.final) async for r in pending.stream(2)]
    assert got == [(b"chunk%d" % i, False) for i in range(5)] + [(b"end", True)]


async def test_each_reply_reaches_its_own_publisher(queue: WorkQueue) -> None:
    p1 = await queue.publish(env(), b"one")
    p2 = await queue.publish(env(), b"two")
    msgs = await queue.pull(["m/a"], budget=100, timeout=1)
    assert [m.body for m in msgs] == [b"one", b"two"]
    for m in reversed(msgs):
        await queue.reply(m, Reply(body=m.body.upper()))
        await queue.ack(m)
    assert (await p2.wait(1)).body == b"TWO"
    assert (await p1.wait(1)).body == b"ONE"


async def test_error_replies_arrive_as_error_bodies(queue: WorkQueue) -> None:
    pending = await queue.publish(env(), b"x")
    [msg] = await queue.pull(["m/a"], budget=1, timeout=1)
    body = {"error": {"code": "invalid_input", "message": "bad", "field": "inputs"}}
    await queue.reply(msg, Reply(error=body))
    assert (await pending.wait(1)).error == body


async def test_pull_respects_the_cost_budget(queue: WorkQueue) -> None:
    for _ in range(4):
        await queue.publish(env(cost=10), b"")
    assert len(await queue.pull(["m/a"], budget=25, timeout=1)) == 2
    assert len(await queue.pull(["m/a"], budget=10, timeout=1)) == 1
    assert await settled(queue, "m/a", 1)


async def test_pull_always_returns_at_least_one(queue: WorkQueue) -> None:
    await queue.publish(env(cost=1000), b"big")
    await queue.publish(env(cost=1000), b"big2")
    msgs = await queue.pull(["m/a"], budget=1, timeout=1)
    assert [m.body for m in msgs] == [b"big"]


async def test_pull_times_out_empty(queue: WorkQueue) -> None:
    t0 = time.monotonic()
    assert await queue.pull(["m/a"], budget=10, timeout=0.05) == []
    assert 0.04 <= time.monotonic() - t0 < 1.0


async def test_pull_wakes_when_work_arrives(queue: WorkQueue) -> None:
    task = asyncio.create_task(queue.pull(["m/a"], budget=10, timeout=5))
    await asyncio.sleep(0.02)  # a window in which a pull that did not wait would return
    assert not task.done()
    t0 = time.monotonic()
    await queue.publish(env(), b"late")
    msgs = await asyncio.wait_for(task, 2)
    assert [m.body for m in msgs] == [b"late"]
    assert time.monotonic() - t0 < 1.0


async def test_pull_only_returns_the_requested_models(queue: WorkQueue) -> None:
    await queue.publish(env("m/a"), b"a")
    await queue.publish(env("m/b"), b"b")
    msgs = await queue.pull(["m/b", "m/c"], budget=100, timeout=1)
    assert [(m.envelope.model, m.body) for m in msgs] == [("m/b", b"b")]
    assert await settled(queue, "m/a", 1)
    assert await queue.pull(["m/c"], budget=100, timeout=0.02) == []


async def test_fifo_oldest_first_across_models(queue: WorkQueue) -> None:
    order = [("m/a", b"1"), ("m/b", b"2"), ("m/b", b"3"), ("m/a", b"4"), ("m/c", b"5")]
    for model, body in order:
        await queue.publish(env(model), body)
    msgs = await queue.pull(["m/a", "m/b", "m/c"], budget=100, timeout=1)
    assert [m.body for m in msgs] == [b"1", b"2", b"3", b"4", b"5"]


async def test_nak_returns_to_the_head_with_one_more_attempt(queue: WorkQueue) -> None:
    await queue.publish(env(), b"first")
    await queue.publish(env(), b"second")
    [msg] = await queue.pull(["m/a"], budget=1, timeout=1)
    assert msg.body == b"first" and await settled(queue, "m/a", 1)
    await queue.nak(msg)
    assert await settled(queue, "m/a", 2)
    again = await queue.pull(["m/a"], budget=100, timeout=1)
    assert [m.body for m in again] == [b"first", b"second"]
    assert again[0].attempts == 2 and again[1].attempts == 1


async def test_nak_wakes_a_waiting_puller(queue: WorkQueue) -> None:
    pending = await queue.publish(env(), b"x")
    [msg] = await queue.pull(["m/a"], budget=1, timeout=1)
    other = asyncio.create_task(queue.pull(["m/a"], budget=1, timeout=5))
    await asyncio.sleep(0.02)  # a window in which a pull that did not wait would return
    assert not other.done()
    await queue.nak(msg)
    [got] = await asyncio.wait_for(other, 2)
    assert got.body == b"x" and got.attempts == 2
    await queue.reply(got, Reply(body=b"done"))
    await queue.ack(got)
    assert (await pending.wait(1)).body == b"done"


async def test_acked_message_is_not_redelivered(queue: WorkQueue) -> None:
    await queue.publish(env(), b"x")
    [msg] = await queue.pull(["m/a"], budget=1, timeout=1)
    await queue.ack(msg)
    await queue.nak(msg)  # too late: already done
    assert await settled(queue, "m/a", 0)
    assert await queue.pull(["m/a"], budget=1, timeout=0.02) == []


async def test_bounded_depth_is_overloaded_with_retry_after(make_queue: MakeQueue) -> None:
    queue = await make_queue(max_depth=2, retry_after=2.5)
    await queue.publish(env("m/a"), b"1")
    await queue.publish(env("m/a"), b"2")
    with pytest.raises(Overloaded) as info:
        await queue.publish(env("m/a"), b"3")
    assert info.value.retry_after == 2.5
    assert "m/a" in info.value.message
    assert await settled(queue, "m/a", 2)
    await queue.publish(env("m/b"), b"other model has its own bound")
    [msg] = await queue.pull(["m/a"], budget=1, timeout=1)
    await queue.ack(msg)  # the bound may count in-flight work too; a finished one frees room
    await queue.publish(env("m/a"), b"room again")
    assert await settled(queue, "m/a", 2)


async def test_wait_past_timeout_is_deadline_exceeded(queue: WorkQueue) -> None:
    pending = await queue.publish(env(), b"x")
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        await pending.wait(0.05)
    assert time.monotonic() - t0 < 1.0
    with pytest.raises(DeadlineExceeded):
        await (await queue.publish(env(), b"y")).wait(-1)


async def test_reply_after_cancel_is_dropped(queue: WorkQueue) -> None:
    pending = await queue.publish(env(), b"x")
    pending.cancel()
    [msg] = await queue.pull(["m/a"], budget=1, timeout=1)
    await queue.reply(msg, Reply(body=b"too late"))  # must not raise
    await queue.ack(msg)
    with pytest.raises(DeadlineExceeded):
        await pending.wait(0.05)


async def test_reply_after_wait_timed_out_is_dropped(queue: WorkQueue) -> None:
    pending = await queue.publish(env(), b"x")
    with pytest.raises(DeadlineExceeded):
        await pending.wait(0.01)
    [msg] = await queue.pull(["m/a"], budget=1, timeout=1)
    await queue.reply(msg, Reply(body=b"too late"))
    await queue.reply(msg, Reply(body=b"twice"))
    await queue.ack(msg)


async def test_depth_counts_waiting_not_in_flight(queue: WorkQueue) -> None:
    assert await settled(queue, "never/seen", 0)
    for _ in range(3):
        await queue.publish(env(), b"")
    assert await settled(queue, "m/a", 3)
    [msg] = await queue.pull(["m/a"], budget=1, timeout=1)
    assert await settled(queue, "m/a", 2)
    await queue.ack(msg)
    assert await settled(queue, "m/a", 2)
    await queue.pull(["m/a"], budget=100, timeout=1)
    assert await settled(queue, "m/a", 0)


async def test_close_releases_pullers_and_marks_unhealthy(queue: WorkQueue) -> None:
    task = asyncio.create_task(queue.pull(["m/a"], budget=1, timeout=10))
    await asyncio.sleep(0.02)  # the pull is under way (the close must release it, either way)
    await queue.close()
    assert await asyncio.wait_for(task, 2) == []
    assert not queue.healthy


# -- priority classes (issue 12) --------------------------------------------------------


async def test_interactive_work_is_pulled_before_older_batch_work(queue: WorkQueue) -> None:
    for i in range(3):
        await queue.publish(env(rid=f"bulk-{i}", cost=10), b"")
    await queue.publish(env(rid="query", cost=1, priority=Priority.INTERACTIVE), b"")
    # each class oldest first, interactive before batch (the budget takes them all)
    got = await pull_all(queue, 4)
    assert [m.envelope.request_id for m in got] == ["query", "bulk-0", "bulk-1", "bulk-2"]
    assert got[0].envelope.priority is Priority.INTERACTIVE
    assert await settled(queue, "m/a", 0)


async def test_a_small_budget_takes_the_interactive_request(queue: WorkQueue) -> None:
    await queue.publish(env(rid="bulk", cost=10), b"")
    await queue.publish(env(rid="query", cost=1, priority=Priority.INTERACTIVE), b"")
    [msg] = await queue.pull(["m/a"], budget=1, timeout=1)
    assert msg.envelope.request_id == "query"


async def test_batch_work_that_waited_too_long_still_gets_in(queue: WorkQueue) -> None:
    # the age limit is 2 s (the default); this one has waited 10
    await queue.publish(env(rid="old-bulk", cost=5, waited=10.0), b"")
    await queue.publish(env(rid="new-bulk", cost=5), b"")
    await queue.publish(env(rid="query", cost=5, priority=Priority.INTERACTIVE), b"")
    # the budget holds the query only; the old batch request comes along, the new waits
    got = await pull_settled(queue, 5, expect=2)
    assert [m.envelope.request_id for m in got] == ["query", "old-bulk"]


async def pull_settled(queue: WorkQueue, budget: int, expect: int) -> list[Message]:
    """One pull once ``expect`` messages are ready together (a distributed queue
    delivers what is ready when the pull arrives: give it the time to be)."""
    end = time.monotonic() + 3.0
    while True:
        await queue.refresh(["m/a"])
        if queue.depth("m/a") >= expect + 1 or time.monotonic() > end:
            break
        await asyncio.sleep(0.01)
    return await queue.pull(["m/a"], budget=budget, timeout=1)


async def pull_all(queue: WorkQueue, n: int) -> list[Message]:
    """``n`` messages in one pull where the queue has them ready together (a
    distributed queue may deliver a pull's worth in pieces: keep pulling)."""
    got: list[Message] = []
    end = time.monotonic() + 3.0
    while len(got) < n and time.monotonic() < end:
        got += await queue.pull(["m/a"], budget=1000, timeout=0.5)
    return got
