"""Cancelled work in a worker: wherever it is, it stops and is settled for good.

A gateway whose client hung up (or whose deadline passed) calls ``Publisher.cancel``;
the worker hears of it through ``Consumer.on_cancel`` (:meth:`Canceller.heard`) and
stops the request, and its slices (``Envelope.part.parent``), wherever they are:

- not pulled yet: the id is kept (:class:`CancelSet`, until the request's deadline,
  bounded), and the message is terminated when it is pulled (``where="queued"``; so
  are messages a queue removed at once, ``Cancel.dropped``);
- parked for its model's load: terminated now, the load goes on (``loading``);
- waiting for its adapter, in a batch former or a batch not yet run: the job is
  settled (``Ledger.cancel``), so the runner drops its items (``loading``, ``batched``);
- in a forward pass or generating: the job is settled, so a batch's rows are dropped
  when it ends, and a sequence stops at the engine's next step, between prefill
  chunks too, and frees its cache (``running``, ``generating``).

The message is terminated (never redelivered) with no reply: nobody waits for one.
Each is counted in ``fleetserve_cancelled{model, where}``, or, when the cancel came
at the request's deadline, in ``fleetserve_expired`` with the rest of expired work.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from ..metrics import Metrics
from ..queue import Consumer, Message
from ..queue.cancels import Cancel
from ..wire import Envelope, Task
from .batcher import Job
from .ledger import Ledger
from .records import State

log = logging.getLogger("fleetserve.worker")
SKEW = 30.0  # seconds a cancel is kept past its deadline (clocks of machines differ)
GENERATION = frozenset({Task.CHAT, Task.GENERATE})


class CancelSet:
    """Request ids cancelled recently, each kept until its deadline (plus ``SKEW``);
    at most ``cap`` of them, the oldest leaving first. A cancel stops only what was
    published before it was heard: a client that retries with the same
    ``X-Request-Id`` after hanging up is served."""

    def __init__(self, cap: int = 16384, clock: Callable[[], float] = time.time) -> None:
        self.cap = cap
        self._clock = clock
        self._until: OrderedDict[str, float] = OrderedDict()  # in the order they came
        self._at: dict[str, float] = {}  # when each was heard
        self._expiry: list[tuple[float, str]] = []  # a heap: the first to expire on top

    def __len__(self) -> int:
        return len(self._until)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._until

    def add(self, request_id: str, until: float) -> None:
        until += SKEW
        self._until[request_id] = until
        self._at[request_id] = self._clock()
        self._until.move_to_end(request_id)
        heapq.heappush(self._expiry, (until, request_id))
        while len(self._until) > self.cap:
            self._at.pop(self._until.popitem(last=False)[0], None)
        now = self._clock()
        while self._expiry and self._expiry[0][0] < now:
            when, rid = heapq.heappop(self._expiry)
            if self._until.get(rid) == when:
                del self._until[rid]
                self._at.pop(rid, None)
        if len(self._expiry) > 2 * self.cap:  # ids that left by the cap: rebuild
            self._expiry = [(u, r) for r, u in self._until.items()]
            heapq.heapify(self._expiry)

    def hit(self, envelope: Envelope) -> bool:
        """Whether the request, or the request it is a slice of, was cancelled (after
        it was published)."""
        part = envelope.part
        rid = part.parent if part is not None and part.parent in self else envelope.request_id
        at = self._at.get(rid)
        return at is not None and envelope.enqueued_at <= at


class Canceller:
    """Honours cancels in one worker: it asks the worker's ledger what a cancel
    concerns, counts it, and has the ledger settle it (``Ledger.cancel``); ``queue``
    terminates what is pulled after its cancel was heard."""

    def __init__(self, queue: Consumer, metrics: Metrics, ledger: Ledger) -> None:
        self.queue = queue
        self.metrics = metrics
        self.ids = CancelSet()
        self.ledger = ledger
        # parked messages terminated here, by id (held, so that no other takes the id)
        self._termed: dict[int, Message] = {}

    def heard(self, cancel: Cancel) -> None:
        """A cancel from the queue (a listener: never blocks)."""
        rid = cancel.request_id
        self.ids.add(rid, cancel.until)
        for model in cancel.dropped:  # removed by the queue before anyone pulled them
            self._count(model, "queued", cancel.until)
        parked, jobs = self.ledger.concerning(rid)
        if not parked and not jobs:
            return  # not here (yet): terminated if it is pulled later
        wheres = [self._where(job) for job in jobs]
        if not self.ledger.cancel(parked, jobs):
            return  # the worker stopped: what it held went back already
        for msg in (record.msg for record in parked):
            self._count(msg.envelope.model, "loading", msg.envelope.deadline)
            self._termed[id(msg)] = msg
        for job, where in zip(jobs, wheres, strict=True):
            self._count(job.msg.envelope.model, where, job.msg.envelope.deadline)
        self._forget_old()

    async def pulled(self, msg: Message) -> bool:
        """Whether ``msg`` was cancelled; if so it is terminated here (once), not run."""
        if self._termed.pop(id(msg), None) is not None:
            return True  # parked when its cancel came: terminated and counted then
        if not self.ids.hit(msg.envelope):
            return False
        self._count(msg.envelope.model, "queued", msg.envelope.deadline)
        await self.queue.term(msg)
        return True

    def _where(self, job: Job) -> str:
        if job.record.state is State.HEATING:
            return "loading"  # its adapter is on its way
        if job.infer_s > 0:  # a step or batch of it has run
            return "generating" if job.msg.envelope.task in GENERATION else "running"
        return "batched"

    def _count(self, model: str, where: str, deadline: float) -> None:
        """A cancel at the deadline (the gateway answered 504) counts as expired work,
        as the worker's own deadline checks count it; others as cancelled."""
        if time.time() >= deadline:
            self.metrics.expired.labels(model).inc()
        else:
            self.metrics.cancelled.labels(model, where).inc()
        log.debug("cancelled work for %s (%s)", model, where)

    def _forget_old(self) -> None:
        """Parked messages whose load then failed never come to ``pulled``."""
        now = time.time()
        for key, msg in list(self._termed.items()):
            if msg.envelope.deadline + SKEW < now:
                del self._termed[key]
