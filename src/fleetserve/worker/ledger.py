"""The worker's in-flight ledger: one record for each message the worker holds.

A message is recorded from the moment the worker keeps it (parked for its model's
load, or prepared into a :class:`~.batcher.Job`) until it is settled, and only the
ledger moves it: ``park`` / ``unpark``, ``open`` (batched), ``heat`` / ``heated``
(its LoRA adapter loads), ``running``, ``chunk`` (streaming), and one method per way
it ends: ``reply`` (answered), ``fail`` (an error answered), ``expire`` and ``cancel``
(terminated, no reply), ``crash`` (retried or dead-lettered) and ``give_back`` (the
worker failed). A settled job stops counting as a use of its model; what runners,
formers and the generation thread still hold of it is dropped (``Job.settled``).

Runners report to it through ``JobSink`` (``worker.runner``), the canceller asks it
what a cancel concerns, and the worker's pull loop reads its counts. Like the single
task that owns the queue state in text-embeddings-inference, it is the one place
that decides what a message's ending is, so each ends exactly once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from ..families import Prepared
from ..metrics import Metrics
from ..queue import Message
from ..queue.cancels import concerns
from ..tracing import Tracer
from ..wire import Encoding, FleetError, Reply
from .batcher import Job
from .chunks import Chunks, Spawn
from .parts import Parts
from .records import Record, State

Postprocess = Callable[[Job, float], Coroutine[Any, Any, None]]


class Settles(Protocol):
    """What the ledger does with the queue: every ending of a message."""

    async def pull(self, models: Sequence[str], budget: int, timeout: float) -> list[Message]: ...

    async def reply(self, msg: Message, reply: Reply) -> None: ...

    async def ack(self, msg: Message) -> None: ...

    async def nak(self, msg: Message, delay: float = 0.0) -> None: ...

    async def term(self, msg: Message) -> None: ...

    async def dead_letter(self, msg: Message, reason: str) -> None: ...

    async def touch(self, msg: Message) -> None: ...


class Uses(Protocol):
    """The fleet, as the ledger sees it: a job holds a use of its model till settled."""

    def release(self, model: str) -> None: ...

    async def relieve(self, model: str) -> bool: ...


class Ledger:
    """The in-flight work of one worker (see the module's docstring). ``spawn`` gives
    the worker's task group's ``create_task`` (``RuntimeError`` while it is not
    running); ``postprocess`` turns a finished job into its reply (then ``reply``)."""

    def __init__(
        self,
        queue: Settles,
        metrics: Metrics,
        tracer: Tracer,
        uses: Uses,
        parts: Parts | None,
        spawn: Callable[[], Spawn],
        postprocess: Postprocess,
        *,
        max_deliver: int = 1,
    ) -> None:
        self.queue = queue
        self.metrics = metrics
        self.tracer = tracer
        self.max_deliver = max_deliver
        self.room = asyncio.Event()  # set whenever held work leaves: the pull loop tops up
        self.chunks = Chunks(queue, spawn)
        self._uses = uses
        self._parts = parts
        self._spawn = spawn
        self._postprocess = postprocess
        self._parked: dict[int, Record] = {}  # by id(msg): waiting for their model's load
        self._jobs: dict[int, Job] = {}  # by id(job): prepared, till settled

    # -- what is held -------------------------------------------------------------
    @property
    def idle(self) -> bool:
        """Nothing parked for a load, nothing waiting for its adapter."""
        return not self._parked and not self._heating()

    def jobs(self) -> list[Job]:
        return list(self._jobs.values())

    def parked(self) -> list[Message]:
        return [r.msg for r in self._parked.values()]

    def holds(self, model: str) -> int:
        """How many messages for ``model`` are held here (parked or not yet settled)."""
        parked = sum(r.msg.envelope.model == model for r in self._parked.values())
        return parked + sum(j.msg.envelope.model == model for j in self._jobs.values())

    def waiting_tokens(self) -> int:
        """Tokens of what waits for a load: parked messages and jobs heating an adapter."""
        msgs = [*self.parked(), *(j.msg for j in self._heating())]
        return sum(m.envelope.cost_hint for m in msgs)

    def concerning(self, request_id: str) -> tuple[list[Record], list[Job]]:
        """What a cancel of ``request_id`` stops here: parked messages, unsettled jobs."""
        parked = [r for r in self._parked.values() if concerns(r.msg.envelope, request_id)]
        jobs = [j for j in self._jobs.values() if concerns(j.msg.envelope, request_id)]
        return parked, [j for j in jobs if not j.settled]

    def _heating(self) -> list[Job]:
        return [j for j in self._jobs.values() if j.record.state is State.HEATING]

    # -- moves before settling ---------------------------------------------------
    def park(self, msg: Message) -> Record:
        """``msg`` waits for its model's load (its tokens count in the pull budget)."""
        record = self._parked[id(msg)] = Record(msg, State.PARKED)
        return record

    def unpark(self, record: Record) -> bool:
        """It no longer waits for the load (the caller prepares or ends it); False if
        it left already (cancelled meanwhile)."""
        if self._parked.pop(id(record.msg), None) is None:
            return False
        self.room.set()
        return True

    def open(self, msg: Message, prepared: Prepared[Any, Any], pulled_at: float) -> Job:
        """A prepared request, held till settled (the caller holds a use of its model)."""
        job = Job(msg, prepared, pulled_at)
        self._jobs[id(job)] = job
        return job

    def heat(self, job: Job) -> None:
        """Its adapter loads (counted in the pull budget while it does)."""
        self._move(job, State.BATCHED, State.HEATING)

    def heated(self, job: Job) -> None:
        """Its adapter is hot (or failed): its tokens leave the count."""
        if self._move(job, State.HEATING, State.BATCHED):
            self.room.set()

    def running(self, job: Job) -> None:
        """A forward pass or a sequence of it has started."""
        self._move(job, State.BATCHED, State.RUNNING)

    def _move(self, job: Job, start: State, to: State) -> bool:
        if job.record.state is not start:
            return False
        job.record.state = to
        return True

    # -- the runners' sink --------------------------------------------------------
    def freed(self) -> None:
        """A runner has room again (a batch left its former, a sequence ended)."""
        self.room.set()

    async def relieve(self, model: str) -> bool:
        """``model`` ran out of memory: evict others; True if any left."""
        return await self._uses.relieve(model)

    def chunk(self, job: Job, body: bytes) -> None:
        """One chunk of a streamed reply, sent after the ones before it."""
        if job.record.state in (State.BATCHED, State.RUNNING):
            job.record.state = State.STREAMING
        self.chunks.schedule(job, body)

    def finish(self, job: Job) -> None:
        """All its outputs are in: postprocess and answer it (held till answered, so a
        crash meanwhile still answers it)."""
        self.room.set()
        self._spawn()(self._finished(job))

    async def _finished(self, job: Job) -> None:
        done = time.time()  # its last forward pass ended
        await self.chunks.sent(job)
        await self._postprocess(job, done)

    # -- settling: each ending is one move ---------------------------------------
    def _settle(self, job: Job) -> bool:
        """SETTLED, once: its use of the model ends. False if it was settled before."""
        if job.settled:
            return False
        job.record.state = State.SETTLED
        self._done(job)
        return True

    def _done(self, job: Job) -> None:
        if self._jobs.pop(id(job), None) is not None:
            if self._parts is not None:
                self._parts.forget(job)
            self._uses.release(job.msg.envelope.model)

    async def reply(self, job: Job, body: bytes, timings: dict[str, float], done: float) -> None:
        """Answered: the reply, then the ack (a part's raw outputs go as msgpack)."""
        if not self._settle(job):
            return  # cancelled (or failed) while it was postprocessed: settled there
        env = job.msg.envelope
        accept = Encoding.MSGPACK if env.part is not None else env.accept
        self.tracer.batch(env, job.pulled_at, done, len(job.prepared.items), job.infer_s)
        with self.tracer.reply(env, done):  # from its postprocessing to the reply sent
            await self.queue.reply(job.msg, Reply(body, accept, timings=timings))
        await self.queue.ack(job.msg)

    async def fail(self, job: Job, err: FleetError) -> None:
        """Answered with an error (this request only)."""
        self.room.set()
        if not self._settle(job):
            return
        await self.chunks.sent(job)
        await self.answer(job.msg, err)

    async def expire(self, job: Job) -> None:
        """Past its deadline (the gateway answered 504): terminated, no reply."""
        self.metrics.expired.labels(job.msg.envelope.model).inc()
        self.room.set()
        if not self._settle(job):
            return
        await self.chunks.sent(job)  # chunks still queued see it settled and are dropped
        await self.queue.term(job.msg)

    async def crash(self, job: Job, err: FleetError) -> None:
        """The model raised on its batch: retry it (alone) or dead-letter it."""
        self.room.set()
        streaming = job.record.state is State.STREAMING  # a retry would repeat its chunks
        if not self._settle(job):
            return
        msg = job.msg
        await self.chunks.sent(job)
        if msg.attempts < self.max_deliver and not streaming:
            self.metrics.retries.labels(msg.envelope.model).inc()
            await self.queue.nak(msg, delay=min(0.05 * 2**msg.attempts, 2.0))
            return
        reply = Reply(content_type=msg.envelope.accept, error=err.to_body())
        await self.queue.reply(msg, reply)
        reason = job.reason or err.message
        await self.queue.dead_letter(msg, f"{reason} (attempt {msg.attempts})")

    def cancel(self, parked: list[Record], jobs: list[Job]) -> bool:
        """Their client went away: each is terminated, with no reply (a job's items and
        sequence are dropped from now on). False if the worker stopped (what it held
        went back already)."""
        try:
            spawn = self._spawn()
        except RuntimeError:
            return False
        for record in parked:
            self.unpark(record)
            spawn(self.queue.term(record.msg))
        for job in jobs:
            if self._settle_later(job):
                spawn(self._cancelled(job))
        return True

    def _settle_later(self, job: Job) -> bool:
        """SETTLED now (formers and the generation thread drop it at once); its use of
        the model ends in ``_cancelled``, after what runs of it."""
        if job.settled:
            return False
        job.record.state = State.SETTLED
        return True

    async def _cancelled(self, job: Job) -> None:
        self.room.set()
        self._done(job)
        await self.chunks.sent(job)
        await self.queue.term(job.msg)

    async def give_back(self, err: FleetError, models: list[str], shared_queue: bool) -> None:
        """The worker failed: it gives back what it holds. On a shared queue other
        workers take it (NAK); alone (embedded) it answers it, and what is queued for
        ``models``, with ``err``."""
        parked = self.parked()  # waiting for a load that will not finish
        self._parked.clear()
        if shared_queue:
            for job in self.jobs():  # settled or not: a cancel's term may not have run
                job.record.state = State.SETTLED
                self._done(job)
                await self.queue.nak(job.msg)
            for msg in parked:
                await self.queue.nak(msg)
            return
        for job in self.jobs():
            await self.fail(job, err)
        for msg in parked:
            await self.answer(msg, err)
        while msgs := await self.queue.pull(models, 1 << 30, 0.0):
            for msg in msgs:
                await self.answer(msg, err)

    # -- messages not (or no longer) recorded ------------------------------------
    async def answer(self, msg: Message, err: FleetError) -> None:
        """Reply with an error body, then ack: the request is finished."""
        reply = Reply(content_type=msg.envelope.accept, error=err.to_body())
        if err.retry_after is not None:
            reply.timings["retry_after"] = err.retry_after
        with self.tracer.reply(msg.envelope, error=err.code):
            await self.queue.reply(msg, reply)
        await self.queue.ack(msg)

    async def drop(self, msg: Message) -> None:
        """Past its deadline before it was prepared: terminated, no reply."""
        self.metrics.expired.labels(msg.envelope.model).inc()
        await self.queue.term(msg)

    async def put_back(self, msg: Message, delay: float) -> None:
        """Another worker may serve it (no room here, or its model failed here only)."""
        await self.queue.nak(msg, delay=delay)

    async def keepalive(self, every: float) -> None:
        """In-progress acks, so that held work is not redelivered while it waits here."""
        while True:
            await asyncio.sleep(every)
            for msg in [*(job.msg for job in self.jobs()), *self.parked()]:
                await self.queue.touch(msg)
