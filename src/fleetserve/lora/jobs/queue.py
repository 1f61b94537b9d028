"""The queue fine-tuning jobs travel on: its protocol, and the in-memory implementation.

A message is only a reference (tenant, job id); what the job is lives in the job
store. A worker ``take``-s a :class:`Lease` on one job, calls ``progress`` at least
every ``ack_wait`` seconds while it trains, and ends the lease with ``done`` (the job
reached an end state, whichever) or ``release`` (this worker is stopping: another may
take the job at once). A lease that is neither, because its worker died, comes back
after ``ack_wait`` with ``deliveries`` one higher, and the runner resumes the job from
its last checkpoint or restarts it: nothing is lost.

The bound counts jobs waiting and jobs held (taken, not yet done), as JetStream's
``max_msgs`` does: a full queue answers ``Overloaded`` at submit.

:class:`MemoryJobQueue` is the embedded mode's queue, in one process; JetStream's is
in ``queue_js.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ...wire import Overloaded, Unavailable


@dataclass(frozen=True, slots=True)
class JobRef:
    """Which job: what travels on the queue."""

    tenant: str
    job_id: str

    def encode(self) -> bytes:
        return json.dumps({"tenant": self.tenant, "job_id": self.job_id}).encode()

    @classmethod
    def decode(cls, data: bytes) -> JobRef:
        """The reference ``encode`` wrote; ``ValueError`` for anything else."""
        try:
            obj = json.loads(data)
        except (ValueError, TypeError) as exc:  # not JSON, or not UTF-8
            raise ValueError(f"not a job reference: {exc}") from None
        if not isinstance(obj, dict) or set(obj) != {"tenant", "job_id"}:
            raise ValueError("not a job reference: want an object with tenant and job_id")
        tenant, job_id = obj["tenant"], obj["job_id"]
        if not (isinstance(tenant, str) and tenant and isinstance(job_id, str) and job_id):
            raise ValueError("not a job reference: tenant and job_id must be non-empty strings")
        return cls(tenant, job_id)


@runtime_checkable
class Lease(Protocol):
    """One delivery of a job to one worker. Settling twice is harmless: only the first
    ``done`` or ``release`` counts, and ``progress`` after either does nothing."""

    @property
    def ref(self) -> JobRef: ...

    @property
    def deliveries(self) -> int:
        """1 the first time, 2 after one redelivery, and so on."""
        ...

    async def progress(self) -> None:
        """Still working on it: push back the time after which it is redelivered."""
        ...

    async def done(self) -> None:
        """Finished, in any end state: it leaves the queue for good."""
        ...

    async def release(self) -> None:
        """Not finished here (this worker is stopping): any worker may take it at once."""
        ...


@runtime_checkable
class JobQueue(Protocol):
    async def submit(self, ref: JobRef) -> None:
        """Enqueue, at the back; raises ``Overloaded`` when the queue is full."""
        ...

    async def take(self, timeout: float) -> Lease | None:
        """The oldest waiting job (released ones first); ``None`` when nothing came
        within ``timeout`` seconds, or the queue is closed."""
        ...

    @property
    def ack_wait(self) -> float:
        """Seconds within which a holder must call ``progress`` again, at the latest."""
        ...

    async def close(self) -> None: ...


@dataclass(slots=True)
class _Entry:
    ref: JobRef
    deliveries: int = 1


class MemoryJobQueue:
    """JobQueue in one process: FIFO and bounded. Nothing dies apart from the process,
    so nothing is redelivered by time (``ack_wait`` is infinite)."""

    def __init__(self, max_queued: int = 100, *, retry_after: float = 30.0) -> None:
        if max_queued < 1:
            raise ValueError(f"max_queued must be at least 1, not {max_queued}")
        self.max_queued = max_queued
        self.retry_after = retry_after
        self._ready: deque[_Entry] = deque()
        # takers waiting while nothing is ready; each future gets one entry, or None
        self._takers: deque[asyncio.Future[_Entry | None]] = deque()
        self._held = 0
        self._closed = False

    @property
    def ack_wait(self) -> float:
        return math.inf

    async def submit(self, ref: JobRef) -> None:
        if self._closed:
            raise Unavailable("the fine-tuning queue is closed", retry_after=self.retry_after)
        if len(self._ready) + self._held >= self.max_queued:
            raise Overloaded(
                f"the fine-tuning queue is full ({self.max_queued} jobs waiting or running); "
                "retry later",
                retry_after=self.retry_after,
            )
        self._offer(_Entry(ref), front=False)

    async def take(self, timeout: float) -> Lease | None:
        if self._closed:
            return None
        if self._ready:
            self._held += 1
            return _MemoryLease(self, self._ready.popleft())
        if timeout <= 0:
            return None
        fut: asyncio.Future[_Entry | None] = asyncio.get_running_loop().create_future()
        self._takers.append(fut)
        try:
            await asyncio.wait((fut,), timeout=timeout)
        except asyncio.CancelledError:
            self._abandon(fut)
            raise
        if not fut.done():
            self._abandon(fut)
            return None
        entry = fut.result()
        return None if entry is None else _MemoryLease(self, entry)

    async def close(self) -> None:
        self._closed = True
        while self._takers:
            fut = self._takers.popleft()
            if not fut.done():
                fut.set_result(None)

    # -- internals ----------------------------------------------------------------
    def _offer(self, entry: _Entry, *, front: bool) -> None:
        """Hand ``entry`` to the first waiting taker, or keep it (at the front for a
        released job, so that it goes before those that never started)."""
        while self._takers:
            fut = self._takers.popleft()
            if not fut.done():
                self._held += 1
                fut.set_result(entry)
                return
        if front:
            self._ready.appendleft(entry)
        else:
            self._ready.append(entry)

    def _abandon(self, fut: asyncio.Future[_Entry | None]) -> None:
        """A taker gave up (timed out or was cancelled); what it was handed goes back."""
        if not fut.done():
            fut.cancel()
            with contextlib.suppress(ValueError):
                self._takers.remove(fut)
            return
        if not fut.cancelled() and (entry := fut.result()) is not None:
            self._held -= 1
            self._offer(entry, front=True)

    def _settle(self, entry: _Entry, *, back: bool) -> None:
        self._held -= 1
        if back:
            self._offer(_Entry(entry.ref, entry.deliveries + 1), front=True)


class _MemoryLease:
    __slots__ = ("_entry", "_queue", "_settled")

    def __init__(self, queue: MemoryJobQueue, entry: _Entry) -> None:
        self._queue = queue
        self._entry = entry
        self._settled = False

    @property
    def ref(self) -> JobRef:
        return self._entry.ref

    @property
    def deliveries(self) -> int:
        return self._entry.deliveries

    async def progress(self) -> None:
        return None  # nothing is redelivered by time here

    async def done(self) -> None:
        if not self._settled:
            self._settled = True
            self._queue._settle(self._entry, back=False)

    async def release(self) -> None:
        if not self._settled:
            self._settled = True
            self._queue._settle(self._entry, back=True)

    def __repr__(self) -> str:
        return f"<lease {self.ref.tenant}/{self.ref.job_id} delivery {self.deliveries}>"
