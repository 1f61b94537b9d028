"""The simulated puller against the real queue and decision functions, and its own rules.

The real side does what the JetStream puller and the worker do with the shared
decisions, here on ``queue.memory.MemoryQueue`` as it is: one memory queue per class
stands in for JetStream's lane per class (the memory queue's own ``pull`` takes a cost
budget in priority order, with no count and no lane to choose; a budget of 0 yields
exactly the oldest message of the queue). The interactive lane is asked for
``pull_batch(room)`` messages, the batch lane for the room they left; ``choose`` keeps
and orders, the rest are NAK-ed (in reverse, so that they are back at the head in their
order); ``plan_slices`` for a request far larger than the budget while fewer messages
wait than it has slices, its other ranges published as ``worker.parts.part_envelope``.
"""

from __future__ import annotations

import time

from fleetserve.bench.sim.puller import EPOCH_S, Lanes, Msg, Puller
from fleetserve.queue import Message
from fleetserve.queue.memory import MemoryQueue
from fleetserve.queue.sizing import MAX_BATCH, CostWindow, choose, pull_batch
from fleetserve.wire import Priority
from fleetserve.worker.parts import part_envelope
from fleetserve.worker.slicing import plan_slices
from tests.queue.envelopes import env

Key = tuple[int, int, int]  # (request, first item, end item)
Decision = tuple[list[tuple[str, int]], list[Key], list[Key], list[Key]]

# (interactive?, item lengths): small queries, medium bulk, one bulk request of 10,000
# tokens (sliced by the first worker), published in this order
TRACE: list[tuple[bool, list[int]]] = [
    (True, [40]),
    (False, [250] * 10),
    (True, [120, 200]),
    (False, [250] * 40),
    (True, [30]),
    (True, [300] * 5),
    (False, [200] * 12),
    (True, [60]),
    (False, [100] * 30),
    (True, [500, 500, 600]),
    (False, [250] * 9),
]
# two workers (a 1x and a 2x one) pull in turn, each with this room left
WORKERS = [(2048, 2048), (4096, 6000)]  # (pull budget, room)
LANES = (Priority.INTERACTIVE, Priority.BATCH)
NAMES = {Priority.INTERACTIVE: "interactive", Priority.BATCH: "batch"}


def _key(msg: Message) -> Key:
    e = msg.envelope
    if e.part is not None:
        return (int(e.part.parent), e.part.start, e.part.stop)
    return (int(e.request_id), 0, len(TRACE[int(e.request_id)][1]))


class RealWorker:
    """One worker's pulls on the real memory queues, with the real decisions."""

    def __init__(self, budget: int, room: int, queues: dict[Priority, MemoryQueue]) -> None:
        self.budget, self.room, self.queues = budget, room, queues
        self.windows = {lane: CostWindow() for lane in LANES}

    async def pull(self, seq: dict[str, int]) -> Decision:
        asked: list[tuple[str, int]] = []
        got: list[Message] = []
        left = self.room
        for lane in LANES:  # interactive first, then batch for the room it left
            q = self.queues[lane]
            if not q.depth("m") or left <= 0:  # (nothing in the trace waits 2 s)
                continue
            n = pull_batch(max(left, 1), self.windows[lane])
            asked.append((NAMES[lane], n))
            for _ in range(n):
                one = await q.pull(["m"], 0, 0.0)
                if not one:
                    break
                got += one
            left = self.room - sum(m.envelope.cost_hint for m in got)
        got.sort(key=lambda m: seq[m.envelope.request_id])  # the stream's order
        for m in got:
            self.windows[m.envelope.priority].add(m.envelope.cost_hint)
        kept_i, back_i = choose([m.envelope for m in got], self.room, 2.0, time.time())
        back = [got[i] for i in back_i]
        for m in sorted(back, key=lambda m: seq[m.envelope.request_id], reverse=True):
            await self.queues[m.envelope.priority].nak(m)
        kept, parts = [], []
        for m in (got[i] for i in kept_i):
            e = m.envelope
            ranges = None
            if e.part is None:
                ranges = plan_slices(TRACE[int(e.request_id)][1], self.budget)
            depth = sum(q.depth("m") for q in self.queues.values())
            if ranges is None or depth >= len(ranges):  # not behind a backlog
                kept.append(_key(m))
                continue
            rid, lengths = int(e.request_id), TRACE[int(e.request_id)][1]
            kept.append((rid, *ranges[0]))
            for a, b in ranges[1:]:
                part = part_envelope(e, a, b, sum(lengths[a:b]), "t")
                seq[part.request_id] = len(seq)
                await self.queues[part.priority].publish(part, b"")
                parts.append((rid, a, b))
        return asked, kept, [_key(m) for m in back], parts


async def _real() -> list[Decision]:
    queues = {lane: MemoryQueue() for lane in LANES}
    seq: dict[str, int] = {}
    for rid, (inter, lengths) in enumerate(TRACE):
        prio = Priority.INTERACTIVE if inter else Priority.BATCH
        seq[str(rid)] = rid
        await queues[prio].publish(env("m", sum(lengths), str(rid), priority=prio), b"")
    workers = [RealWorker(b, room, queues) for b, room in WORKERS]
    out: list[Decision] = []
    while any(q.depth("m") for q in queues.values()):
        out.append(await workers[len(out) % len(workers)].pull(seq))
    return out


def _simulated() -> list[Decision]:
    lanes = Lanes()
    for rid, (inter, lengths) in enumerate(TRACE):
        lanes.publish(Msg(rid, lengths, 0.0, inter))
    workers = [(Puller(b), room) for b, room in WORKERS]
    out: list[Decision] = []
    while lanes:
        puller, room = workers[len(out) % len(workers)]
        got = puller.pull(lanes, 1.0, room)  # 1 ms on: nothing has waited 2 s
        keys = [m.key for m in got.kept], [m.key for m in got.put_back]
        out.append((got.asked, *keys, [m.key for m in got.parts]))
    return out


async def test_simulated_puller_decides_as_the_real_queue_and_functions_do() -> None:
    real, sim = await _real(), _simulated()
    assert sim == real
    # the trace exercises every decision: a cold pull asks for MAX_BATCH, some are put
    # back, the big request is sliced, parts are pulled as messages of their own
    assert real[0][0] == [("interactive", MAX_BATCH)]  # queries filled the room
    assert real[1][0] == [("interactive", MAX_BATCH), ("batch", MAX_BATCH)]
    assert sum(len(back) for _, _, back, _ in real) >= 5
    assert {r for _, _, _, parts in real for r, _, _ in parts} == {3}  # only 10,000 tokens
    assert any(k[0] == 3 and k[1] > 0 for _, kept, _, _ in real for k in kept)
    # interactive work is kept before batch work that came before it
    order = [k[0] for _, kept, _, _ in real for k in kept]
    assert order[:3] == [0, 2, 4]


def test_put_backs_return_to_the_head_in_order() -> None:
    lanes = Lanes()
    for rid in range(6):
        lanes.publish(Msg(rid, [1000], 0.0, False))
    got = Puller(2048).pull(lanes, 0.0, 3000)  # a cold window asks for all six
    assert [m.rid for m in got.kept] == [0, 1, 2]  # 3000 tokens of room
    assert [m.rid for m in got.put_back] == [3, 4, 5]
    assert [m.rid for m in lanes.lo] == [3, 4, 5]


def test_warm_windows_ask_for_what_fits_at_the_90th_percentile() -> None:
    lanes = Lanes()
    puller = Puller(4096)
    for _ in range(50):
        puller.windows[False].add(1000)
    for rid in range(10):
        lanes.publish(Msg(rid, [500], 0.0, False))
    got = puller.pull(lanes, 0.0, 4096)
    assert got.asked == [("batch", 4)] and len(got.kept) == 4 and not got.put_back


def test_old_batch_work_goes_first() -> None:
    lanes = Lanes()
    lanes.publish(Msg(0, [3000], 0.0, False))
    lanes.publish(Msg(1, [3000], 900.0, True))
    young = Puller(2048).pull(lanes, 1500.0, 2048)
    assert [m.rid for m in young.kept] == [1]  # interactive first while batch is young
    lanes.publish(Msg(2, [3000], 2200.0, True))
    old = Puller(2048).pull(lanes, 2500.0, 2048)
    assert old.asked == [("interactive", MAX_BATCH), ("batch", 1)]  # asked though full
    assert [m.rid for m in old.kept] == [2, 0]  # it has waited 2.5 s: kept as well
    assert not old.put_back


def test_a_big_request_is_sliced_and_its_parts_are_not_sliced_again() -> None:
    lanes = Lanes()
    lanes.publish(Msg(7, [100] * 100, 5.0, False))  # 10,000 tokens, budget 1000
    lanes.publish(Msg(8, [100], 6.0, False))
    got = Puller(1000).pull(lanes, 10.0, 1000)
    assert [m.key for m in got.kept] == [(7, 0, 10)]
    assert [m.key for m in got.parts] == [(7, a, a + 10) for a in range(10, 100, 10)]
    assert [m.key for m in lanes.lo] == [(8, 0, 1), *(m.key for m in got.parts)]  # the tail
    assert all(m.part and m.enqueued == 10.0 for m in got.parts)  # enqueued when published
    small = Puller(100)  # a part of 1,000 tokens over 2 x 100 is still not sliced
    while lanes:
        assert not small.pull(lanes, 10.0, 100).parts


def test_a_big_request_is_not_shared_behind_a_backlog() -> None:
    lanes = Lanes()
    lanes.publish(Msg(7, [100] * 100, 5.0, False))  # 10 slices of one budget
    for rid in range(8, 20):
        lanes.publish(Msg(rid, [100], 6.0, False))
    got = Puller(1000).pull(lanes, 10.0, 1000)
    assert [m.key for m in got.kept] == [(7, 0, 100)] and not got.parts  # 12 wait


def test_envelopes_carry_what_the_decisions_read() -> None:
    m = Msg(3, [10, 20], 1500.0, True)
    e = m.envelope()
    assert (e.request_id, e.cost_hint, e.interactive) == ("3", 30, True)
    assert e.enqueued_at == EPOCH_S + 1.5
