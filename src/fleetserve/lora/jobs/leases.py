"""One owner per fine-tuning job among embedded servers that share an adapter store.

An embedded server queues jobs in its memory, so another server on the same cache
directory (or object store) cannot see what it holds. Each job a server holds, queued
in its memory or training, therefore has a lease in the store,
``finetune/jobs/<tenant>/<id>.lease``: the holder's token, where it runs, and when it
last renewed it. The holder renews every ``ttl / 3`` seconds. A server takes up an
unfinished job (at start, and every ``ttl`` after, for leases gone stale) only when its
lease is free: released at a clean stop, never written, or not renewed for ``ttl``
seconds because its server died. A job a live server holds is never taken twice, and
one whose server was killed is taken up within about ``ttl``.

A lease changes hands through an atomic create of ``<id>.claim-<epoch>``
(create-if-absent, which every adapter store has): of two servers that find one stale
lease, one wins the next epoch and the other leaves the job alone. The clocks of the
servers sharing a store are compared (wall time): on one host they agree.

In distributed mode none of this is needed: JetStream's own lease (``ack_wait``)
redelivers a job only when its worker has stopped telling it the job is alive.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

from ...wire import FleetError, Overloaded
from ...wire.finetune import Job, JobStatus
from .manager import add_event
from .queue import JobQueue, JobRef, Lease, MemoryJobQueue
from .store import JobStore

log = logging.getLogger("fleetserve.train")
TAKEN_UP = "no live trainer held it (its server stopped); job queued again"
_CLAIM_TRIES = 4  # epochs skipped past claims left by claimants that died mid-claim


class StoreLeases:
    """This process's leases on jobs, kept in ``store``."""

    def __init__(
        self, store: JobStore, ttl: float, *, clock: Callable[[], float] = time.time
    ) -> None:
        if not ttl > 0:
            raise ValueError(f"the lease ttl must be positive, not {ttl}")
        self.store = store
        self.ttl = ttl
        self.clock = clock
        self.token = secrets.token_hex(8)
        self.where = f"{socket.gethostname()} pid {os.getpid()}"
        self.held: dict[JobRef, int] = {}  # job -> the epoch this process won

    def fresh(self, record: dict[str, Any] | None) -> bool:
        """Whether ``record`` is a lease someone holds and renewed within ``ttl``."""
        if record is None or not record.get("owner"):
            return False
        return self.clock() - float(record.get("at", 0)) < self.ttl

    def holds(self, ref: JobRef) -> bool:
        return ref in self.held

    async def claim(self, ref: JobRef) -> bool:
        """Take the lease on ``ref`` unless a live holder has it: True if it is ours."""
        if ref in self.held:
            return True
        record = await self.store.lease(ref.tenant, ref.job_id)
        if self.fresh(record):
            return False
        epoch = int(record["epoch"]) + 1 if record else 1
        for _ in range(_CLAIM_TRIES):
            mine = self._record(epoch)
            if await self.store.claim_lease(ref.tenant, ref.job_id, epoch, mine):
                break
            other = await self.store.claim(ref.tenant, ref.job_id, epoch)
            if other is None or self.fresh(other):
                return False  # another server is claiming it now
            epoch += 1  # a claim whose claimant died before it wrote the lease
        else:
            return False
        await self.store.put_lease(ref.tenant, ref.job_id, mine)
        self.held[ref] = epoch
        return True

    async def renew(self) -> list[JobRef]:
        """Renew every lease held; the jobs lost to another server (this one went
        ``ttl`` without renewing) are returned and no longer held."""
        lost = []
        for ref, epoch in list(self.held.items()):
            record = await self.store.lease(ref.tenant, ref.job_id)
            if record is None or record.get("owner") != self.token or record["epoch"] != epoch:
                self.held.pop(ref, None)
                lost.append(ref)
                continue
            await self.store.put_lease(ref.tenant, ref.job_id, self._record(epoch))
        for ref in lost:
            log.warning("fine-tuning job %s: another server holds its lease now", ref.job_id)
        return lost

    async def drop(self, ref: JobRef) -> None:
        """The job is settled (an end state): its lease and claims go."""
        epoch = self.held.pop(ref, None)
        if epoch is None:
            return
        record = await self.store.lease(ref.tenant, ref.job_id)
        if record is None or record.get("owner") == self.token:  # not another's since
            await self.store.drop_lease(ref.tenant, ref.job_id, range(1, epoch + 1))

    async def release_all(self) -> None:
        """This process stops: what it holds is free for the next server at once."""
        for ref, epoch in list(self.held.items()):
            free = {**self._record(epoch), "owner": None}
            try:
                await self.store.put_lease(ref.tenant, ref.job_id, free)
            except Exception as exc:  # it goes stale after ttl instead
                log.warning("fine-tuning job %s: lease not released: %s", ref.job_id, exc)
        self.held.clear()

    def _record(self, epoch: int) -> dict[str, object]:
        return {"owner": self.token, "at": self.clock(), "epoch": epoch, "where": self.where}


class LeasedJobQueue:
    """The embedded server's :class:`JobQueue`: a memory queue whose every job holds a
    lease in the store while this process has it, queued or training."""

    def __init__(self, inner: MemoryJobQueue, leases: StoreLeases) -> None:
        self.inner = inner
        self.leases = leases

    @property
    def ack_wait(self) -> float:
        return self.inner.ack_wait

    async def submit(self, ref: JobRef) -> None:
        if not await self.leases.claim(ref):
            return  # another live server took it up first: it is queued there
        try:
            await self.inner.submit(ref)
        except FleetError:
            await self.leases.drop(ref)
            raise

    async def take(self, timeout: float) -> Lease | None:
        deadline = time.monotonic() + timeout
        while True:
            lease = await self.inner.take(max(0.0, deadline - time.monotonic()))
            if lease is None:
                return None
            if self.leases.holds(lease.ref):
                return _StoreLease(lease, self.leases)
            await lease.done()  # lost to another server while it waited here
            if time.monotonic() >= deadline:
                return None

    async def close(self) -> None:
        await self.inner.close()
        await self.leases.release_all()

    async def take_up(self, jobs: list[Job], message: str = TAKEN_UP) -> int:
        """Queue here those of ``jobs`` that are unfinished and whose lease is free."""
        count = 0
        for job in jobs:
            ref = JobRef(job.tenant, job.id)
            if job.status.finished or self.leases.holds(ref):
                continue
            if not await self.leases.claim(ref):
                continue  # a live server holds it
            try:
                job = await self.leases.store.job(job.tenant, job.id)  # as it is now
            except FleetError:
                job = job.with_(status=JobStatus.CANCELLED)  # gone since the listing
            if job.status.finished:
                await self.leases.drop(ref)
                continue
            if await requeue(self.leases.store, self.inner, job, message):
                count += 1
            else:
                await self.leases.drop(ref)
        return count

    async def keep(self) -> None:
        """Renew this process's leases every ``ttl / 3`` seconds and, every ``ttl``,
        take up the jobs whose lease went stale (their server died); until cancelled."""
        ttl = self.leases.ttl
        swept = time.monotonic()
        while True:
            await asyncio.sleep(ttl / 3)
            try:
                await self.leases.renew()
                if time.monotonic() - swept >= ttl:
                    swept = time.monotonic()
                    if n := await self.take_up(await self._stale()):
                        log.info("fine-tuning: %d job(s) of a stopped server queued here", n)
            except Exception as exc:  # the store failed this round: the next tries again
                log.warning("fine-tuning leases: %s", exc)

    async def _stale(self) -> list[Job]:
        out = []
        store = self.leases.store
        for tenant, job_id in await store.leased():
            ref = JobRef(tenant, job_id)
            if self.leases.holds(ref) or self.leases.fresh(await store.lease(tenant, job_id)):
                continue
            try:
                out.append(await store.job(tenant, job_id))
            except FleetError:
                continue
        return out


class _StoreLease:
    """A memory lease that gives up the job's store lease once settled ``done``."""

    __slots__ = ("_inner", "_leases")

    def __init__(self, inner: Lease, leases: StoreLeases) -> None:
        self._inner = inner
        self._leases = leases

    @property
    def ref(self) -> JobRef:
        return self._inner.ref

    @property
    def deliveries(self) -> int:
        return self._inner.deliveries

    async def progress(self) -> None:
        await self._inner.progress()  # the store lease is renewed by LeasedJobQueue.keep

    async def done(self) -> None:
        await self._inner.done()
        await self._leases.drop(self.ref)

    async def release(self) -> None:
        await self._inner.release()  # back on this process's queue: still held here


async def requeue(store: JobStore, queue: JobQueue, job: Job, message: str) -> bool:
    """Put unfinished ``job`` on ``queue``, saying so in its feed if it had started;
    a full queue fails it (and says so). True if it was queued."""
    if job.status is not JobStatus.QUEUED:
        job = job.with_(status=JobStatus.QUEUED)
        await store.put_job(job)
        await add_event(store, job, message, type="status")
    try:
        await queue.submit(JobRef(job.tenant, job.id))
    except Overloaded as exc:  # more left over than the queue now holds
        error = {"code": exc.code, "message": exc.message, "field": None, "param": None}
        failed = job.with_(status=JobStatus.FAILED, error=error)
        await add_event(store, failed, exc.message, level="error", type="status")
        await store.put_job(failed)  # (after its event, as the runner's _finish)
        return False
    return True
