"""The simulated batch former against the real one (``worker.batcher.BatchFormer``).

The simulator keeps its own former, on item lengths only, for speed; this drives both
through the same script of arrivals and batches on one clock and checks that every
batch takes the same items of the same requests, with the same budget.
"""

from __future__ import annotations

from fleetserve.bench.sim.former import Former
from fleetserve.bench.sim.puller import Msg
from fleetserve.families import Prepared
from fleetserve.queue import Message
from fleetserve.wire import Priority
from fleetserve.worker.batcher import BatchFormer, Job
from tests.queue.envelopes import env

BUDGET, CAP, SIZE, AGE_MS, HOLD_MS = 2048, 512, 32, 2000.0, 1000.0

# (ms, request id, interactive?, item lengths) to add, or (ms, None, ...) to take a batch
Step = tuple[float, int | None, bool, list[int]]
SCRIPT: list[Step] = [
    (0.0, 0, False, sorted([30, 90, 250, 250, 120, 60] * 6)),  # bulk, 36 items
    (0.0, 1, True, [40, 50, 300]),
    (1.0, None, False, []),  # queries only, capped
    (2.0, None, False, []),
    (5.0, 2, True, [20]),
    (6.0, None, False, []),
    (7.0, None, False, []),  # no query waits, but one came 7 ms ago: capped bulk
    (1500.0, None, False, []),  # the hold is over: the full budget
    (1600.0, 3, False, [256] * 40),  # more bulk: the window is two budgets of tokens
]
for _k in range(30):  # a query every 100 ms, each batched at once: bulk waits 2 s
    SCRIPT += [(1700.0 + 100 * _k, 10 + _k, True, [64, 64]), (1710.0 + 100 * _k, None, False, [])]
SCRIPT += [(5000.0 + 10 * _k, None, False, []) for _k in range(6)]


def _real() -> list[tuple[int, list[tuple[int, int]]]]:
    now = [0.0]
    f = BatchFormer(
        BUDGET,
        SIZE,
        interactive_tokens=CAP,
        hold=HOLD_MS / 1e3,
        age_limit=AGE_MS / 1e3,
        clock=lambda: now[0],
    )
    out = []
    for ms, rid, inter, lengths in SCRIPT:
        now[0] = ms / 1e3
        if rid is not None:
            prio = Priority.INTERACTIVE if inter else Priority.BATCH
            msg = Message(env("m", sum(lengths), str(rid), priority=prio), b"", rid)
            f.add(Job(msg, Prepared(list(lengths), None, sum(lengths), list(lengths)), now[0]))
            continue
        budget = f.budget()
        batch = f.take()
        counts: dict[int, int] = {}
        for it in batch:
            rid_of = int(it.job.msg.envelope.request_id)
            counts[rid_of] = counts.get(rid_of, 0) + 1
        out.append((budget, sorted(counts.items())))
    return out


def _simulated() -> list[tuple[int, list[tuple[int, int]]]]:
    f = Former(BUDGET, CAP, SIZE, AGE_MS, HOLD_MS)
    out = []
    for ms, rid, inter, lengths in SCRIPT:
        if rid is not None:
            f.add(Msg(rid, list(lengths), ms, inter), ms)
            continue
        if not f:
            out.append((BUDGET, []))
            continue
        b = f.take(ms)
        out.append((b.budget, sorted((m.rid, c) for m, c in b.done)))
    return out


def test_the_simulated_former_batches_as_the_real_one() -> None:
    real, sim = _real(), _simulated()
    assert sim == real
    # the script exercises each rule: queries alone and capped, the hold, the full
    # budget, and bulk work getting one batch after 2 s without one behind queries
    assert real[:4] == [(CAP, [(1, 2)]), (CAP, [(1, 1)]), (CAP, [(2, 1)]), (CAP, [(0, 8)])]
    assert real[4] == (BUDGET, [(0, 16)])
    queries = [batch for _, batch in real[5:35]]
    turns = [i for i, batch in enumerate(queries) if batch and batch[0][0] in (0, 3)]
    assert turns == [18]  # at 3510 ms: 2.01 s after bulk's last batch (at 1500 ms)
    assert queries[19] == [(28, 2), (29, 2)]  # the query it held back waited one batch
