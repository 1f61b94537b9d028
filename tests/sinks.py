"""A runner's ``JobSink`` for tests that drive a runner without a worker."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from fleetserve.wire import FleetError, InternalError
from fleetserve.worker.batcher import Job
from fleetserve.worker.records import State


def settle(job: Job) -> None:
    """What the worker's ledger does to a job it answers: formers and the generation
    thread drop what is left of it (a test stands in for the ledger here)."""
    job.record.state = State.SETTLED


class CallbackSink:
    """Finishes with ``finish``; crashes, expiries and failures (settled first) go to
    ``failed`` (with an "expired" error for expiries); chunks to ``chunk``, if given."""

    def __init__(
        self,
        finish: Callable[[Job], object],
        failed: Callable[[Job, FleetError], Awaitable[None]],
        chunk: Callable[[Job, bytes], None] | None = None,
    ) -> None:
        self._finish, self._failed, self._chunk = finish, failed, chunk
        self.room = asyncio.Event()
        self.running_jobs: list[Job] = []

    def running(self, job: Job) -> None:
        self.running_jobs.append(job)

    def finish(self, job: Job) -> None:
        self._finish(job)

    def chunk(self, job: Job, body: bytes) -> None:
        if self._chunk is not None:
            self._chunk(job, body)

    async def fail(self, job: Job, err: FleetError) -> None:
        settle(job)
        await self._failed(job, err)

    async def crash(self, job: Job, err: FleetError) -> None:
        await self.fail(job, err)

    async def expire(self, job: Job) -> None:
        await self.fail(job, InternalError("expired"))

    async def relieve(self, model: str) -> bool:
        return False

    def freed(self) -> None:
        self.room.set()
