"""How the worker ends a request that gets no normal reply: an error answered, work
expired, cancelled or crashed, and everything a crashed worker holds given back.

``Settling`` is the part of the :class:`~fleetserve.worker.loop.Worker` that does it;
the worker provides the state it reads (declared here) and ``_done``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from ..metrics import Metrics
from ..queue import Message, WorkQueue
from ..tracing import Tracer
from ..wire import FleetError, Reply
from .batcher import Job
from .chunks import Chunks
from .runner import Runner


class Settling:
    queue: WorkQueue
    metrics: Metrics
    tracer: Tracer
    runners: Mapping[str, Runner]
    max_deliver: int
    shared_queue: bool
    _jobs: set[Job]
    _loading: dict[int, Message]
    _room: asyncio.Event
    _chunks: Chunks

    def _done(self, job: Job) -> None:
        """The job is answered (or given back): its use of the model ends."""
        raise NotImplementedError

    async def _fail(self, job: Job, err: FleetError) -> None:
        self._room.set()
        if job.failed:
            return
        job.failed = True
        self._done(job)
        await self._chunks.sent(job)
        await self._answer(job.msg, err)

    async def _expire(self, job: Job, _err: FleetError) -> None:
        self.metrics.expired.labels(job.msg.envelope.model).inc()
        self._room.set()
        if job.failed:
            return
        job.failed = True
        self._done(job)
        await self._chunks.sent(job)  # chunks still queued see job.failed and are dropped
        await self.queue.term(job.msg)

    async def _settle_cancelled(self, job: Job) -> None:
        """Its client went away (``cancels`` failed it: its items and sequence are
        dropped): its use of the model ends and it is terminated, with no reply."""
        self._room.set()
        self._done(job)
        await self._chunks.sent(job)
        await self.queue.term(job.msg)

    async def _crash(self, job: Job, err: FleetError) -> None:
        """The model raised on this job's batch: retry it (alone) or dead-letter it."""
        self._room.set()
        if job.failed:
            return
        job.failed = True
        self._done(job)
        msg = job.msg
        streamed = self._chunks.streamed(job)  # a retry would repeat the client's chunks
        await self._chunks.sent(job)
        if msg.attempts < self.max_deliver and not streamed:
            self.metrics.retries.labels(msg.envelope.model).inc()
            await self.queue.nak(msg, delay=min(0.05 * 2**msg.attempts, 2.0))
            return
        reply = Reply(content_type=msg.envelope.accept, error=err.to_body())
        await self.queue.reply(msg, reply)
        reason = job.reason or err.message
        await self.queue.dead_letter(msg, f"{reason} (attempt {msg.attempts})")

    async def _keepalive_loop(self, every: float) -> None:
        """In-progress acks, so that held work is not redelivered while it waits here."""
        while True:
            await asyncio.sleep(every)
            for msg in [*(job.msg for job in self._jobs), *self._loading.values()]:
                await self.queue.touch(msg)

    async def _answer(self, msg: Message, err: FleetError) -> None:
        """Reply with an error body, then ack: the request is finished."""
        reply = Reply(content_type=msg.envelope.accept, error=err.to_body())
        if err.retry_after is not None:
            reply.timings["retry_after"] = err.retry_after
        with self.tracer.reply(msg.envelope, error=err.code):
            await self.queue.reply(msg, reply)
        await self.queue.ack(msg)

    async def _fail_all(self, err: FleetError) -> None:
        """A crashed worker gives back what it holds. On a shared queue other workers
        take it (NAK); alone (embedded) it answers it, and what is queued, with 503."""
        for r in self.runners.values():
            r.waiting.drain()
        parked = list(self._loading.values())  # waiting for a load that will not finish
        self._loading.clear()
        if self.shared_queue:
            for job in list(self._jobs):
                job.failed = True
                self._done(job)
                await self.queue.nak(job.msg)
            for msg in parked:
                await self.queue.nak(msg)
            return
        for job in list(self._jobs):
            await self._fail(job, err)
        for msg in parked:
            await self._answer(msg, err)
        while msgs := await self.queue.pull(list(self.runners), 1 << 30, 0.0):
            for msg in msgs:
                await self._answer(msg, err)
