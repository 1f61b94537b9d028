"""The machine-local queue: rebalancing, device crashes, and settling upstream once.

``LocalStack`` (a client with its own server and in-memory upstream) also runs the
publisher and consumer contracts (``contract.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from fleetserve.queue import MemoryQueue, Message, WorkQueue
from fleetserve.queue.local import LocalQueueClient, LocalQueueServer
from fleetserve.wire import Reply

from ..waiting import async_wait_for
from .envelopes import env

_ids = itertools.count()


class LocalStack(LocalQueueClient):
    """A client with its own local queue server and upstream, started and closed with it."""

    def __init__(self, upstream: WorkQueue, **server: Any) -> None:
        self._dir = tempfile.mkdtemp(prefix="fs-local-")  # short: socket paths are limited
        super().__init__(os.path.join(self._dir, "queue.sock"))
        self.upstream = upstream
        self.server = LocalQueueServer(upstream, self.path, **server)
        self._stopped = False

    async def start(self) -> None:
        await self.upstream.start()
        await self.server.start()
        await super().start()

    async def client(self) -> LocalQueueClient:
        """Another device process on the same server."""
        c = LocalQueueClient(self.path)
        await c.start()
        return c

    async def close(self) -> None:
        await super().close()
        if self._stopped:
            return
        self._stopped = True
        await self.server.close()
        await self.upstream.close()
        shutil.rmtree(self._dir, ignore_errors=True)


class Recording(MemoryQueue):
    """A MemoryQueue that counts what reaches it, per request id; pulls can be slowed."""

    def __init__(self, pull_delay: float = 0.0) -> None:
        super().__init__()
        self.calls: Counter[tuple[str, str]] = Counter()
        self.pulls = 0
        self.pull_delay = pull_delay

    async def pull(
        self,
        models: Sequence[str],
        budget: int,
        timeout: float,
        *,
        interactive_only: bool = False,
    ) -> list[Message]:
        self.pulls += 1
        got = await super().pull(models, budget, timeout, interactive_only=interactive_only)
        if got and self.pull_delay:
            await asyncio.sleep(self.pull_delay)
        return got

    def _count(self, what: str, msg: Message) -> None:
        self.calls[(what, msg.envelope.request_id)] += 1

    async def ack(self, msg: Message) -> None:
        self._count("ack", msg)
        await super().ack(msg)

    async def nak(self, msg: Message, delay: float = 0.0) -> None:
        self._count("nak", msg)
        await super().nak(msg, delay)

    async def touch(self, msg: Message) -> None:
        self._count("touch", msg)

    async def dead_letter(self, msg: Message, reason: str) -> None:
        self._count("dead_letter", msg)
        await super().dead_letter(msg, reason)

    async def reply(self, msg: Message, reply: Reply) -> None:
        self._count("reply", msg)
        await super().reply(msg, reply)

    def total(self, what: str) -> int:
        return sum(n for (w, _), n in self.calls.items() if w == what)


@pytest.fixture
async def stack() -> AsyncIterator[LocalStack]:
    s = LocalStack(Recording())
    await s.start()
    yield s
    await s.close()


async def test_work_pulled_too_early_goes_to_whoever_asks(stack: LocalStack) -> None:
    up = stack.upstream
    assert isinstance(up, Recording)
    up.pull_delay = 0.2  # the upstream answers after the first asker gave up
    b = await stack.client()
    pending = await stack.publish(env(), b"x")
    assert await stack.pull(["m/a"], budget=10, timeout=0.05) == []
    await async_wait_for(lambda: stack.server.buffered == 1, 5, "the late answer buffered")
    assert stack.server.depth("m/a") == 1
    [msg] = await b.pull(["m/a"], budget=10, timeout=1)
    assert msg.body == b"x" and msg.attempts == 1
    assert up.total("nak") == 0 and not up.stats.redeliveries  # it never went back upstream
    await b.reply(msg, Reply(body=b"done"))
    await b.ack(msg)
    assert (await pending.wait(1)).body == b"done"
    await b.close()


async def test_concurrent_askers_share_one_upstream_pull(stack: LocalStack) -> None:
    b = await stack.client()
    asks = [asyncio.create_task(c.pull(["m/a"], budget=1, timeout=2)) for c in (stack, b)]
    await asyncio.sleep(0.05)  # both ask before there is work (the case under test)
    for body in (b"1", b"2"):
        await stack.publish(env(), body)
    got = await asyncio.gather(*asks)
    assert sorted(m.body for msgs in got for m in msgs) == [b"1", b"2"]
    assert all(len(msgs) == 1 for msgs in got)
    await b.close()


async def test_nak_stays_local_and_another_device_takes_it(stack: LocalStack) -> None:
    up = stack.upstream
    assert isinstance(up, Recording)
    b = await stack.client()
    await stack.publish(env(), b"x")
    [msg] = await stack.pull(["m/a"], budget=1, timeout=1)
    await stack.nak(msg)
    [again] = await b.pull(["m/a"], budget=1, timeout=1)
    assert again.body == b"x" and again.attempts == 2
    assert up.total("nak") == 0 and up.depth("m/a") == 0
    await b.close()


async def test_a_crashed_device_has_its_work_redelivered(stack: LocalStack) -> None:
    up = stack.upstream
    assert isinstance(up, Recording)
    a, b = await stack.client(), await stack.client()
    pendings = [await stack.publish(env(), body) for body in (b"1", b"2", b"3")]
    held = await a.pull(["m/a"], budget=2, timeout=1)
    assert [m.body for m in held] == [b"1", b"2"]
    await a.close()  # as a crash does: the socket closes with work unsettled
    got = await b.pull(["m/a"], budget=10, timeout=1)
    assert [(m.body, m.attempts) for m in got] == [(b"1", 2), (b"2", 2), (b"3", 1)]
    for m in got:
        await b.reply(m, Reply(body=m.body * 2))
        await b.ack(m)
    assert [(await p.wait(1)).body for p in pendings] == [b"11", b"22", b"33"]
    assert stack.server.stats.redeliveries == {"m/a": 2}
    assert up.total("nak") == 0
    await b.close()


async def test_replies_and_acks_reach_upstream_exactly_once(stack: LocalStack) -> None:
    up = stack.upstream
    assert isinstance(up, Recording)
    a, b = await stack.client(), await stack.client()
    envs = [env() for _ in range(6)]
    pendings = [await stack.publish(e, b"x") for e in envs]
    for client in (a, b, a):
        for m in await client.pull(["m/a"], budget=2, timeout=1):
            await client.reply(m, Reply(body=m.envelope.request_id.encode()))
            await client.reply(m, Reply(body=b"twice"))  # dropped here
            await client.ack(m)
            await client.ack(m)
    assert [(await p.wait(1)).body for p in pendings] == [e.request_id.encode() for e in envs]
    # answered, then crashed before its ack: acked for it, not computed again
    last = await stack.publish(env(), b"y")
    [m] = await a.pull(["m/a"], budget=1, timeout=1)
    await a.reply(m, Reply(body=b"ok"))
    await a.close()
    assert (await last.wait(1)).body == b"ok"
    assert await b.pull(["m/a"], budget=1, timeout=0.1) == []
    for e in [*envs, m.envelope]:
        assert up.calls[("reply", e.request_id)] == 1
        assert up.calls[("ack", e.request_id)] == 1
    assert up.total("nak") == 0
    await b.close()


async def test_work_that_keeps_crashing_devices_is_dead_lettered() -> None:
    stack = LocalStack(Recording(), max_deliver=2)
    await stack.start()
    try:
        pending = await stack.publish(env(), b"poison")
        for _ in range(2):
            c = await stack.client()
            assert len(await c.pull(["m/a"], budget=1, timeout=1)) == 1
            await c.close()
        reply = await pending.wait(1)
        assert reply.error is not None and reply.error["error"]["code"] == "internal_error"
        up = stack.upstream
        assert isinstance(up, Recording)
        [(msg, reason)] = list(up.dead)
        assert msg.body == b"poison" and "crashed" in reason
        assert await stack.pull(["m/a"], budget=1, timeout=0.05) == []
    finally:
        await stack.close()


async def test_buffered_work_is_kept_alive_upstream() -> None:
    up = Recording(pull_delay=0.1)
    stack = LocalStack(up, touch_every=0.02)
    await stack.start()
    try:
        await stack.publish(env(), b"x")
        assert await stack.pull(["m/a"], budget=1, timeout=0.02) == []
        await async_wait_for(
            lambda: stack.server.buffered == 1 and up.total("touch") >= 3, 5, "three touches"
        )
        [m] = await stack.pull(["m/a"], budget=1, timeout=1)
        await stack.touch(m)  # a device's own touch is passed on
        await stack.ack(m)
    finally:
        await stack.close()


async def test_announce_and_a_parent_that_goes_away(stack: LocalStack) -> None:
    seen: list[dict[str, Any]] = []
    stack.server.on_hello = seen.append
    c = await stack.client()
    c.announce({"device": "cpu:1", "ready": True})
    await stack.refresh(["m/a"])  # a round trip: the hello has been read
    assert seen == [{"device": "cpu:1", "ready": True}]
    assert {"device": "cpu:1", "ready": True} in stack.server.clients
    waiting = asyncio.create_task(c.pull(["m/a"], budget=1, timeout=5))
    await asyncio.sleep(0.02)  # the pull is under way (the close must end it, either way)
    await stack.server.close()
    assert await asyncio.wait_for(waiting, 2) == []
    await asyncio.wait_for(c.lost.wait(), 2)
    assert not c.healthy
    t0 = time.monotonic()
    assert await c.pull(["m/a"], budget=1, timeout=0.05) == []
    assert time.monotonic() - t0 >= 0.04  # no spinning in a pull loop
    await c.ack(Message(env(), b"", 1))  # quietly nothing: upstream redelivers
    await c.close()


async def test_a_full_device_asking_for_queries_hoards_no_batch_work(stack: LocalStack) -> None:
    from fleetserve.wire import Priority

    for i in range(2):
        await stack.publish(env(rid=f"bulk-{i}"), b"b")
    # its formers are full: it asks for interactive work only, and gets none yet
    got = await stack.pull(["m/a"], budget=10, timeout=0.2, interactive_only=True)
    assert got == [] and stack.server.buffered == 0  # the batch work stays upstream
    await stack.publish(env(rid="query", priority=Priority.INTERACTIVE), b"q")
    [msg] = await stack.pull(["m/a"], budget=10, timeout=1, interactive_only=True)
    assert msg.envelope.request_id == "query"
    bulk = await stack.pull(["m/a"], budget=10, timeout=1)  # room again: the batch work
    assert sorted(m.envelope.request_id for m in bulk) == ["bulk-0", "bulk-1"]


def test_an_unexpected_error_crosses_to_a_device_without_its_text() -> None:
    """Before, WireError.of sent any exception's text (hosts, paths) to the device."""
    from fleetserve.queue.local_proto import WireError
    from fleetserve.wire import Unavailable

    err = WireError.of(ConnectionResetError("nats://10.0.0.7:4222 reset")).exception()
    assert err.code == "internal_error" and err.message == "internal error (ConnectionResetError)"
    kept = WireError.of(Unavailable("queue storage full", retry_after=2.0)).exception()
    assert kept.message == "queue storage full" and kept.retry_after == 2.0
