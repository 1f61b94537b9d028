"""The Consumer contract (the worker's side), run against every implementation.

Each test pulls, settles and replies through the consumer; the publisher of the same
queue (``contract.Sides``) feeds it. The implementations are in ``contract.py``.
"""

from __future__ import annotations

import asyncio
import time

from fleetserve.queue import Consumer
from fleetserve.wire import Priority, Reply

from .contract import Sides, make_sides, pull_all, pull_settled, settled, sides
from .envelopes import env

__all__ = ["make_sides", "sides"]  # the fixtures: every implementation


async def test_implements_the_protocol(sides: Sides) -> None:
    assert isinstance(sides.con, Consumer)
    assert sides.con.healthy
    assert await sides.con.pull(["m/a"], budget=1, timeout=0.01) == []


async def test_pull_respects_the_cost_budget(sides: Sides) -> None:
    for _ in range(4):
        await sides.pub.publish(env(cost=10), b"")
    assert len(await sides.con.pull(["m/a"], budget=25, timeout=1)) == 2
    assert len(await sides.con.pull(["m/a"], budget=10, timeout=1)) == 1
    assert await settled(sides.con, "m/a", 1)


async def test_pull_always_returns_at_least_one(sides: Sides) -> None:
    await sides.pub.publish(env(cost=1000), b"big")
    await sides.pub.publish(env(cost=1000), b"big2")
    msgs = await sides.con.pull(["m/a"], budget=1, timeout=1)
    assert [m.body for m in msgs] == [b"big"]


async def test_pull_times_out_empty(sides: Sides) -> None:
    t0 = time.monotonic()
    assert await sides.con.pull(["m/a"], budget=10, timeout=0.05) == []
    assert 0.04 <= time.monotonic() - t0 < 1.0


async def test_pull_wakes_when_work_arrives(sides: Sides) -> None:
    task = asyncio.create_task(sides.con.pull(["m/a"], budget=10, timeout=5))
    await asyncio.sleep(0.02)  # a window in which a pull that did not wait would return
    assert not task.done()
    t0 = time.monotonic()
    await sides.pub.publish(env(), b"late")
    msgs = await asyncio.wait_for(task, 2)
    assert [m.body for m in msgs] == [b"late"]
    assert time.monotonic() - t0 < 1.0


async def test_pull_only_returns_the_requested_models(sides: Sides) -> None:
    await sides.pub.publish(env("m/a"), b"a")
    await sides.pub.publish(env("m/b"), b"b")
    msgs = await sides.con.pull(["m/b", "m/c"], budget=100, timeout=1)
    assert [(m.envelope.model, m.body) for m in msgs] == [("m/b", b"b")]
    assert await settled(sides.con, "m/a", 1)
    assert await sides.con.pull(["m/c"], budget=100, timeout=0.02) == []


async def test_fifo_oldest_first_across_models(sides: Sides) -> None:
    order = [("m/a", b"1"), ("m/b", b"2"), ("m/b", b"3"), ("m/a", b"4"), ("m/c", b"5")]
    for model, body in order:
        await sides.pub.publish(env(model), body)
    msgs = await sides.con.pull(["m/a", "m/b", "m/c"], budget=100, timeout=1)
    assert [m.body for m in msgs] == [b"1", b"2", b"3", b"4", b"5"]


async def test_nak_returns_to_the_head_with_one_more_attempt(sides: Sides) -> None:
    await sides.pub.publish(env(), b"first")
    await sides.pub.publish(env(), b"second")
    [msg] = await sides.con.pull(["m/a"], budget=1, timeout=1)
    assert msg.body == b"first" and await settled(sides.con, "m/a", 1)
    await sides.con.nak(msg)
    assert await settled(sides.con, "m/a", 2)
    again = await pull_all(sides.con, 2)  # (a distributed queue's may come in pieces)
    assert [m.body for m in again] == [b"first", b"second"]
    assert again[0].attempts == 2 and again[1].attempts == 1


async def test_nak_wakes_a_waiting_puller(sides: Sides) -> None:
    pending = await sides.pub.publish(env(), b"x")
    [msg] = await sides.con.pull(["m/a"], budget=1, timeout=1)
    other = asyncio.create_task(sides.con.pull(["m/a"], budget=1, timeout=5))
    await asyncio.sleep(0.02)  # a window in which a pull that did not wait would return
    assert not other.done()
    await sides.con.nak(msg)
    [got] = await asyncio.wait_for(other, 2)
    assert got.body == b"x" and got.attempts == 2
    await sides.con.reply(got, Reply(body=b"done"))
    await sides.con.ack(got)
    assert (await pending.wait(1)).body == b"done"


async def test_acked_message_is_not_redelivered(sides: Sides) -> None:
    await sides.pub.publish(env(), b"x")
    [msg] = await sides.con.pull(["m/a"], budget=1, timeout=1)
    await sides.con.ack(msg)
    await sides.con.nak(msg)  # too late: already done
    assert await settled(sides.con, "m/a", 0)
    assert await sides.con.pull(["m/a"], budget=1, timeout=0.02) == []


async def test_depth_counts_waiting_not_in_flight(sides: Sides) -> None:
    assert await settled(sides.con, "never/seen", 0)
    for _ in range(3):
        await sides.pub.publish(env(), b"")
    assert await settled(sides.con, "m/a", 3)
    [msg] = await sides.con.pull(["m/a"], budget=1, timeout=1)
    assert await settled(sides.con, "m/a", 2)
    await sides.con.ack(msg)
    assert await settled(sides.con, "m/a", 2)
    await sides.con.pull(["m/a"], budget=100, timeout=1)
    assert await settled(sides.con, "m/a", 0)


async def test_close_releases_pullers_and_marks_unhealthy(sides: Sides) -> None:
    task = asyncio.create_task(sides.con.pull(["m/a"], budget=1, timeout=10))
    await asyncio.sleep(0.02)  # the pull is under way (the close must release it, either way)
    await sides.con.close()
    assert await asyncio.wait_for(task, 2) == []
    assert not sides.con.healthy


# -- priority classes (issue 12) --------------------------------------------------------


async def test_interactive_work_is_pulled_before_older_batch_work(sides: Sides) -> None:
    for i in range(3):
        await sides.pub.publish(env(rid=f"bulk-{i}", cost=10), b"")
    await sides.pub.publish(env(rid="query", cost=1, priority=Priority.INTERACTIVE), b"")
    # each class oldest first, interactive before batch (the budget takes them all)
    got = await pull_all(sides.con, 4)
    assert [m.envelope.request_id for m in got] == ["query", "bulk-0", "bulk-1", "bulk-2"]
    assert got[0].envelope.priority is Priority.INTERACTIVE
    assert await settled(sides.con, "m/a", 0)


async def test_a_small_budget_takes_the_interactive_request(sides: Sides) -> None:
    await sides.pub.publish(env(rid="bulk", cost=10), b"")
    await sides.pub.publish(env(rid="query", cost=1, priority=Priority.INTERACTIVE), b"")
    [msg] = await sides.con.pull(["m/a"], budget=1, timeout=1)
    assert msg.envelope.request_id == "query"


async def test_batch_work_that_waited_too_long_still_gets_in(sides: Sides) -> None:
    # the age limit is 2 s (the default); this one has waited 10
    await sides.pub.publish(env(rid="old-bulk", cost=5, waited=10.0), b"")
    await sides.pub.publish(env(rid="new-bulk", cost=5), b"")
    await sides.pub.publish(env(rid="query", cost=5, priority=Priority.INTERACTIVE), b"")
    # the budget holds the query only; the old batch request comes along, the new waits
    got = await pull_settled(sides.con, 5, expect=2)
    assert [m.envelope.request_id for m in got] == ["query", "old-bulk"]
