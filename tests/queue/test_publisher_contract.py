"""The Publisher contract (the gateway's side), run against every implementation.

Each test publishes, awaits or cancels through the publisher; the consumer of the same
queue (``contract.Sides``) serves it. The implementations are in ``contract.py``.
"""

from __future__ import annotations

import time

import pytest

from fleetserve.queue import PendingReply, Publisher
from fleetserve.wire import DeadlineExceeded, Encoding, Overloaded, Reply

from .contract import MakeSides, Sides, make_sides, settled, sides
from .envelopes import env

__all__ = ["make_sides", "sides"]  # the fixtures: every implementation


async def test_implements_the_protocol(sides: Sides) -> None:
    assert isinstance(sides.pub, Publisher)
    assert sides.pub.healthy
    pending = await sides.pub.publish(env(), b"x")
    assert isinstance(pending, PendingReply)


async def test_round_trip_delivers_the_reply(sides: Sides) -> None:
    e = env(cost=3)
    pending = await sides.pub.publish(e, b'{"inputs": ["x"]}')
    [msg] = await sides.con.pull(["m/a"], budget=100, timeout=1)
    assert msg.envelope == e and msg.body == b'{"inputs": ["x"]}' and msg.attempts == 1
    reply = Reply(body=b"result", content_type=Encoding.MSGPACK, timings={"queue_ms": 1.0})
    await sides.con.reply(msg, reply)
    await sides.con.ack(msg)
    got = await pending.wait(1)
    assert got.body == b"result" and got.content_type is Encoding.MSGPACK and got.error is None
    assert await settled(sides.con, "m/a", 0)


async def test_a_streamed_reply_arrives_chunk_by_chunk_in_order(sides: Sides) -> None:
    pending = await sides.pub.publish(env(), b"x")
    [msg] = await sides.con.pull(["m/a"], budget=100, timeout=1)
    for i in range(5):
        await sides.con.reply(msg, Reply(body=b"chunk%d" % i, final=False))
    await sides.con.reply(msg, Reply(body=b"end"))
    await sides.con.ack(msg)
    got = [(r.body, r.final) async for r in pending.stream(2)]
    assert got == [(b"chunk%d" % i, False) for i in range(5)] + [(b"end", True)]


async def test_each_reply_reaches_its_own_publisher(sides: Sides) -> None:
    p1 = await sides.pub.publish(env(), b"one")
    p2 = await sides.pub.publish(env(), b"two")
    msgs = await sides.con.pull(["m/a"], budget=100, timeout=1)
    assert [m.body for m in msgs] == [b"one", b"two"]
    for m in reversed(msgs):
        await sides.con.reply(m, Reply(body=m.body.upper()))
        await sides.con.ack(m)
    assert (await p2.wait(1)).body == b"TWO"
    assert (await p1.wait(1)).body == b"ONE"


async def test_error_replies_arrive_as_error_bodies(sides: Sides) -> None:
    pending = await sides.pub.publish(env(), b"x")
    [msg] = await sides.con.pull(["m/a"], budget=1, timeout=1)
    body = {"error": {"code": "invalid_input", "message": "bad", "field": "inputs"}}
    await sides.con.reply(msg, Reply(error=body))
    assert (await pending.wait(1)).error == body


async def test_bounded_depth_is_overloaded_with_retry_after(make_sides: MakeSides) -> None:
    sides = await make_sides(max_depth=2, retry_after=2.5)
    await sides.pub.publish(env("m/a"), b"1")
    await sides.pub.publish(env("m/a"), b"2")
    with pytest.raises(Overloaded) as info:
        await sides.pub.publish(env("m/a"), b"3")
    assert info.value.retry_after == 2.5
    assert "m/a" in info.value.message
    assert await settled(sides.con, "m/a", 2)
    await sides.pub.publish(env("m/b"), b"other model has its own bound")
    [msg] = await sides.con.pull(["m/a"], budget=1, timeout=1)
    await sides.con.ack(msg)  # the bound may count in-flight work too; a finished one frees room
    await sides.pub.publish(env("m/a"), b"room again")
    assert await settled(sides.con, "m/a", 2)


async def test_wait_past_timeout_is_deadline_exceeded(sides: Sides) -> None:
    pending = await sides.pub.publish(env(), b"x")
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        await pending.wait(0.05)
    assert time.monotonic() - t0 < 1.0
    with pytest.raises(DeadlineExceeded):
        await (await sides.pub.publish(env(), b"y")).wait(-1)


async def test_reply_after_cancel_is_dropped(sides: Sides) -> None:
    pending = await sides.pub.publish(env(), b"x")
    pending.cancel()
    [msg] = await sides.con.pull(["m/a"], budget=1, timeout=1)
    await sides.con.reply(msg, Reply(body=b"too late"))  # must not raise
    await sides.con.ack(msg)
    with pytest.raises(DeadlineExceeded):
        await pending.wait(0.05)


async def test_reply_after_wait_timed_out_is_dropped(sides: Sides) -> None:
    pending = await sides.pub.publish(env(), b"x")
    with pytest.raises(DeadlineExceeded):
        await pending.wait(0.01)
    [msg] = await sides.con.pull(["m/a"], budget=1, timeout=1)
    await sides.con.reply(msg, Reply(body=b"too late"))
    await sides.con.reply(msg, Reply(body=b"twice"))
    await sides.con.ack(msg)
