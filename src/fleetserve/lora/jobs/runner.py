"""The trainer's side: take a job from the queue, train it in a child process, gate it,
register the adapter, and record all of it.

While a job trains, the runner tells the queue it is alive (``Lease.progress``, so
JetStream does not redeliver it), writes the feed and the newest checkpoint to the
store, and watches for a cancel. A worker that dies leaves the job unacked: after
``ack_wait`` another trainer takes it and resumes from the last checkpoint. One that
stops cleanly puts the job back at once. A job started ``max_attempts`` times fails.

With a ``TrainMemory``, the child trains within its share of the fleet's memory
budget: the runner holds that many bytes of the budget while the child runs (room made
as for a load, or waited for, and the feed says so), and the trainer fits its batches
to it (``lora/train/share.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from ...wire import Cancelled, FleetError, Principal, Scope
from ...wire.errors import brief
from ...wire.finetune import Job, JobEvent, JobStatus
from ..registry import AdapterRegistry
from ..train import CheckpointMismatch, OutOfMemory, TrainResult, TrainSpec, train_in_child
from .manager import add_event
from .queue import JobQueue, Lease
from .room import TrainMemory, held_share
from .specs import TrainBase, train_spec
from .store import JobStore

log = logging.getLogger("fleetserve.train")
TICK = 0.5  # seconds between flushes of the feed and looks at the cancel flag


Train = Callable[
    [TrainSpec, Callable[[str, dict[str, Any]], None], asyncio.Event], Awaitable[TrainResult]
]


async def _in_child(
    spec: TrainSpec, on_event: Callable[[str, dict[str, Any]], None], cancel: asyncio.Event
) -> TrainResult:
    return await train_in_child(spec, on_event, cancel)


class JobRunner:
    def __init__(
        self,
        store: JobStore,
        queue: JobQueue,
        registry: AdapterRegistry,
        base_of: Callable[[str], Awaitable[TrainBase]],
        *,
        threads: int = 1,
        max_attempts: int = 3,
        price_per_hour: float = 0.0,
        node: str = "",
        train: Train = _in_child,
        memory: TrainMemory | None = None,
        miner: str = "",
    ) -> None:
        """``miner``: the catalog's bi-encoder a reranker's job mines and retrieves
        with (``train_miner``)."""
        self.store = store
        self.queue = queue
        self.registry = registry
        self.base_of = base_of
        self.threads = threads
        self.max_attempts = max_attempts
        self.price_per_hour = price_per_hour
        self.node = node  # which worker trains, in the feed
        self._train = train
        self.memory = memory
        self.miner = miner
        self.current: str | None = None  # the job id training now

    async def run(self) -> None:
        """Take and train jobs, one at a time, until cancelled. A job that breaks the
        trainer fails alone; the loop goes on."""
        while True:
            lease = await self.queue.take(timeout=1.0)
            if lease is None:
                continue
            try:
                await self.handle(lease)
            except Exception as exc:
                log.exception("training job %s: the trainer failed", lease.ref.job_id)
                with contextlib.suppress(Exception):
                    job = await self.store.job(lease.ref.tenant, lease.ref.job_id)
                    if not job.status.finished:
                        await self._fail(job, f"internal error in the trainer: {brief(exc)}",
                                         "internal_error")  # fmt: skip
                with contextlib.suppress(Exception):
                    await lease.done()

    async def handle(self, lease: Lease) -> None:
        """One job, from its lease until it is settled; the lease is kept alive all along
        (reading the files, fetching the base, registering), not only while training."""
        keep = asyncio.ensure_future(self._keepalive(lease))
        try:
            await self._handle(lease)
        finally:
            keep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keep

    async def _keepalive(self, lease: Lease) -> None:
        beat = min(lease_interval(self.queue.ack_wait), 5.0)
        if beat == float("inf"):
            return
        while True:
            await asyncio.sleep(beat)
            with contextlib.suppress(Exception):  # at worst the job is redelivered
                await lease.progress()

    async def _handle(self, lease: Lease) -> None:
        ref = lease.ref
        try:
            job = await self.store.job(ref.tenant, ref.job_id)
        except FleetError:
            log.warning("training job %s of %s is gone; dropped", ref.job_id, ref.tenant)
            await lease.done()
            return
        if job.status.finished:
            await lease.done()
            return
        if await self.store.cancel_requested(job.tenant, job.id):
            await self._finish(job, JobStatus.CANCELLED, "cancelled before training began")
            await lease.done()
            return
        if job.attempts >= self.max_attempts:
            await self._fail(job, f"started {job.attempts} times and never finished "
                             f"(train_max_attempts is {self.max_attempts})")  # fmt: skip
            await lease.done()
            return
        token = secrets.token_hex(6)
        self.current = job.id
        try:
            await self._run(job, token)
        except asyncio.CancelledError:  # this worker stops: the job goes back, not lost
            with contextlib.suppress(Exception):
                now = await self.store.job(job.tenant, job.id)
                if now.status.finished or now.owner != token:
                    await lease.done()
                else:  # a clean stop is not a failed attempt
                    back = now.with_(status=JobStatus.QUEUED, owner=None,
                                     attempts=max(0, now.attempts - 1))  # fmt: skip
                    await self.store.put_job(back)
                    await add_event(self.store, back, "the worker stopped; job queued again",
                                    type="status")  # fmt: skip
                    await lease.release()
            raise
        finally:
            self.current = None
        await lease.done()

    async def _mine(self, job: Job, token: str) -> bool:
        """Whether this trainer still holds ``job`` (a redelivery may have passed it to
        another one, which then writes its record)."""
        try:
            return (await self.store.job(job.tenant, job.id)).owner == token
        except FleetError:
            return False

    async def _run(self, job: Job, token: str) -> None:
        resume = await self.store.checkpoint(job.tenant, job.id)
        job = job.with_(status=JobStatus.RUNNING, started_at=job.started_at or int(time.time()),
                        attempts=job.attempts + 1, owner=token)  # fmt: skip
        await self.store.put_job(job)
        again = f" (attempt {job.attempts}{', resuming from a checkpoint' if resume else ''})"
        again = again if job.attempts > 1 or resume else ""  # a retry says so, checkpoint or not
        where = f" on {self.node}" if self.node else ""
        await add_event(self.store, job, f"training started{where}{again}", type="status",
                        data={"node": self.node, "attempt": job.attempts})  # fmt: skip
        log.info("fine-tuning job %s of %s started: %s%s", job.id, job.tenant, job.model, again)
        feed = _Feed(self.store, job)
        cancel, stop = asyncio.Event(), asyncio.Event()
        watch = asyncio.ensure_future(self._watch(job, token, feed, cancel, stop))
        t0 = time.perf_counter()
        outcome: tuple[JobStatus, str, str, str | None] | None = None
        result: TrainResult | None = None
        spec: TrainSpec | None = None
        try:
            spec = await self._spec(job, resume, feed)
            if cancel.is_set():
                raise Cancelled("cancelled before training began")
            async with held_share(self.memory, job.id, spec.memory_share, feed.note, cancel):
                try:
                    result = await self._train(spec, feed.on_event, cancel)
                except CheckpointMismatch as exc:  # not this job's: train from the start
                    feed.note(f"checkpoint refused ({exc}); training from the start")
                    spec = replace(spec, resume=None)
                    result = await self._train(spec, feed.on_event, cancel)
        except Cancelled:
            outcome = (JobStatus.CANCELLED, "cancelled while training", "cancelled", None)
        except FleetError as exc:
            outcome = (JobStatus.FAILED, exc.message, exc.code, exc.field)
        except OutOfMemory as exc:  # over train_memory_limit: says so and names it
            log.warning("training job %s failed: %s", job.id, exc)
            outcome = (JobStatus.FAILED, str(exc), "out_of_memory", None)
        except Exception as exc:
            log.warning("training job %s failed: %s", job.id, exc)
            outcome = (JobStatus.FAILED, f"training failed: {brief(exc)}", "training_failed", None)
        finally:  # the watch ends its tick (no write cut in half), then the last of the feed
            stop.set()
            await asyncio.shield(watch)
            with contextlib.suppress(Exception):
                await feed.flush()
        if not await self._mine(job, token):
            log.warning("training job %s is held by another trainer now; its result here "
                        "is dropped", job.id)  # fmt: skip
            return
        if outcome is not None:
            status, message, code, field = outcome
            if status is JobStatus.CANCELLED:
                await self._finish(job, status, message)
            else:
                await self._fail(job, message, code, field)
            return
        assert result is not None and spec is not None
        await self._gate(job, spec, result, time.perf_counter() - t0)

    async def _spec(self, job: Job, resume: bytes | None, feed: _Feed) -> TrainSpec:
        return await train_spec(
            job, self.store, self.base_of, miner=self.miner, threads=self.threads,
            memory_share=self.memory.share() if self.memory else 0, resume=resume,
            note=feed.note,
        )  # fmt: skip

    async def _watch(
        self, job: Job, token: str, feed: _Feed, cancel: asyncio.Event, stop: asyncio.Event
    ) -> None:
        """While a job runs: the feed and checkpoints out, a cancel seen, and training
        stopped if another trainer took the job over (its token in the record: this one
        then writes nothing more). A store that fails a tick is tried again the next."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), TICK)
            try:
                await feed.flush()
                if await self.store.cancel_requested(job.tenant, job.id):
                    cancel.set()
                taken = (await self.store.job(job.tenant, job.id)).owner != token
                if taken and not cancel.is_set():
                    log.warning("training job %s: another trainer holds it now; stopping "
                                "here", job.id)  # fmt: skip
                if taken:
                    cancel.set()
            except Exception as exc:
                log.warning("training job %s: the store failed a tick: %s", job.id, exc)

    async def _gate(self, job: Job, spec: TrainSpec, r: TrainResult, took: float) -> None:
        gain = r.adapter.ndcg_at_10 - r.base.ndcg_at_10
        passed = gain >= job.margin
        result: dict[str, object] = {
            "base": r.base.to_dict(),
            "adapter": r.adapter.to_dict(),
            "gain": round(gain, 6),
            "relative_gain": round(gain / r.base.ndcg_at_10, 6) if r.base.ndcg_at_10 else None,
            "margin": job.margin,
            "registered": False,
            "adapter_id": None,
            "train_seconds": round(r.train_seconds, 3),
            "job_seconds": round(took, 3),
            "steps": r.steps,
            "epochs": r.epochs,
            "resumed_from_epoch": r.resumed_from_epoch,
            "pairs": {"train": len(spec.train), "validation": len(spec.validation),
                      "validation_queries": len({p.query for p in spec.validation})},
            "mined_negatives": r.mined_negatives,
            "threads": spec.threads,
            "memory": dict(r.memory),  # the child's peak growth; its share, if any
        }  # fmt: skip
        if self.price_per_hour > 0:
            result["price_per_hour"] = self.price_per_hour
            result["cost_usd"] = round(took / 3600 * self.price_per_hour, 6)
        figures = (
            f"nDCG@10 {r.base.ndcg_at_10:.3f} -> {r.adapter.ndcg_at_10:.3f} "
            f"({gain:+.3f}; the margin is {job.margin:+.3f})"
        )
        await add_event(self.store, job, figures, type="metrics", data=dict(result))
        fine_tuned = None
        if passed:
            writer = Principal(job.tenant, frozenset({Scope.ADAPTERS_WRITE}))
            try:
                info = await self.registry.create(
                    writer, job.suffix, r.config, r.weights, base=job.model
                )
            except FleetError as exc:
                await self._fail(job.with_(result=result), f"the adapter was not registered: "
                                 f"{exc.message}", exc.code, exc.field)  # fmt: skip
                return
            result["registered"], result["adapter_id"] = True, str(info.id)
            fine_tuned = f"{job.model}:{info.id}"
        done = job.with_(result=result, fine_tuned_model=fine_tuned)
        said = f"registered as {fine_tuned}" if passed else "not registered: below the margin"
        await self._finish(done, JobStatus.SUCCEEDED, f"job succeeded; the adapter is {said}")

    async def _finish(self, job: Job, status: JobStatus, message: str) -> None:
        """The last event, then the finished record: whoever sees the job finished (a
        cancel that waits for it, a client polling) finds the event that says why."""
        job = job.with_(status=status, finished_at=int(time.time()))
        level = "error" if status is JobStatus.FAILED else "info"
        await add_event(self.store, job, message, level=level, type="status")
        await self.store.put_job(job)
        with contextlib.suppress(Exception):
            await self.store.drop_leftovers(job.tenant, job.id)
        log.log(
            logging.WARNING if status is JobStatus.FAILED else logging.INFO,
            "fine-tuning job %s of %s %s: %s", job.id, job.tenant, status.value, message,
        )  # fmt: skip

    async def _fail(
        self, job: Job, message: str, code: str = "training_failed", field: str | None = None
    ) -> None:
        error = {"code": code, "message": message, "field": field, "param": field}
        await self._finish(job.with_(error=error), JobStatus.FAILED, message)


def lease_interval(ack_wait: float) -> float:
    """How often to tell the queue a job is alive: a third of its ack wait."""
    return ack_wait / 3 if ack_wait < float("inf") else float("inf")


class _Feed:
    """Training events from the child, kept here and written out each tick: progress
    as ``metrics`` events, the newest checkpoint as the job's checkpoint."""

    def __init__(self, store: JobStore, job: Job) -> None:
        self.store = store
        self.job = job
        self.pending: list[tuple[str, str, dict[str, object] | None]] = []
        self.checkpoint: bytes | None = None
        self._lock = asyncio.Lock()

    def note(self, message: str) -> None:
        self.pending.append(("message", message, None))

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "checkpoint":
            self.checkpoint = bytes(data["blob"])
            self.pending.append(("message", f"checkpoint after epoch {data['epoch']}", None))
        elif kind == "progress":
            loss = data.get("loss")
            said = f", training loss {loss:.4f}" if isinstance(loss, float) else ""
            self.pending.append(("metrics", f"step {data['step']}/{data['steps']}{said}", {
                "step": data["step"], "total_steps": data["steps"],
                "epoch": data.get("epoch"), "train_loss": loss}))  # fmt: skip
        else:
            self.pending.append(("message", str(data.get("message", kind)), None))

    async def flush(self) -> None:
        async with self._lock:
            pending, self.pending = self.pending, []
            blob, self.checkpoint = self.checkpoint, None
            if blob is not None:
                await self.store.put_checkpoint(self.job.tenant, self.job.id, blob)
            if not pending:
                return
            events = await self.store.events(self.job.tenant, self.job.id)
            seq = events[-1].seq if events else 0
            now = time.time()
            for i, (kind, message, data) in enumerate(pending, start=1):
                events.append(JobEvent(seq + i, now, message, type=kind, data=data))
            await self.store.put_events(self.job.tenant, self.job.id, events)
