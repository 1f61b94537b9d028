"""One served model inside a worker: its family, batch former and forward thread."""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Sequence
from typing import Any, Protocol, Self

from ..catalog import ModelSpec, Profile
from ..families import AnyFamily
from ..fleet.member import Member, is_oom
from ..metrics import Metrics
from ..wire import AdapterNotFound, FleetError, InternalError, Task
from .adapter_wait import as_fleet_error
from .batcher import BatchFormer, Job, WorkItem
from .loadable import Estimate, FamilyFactory, Loadable, Measure, Verify
from .lora_hosting import AdapterHosting

__all__ = ["FamilyFactory", "JobSink", "Loadable", "Measure", "ModelRunner", "Runner", "Verify"]

UNFIT = object()  # the output of an item that runs out of memory even alone


class JobSink(Protocol):
    """Where a runner reports on its jobs (the worker's ledger, ``worker.ledger``):
    the calls that do not block are made on the event loop, between its awaits."""

    def running(self, job: Job) -> None:
        """A forward pass (or the sequence) of ``job`` starts."""
        ...

    def finish(self, job: Job) -> None:
        """All its outputs are in: schedules the reply; must not block."""
        ...

    def chunk(self, job: Job, body: bytes) -> None:
        """Schedules one chunk of a streamed reply, in order."""
        ...

    async def fail(self, job: Job, err: FleetError) -> None:
        """Answer this request with an error (an adapter deleted while it waited)."""
        ...

    async def crash(self, job: Job, err: FleetError) -> None:
        """The model raised on it: retried or dead-lettered."""
        ...

    async def expire(self, job: Job) -> None:
        """Past its deadline: dropped with no reply."""
        ...

    async def relieve(self, model: str) -> bool:
        """Out of memory: evict other models; True if any left."""
        ...

    def freed(self) -> None:
        """Room for more work (a batch left the former, a sequence ended)."""
        ...


class Waiting(Protocol):
    """What the worker reads of a runner's intake: its budget and what waits in it."""

    @property
    def max_batch_tokens(self) -> int: ...

    @property
    def pending_tokens(self) -> int: ...

    @property
    def interactive_tokens_pending(self) -> int:
        """Tokens of interactive work waiting (bounds its intake while the former is full)."""
        ...

    def drain(self) -> list[Any]: ...

    def __len__(self) -> int: ...


class Runner(Member, Protocol):
    """One served model in a worker: a ModelRunner (batches) or a GenerationRunner
    (continuous batching). The worker drives every runner through this surface, and
    the fleet manages it as a ``Member`` (load, unload, footprint)."""

    spec: ModelSpec
    profile: Profile
    eager: bool
    loaded: bool
    ever_loaded: bool
    busy_s: float
    memory: dict[str, int]  # weights, counted, resident_growth, activation_peak, load_transient

    @property
    def waiting(self) -> Waiting: ...

    @property
    def family(self) -> AnyFamily: ...

    @property
    def family_or_none(self) -> AnyFamily | None: ...

    @property
    def tasks(self) -> frozenset[Task]: ...

    def submit(self, job: Job) -> None: ...

    def cannot_adopt(self) -> str:
        """Why the served profile cannot change now ("" when it can)."""
        ...

    def adopt(self, other: Self) -> None:
        """Serve ``other``'s profile from now on (a runner of the same kind and model)."""
        ...

    def refigure(self, other: Self) -> None:
        """Take ``other``'s profile figures, keeping the adapter that runs (the same
        engine and batch budget: the tuner kept it)."""
        ...

    @property
    def adapters(self) -> AdapterHosting:
        """Its LoRA adapters: where they come from, which are hot, where they run."""
        ...

    async def run(self, sink: JobSink) -> None: ...

    def close(self) -> None: ...


class ModelRunner(Loadable):
    """Runs the batch loop for one model: take a batch, forward it, route the rows.
    Rows of different adapters of the model share a batch (see ``worker.lora_hosting``)."""

    def __init__(
        self,
        spec: ModelSpec,
        profile: Profile,
        adapter: AnyFamily | FamilyFactory,
        metrics: Metrics,
        max_batch_tokens: int = 0,
        *,
        eager: bool = True,
        verify: Verify | None = None,
        measure: Measure | None = None,
        estimate: Estimate | None = None,
        max_adapters: int = 16,
        may_sleep: bool = False,
        interactive_tokens: int = 0,
        hold: float = 5.0,
        age_limit: float = 2.0,
    ) -> None:
        super().__init__(spec, profile, adapter, eager, verify, measure, estimate, may_sleep)
        self.metrics = metrics
        tokens = max_batch_tokens or profile.max_batch_tokens
        self.waiting = BatchFormer(
            tokens,
            profile.max_batch_size,
            max_adapters,
            interactive_tokens=min(interactive_tokens or tokens, tokens),
            hold=hold,
            age_limit=age_limit,
        )
        self._wake = asyncio.Event()
        self.loaded = False
        self.busy_s = 0.0  # seconds the forward thread spent in forward passes
        # the adapter (and adapter host) the batch in flight runs on, fixed when it
        # starts: a profile swap meanwhile never changes a batch halfway
        self._batch_on: tuple[AnyFamily, AnyFamily | None] | None = None

    def submit(self, job: Job) -> None:
        self.waiting.add(job)
        self._wake.set()

    def adopt(self, other: Self) -> None:
        """``Loadable.adopt``, and ``other``'s batch budgets from the next batch on (what
        waits in the batch former stays queued)."""
        super().adopt(other)
        f = other.waiting
        self.waiting.resize(
            f.max_batch_tokens, f.max_batch_size, interactive_tokens=f.interactive_tokens
        )

    def refigure(self, other: Self) -> None:
        """``Loadable.refigure``, and ``other``'s cap while interactive work waits."""
        super().refigure(other)
        f = other.waiting
        self.waiting.resize(
            f.max_batch_tokens, f.max_batch_size, interactive_tokens=f.interactive_tokens
        )

    async def run(self, sink: JobSink) -> None:
        """The batch loop; returns only by cancellation, raises if a stage breaks.

        ``sink.freed`` is called whenever a batch leaves the former, so that the pull
        loop tops it up while this batch runs and the forward thread never waits on
        intake. A batch whose forward pass raises goes to ``sink.crash``, job by job.
        """
        model = self.spec.id
        while True:
            batch = self.waiting.take()
            sink.freed()
            if not batch:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = await self._skip_expired(batch, sink)
            if batch and any(it.adapter for it in batch):
                batch = await self._with_adapters(batch, sink)
            if not batch:
                continue
            for it in batch:
                sink.running(it.job)
            t0 = time.perf_counter()
            try:
                # the family and adapter host as they are now, whatever swaps meanwhile
                self._batch_on = (self.family, self.adapters.host_family)
                out = await self._forward_fitting(batch, sink)
            except Exception as exc:  # a model failure fails this batch's requests only
                await self._crash_all([it.job for it in batch], exc, sink)
                continue
            finally:
                self._batch_on = None  # the old adapter of a swap or an eviction may go
                self._release_adapters(batch)
            unfit = [it.job for it, row in zip(batch, out, strict=True) if row is UNFIT]
            if unfit:  # items that do not fit even alone fail their own requests only
                oom = MemoryError("out of memory: one item does not fit even in a batch alone")
                await self._crash_all(unfit, oom, sink)
            dt = time.perf_counter() - t0
            self.busy_s += dt
            width = max(it.length for it in batch)
            self.metrics.batch_size.labels(model).observe(len(batch))
            self.metrics.batch_tokens.labels(model).observe(width * len(batch))
            self.metrics.batch_fill.labels(model).observe(
                width * len(batch) / self.waiting.max_batch_tokens
            )
            self.metrics.tokens.labels(model).inc(sum(it.length for it in batch))
            self._route(batch, out, dt, sink)

    @staticmethod
    async def _crash_all(jobs: list[Job], exc: BaseException, sink: JobSink) -> None:
        # the client sees the type only; the dead-letter reason keeps the text
        err = InternalError(f"inference failed: {type(exc).__name__}")
        for job in {id(j): j for j in jobs}.values():
            job.reason = f"inference failed: {type(exc).__name__}: {exc}"[:300]
            await sink.crash(job, err)

    async def _with_adapters(self, batch: list[WorkItem], sink: JobSink) -> list[WorkItem]:
        """Sort the batch by adapter (contiguous segments); answer 404 for adapters
        deleted since their requests came; heat any that left the hot tier."""
        keep: list[WorkItem] = []
        for it in batch:
            if it.adapter and not self.adapters.alive(it.adapter):
                if not it.job.settled:
                    await sink.fail(it.job, AdapterNotFound(
                        f"adapter {it.adapter!r} was deleted", field="adapter"
                    ))  # fmt: skip
                continue
            keep.append(it)
        keep.sort(key=lambda it: it.adapter or "")
        served = self.family_or_none
        keys = {it.adapter for it in keep if it.adapter}
        for key in keys:  # in use before any heats: heating one never evicts another
            self.adapters.mark(key, +1)
        for key in keys:
            try:
                await self.adapters.ensure_hot(key)  # hot already, unless it left since it came
            except Exception as exc:
                err = as_fleet_error(exc, key, self.spec.id)
                for it in keep:
                    if it.adapter == key and not it.job.settled:
                        await sink.fail(it.job, err)
        keep = [it for it in keep if not it.job.settled]
        for key in keys - {it.adapter for it in keep}:
            self.adapters.mark(key, -1)
        if keep and self.family_or_none is not served:  # a profile swap while they heated
            self._release_adapters(keep)
            return await self._with_adapters(keep, sink)  # hot in the new adapter host
        return keep

    def _release_adapters(self, batch: list[WorkItem]) -> None:
        for key in {it.adapter for it in batch if it.adapter}:
            self.adapters.mark(key, -1)

    def _planned(self, items: list[Any], keys: list[str | None]) -> Sequence[Any]:
        """On the compute thread: a batch with adapter rows runs on the adapters' host
        (the torch copy, where the tuned runtime takes none), others as served, both as
        they were when the batch started (``_batch_on``)."""
        served, host = self._batch_on or (self.family, self.adapters.host_family)
        if not any(keys):
            return served.forward(items)
        if host is None:
            raise RuntimeError(f"model {self.spec.id} has no adapter runtime")
        with self.adapters.plan(keys, host):
            return host.forward(items)

    async def _forward_fitting(
        self, batch: list[WorkItem], sink: JobSink, retried: bool = False
    ) -> Sequence[Any]:
        """Forward ``batch``; out of memory, evict other models and retry once, then
        run the batch in halves. An item that does not fit even alone comes back as
        ``UNFIT``, so that only its request fails."""
        loop = asyncio.get_running_loop()
        items, keys = [it.item for it in batch], [it.adapter for it in batch]
        try:
            return await loop.run_in_executor(self._forward, self._planned, items, keys)
        except Exception as exc:
            if not is_oom(exc):
                raise
            traceback.clear_frames(exc.__traceback__)  # let go of the failed try's tensors
        if not retried and await sink.relieve(self.spec.id):
            return await self._forward_fitting(batch, sink, retried=True)
        if len(batch) == 1:
            return [UNFIT]
        half = len(batch) // 2
        self.metrics.retries.labels(self.spec.id).inc()
        first = await self._forward_fitting(batch[:half], sink, retried=True)
        return [*first, *await self._forward_fitting(batch[half:], sink, retried=True)]

    def _route(self, batch: list[WorkItem], out: Sequence[Any], dt: float, sink: JobSink) -> None:
        seen: set[int] = set()
        for it, row in zip(batch, out, strict=True):
            job = it.job
            if job.settled or row is UNFIT:
                continue
            if id(job) not in seen:
                seen.add(id(job))
                job.infer_s += dt
            if job.outputs is None:
                job.outputs = [None] * len(job.prepared.items)
            job.outputs[it.index] = row
            job.remaining -= 1
            if job.remaining == 0:
                sink.finish(job)

    async def _skip_expired(self, batch: list[WorkItem], sink: JobSink) -> list[WorkItem]:
        keep = []
        for it in batch:
            if it.job.settled:
                continue
            if it.job.expired:
                await sink.expire(it.job)
                continue
            keep.append(it)
        return keep

    def close(self) -> None:
        """Nothing to release: the compute thread is shared and outlives runners."""
