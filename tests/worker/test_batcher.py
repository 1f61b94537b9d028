"""The batch former: padded-token packing, windows, splitting and failed jobs."""

from __future__ import annotations

import itertools
import time

import pytest

from fleetserve.families import Prepared
from fleetserve.queue import Message
from fleetserve.wire import Encoding, Envelope, Task
from fleetserve.worker.batcher import BatchFormer, Job, WorkItem

from ..sinks import settle

_ids = itertools.count(1)


def job(*lengths: int, deadline_in: float = 30.0) -> Job:
    n = next(_ids)
    now = time.time()
    env = Envelope(
        request_id=f"r{n}",
        model="m",
        task=Task.ENCODE,
        content_type=Encoding.JSON,
        accept=Encoding.JSON,
        cost_hint=sum(lengths),
        deadline=now + deadline_in,
    )
    items = [list(range(k)) for k in lengths]
    return Job(Message(env, b"", n), Prepared(items, None, sum(lengths)), pulled_at=now)


def lens(batch: list[WorkItem]) -> list[int]:
    return [it.length for it in batch]


def padded(batch: list[WorkItem]) -> int:
    return max(lens(batch)) * len(batch)


def take_all(bf: BatchFormer) -> list[list[WorkItem]]:
    out = []
    while batch := bf.take():
        out.append(batch)
    return out


def test_budgets_must_be_positive() -> None:
    for tokens, size in ((0, 1), (1, 0), (-5, 4)):
        with pytest.raises(ValueError):
            BatchFormer(tokens, size)


def test_job_counts_items_and_knows_its_deadline() -> None:
    j = job(3, 4, 5)
    assert j.remaining == 3 and not j.expired and not j.settled
    assert job(1, deadline_in=-1).expired


def test_empty_former_takes_nothing() -> None:
    bf = BatchFormer(100, 8)
    assert bf.take() == [] and len(bf) == 0 and bf.pending_tokens == 0


def test_packs_by_padded_tokens() -> None:
    bf = BatchFormer(max_batch_tokens=20, max_batch_size=100)
    bf.add(job(5, 5, 5, 5, 5, 5))
    batches = take_all(bf)
    assert [len(b) for b in batches] == [4, 2]
    assert all(padded(b) <= 20 for b in batches)


def test_padding_counts_the_longest_item_not_the_sum() -> None:
    # real tokens 1+1+1+8 = 11 fit a budget of 16, but padded 8 x 4 = 32 does not
    bf = BatchFormer(max_batch_tokens=16, max_batch_size=100)
    bf.add(job(1, 1, 1, 8))
    first = bf.take()
    assert lens(first) == [1, 1, 1]
    assert lens(bf.take()) == [8]


def test_respects_the_max_batch_size() -> None:
    bf = BatchFormer(max_batch_tokens=10_000, max_batch_size=3)
    bf.add(job(*[2] * 7))
    assert [len(b) for b in take_all(bf)] == [3, 3, 1]


def test_sorts_by_length_within_the_window() -> None:
    bf = BatchFormer(max_batch_tokens=10, max_batch_size=10)
    bf.add(job(9, 1, 5, 2))
    assert [lens(b) for b in take_all(bf)] == [[1, 2], [5], [9]]


def test_sorting_mixes_requests() -> None:
    bf = BatchFormer(max_batch_tokens=100, max_batch_size=10)
    a, b = job(7, 2), job(1, 6)
    bf.add(a)
    bf.add(b)
    batch = bf.take()
    assert lens(batch) == [1, 2, 6, 7]
    assert [(it.job is a, it.index) for it in batch] == [
        (False, 0),
        (True, 1),
        (False, 1),
        (True, 0),
    ]


def test_window_is_bounded_and_oldest_first() -> None:
    # window: at most 2 x max_batch_size items, so the short item at the end waits
    bf = BatchFormer(max_batch_tokens=10, max_batch_size=2)
    bf.add(job(3, 3, 3, 3, 1))
    assert lens(bf.take()) == [3, 3]
    assert lens(bf.take()) == [1, 3]
    assert lens(bf.take()) == [3]


def test_one_large_job_is_split_across_batches() -> None:
    bf = BatchFormer(max_batch_tokens=16, max_batch_size=8)
    j = job(*[4] * 10)
    bf.add(j)
    batches = take_all(bf)
    assert len(batches) == 3
    assert all(len(b) <= 4 and padded(b) <= 16 for b in batches)
    indices = sorted(it.index for b in batches for it in b)
    assert indices == list(range(10))
    assert all(it.job is j for b in batches for it in b)
    assert all(it.item == j.prepared.items[it.index] for b in batches for it in b)


def test_always_takes_at_least_one_over_budget_item() -> None:
    bf = BatchFormer(max_batch_tokens=10, max_batch_size=4)
    bf.add(job(50))
    assert lens(bf.take()) == [50]
    bf.add(job(50, 2))  # the 50 alone fills the window (2 x budget), so it goes first
    assert [lens(b) for b in take_all(bf)] == [[50], [2]]
    bf.add(job(2, 12))  # both in the window: 12 x 2 > 10, so the 12 waits for its own batch
    assert [lens(b) for b in take_all(bf)] == [[2], [12]]


def test_skips_failed_jobs() -> None:
    bf = BatchFormer(max_batch_tokens=1000, max_batch_size=100)
    good1, bad, good2 = job(2, 3), job(4, 4, 4), job(5)
    for j in (good1, bad, good2):
        bf.add(j)
    settle(bad)
    batch = bf.take()
    assert {it.job for it in batch} == {good1, good2}
    assert sorted(lens(batch)) == [2, 3, 5]
    assert bf.take() == []
    assert len(bf) == 0 and bf.pending_tokens == 0


def test_failed_job_at_the_head_is_dropped() -> None:
    bf = BatchFormer(max_batch_tokens=1000, max_batch_size=100)
    bad, good = job(7, 7), job(1)
    bf.add(bad)
    bf.add(good)
    settle(bad)
    batch = bf.take()
    assert [it.job for it in batch] == [good]
    assert bf.pending_tokens == 0 and len(bf) == 0


def test_pending_tokens_accounting() -> None:
    bf = BatchFormer(max_batch_tokens=8, max_batch_size=100)
    bf.add(job(3, 4))
    bf.add(job(2))
    assert bf.pending_tokens == 9 and len(bf) == 3
    batch = bf.take()
    assert bf.pending_tokens == 9 - sum(lens(batch))
    assert len(bf) == 3 - len(batch)
    take_all(bf)
    assert bf.pending_tokens == 0 and len(bf) == 0


def test_drain_returns_everything_left() -> None:
    bf = BatchFormer(max_batch_tokens=4, max_batch_size=1)
    j1, j2 = job(1, 2), job(3)
    bf.add(j1)
    bf.add(j2)
    bf.take()
    left = bf.drain()
    assert [(it.job, it.index) for it in left] == [(j1, 1), (j2, 0)]
    assert len(bf) == 0 and bf.pending_tokens == 0 and bf.take() == []


def test_a_retried_request_is_batched_alone() -> None:
    bf = BatchFormer(max_batch_tokens=1000, max_batch_size=8)
    retried = job(4, 4)
    retried.msg.attempts = 2  # its batch failed before: it may be the poison
    fresh = job(4, 4)
    bf.add(retried)
    bf.add(fresh)
    first = bf.take()
    assert {id(it.job) for it in first} == {id(retried)} and len(first) == 2
    assert {id(it.job) for it in bf.take()} == {id(fresh)}
    assert bf.pending_tokens == 0
