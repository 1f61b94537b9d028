"""Cancels, against every queue of the contracts (``contract.py``): a cancel reaches the workers'
listeners; a waiting message of the request is removed at once where the queue can
(counted once, in ``dropped``), or is still delivered after its cancel was heard (a
worker then terminates it); slices of the request go with it."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from fleetserve.queue import Consumer, MemoryQueue
from fleetserve.queue.cancels import Cancel, Listeners
from fleetserve.queue.local_buffer import Entry
from fleetserve.wire import Part

from .contract import Sides, make_sides, sides  # the fixtures: every queue
from .envelopes import env
from .test_local import LocalStack

__all__ = ["make_sides", "sides"]


async def heard(cancels: list[Cancel], n: int = 1) -> list[Cancel]:
    async with asyncio.timeout(10):
        while len(cancels) < n:
            await asyncio.sleep(0.005)
    return cancels


async def test_a_cancel_reaches_the_listeners(sides: Sides) -> None:
    got: list[Cancel] = []
    remove = sides.con.on_cancel(got.append)
    until = time.time() + 30
    await sides.pub.cancel("gone-1", until)
    (c,) = await heard(got)
    assert c.request_id == "gone-1" and abs(c.until - until) < 1e-3
    remove()
    await sides.pub.cancel("gone-2", until)
    await sides.pub.cancel("gone-3", until)
    others: list[Cancel] = []
    sides.con.on_cancel(others.append)
    await sides.pub.cancel("gone-4", until)
    await heard(others)
    assert [c.request_id for c in got] == ["gone-1"]  # removed: it hears no more


async def test_a_waiting_message_is_removed_or_its_cancel_comes_first(sides: Sides) -> None:
    got: list[Cancel] = []
    sides.con.on_cancel(got.append)
    e = env(rid="gone-5")
    pending = await sides.pub.publish(e, b"x")
    kept = await sides.pub.publish(env(), b"y")
    await sides.pub.cancel("gone-5", e.deadline)
    (c,) = await heard(got)
    msgs = await sides.con.pull(["m/a"], budget=100, timeout=1)
    ids = [m.envelope.request_id for m in msgs]
    assert kept is not None and len(ids) == len(set(ids))
    if c.dropped:  # removed at once: nobody pulls it
        assert c.dropped == ("m/a",) and "gone-5" not in ids
    else:  # delivered after the cancel was heard: the worker terminates it
        assert "gone-5" in ids or await _later(sides.con, "gone-5")
    for m in msgs:
        await sides.con.ack(m)
    pending.cancel()


async def _later(queue: Consumer, rid: str) -> bool:
    for m in await queue.pull(["m/a"], budget=100, timeout=1):
        await queue.ack(m)
        if m.envelope.request_id == rid:
            return True
    return False


async def test_slices_of_a_cancelled_request_go_with_it(sides: Sides) -> None:
    got: list[Cancel] = []
    sides.con.on_cancel(got.append)
    part = dataclasses.replace(env(rid="parent-1/0-4"), part=Part("parent-1", 0, 4))
    await sides.pub.publish(part, b"slice")
    await sides.pub.cancel("parent-1", part.deadline)
    (c,) = await heard(got)
    msgs = await sides.con.pull(["m/a"], budget=100, timeout=0.3 if c.dropped else 1)
    for m in msgs:
        await sides.con.ack(m)
    if c.dropped:  # removed with its parent
        assert c.dropped == ("m/a",) and msgs == []
    else:
        assert [m.envelope.part for m in msgs] == [Part("parent-1", 0, 4)]


def test_dropped_messages_are_told_to_one_listener_only() -> None:
    ls = Listeners()
    a: list[Cancel] = []
    b: list[Cancel] = []
    ls.add(a.append)
    ls.add(b.append)
    ls.emit(Cancel("r", 1.0, ("m/a", "m/a")))
    assert a == [Cancel("r", 1.0, ("m/a", "m/a"))] and b == [Cancel("r", 1.0)]


def test_a_failing_listener_does_not_keep_the_others_uninformed() -> None:
    ls = Listeners()
    seen: list[Cancel] = []

    def broken(_: Cancel) -> None:
        raise RuntimeError("boom")

    ls.add(broken)
    ls.add(seen.append)
    ls.emit(Cancel("r", 1.0))
    assert seen == [Cancel("r", 1.0)]


async def test_the_local_queue_drops_what_it_buffers_and_tells_its_devices() -> None:
    upstream = MemoryQueue()
    stack = LocalStack(upstream)
    await stack.start()
    try:
        got: list[Cancel] = []
        stack.on_cancel(got.append)
        async with asyncio.timeout(10):  # the device's connection is accepted
            while not stack.server.clients:
                await asyncio.sleep(0.005)
        e = env(rid="gone-6")
        await upstream.publish(e, b"x")
        [msg] = await upstream.pull(["m/a"], budget=10, timeout=1)  # fetched, not handed out
        stack.server.buffer.entries.append(Entry(msg, 1, 1))
        await upstream.cancel("gone-6", e.deadline)
        (c,) = await heard(got)
        assert c.request_id == "gone-6" and c.dropped == ("m/a",)  # removed from the buffer
        assert stack.server.buffered == 0
        assert await stack.pull(["m/a"], budget=10, timeout=0.3) == []
        await stack.cancel("gone-7", e.deadline)  # a device's own cancel goes upstream
        await heard(got, 2)
        assert got[1].request_id == "gone-7"
    finally:
        await stack.close()
