"""The simulated puller: the real worker's pull decisions, on the simulated queue.

The decisions are the real functions (``queue.sizing``, ``worker.slicing``), called
as the JetStream puller (``queue/js_pull.py``) and the worker (``worker/loop.py``,
``worker/parts.py``) call them; only the queue is simulated (``Lanes``: one FIFO per
priority class, as JetStream has a subject per model and class). One pull by a worker
with ``room`` tokens to fill (two budgets less what it holds or, when it is full, one
budget less the interactive work it holds: then it pulls interactive work only):

1. The interactive lane is asked for ``pull_batch(room, window)`` messages (``room``
   over the 90th percentile of the lane's recent costs, as this worker saw them), then
   the batch lane for the room they left (none left: only if its oldest message has
   waited more than ``age_limit``), unless the worker is full.
2. What arrived, in publish order, goes into the lanes' cost windows; ``choose`` keeps
   interactive work first, within ``room`` (the first always), plus the oldest batch
   message if none was kept and it waited too long. The rest go back to the head of
   their lane in their order (NAK).
3. A kept request (not a part) for which ``plan_slices(lengths, budget)`` returns
   ranges is sliced (``budget``: the worker's pull budget, one batch) while fewer
   messages wait than it has ranges: the worker keeps the first range and publishes
   the others as new parts at the tail of the request's lane, enqueued now, for any
   worker. A part is not sliced again.

``tests/bench/test_sim_puller.py`` runs the same trace through the real
``queue.memory.MemoryQueue`` with these functions and checks the decisions match.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from itertools import count

from ...queue.sizing import CostWindow, choose, pull_batch
from ...wire import Encoding, Envelope, Priority, Task
from ...worker.slicing import plan_slices

EPOCH_S = 1e6  # simulated time 0 in envelope seconds (choose reads a time of 0 as "now")


@dataclass(slots=True, eq=False)
class Msg:
    """One queue message: a whole request or one part of it (items ``start`` on)."""

    rid: int
    lengths: list[int]  # this message's items in tokens (shortest first)
    enqueued: float  # ms: the request's arrival, or when its part was published
    interactive: bool
    start: int = 0  # the first item's index in the request
    part: bool = False
    pos: int = 0  # items a worker has batched so far
    pulled: float = 0.0  # ms: when the worker that holds it pulled it
    seq: int = 0  # publish order (the stream sequence)
    cost: int = field(init=False)

    def __post_init__(self) -> None:
        self.cost = sum(self.lengths)

    @property
    def key(self) -> tuple[int, int, int]:
        """(request, first item, end item): what the test compares."""
        return (self.rid, self.start, self.start + len(self.lengths))

    def cut(self, a: int, b: int) -> None:
        """Keep only items ``a`` to ``b`` of this message (its first slice)."""
        self.start += a
        self.lengths = self.lengths[a:b]
        self.cost = sum(self.lengths)

    def envelope(self) -> Envelope:
        """What the queue's decisions read: class, cost hint, enqueue time."""
        return Envelope(
            request_id=str(self.rid),
            model="sim",
            task=Task.ENCODE,
            content_type=Encoding.MSGPACK,
            accept=Encoding.MSGPACK,
            cost_hint=self.cost,
            deadline=math.inf,
            enqueued_at=EPOCH_S + self.enqueued / 1000.0,
            priority=Priority.INTERACTIVE if self.interactive else Priority.BATCH,
        )


class Lanes:
    """The simulated queue: one FIFO of messages per priority class."""

    def __init__(self) -> None:
        self.hi: deque[Msg] = deque()  # interactive
        self.lo: deque[Msg] = deque()  # batch
        self._seq = count()

    def __len__(self) -> int:
        return len(self.hi) + len(self.lo)

    def lane(self, m: Msg) -> deque[Msg]:
        return self.hi if m.interactive else self.lo

    def publish(self, m: Msg) -> None:
        m.seq = next(self._seq)
        self.lane(m).append(m)


@dataclass
class Pulled:
    """What one pull did."""

    asked: list[tuple[str, int]] = field(default_factory=list)  # (lane, messages asked)
    kept: list[Msg] = field(default_factory=list)  # a sliced request: its first slice
    put_back: list[Msg] = field(default_factory=list)
    parts: list[Msg] = field(default_factory=list)  # published for other workers


class Puller:
    """One worker's pulls: its pull budget and its cost windows, one per lane."""

    def __init__(self, budget: int, age_limit_ms: float = 2000.0) -> None:
        if budget < 1:
            raise ValueError("the pull budget must be positive")
        self.budget = budget
        self.age_limit_ms = age_limit_ms
        self.windows = {True: CostWindow(), False: CostWindow()}  # by interactive

    def pull(self, lanes: Lanes, now: float, room: int, interactive_only: bool = False) -> Pulled:
        out = Pulled()
        got: list[Msg] = []
        left = room
        for name, q in (("interactive", lanes.hi), ("batch", lanes.lo)):
            if not q or (interactive_only and q is lanes.lo):
                continue
            if left <= 0 and now - q[0].enqueued <= self.age_limit_ms:
                continue  # no room left, and its oldest has not waited too long
            n = pull_batch(max(left, 1), self.windows[q is lanes.hi])
            out.asked.append((name, n))
            got += [q.popleft() for _ in range(min(n, len(q)))]
            left = room - sum(m.cost for m in got)
        got.sort(key=lambda m: m.seq)
        for m in got:
            self.windows[m.interactive].add(m.cost)
        kept, back = choose([m.envelope() for m in got], room, self.age_limit_ms / 1e3, now_s(now))
        out.kept = [got[i] for i in kept]
        out.put_back = [got[i] for i in back]
        for m in sorted(out.put_back, key=lambda m: m.seq, reverse=True):
            lanes.lane(m).appendleft(m)  # back at the head of its lane, in order
        out.parts = self.share(out.kept, lanes, now)
        return out

    def share(self, kept: list[Msg], lanes: Lanes, now: float) -> list[Msg]:
        """Slice the kept requests far larger than one batch, while fewer messages wait
        than it has slices (behind a backlog its parts would wait); publish the others."""
        parts: list[Msg] = []
        for m in kept:
            ranges = None if m.part else plan_slices(m.lengths, self.budget)
            if ranges is None or len(lanes) >= len(ranges):
                continue
            for a, b in ranges[1:]:
                p = Msg(m.rid, m.lengths[a:b], now, m.interactive, m.start + a, True)
                lanes.publish(p)
                parts.append(p)
            m.cut(*ranges[0])
        return parts


def now_s(ms: float) -> float:
    """Simulated ms as the envelope clock's seconds."""
    return EPOCH_S + ms / 1000.0
