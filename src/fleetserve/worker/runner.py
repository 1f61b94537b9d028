"""One served model inside a worker: its adapter, batch former and forward thread."""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Protocol

from ..catalog import ModelSpec, Profile
from ..families import FamilyAdapter, family_tasks
from ..fleet.member import Footprint, Member, is_oom
from ..fleet.memory import rss_bytes
from ..metrics import Metrics
from ..wire import FleetError, InternalError, Task
from .batcher import BatchFormer, Job, WorkItem
from .compute import compute_executor

FinishFn = Callable[[Job], None]  # schedules the reply; must not block
FailFn = Callable[[Job, FleetError], Awaitable[None]]
ChunkFn = Callable[[Job, bytes], None]  # schedules one chunk of a streamed reply, in order
AdapterFactory = Callable[[], FamilyAdapter]


class Verify(Protocol):
    """A check of a loaded adapter that returns the one to serve (the quality gate):
    ``prepare`` runs on the loader thread, ``judge`` on the compute thread."""

    def prepare(self) -> FamilyAdapter: ...

    def judge(self, adapter: FamilyAdapter, reference: FamilyAdapter) -> FamilyAdapter: ...


Measure = Callable[[FamilyAdapter], int]  # a loaded adapter -> its activation peak (bytes)
Relieve = Callable[[], Awaitable[bool]]  # out of memory: evict others; True if any left
UNFIT = object()  # the output of an item that runs out of memory even alone


class Former(Protocol):
    """What the worker reads of a runner's intake: its budget and what waits in it."""

    @property
    def max_batch_tokens(self) -> int: ...

    @property
    def pending_tokens(self) -> int: ...

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
    memory: dict[str, int]  # weights, resident_growth, activation_peak (last load)

    @property
    def former(self) -> Former: ...

    @property
    def adapter(self) -> FamilyAdapter: ...

    @property
    def adapter_or_none(self) -> FamilyAdapter | None: ...

    @property
    def tasks(self) -> frozenset[Task]: ...

    relieve: Relieve | None

    def submit(self, job: Job) -> None: ...

    async def run(
        self,
        finish: FinishFn,
        crash: FailFn,
        expire: FailFn,
        room: asyncio.Event,
        chunk: ChunkFn | None = None,
    ) -> None: ...

    def close(self) -> None: ...


class Loadable:
    """Loading and unloading shared by runners; the fleet manager decides when.

    ``eager`` runners (pinned, or named in ``--models``) load at start and gate
    readiness; the others load on first use. Pinned ones never leave; the others may
    be evicted and load again on their next use. A load resolves,
    fetches, converts and loads the weights on a loader thread of its own, so the
    compute thread keeps running other models' batches; only the warm-up, the quality
    gate and the activation-peak batch run on the compute thread. It measures what the
    model holds: its weights (the runtime's count, else the resident growth) plus the
    activation peak of a full batch, the profile's own figure where the tuner measured one.
    The resident growth is kept beside them (a first load's includes lazy imports).
    """

    spec: ModelSpec
    profile: Profile
    eager: bool
    loaded: bool
    _adapter: FamilyAdapter | None
    _factory: AdapterFactory
    _load_lock: asyncio.Lock | None
    _forward: ThreadPoolExecutor
    _verify: Verify | None
    _measure: Measure | None
    _estimate: Callable[[], int] | None
    _measured: Footprint | None
    relieve: Relieve | None

    def _init_loadable(
        self,
        spec: ModelSpec,
        profile: Profile,
        adapter: FamilyAdapter | AdapterFactory,
        eager: bool,
        verify: Verify | None = None,
        measure: Measure | None = None,
        estimate: Callable[[], int] | None = None,
    ) -> None:
        """``adapter`` is a loaded-on-demand adapter, or a factory that builds one.
        ``verify`` runs on the loaded adapter (on the compute thread) and returns the
        adapter to serve: a quality gate may swap in another. ``measure`` gives the
        activation peak of a full batch when the profile has no figure; ``estimate``
        the footprint before the first load (from the weights on disk)."""
        self.spec = spec
        self.profile = profile
        self._profile0 = profile
        self._measure = measure
        self._estimate = estimate
        self._measured: Footprint | None = None
        self._estimated: int | None = None
        self.ever_loaded = False
        self.memory: dict[str, int] = {}  # what the last load measured
        self.relieve = None
        if isinstance(adapter, FamilyAdapter):
            self._adapter, self._factory = adapter, lambda: adapter
        else:
            self._adapter, self._factory = None, adapter
        self.eager = eager
        self._load_lock = None
        self._verify = verify
        self._forward = compute_executor()  # shared: one OpenMP pool per process

    @property
    def adapter(self) -> FamilyAdapter:
        if self._adapter is None:
            raise RuntimeError(f"model {self.spec.id} is not loaded")
        return self._adapter

    @property
    def adapter_or_none(self) -> FamilyAdapter | None:
        return self._adapter

    @property
    def tasks(self) -> frozenset[Task]:
        """What this model serves, known before it is loaded."""
        if self._adapter is not None:
            return self._adapter.tasks
        return family_tasks(self.spec.family)

    @property
    def model_id(self) -> str:
        return self.spec.id

    @property
    def pinned(self) -> bool:
        return self.spec.pinned

    @property
    def keep_alive(self) -> float:
        return self.spec.keep_alive

    def expected(self) -> Footprint:
        """Measured at its last load; else the weights on disk and the profile's figure
        (weights plus peak, as the tuner measured them)."""
        if self._measured is not None:
            return self._measured
        if self._estimated is None:
            self._estimated = self._estimate() if self._estimate is not None else 0
        weights = self._estimated or self.profile.memory_bytes
        return Footprint(weights, max(0, self.profile.memory_bytes - weights))

    async def load(self) -> Footprint:
        """Load the model (once; concurrent callers share it); what it holds."""
        if self._load_lock is None:
            self._load_lock = asyncio.Lock()
        async with self._load_lock:
            if self.loaded and self._measured is not None:
                return self._measured
            loop = asyncio.get_running_loop()
            before = rss_bytes()
            # a thread per load: it ends with the load, and its OpenMP pool with it
            loader = ThreadPoolExecutor(1, thread_name_prefix="loader")
            try:
                adapter = self._adapter
                if adapter is None:
                    adapter = await loop.run_in_executor(loader, self._factory)
                await loop.run_in_executor(loader, adapter.load)
                grown = max(0, rss_bytes() - before)  # a first load's has lazy imports
                ref = None
                if self._verify is not None:  # the gate's fp32 reference loads here too
                    ref = await loop.run_in_executor(loader, self._verify.prepare)
            finally:
                loader.shutdown(wait=False)
            weights = adapter.memory_bytes() or grown
            await loop.run_in_executor(self._forward, adapter.warmup)
            if self._verify is not None and ref is not None:
                served = await loop.run_in_executor(self._forward, self._verify.judge, adapter, ref)
                del ref
                if served is not adapter:  # the gate swapped in its fp32 reference
                    rt = served.runtime
                    self.profile = replace(self.profile, runtime=rt.name, precision=rt.precision)
                    weights = served.memory_bytes() or weights
                adapter = served
            if self.profile.memory_bytes:  # the tuner measured weights plus peak
                peak = max(0, self.profile.memory_bytes - weights)
            elif self._measure is not None:
                peak = await loop.run_in_executor(self._forward, self._measure, adapter)
            else:
                peak = 0
            held = Footprint(weights, peak)
            self.memory = {"weights": weights, "resident_growth": grown, "activation_peak": peak}
            self._adapter = adapter
            self._measured = held
            self.loaded = self.ever_loaded = True
            return held

    def unload(self) -> None:
        """Drop the adapter (the fleet frees the memory after): it loads again on use."""
        self._adapter = None
        self.loaded = False
        self.profile = self._profile0


class ModelRunner(Loadable):
    """Runs the batch loop for one model: take a batch, forward it, route the rows."""

    def __init__(
        self,
        spec: ModelSpec,
        profile: Profile,
        adapter: FamilyAdapter | AdapterFactory,
        metrics: Metrics,
        max_batch_tokens: int = 0,
        *,
        eager: bool = True,
        verify: Verify | None = None,
        measure: Measure | None = None,
        estimate: Callable[[], int] | None = None,
    ) -> None:
        self._init_loadable(spec, profile, adapter, eager, verify, measure, estimate)
        self.metrics = metrics
        self.former = BatchFormer(
            max_batch_tokens or profile.max_batch_tokens, profile.max_batch_size
        )
        self._wake = asyncio.Event()
        self.loaded = False
        self.busy_s = 0.0  # seconds the forward thread spent in forward passes

    def submit(self, job: Job) -> None:
        self.former.add(job)
        self._wake.set()

    async def run(
        self,
        finish: FinishFn,
        crash: FailFn,
        expire: FailFn,
        room: asyncio.Event,
        chunk: ChunkFn | None = None,
    ) -> None:
        """The batch loop; returns only by cancellation, raises if a stage breaks.

        ``room`` is set whenever a batch leaves the former, so that the pull loop
        tops it up while this batch runs and the forward thread never waits on intake.
        A batch whose forward pass raises goes to ``crash``, job by job.
        """
        model = self.spec.id
        while True:
            batch = self.former.take()
            room.set()
            if not batch:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = await self._skip_expired(batch, expire)
            if not batch:
                continue
            t0 = time.perf_counter()
            try:
                out = await self._forward_fitting([it.item for it in batch])
            except Exception as exc:  # a model failure fails this batch's requests only
                await self._crash_all([it.job for it in batch], exc, crash)
                continue
            unfit = [it.job for it, row in zip(batch, out, strict=True) if row is UNFIT]
            if unfit:  # items that do not fit even alone fail their own requests only
                oom = MemoryError("out of memory: one item does not fit even in a batch alone")
                await self._crash_all(unfit, oom, crash)
            dt = time.perf_counter() - t0
            self.busy_s += dt
            width = max(it.length for it in batch)
            self.metrics.batch_size.labels(model).observe(len(batch))
            self.metrics.batch_tokens.labels(model).observe(width * len(batch))
            self.metrics.batch_fill.labels(model).observe(
                width * len(batch) / self.former.max_batch_tokens
            )
            self.metrics.tokens.labels(model).inc(sum(it.length for it in batch))
            self._route(batch, out, dt, finish)

    @staticmethod
    async def _crash_all(jobs: list[Job], exc: BaseException, crash: FailFn) -> None:
        # the client sees the type only; the dead-letter reason keeps the text
        err = InternalError(f"inference failed: {type(exc).__name__}")
        for job in {id(j): j for j in jobs}.values():
            job.reason = f"inference failed: {type(exc).__name__}: {exc}"[:300]
            await crash(job, err)

    async def _forward_fitting(self, items: list[Any], retried: bool = False) -> Sequence[Any]:
        """Forward ``items``; out of memory, evict other models and retry once, then
        run the batch in halves. An item that does not fit even alone comes back as
        ``UNFIT``, so that only its request fails."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._forward, self.adapter.forward, items)
        except Exception as exc:
            if not is_oom(exc):
                raise
            traceback.clear_frames(exc.__traceback__)  # let go of the failed try's tensors
        if not retried and self.relieve is not None and await self.relieve():
            return await self._forward_fitting(items, retried=True)
        if len(items) == 1:
            return [UNFIT]
        half = len(items) // 2
        self.metrics.retries.labels(self.spec.id).inc()
        first = await self._forward_fitting(items[:half], retried=True)
        return [*first, *await self._forward_fitting(items[half:], retried=True)]

    def _route(
        self, batch: list[WorkItem], out: Sequence[Any], dt: float, finish: FinishFn
    ) -> None:
        seen: set[int] = set()
        for it, row in zip(batch, out, strict=True):
            job = it.job
            if job.failed or row is UNFIT:
                continue
            if id(job) not in seen:
                seen.add(id(job))
                job.infer_s += dt
            if job.outputs is None:
                job.outputs = [None] * len(job.prepared.items)
            job.outputs[it.index] = row
            job.remaining -= 1
            if job.remaining == 0:
                finish(job)

    async def _skip_expired(self, batch: list[WorkItem], expire: FailFn) -> list[WorkItem]:
        keep = []
        for it in batch:
            if it.job.failed:
                continue
            if it.job.expired:
                await expire(it.job, InternalError("expired"))
                continue
            keep.append(it)
        return keep

    def close(self) -> None:
        """Nothing to release: the compute thread is shared and outlives runners."""
