"""A request far larger than one batch, shared with other workers as parts.

The worker that pulled it (the holder) keeps the first slice in its batch former and
publishes the other slices (``worker.slicing``) back to the queue as new messages:
their items already prepared (``wire.items``), ``Envelope.part`` naming the parent,
their replies addressed to the holder. Any worker serves a part like any request,
except that it skips preprocessing and replies with the raw outputs. The holder fills
them into the parent's outputs and answers the client once, in order.

Nothing is lost or duplicated if a worker dies: the holder acks the parent only after
the client's reply, so a dead holder's parent is redelivered and sliced anew (the
parts it published reply to nobody); a dead part worker's part is redelivered.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from typing import Protocol

from ..families import Prepared
from ..queue import PendingReply, Publisher
from ..wire import Encoding, Envelope, FleetError, InvalidInput, Part, error_from_body, items
from .batcher import Job
from .chunks import Spawn
from .slicing import plan_slices

log = logging.getLogger("fleetserve.worker")


class PartSink(Protocol):
    """The worker's ledger, as the parts of a job report to it."""

    def finish(self, job: Job) -> None: ...

    async def fail(self, job: Job, err: FleetError) -> None: ...


def prepared_of(body: bytes) -> Prepared[object, None]:
    """A part's body: the items and their lengths, prepared by the holder."""
    try:
        data = items.unpack(body)
        rows, lengths = data["items"], [int(n) for n in data["lengths"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidInput(f"malformed part: {exc}", field="part") from None
    return Prepared(rows, None, sum(lengths), lengths)


def outputs_body(outputs: list[object]) -> bytes:
    """A part's reply: its raw outputs, in order."""
    return items.pack(outputs)


def plan(job: Job, budget: int) -> list[tuple[int, int]] | None:
    """The slices of ``job`` if it is far larger than one batch and its items can
    travel (plain data and arrays; some families' items are objects: not sliced)."""
    env = job.msg.envelope
    if env.part is not None:
        return None  # a part is never sliced again
    ranges = plan_slices(job.prepared.lengths, budget)
    if ranges is None:
        return None
    try:
        items.pack(job.prepared.items[ranges[1][0] : ranges[1][1]])
    except TypeError:
        return None
    return ranges


def part_envelope(env: Envelope, start: int, stop: int, cost: int, attempt: str) -> Envelope:
    """A part's envelope. Its id is new for each time the request is sliced
    (``attempt``): a holder that died may have published the same range, and the queue
    would drop a part with the same id as a duplicate while its reply goes to the dead."""
    return dataclasses.replace(
        env,
        request_id=f"{env.request_id}/{attempt}/{start}",
        content_type=Encoding.MSGPACK,
        accept=Encoding.MSGPACK,
        cost_hint=max(1, cost),
        enqueued_at=time.time(),
        part=Part(env.request_id, start, stop),
    )


class Parts:
    """The parts in flight, per parent job, and the tasks that wait for them."""

    def __init__(self, queue: Publisher, spawn: Callable[[], Spawn]) -> None:
        self.queue = queue
        self._spawn = spawn
        self._tasks: dict[int, list[asyncio.Task[None]]] = {}

    async def share(
        self,
        job: Job,
        ranges: list[tuple[int, int]],
        sink: PartSink,
        submit: Callable[[Job], None],
    ) -> list[tuple[int, int]]:
        """Publish ``ranges[1:]`` as parts; returns the ranges served here: the first,
        and from a part the queue refused (it is full) on, the rest as well. A part
        that comes back with a retryable error (no room over there) is served here
        with ``submit``."""
        env = job.msg.envelope
        p = job.prepared
        tasks: list[asyncio.Task[None]] = []
        attempt = uuid.uuid4().hex[:8]
        for start, stop in ranges[1:]:
            if job.settled:  # cancelled meanwhile: publish no more
                break
            try:
                body = items.pack({"items": p.items[start:stop], "lengths": p.lengths[start:stop]})
                part = part_envelope(env, start, stop, sum(p.lengths[start:stop]), attempt)
                pending = await self.queue.publish(part, body)
            except (FleetError, TypeError) as exc:  # full, or its items cannot travel
                log.info("serving the rest of %s here: %s", env.request_id, exc)
                return [ranges[0], (start, ranges[-1][1])]
            gather = self._gather(job, pending, (start, stop), sink, submit)
            tasks.append(self._spawn()(gather))
        if tasks and not job.settled:
            self._tasks[id(job)] = tasks
        else:
            for t in tasks:
                t.cancel()
        return [ranges[0]]

    async def _gather(
        self,
        job: Job,
        pending: PendingReply,
        span: tuple[int, int],
        sink: PartSink,
        submit: Callable[[Job], None],
    ) -> None:
        start, stop = span
        try:
            reply = await pending.wait(max(0.0, job.msg.envelope.deadline - time.time()))
            if reply.error is not None:
                raise error_from_body(reply.error, retry_after=reply.timings.get("retry_after"))
            try:
                rows = items.unpack(reply.body)
            except ValueError as exc:
                raise InvalidInput(f"malformed reply to a part: {exc}") from None
            if not isinstance(rows, list) or len(rows) != stop - start:
                raise InvalidInput("a part's reply has the wrong number of outputs")
        except FleetError as err:
            if job.settled:
                return
            if err.retry_after is not None and job.msg.envelope.adapter is None:
                log.info("serving part %s of %s here: %s", span, job.msg.envelope.request_id, err)
                job.spans = [span]
                submit(job)
                return
            await sink.fail(job, err)
            return
        finally:
            pending.cancel()
        if job.settled:
            return
        if job.outputs is None:
            job.outputs = [None] * len(job.prepared.items)
        job.outputs[start:stop] = rows
        job.infer_s += reply.timings.get("inference_ms", 0.0) / 1e3
        job.remaining -= stop - start
        if job.remaining == 0:
            sink.finish(job)

    def forget(self, job: Job) -> None:
        """The job is answered or failed: stop waiting for its parts."""
        for t in self._tasks.pop(id(job), []):
            if t is not asyncio.current_task():
                t.cancel()
