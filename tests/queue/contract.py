"""Every queue implementation, as the two sides the contracts run against.

A new implementation joins by adding an entry to ``IMPLS``; every test of the
publisher contract (``test_publisher_contract.py``), the consumer contract
(``test_consumer_contract.py``) and the cancels (``test_cancel.py``) then runs
against it too. Each entry makes a :class:`Sides`: the Publisher a gateway holds and
the Consumer a worker holds, one object where the implementation plays both.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from fleetserve.queue import (
    Consumer,
    JetStreamQueue,
    MemoryQueue,
    Message,
    Publisher,
    StreamOptions,
)
from fleetserve.queue.offload import OffloadingPublisher
from fleetserve.queue.offload_consumer import OffloadingConsumer
from fleetserve.storage import MemoryStore, Offload

from .test_local import LocalStack


@dataclass(frozen=True)
class Sides:
    """The gateway's side and the worker's side of one queue."""

    pub: Publisher
    con: Consumer


MakeSides = Callable[..., Awaitable[Sides]]
_prefixes = itertools.count()


def _both(q: Publisher | Consumer) -> Sides:
    assert isinstance(q, Publisher) and isinstance(q, Consumer)
    return Sides(q, q)


def _options(max_depth: int) -> StreamOptions:
    return StreamOptions(prefix=f"contract{next(_prefixes)}", storage="memory", max_depth=max_depth)


def _memory(request: pytest.FixtureRequest, max_depth: int, retry_after: float) -> Sides:
    return _both(MemoryQueue(max_depth=max_depth, retry_after=retry_after))


def _jetstream(request: pytest.FixtureRequest, max_depth: int, retry_after: float) -> Sides:
    """A real nats-server (session fixture); each queue gets its own streams."""
    server = request.getfixturevalue("nats_server")
    return _both(JetStreamQueue(server.url, _options(max_depth), retry_after=retry_after))


def _offloaded(request: pytest.FixtureRequest, max_depth: int, retry_after: float) -> Sides:
    """JetStream with every non-empty body and result sent through a payload store: each
    side wrapped on its own, over one connection."""
    server = request.getfixturevalue("nats_server")
    js = JetStreamQueue(server.url, _options(max_depth), retry_after=retry_after)
    offload = Offload(MemoryStore(), threshold=0)
    return Sides(OffloadingPublisher(js, offload), OffloadingConsumer(js, offload))


def _local(request: pytest.FixtureRequest, max_depth: int, retry_after: float) -> Sides:
    """A device process's client, over a Unix socket, to a local queue on a memory queue."""
    return _both(LocalStack(MemoryQueue(max_depth=max_depth, retry_after=retry_after)))


def _local_js(request: pytest.FixtureRequest, max_depth: int, retry_after: float) -> Sides:
    """The same over JetStream, as ``fleetserve worker --devices`` runs it."""
    server = request.getfixturevalue("nats_server")
    upstream = JetStreamQueue(server.url, _options(max_depth), retry_after=retry_after)
    return _both(LocalStack(upstream))


IMPLS = {
    "memory": _memory,
    "jetstream": _jetstream,
    "jetstream+offload": _offloaded,
    "local": _local,
    "local+jetstream": _local_js,
}


@pytest.fixture(params=sorted(IMPLS))
async def make_sides(request: pytest.FixtureRequest) -> AsyncIterator[MakeSides]:
    made: list[Consumer] = []

    async def make(max_depth: int = 100, retry_after: float = 1.5) -> Sides:
        sides = IMPLS[request.param](request, max_depth, retry_after)
        await sides.con.start()  # where the sides share a queue, it starts (and closes) once
        made.append(sides.con)
        return sides

    yield make
    for q in made:
        await q.close()


@pytest.fixture
async def sides(make_sides: MakeSides) -> Sides:
    return await make_sides()


async def settled(queue: Consumer, model: str, expect: int) -> bool:
    """``depth`` is eventually consistent: refresh until it reads ``expect`` (or 2 s)."""
    end = time.monotonic() + 2.0
    while True:
        await queue.refresh([model])
        if queue.depth(model) == expect or time.monotonic() > end:
            return queue.depth(model) == expect
        await asyncio.sleep(0.01)


async def pull_settled(queue: Consumer, budget: int, expect: int) -> list[Message]:
    """One pull once ``expect`` messages are ready together (a distributed queue
    delivers what is ready when the pull arrives: give it the time to be)."""
    end = time.monotonic() + 3.0
    while True:
        await queue.refresh(["m/a"])
        if queue.depth("m/a") >= expect + 1 or time.monotonic() > end:
            break
        await asyncio.sleep(0.01)
    return await queue.pull(["m/a"], budget=budget, timeout=1)


async def pull_all(queue: Consumer, n: int) -> list[Message]:
    """``n`` messages in one pull where the queue has them ready together (a
    distributed queue may deliver a pull's worth in pieces: keep pulling)."""
    got: list[Message] = []
    end = time.monotonic() + 3.0
    while len(got) < n and time.monotonic() < end:
        got += await queue.pull(["m/a"], budget=1000, timeout=0.5)
    return got
