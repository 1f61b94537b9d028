"""The JobQueue contract, run against every implementation.

A new implementation joins by adding a param to ``IMPLS``; every test below then runs
against it too. JetStream queues run on the session's real nats-server, each on its
own prefix (so its own stream and consumer), with memory storage.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import nats
import pytest

from fleetserve.lora.jobs import JetStreamJobQueue, JobQueue, JobRef, Lease, MemoryJobQueue
from fleetserve.wire import Overloaded

MakeQueue = Callable[..., Awaitable[JobQueue]]
_prefixes = itertools.count()
_ids = itertools.count()


def ref(tenant: str = "acme") -> JobRef:
    return JobRef(tenant, f"ftjob-{next(_ids)}")


@pytest.fixture(params=["memory", "jetstream"])
async def make_queue(request: pytest.FixtureRequest) -> AsyncIterator[MakeQueue]:
    made: list[JobQueue] = []
    conns: list[object] = []

    async def make(max_queued: int = 100, ack_wait: float = 30.0) -> JobQueue:
        q: JobQueue
        if request.param == "memory":
            q = MemoryJobQueue(max_queued)
        else:
            server = request.getfixturevalue("nats_server")
            nc = await nats.connect(server.url)
            conns.append(nc)
            q = await JetStreamJobQueue.open(
                nc,
                prefix=f"jobc{next(_prefixes)}",
                ack_wait=ack_wait,
                storage="memory",
                max_queued=max_queued,
            )
        made.append(q)
        return q

    yield make
    for q in made:
        await q.close()
        if isinstance(q, JetStreamJobQueue):
            await q._js.delete_stream(q.stream)
    for nc in conns:
        await nc.close()  # type: ignore[attr-defined]


@pytest.fixture
async def queue(make_queue: MakeQueue) -> JobQueue:
    return await make_queue()


async def take(queue: JobQueue, timeout: float = 2.0) -> Lease:
    lease = await queue.take(timeout)
    assert lease is not None, "nothing came"
    return lease


async def test_implements_the_protocol(queue: JobQueue) -> None:
    assert isinstance(queue, JobQueue)
    await queue.submit(ref())
    lease = await take(queue)
    assert isinstance(lease, Lease)
    await lease.progress()
    await lease.done()


async def test_jobs_come_out_in_the_order_they_went_in(queue: JobQueue) -> None:
    refs = [ref() for _ in range(4)]
    for r in refs:
        await queue.submit(r)
    got = []
    for _ in refs:
        lease = await take(queue)
        assert lease.deliveries == 1
        got.append(lease.ref)
        await lease.done()
    assert got == refs


async def test_take_returns_none_when_nothing_comes(queue: JobQueue) -> None:
    start = time.monotonic()
    assert await queue.take(0.3) is None
    assert 0.25 <= time.monotonic() - start < 2.0


async def started() -> None:
    """Let the tasks just created run up to where they wait (a yield, not a timed sleep)."""
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_waiting_taker_gets_a_job_submitted_meanwhile(queue: JobQueue) -> None:
    taker = asyncio.ensure_future(queue.take(5.0))
    await started()
    r = ref()
    await queue.submit(r)
    lease = await asyncio.wait_for(taker, 5.0)
    assert lease is not None and lease.ref == r
    await lease.done()


async def test_a_released_job_comes_back_first_with_one_more_delivery(queue: JobQueue) -> None:
    first, second = ref(), ref()
    await queue.submit(first)
    await queue.submit(second)
    lease = await take(queue)
    assert (lease.ref, lease.deliveries) == (first, 1)
    await lease.release()
    again = await take(queue)
    assert (again.ref, again.deliveries) == (first, 2)
    await again.done()
    after = await take(queue)
    assert (after.ref, after.deliveries) == (second, 1)
    await after.done()


async def test_a_done_job_is_never_seen_again(make_queue: MakeQueue) -> None:
    queue = await make_queue(ack_wait=0.5)
    r = ref()
    await queue.submit(r)
    lease = await take(queue)
    await lease.done()
    await lease.release()  # settled already: ignored
    await lease.progress()
    assert await queue.take(1.2) is None  # longer than ack_wait: not redelivered
    other = ref()
    await queue.submit(other)
    assert (await take(queue)).ref == other


async def test_concurrent_takers_each_get_a_different_job(queue: JobQueue) -> None:
    takers = [asyncio.ensure_future(queue.take(1.0)) for _ in range(3)]
    await started()
    refs = {ref(), ref()}
    for r in refs:
        await queue.submit(r)
    leases = await asyncio.gather(*takers)
    got = [lease.ref for lease in leases if lease is not None]
    assert sorted(got, key=lambda r: r.job_id) == sorted(refs, key=lambda r: r.job_id)
    assert leases.count(None) == 1  # two jobs, three takers: each job to exactly one
    assert await queue.take(0.2) is None  # nothing was kept back or handed out twice


async def test_a_full_queue_is_overloaded(make_queue: MakeQueue) -> None:
    queue = await make_queue(max_queued=2)
    await queue.submit(ref())
    await queue.submit(ref())
    with pytest.raises(Overloaded) as err:
        await queue.submit(ref())
    assert "full" in err.value.message and "2 jobs" in err.value.message
    assert err.value.retry_after is not None and err.value.retry_after > 0
    lease = await take(queue)
    with pytest.raises(Overloaded):  # a running job still counts
        await queue.submit(ref())
    await lease.done()
    await queue.submit(ref())  # room again
    for _ in range(2):
        await (await take(queue)).done()
    taker = asyncio.ensure_future(queue.take(5.0))  # handed over as it is submitted...
    await started()
    await queue.submit(ref())
    assert await asyncio.wait_for(taker, 5.0) is not None
    await queue.submit(ref())
    with pytest.raises(Overloaded):  # ... it counts too
        await queue.submit(ref())


async def test_ack_wait_says_how_often_to_show_progress(make_queue: MakeQueue) -> None:
    queue = await make_queue(ack_wait=2.5)
    if isinstance(queue, MemoryJobQueue):
        assert queue.ack_wait == math.inf  # nothing dies on its own in one process
    else:
        assert queue.ack_wait == 2.5


async def test_close_ends_a_waiting_take(queue: JobQueue) -> None:
    taker = asyncio.ensure_future(queue.take(30.0))
    await asyncio.sleep(0)  # let it start waiting
    start = time.monotonic()
    await queue.close()
    assert await asyncio.wait_for(taker, 5.0) is None
    assert time.monotonic() - start < 2.0
    assert await queue.take(1.0) is None


async def test_a_reference_survives_the_trip(queue: JobQueue) -> None:
    r = JobRef("tenant/with spaces and ünïcode", "ftjob-Ω")
    await queue.submit(r)
    lease = await take(queue)
    assert lease.ref == r
    await lease.done()


def test_a_reference_round_trips() -> None:
    r = JobRef("acme", "ftjob-abc123")
    assert JobRef.decode(r.encode()) == r


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"\xff\xfe",
        b"[]",
        b'"acme"',
        b'{"tenant": "acme"}',
        b'{"tenant": "acme", "job_id": 7}',
        b'{"tenant": "", "job_id": "x"}',
        b'{"tenant": "acme", "job_id": "x", "extra": 1}',
    ],
)
def test_garbage_is_not_a_reference(data: bytes) -> None:
    with pytest.raises(ValueError, match="not a job reference"):
        JobRef.decode(data)


async def test_a_job_queue_publish_failure_says_its_kind_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, the 503 said 'could not queue the job: <type> <the exception's text>'."""
    from fleetserve.wire import Unavailable

    class JS:
        async def publish(self, *args: Any, **kwargs: Any) -> None:
            raise ConnectionResetError("nats://10.0.0.7:4222: connection reset")

    class NC:
        def jetstream(self) -> JS:
            return JS()

    q = JetStreamJobQueue(NC(), None, prefix="t", ack_wait=30.0, max_queued=10, retry_after=5.0)
    with (
        caplog.at_level(logging.WARNING, "fleetserve.lora.jobs"),
        pytest.raises(Unavailable) as info,
    ):
        await q.submit(JobRef("default", "ftjob-1"))
    assert info.value.message == "could not queue the job: ConnectionResetError; retry"
    assert info.value.retry_after == 5.0 and "10.0.0.7" in caplog.text
