"""Interactive work first in the batch former, capped batches while it is about, and
the age rule that keeps batch work from starving (issue 12, item 1)."""

from __future__ import annotations

import dataclasses

from fleetserve.wire import Priority
from fleetserve.worker.batcher import BatchFormer, Job

from ..sinks import settle
from .test_batcher import job, take_all


def interactive(*lengths: int) -> Job:
    j = job(*lengths)
    j.msg.envelope = dataclasses.replace(j.msg.envelope, priority=Priority.INTERACTIVE)
    return j


def test_interactive_items_take_the_next_batch_alone() -> None:
    bf = BatchFormer(max_batch_tokens=100, max_batch_size=50, interactive_tokens=40)
    bulk = job(*[10] * 20)
    bf.add(bulk)
    query = interactive(5, 5)
    bf.add(query)
    assert bf.interactive_waiting
    first = bf.take()
    assert {it.job for it in first} == {query}  # no bulk rows ride along
    assert not bf.interactive_waiting
    # bulk goes on, capped at 40 padded tokens while interactive work was seen lately
    rest = take_all(bf)
    assert all(max(it.length for it in b) * len(b) <= 40 for b in rest)
    assert sum(len(b) for b in rest) == 20


def test_without_interactive_work_batches_use_the_full_budget() -> None:
    bf = BatchFormer(max_batch_tokens=100, max_batch_size=50, interactive_tokens=40, hold=0.0)
    bf.add(job(*[10] * 20))
    assert [len(b) for b in take_all(bf)] == [10, 10]


def test_the_cap_holds_for_a_while_after_the_last_query() -> None:
    bf = BatchFormer(max_batch_tokens=100, max_batch_size=50, interactive_tokens=40, hold=30.0)
    bf.add(interactive(5))
    bf.take()
    bf.add(job(*[10] * 8))
    assert bf.budget() == 40 and len(bf.take()) == 4
    bf.hold = 0.0  # the hold is over
    assert bf.budget() == 100 and len(bf.take()) == 4  # what is left


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_batch_work_kept_from_every_batch_too_long_takes_the_next() -> None:
    clock = Clock()
    bf = BatchFormer(max_batch_tokens=100, max_batch_size=50, age_limit=2.0, clock=clock)
    bulk = job(10, 10)
    bf.add(bulk)
    bf.add(interactive(5))
    assert {it.job.msg.envelope.priority for it in bf.take()} == {Priority.INTERACTIVE}
    clock.now = 10.0  # queries kept coming: batch work has had no batch for 10 s
    bf.add(interactive(5))
    assert {it.job for it in bf.take()} == {bulk}
    assert bf.interactive_waiting


def test_failed_interactive_requests_do_not_stall_batch_work() -> None:
    bf = BatchFormer(max_batch_tokens=100, max_batch_size=50)
    bulk = job(10, 10)
    bf.add(bulk)
    query = interactive(5)
    bf.add(query)
    settle(query)  # its client went away
    assert {it.job for it in bf.take()} == {bulk}
    assert not bf.interactive_waiting and bf.take() == []


def test_a_job_with_spans_adds_only_those_items() -> None:
    bf = BatchFormer(max_batch_tokens=1000, max_batch_size=50)
    j = job(*range(1, 11))
    j.spans = [(0, 3), (7, 10)]
    bf.add(j)
    assert sorted(it.index for it in bf.take()) == [0, 1, 2, 7, 8, 9]
    assert bf.pending_tokens == 0


def test_under_constant_queries_batch_work_gets_a_batch_per_age_limit() -> None:
    clock = Clock()
    bf = BatchFormer(max_batch_tokens=20, max_batch_size=50, age_limit=2.0, clock=clock)
    bf.add(job(*[10] * 8))
    kinds = []
    for t in range(8):  # a query every second, each taking the next batch
        clock.now = float(t)
        bf.add(interactive(5))
        kinds.append("q" if bf.take()[0].interactive else "b")
    assert kinds == ["q", "q", "q", "b", "q", "q", "b", "q"]  # a query waits one batch


def test_a_cancelled_query_behind_batch_work_leaves_the_counts_right() -> None:
    bf = BatchFormer(max_batch_tokens=1000, max_batch_size=50)
    bf.add(job(10, 10))
    query = interactive(5)
    bf.add(query)
    settle(query)
    take_all(bf)
    assert not bf.interactive_waiting and bf.interactive_tokens_pending == 0
    bf.add(interactive(5))
    assert bf.interactive_waiting


def test_generation_admits_interactive_requests_first() -> None:
    from fleetserve.worker.admission import WaitQueue

    q = WaitQueue(max_batch_tokens=100)
    first, second, query = job(10), job(10), interactive(5)
    for j in (first, second, query):
        q.add(j)
    assert q.interactive_tokens_pending == 5 and q.pending_tokens == 25
    order = [q.pop_if(lambda _: True) for _ in range(3)]
    assert order == [query, first, second]
    assert q.pending_tokens == 0 and q.interactive_tokens_pending == 0


def test_a_retried_batch_request_waits_behind_queries_and_then_runs_alone() -> None:
    bf = BatchFormer(max_batch_tokens=100, max_batch_size=50, interactive_tokens=40)
    retried = job(10, 10, 10, 10, 10, 10)
    retried.msg.attempts = 2  # its batch failed before: it runs alone
    bf.add(retried)
    other = job(10)
    bf.add(other)
    query = interactive(5)
    bf.add(query)
    assert {it.job for it in bf.take()} == {query}
    alone = bf.take()
    assert {it.job for it in alone} == {retried}
    assert max(it.length for it in alone) * len(alone) <= 40  # capped while queries are about
