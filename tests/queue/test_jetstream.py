"""JetStream-only behaviour: dead letters, max deliveries, put-back, connection loss."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator

import pytest

from fleetserve.cluster import NatsServer
from fleetserve.queue import JetStreamQueue, StreamOptions
from fleetserve.wire import Envelope, InternalError, Reply, Unavailable
from fleetserve.wire import headers as H

from .envelopes import env as make_env

_n = itertools.count()


def env(model: str = "org/m-1.5", cost: int = 1) -> Envelope:
    return make_env(model, cost)


@pytest.fixture
async def queue(nats_server: NatsServer) -> AsyncIterator[JetStreamQueue]:
    opts = StreamOptions(prefix=f"js{next(_n)}", storage="memory", max_deliver=2, ack_wait=0.5)
    q = JetStreamQueue(nats_server.url, opts)
    await q.start()
    yield q
    await q.close()


def test_subject_tokens_are_reversible_and_safe() -> None:
    for model in ["sentence-transformers/all-MiniLM-L6-v2", "BAAI/bge-small-en-v1.5", "a b*>"]:
        token = H.subject_token(model)
        assert all(c.isalnum() or c in "-_" for c in token)
        assert H.model_from_token(token) == model


async def test_put_back_is_counted_and_goes_to_the_head(queue: JetStreamQueue) -> None:
    model = "org/m-1.5"
    for _ in range(5):
        await queue.publish(env(cost=1), b"x")
    assert len(await drain(queue, model, 5)) == 5  # it learns: requests cost 1
    for _ in range(4):
        await queue.publish(env(cost=10), b"x")
    # sized for cost-1 requests, the pull asks for 15 and gets all 4: 3 go back
    got = await queue.pull([model], budget=15, timeout=1)
    assert len(got) == 1
    assert queue.stats.put_backs == {model: 3}
    # now sized from the 90th percentile of recent costs (10): no more put-backs
    for _ in range(3):
        assert len(await queue.pull([model], budget=15, timeout=1)) == 1
    assert queue.stats.put_backs == {model: 3}


async def drain(queue: JetStreamQueue, model: str, n: int) -> list[object]:
    got: list[object] = []
    end = time.monotonic() + 3
    while len(got) < n and time.monotonic() < end:
        for m in await queue.pull([model], budget=1000, timeout=0.5):
            got.append(m)
            await queue.ack(m)
    return got


async def test_each_class_has_its_own_subject(queue: JetStreamQueue) -> None:
    from fleetserve.wire import Priority

    o = queue.options
    assert o.subject("a/b") == f"{o.prefix}.work.a_2Fb"  # batch: as before classes
    assert o.subject("a/b", Priority.INTERACTIVE) == f"{o.prefix}.work.a_2Fb.i"
    e = make_env("a/b", 1, priority=Priority.INTERACTIVE)
    await queue.publish(e, b"x")
    info = await queue.js.stream_info(o.stream, subjects_filter=f"{o.prefix}.work.>")
    assert info.state.subjects == {o.subject("a/b", Priority.INTERACTIVE): 1}


async def test_dead_letter_keeps_the_message_and_reason(queue: JetStreamQueue) -> None:
    e = env()
    pending = await queue.publish(e, b'{"inputs": ["boom"]}')
    [msg] = await queue.pull([e.model], budget=10, timeout=1)
    await queue.reply(msg, Reply(error=InternalError("inference failed").to_body()))
    await queue.dead_letter(msg, "inference failed: RuntimeError")
    assert (await pending.wait(1)).error is not None
    assert queue.dlq is not None
    [entry] = await queue.dlq.list_entries()
    assert entry.request_id == e.request_id and entry.model == e.model
    assert entry.reason == "inference failed: RuntimeError"
    assert entry.data == b'{"inputs": ["boom"]}'
    assert await queue.pull([e.model], budget=10, timeout=0.05) == []
    assert queue.stats.dead_letters[e.model] == 1


async def test_malformed_headers_go_to_the_dead_letter_stream(queue: JetStreamQueue) -> None:
    assert queue.js is not None
    good = env()
    bad = H.envelope_headers(good, "nowhere")
    bad[H.DEADLINE] = "soon"
    await queue.js.publish(queue.options.subject(good.model), b"body", headers=bad)
    await queue.js.publish(queue.options.subject(good.model), b"no headers")
    assert await queue.pull([good.model], budget=10, timeout=0.3) == []
    assert queue.dlq is not None
    entries = await queue.dlq.list_entries()
    reasons = " | ".join(e.reason for e in entries)
    assert len(entries) == 2
    assert "Fleetserve-Deadline is not a number" in reasons and "no headers" in reasons


async def test_a_message_never_acked_is_dead_lettered_after_max_deliver(
    queue: JetStreamQueue,
) -> None:
    e = env()
    pending = await queue.publish(e, b"poison")
    for _ in range(2):  # max_deliver=2; the holder "dies" each time (never acks)
        [msg] = await queue.pull([e.model], budget=10, timeout=3)
        assert msg.body == b"poison"
    # JetStream notices the limit when it next tries to deliver: a worker keeps pulling
    assert await queue.pull([e.model], budget=10, timeout=1.5) == []
    reply = await pending.wait(5)  # the advisory handler answers the gateway
    assert reply.error is not None and reply.error["error"]["code"] == "internal_error"
    assert queue.dlq is not None
    [entry] = await queue.dlq.list_entries()
    assert "2 times without an ack" in entry.reason


async def test_dlq_replay_and_purge(queue: JetStreamQueue) -> None:
    e = env()
    await queue.publish(e, b"again")
    [msg] = await queue.pull([e.model], budget=10, timeout=1)
    await queue.dead_letter(msg, "test")
    assert queue.dlq is not None
    assert await queue.dlq.replay(None, timeout=30) == 1
    [back] = await queue.pull([e.model], budget=10, timeout=1)
    assert back.body == b"again" and back.envelope.deadline > time.time() + 20
    await queue.dead_letter(back, "test again")
    assert await queue.dlq.purge() == 1
    assert await queue.dlq.list_entries() == []


async def test_unreachable_url_is_a_clear_error_after_retrying() -> None:
    q = JetStreamQueue("nats://127.0.0.1:9", connect_for=0.3)
    t0 = time.monotonic()
    with pytest.raises(Unavailable, match=r"cannot reach NATS at nats://127\.0\.0\.1:9"):
        await q.start()
    assert time.monotonic() - t0 >= 0.25


async def test_losing_the_server_fails_waiting_requests_with_retryable_503() -> None:
    with NatsServer() as server:
        q = JetStreamQueue(server.url, StreamOptions(prefix="lose", storage="memory"))
        await q.start()
        pending = await q.publish(env(), b"x")
        assert q.healthy
        server.kill()
        with pytest.raises(Unavailable) as info:
            await pending.wait(5)
        assert info.value.retry_after is not None
        for _ in range(100):
            if not q.healthy:
                break
            await asyncio.sleep(0.01)
        assert not q.healthy
        with pytest.raises(Unavailable):
            await q.publish(env(), b"y")
        await q.close()


async def test_oldest_wait_is_the_age_of_the_oldest_request_not_yet_taken(
    queue: JetStreamQueue,
) -> None:
    model, other = "org/oldest", "org/never-pulled"
    await queue.publish(make_env(model, 1), b"first")
    await queue.publish(make_env(other, 1), b"x")
    await asyncio.sleep(0.3)  # the point: these two are 0.3 s old when the second comes
    await queue.publish(make_env(model, 1), b"second")
    await queue.refresh([model, other])
    assert 0.25 <= queue.oldest_wait(model) < 5  # the first, not the second
    assert 0.25 <= queue.oldest_wait(other) < 5  # no consumer yet: the stream says
    got = await queue.pull([model], budget=1, timeout=1)  # the first leaves the queue
    assert len(got) == 1 and got[0].body == b"first"
    await queue.refresh([model])
    assert queue.oldest_wait(model) < 0.25  # the second, enqueued later
    await queue.ack(got[0])
    rest = await queue.pull([model], budget=10, timeout=1)
    for m in rest:
        await queue.ack(m)
    await queue.refresh([model])
    assert queue.oldest_wait(model) == 0.0


async def test_stream_replicas_reach_the_server(nats_server: NatsServer) -> None:
    """``stream_replicas`` becomes the streams' replica count: a lone server refuses 3
    (it would take a cluster), and the settings carry it into the options."""
    from fleetserve.queue.factory import stream_options
    from fleetserve.settings import Settings

    assert stream_options(Settings(stream_replicas=3)).replicas == 3
    with pytest.raises(ValueError, match="stream_replicas must be 1 to 5"):
        stream_options(Settings(stream_replicas=0))
    q = JetStreamQueue(nats_server.url, StreamOptions(prefix=f"js{next(_n)}", replicas=3))
    with pytest.raises(Exception, match=r"(?i)replicas"):
        await q.start()
    await q.close()


async def test_a_consumer_made_with_another_ack_wait_is_updated(queue: JetStreamQueue) -> None:
    """Nothing failed before: the fallback to ``js.update_consumer`` (which nats-py 2.16
    lacks) ran only on error 10148, which nats-py's legacy durable create never gets.
    It is gone; this pins that ``add_consumer`` on the durable updates its config."""
    from fleetserve.queue.js_consumers import durable
    from fleetserve.wire import Priority

    assert queue.puller is not None
    lane = ("org/m-1.5", Priority.BATCH)
    await queue.puller.consumers.ensure_one(lane)
    queue.puller.ack_waits["org/m-1.5"] = 7.0  # the profile's, sized later
    queue.puller.reset()  # as after a reconnect: made sure of again
    assert await queue.puller.consumers.ensure([lane], timeout=1.0)
    info = await queue.js.consumer_info(queue.options.stream, durable(lane))
    assert info.config.ack_wait == 7.0
