"""The generation runner: continuous batching for one causal LM inside a worker.

It has the surface of :class:`~.runner.ModelRunner`, so the worker drives it the
same way, but it batches sequences, not requests: a dedicated thread runs the
family's engine step by step, admits waiting jobs between steps (the newcomer is
prefilled, then decodes with the others), and lets finished ones leave at once.
Cancelled (a client gone: ``worker.cancel``) and expired jobs stop at the next step
and leave the cache; a long prompt is prefilled a chunk a step, so it stops between
chunks too (``families.generate.engine``). Events cross to the event loop with
``call_soon_threadsafe``: text chunks of streamed requests, finished jobs,
failures. With ``runtime: external`` the thread hands each admitted sequence to
a pool that calls ``runtime.generate`` (SGLang or vLLM batch them there).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Self

from ..catalog import ModelSpec, Profile
from ..families import AnyFamily
from ..families.generate import GenerateFamily
from ..metrics import Metrics
from ..wire import AdapterNotFound, FleetError, InternalError, Unavailable
from .admission import Event, WaitQueue, cost
from .batcher import Job
from .loadable import Estimate, FamilyFactory, Loadable, Measure, Verify
from .runner import JobSink

if TYPE_CHECKING:
    from ..families.generate.engine import Seq

log = logging.getLogger("fleetserve.worker")
IDLE_WAIT_S = 0.5  # the thread re-checks deadlines at least this often


class _Cancelled(Exception):
    """Raised from an external stream's callback to stop a cancelled sequence."""


class GenerationRunner(Loadable):
    """Continuous batching; sequences of different adapters of the model share every
    step, at most ``max_adapters`` distinct adapters at once."""

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
    ) -> None:
        super().__init__(spec, profile, adapter, eager, verify, measure, estimate)
        self.metrics = metrics
        self.max_adapters = max_adapters
        # max_batch_tokens: prompt + max_tokens summed over the running sequences
        self.waiting = WaitQueue(max_batch_tokens or profile.max_batch_tokens)
        self.max_sequences = profile.max_batch_size
        self.loaded = False
        self.busy_s = 0.0  # seconds spent in engine steps
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: asyncio.Queue[list[Event]] | None = None
        self._thread: threading.Thread | None = None
        self._signal = threading.Event()
        self._closed = False
        self._retiring: set[threading.Thread] = set()  # evicted models' old threads
        self._live: dict[int, Job] = {}  # admitted jobs, by id
        self._cost = 0  # tokens reserved by the admitted jobs
        self._lock = threading.Lock()  # _live and _cost (external mode ends jobs in a pool)
        self._marked: dict[int, str] = {}  # the adapter each running job holds in use

    def state_bytes(self, family: AnyFamily) -> int:
        """The KV cache of a full budget of running tokens (prompts and completions,
        ``max_batch_tokens``: admission holds them within it), charged while the model
        is resident (``Footprint.state``)."""
        if not isinstance(family, GenerateFamily):
            return 0
        return family.kv_cache_bytes(self.waiting.max_batch_tokens)

    @property
    def generation_family(self) -> GenerateFamily:
        """The loaded family, as the generate family (streaming, the engine)."""
        family = self.family
        if not isinstance(family, GenerateFamily):
            raise TypeError(
                f"model {self.spec.id}: the generation runner needs the generate family, "
                f"not {type(family).__name__}"
            )
        return family

    def submit(self, job: Job) -> None:
        self.waiting.add(job)
        self._start()
        self._signal.set()

    def unload(self) -> None:
        """Evicted (never while it has work): the generation thread lets go of the
        adapter and ends; the next request after the reload starts a new one."""
        super().unload()
        self._retire()

    def cannot_adopt(self) -> str:
        """Sequences share the running engine's cache: the profile changes only while
        none runs or waits to start."""
        with self._lock:
            running = bool(self._live)
        return "busy: running sequences" if running or len(self.waiting) else ""

    def adopt(self, other: Self) -> None:
        """``Loadable.adopt`` while idle (``cannot_adopt``), with ``other``'s token and
        sequence budgets; the generation thread, whose engine holds the old adapter,
        ends, and the next request starts one on the new adapter."""
        busy = self.cannot_adopt()
        if busy:
            raise RuntimeError(f"model {self.spec.id}: {busy}")
        super().adopt(other)
        self.waiting.resize(other.waiting.max_batch_tokens)
        self.max_sequences = other.max_sequences
        self._retire()

    def _retire(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._retiring.add(thread)
            self._signal.set()

    async def run(self, sink: JobSink) -> None:
        """Apply the thread's events on the event loop; returns only by cancellation."""
        self._loop = asyncio.get_running_loop()
        self._events = asyncio.Queue()
        if len(self.waiting):
            self._start()
        try:
            while True:
                for ev in await self._events.get():
                    await self._apply(ev, sink)
        finally:
            self.close()

    async def _apply(self, ev: Event, sink: JobSink) -> None:
        job = ev.job
        if ev.kind == "room":
            sink.freed()
        elif ev.kind == "fatal":
            raise RuntimeError(f"the generation thread for {self.spec.id} failed") from ev.error
        elif job is None or job.settled:
            return
        elif ev.kind == "start":
            sink.running(job)
        elif ev.kind == "text":
            adapter = self.generation_family
            if ev.text is None:
                body = adapter.stream_open(job.prepared)
            else:
                body = adapter.stream_text(job.prepared, ev.text)
            if body:
                sink.chunk(job, body)
        elif ev.kind == "done":
            from ..families.generate.chat import GenOutput

            assert ev.output is not None  # a done event carries its Generation
            job.outputs = [GenOutput(ev.output, streamed=job.prepared.options.stream)]
            job.remaining = 0
            sink.finish(job)
        elif ev.kind == "expire":
            await sink.expire(job)
        elif ev.kind == "fail" and isinstance(ev.error, FleetError):
            await sink.fail(job, ev.error)
        elif ev.kind == "crash":
            exc = ev.error
            err = exc if isinstance(exc, FleetError) else None
            job.reason = f"inference failed: {type(exc).__name__}: {exc}"[:300]
            await sink.crash(job, err or InternalError(f"inference failed: {type(exc).__name__}"))

    def _post(self, events: list[Event]) -> None:
        if events and self._loop is not None and self._events is not None:
            try:
                self._loop.call_soon_threadsafe(self._events.put_nowait, events)
            except RuntimeError:  # the loop closed under us (shutdown)
                self._closed = True

    # -- the generation thread --------------------------------------------------------------
    def _start(self) -> None:
        if self._thread is not None or self._loop is None or self._closed:
            return
        self._thread = threading.Thread(
            target=self._serve, name=f"generate-{self.spec.id}", daemon=True
        )
        self._thread.start()

    def _serve(self) -> None:
        try:
            if self.generation_family.external:
                self._serve_external()
            else:
                self._serve_local()
        except BaseException as exc:  # a bug here fails the worker, not silently
            log.exception("generation thread for %s failed", self.spec.id)
            self._post([Event("fatal", error=exc)])

    def _admit(self, on_job: Callable[[Job], object]) -> None:
        """Start waiting jobs while sequences and token budget allow (oldest first)."""
        while len(self._live) < self.max_sequences:
            job = self.waiting.pop_if(self._fits)
            if job is None:
                return
            events = [Event("room")]
            if job.expired and not job.settled:
                events.append(Event("expire", job))
            if job.settled or job.expired:
                self._post(events)
                continue
            with self._lock:
                self._live[id(job)] = job
                self._cost += cost(job)
            events.append(Event("start", job))
            if job.prepared.options.stream:
                events.append(Event("text", job))  # the stream's opening event
            self._post(events)  # before on_job: an external sequence may stream at once
            try:
                on_job(job)
            except FleetError as exc:  # its adapter was deleted: this request only
                self._leave(job)
                self._post([Event("fail", job, error=exc)])
            except Exception as exc:  # e.g. a grammar that fails to load
                self._leave(job)
                self._post([Event("crash", job, error=exc)])

    def _fits(self, job: Job) -> bool:
        """Room in the token budget, and for its adapter among the running ones; none
        in a retired thread (evicted or swapped: its engine holds the old adapter), so
        that a job submitted after ``_retire`` starts on the thread that replaces it."""
        if threading.current_thread() in self._retiring:
            return False
        with self._lock:
            if not self._live:
                return True
            key = job.msg.envelope.adapter
            if key is not None:
                running = {j.msg.envelope.adapter for j in self._live.values()} - {None}
                if key not in running and len(running) >= self.max_adapters:
                    return False
            return self._cost + cost(job) <= self.waiting.max_batch_tokens

    def _leave(self, job: Job) -> None:
        with self._lock:
            if self._live.pop(id(job), None) is not None:
                self._cost -= cost(job)
            key = self._marked.pop(id(job), None)
        if key is not None:
            self.adapters.mark(key, -1)

    def _serve_local(self) -> None:
        adapter = self.generation_family
        engine = adapter.engine()
        seqs: dict[int, Seq] = {}

        def start(job: Job) -> None:
            seq = adapter.sequence(job.prepared.items[0], tag=job)
            key = job.msg.envelope.adapter
            if key is not None:
                if not self.adapters.alive(key):
                    raise AdapterNotFound(f"adapter {key!r} was deleted", field="adapter")
                self.adapters.mark(key, +1)  # in use while the sequence runs (released in _leave)
                self._marked[id(job)] = key
                if not self.adapters.hot(key):  # it left memory while the job waited to start
                    raise Unavailable(
                        f"adapter {key!r} left memory before its sequence started; retry",
                        retry_after=1.0,
                    )
            seq.adapter = key
            seqs[id(job)] = seq
            engine.add(seq)

        model = self.spec.id
        me = threading.current_thread()
        while not self._closed and me not in self._retiring:
            self._signal.clear()
            self._admit(start)
            events: list[Event] = []
            for job in list(self._live.values()):
                if job.settled or job.expired:
                    seqs.pop(id(job)).cancelled = True
                    self._leave(job)
                    if not job.settled:
                        events.append(Event("expire", job))
            if engine.idle:
                self._post(events)
                self._signal.wait(IDLE_WAIT_S)
                continue
            # the rows this step runs: the cancelled leave at its start, unrun
            live = (*engine.running, *engine.prefilling, *engine.waiting)
            width = sum(not s.done for s in live)
            t0 = time.perf_counter()
            try:
                changed = self._forward.submit(engine.step).result()
            except Exception as exc:
                log.exception("generation step failed for %s", model)
                engine.reset()
                # every admitted job, not only what the engine still lists: a step that
                # raises mid-prefill holds the newcomers in its own locals
                for job in list(self._live.values()):
                    seqs.pop(id(job), None)
                    self._leave(job)
                    events.append(Event("crash", job, error=exc))
                self._post(events)
                continue
            dt = time.perf_counter() - t0
            self.busy_s += dt
            if width:  # a step that only let cancelled sequences go ran no batch
                self.metrics.batch_size.labels(model).observe(width)
            for job in self._live.values():
                job.infer_s += dt
            for s in changed:
                job = s.tag
                if s.delta and job.prepared.options.stream:
                    events.append(Event("text", job, text=s.delta))
                if s.finish_reason is not None:
                    self.metrics.tokens.labels(model).inc(len(s.prompt) + len(s.out))
                    seqs.pop(id(job), None)
                    self._leave(job)
                    events.append(Event("done", job, output=adapter.generation(s)))
            self._post(events)

    def _serve_external(self) -> None:
        pool = ThreadPoolExecutor(self.max_sequences, thread_name_prefix=f"external-{self.spec.id}")
        try:
            me = threading.current_thread()
            while not self._closed and me not in self._retiring:
                self._signal.clear()
                self._admit(lambda job: pool.submit(self._external_one, job))
                self._signal.wait(IDLE_WAIT_S)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _external_one(self, job: Job) -> None:
        item = job.prepared.items[0]
        stream = job.prepared.options.stream

        def on_text(text: str) -> None:
            if job.settled or job.expired or self._closed:
                raise _Cancelled
            self._post([Event("text", job, text=text)])

        t0 = time.perf_counter()
        try:
            runtime = self.generation_family.external_runtime
            gen = runtime.generate(item.prompt, item.params, on_text if stream else None)
            event = Event("done", job, output=gen)
        except _Cancelled:
            event = Event("expire", job) if not job.settled else Event("room")
        except Exception as exc:
            event = Event("crash", job, error=exc)
        dt = time.perf_counter() - t0
        job.infer_s += dt
        self._leave(job)
        self._post([event, Event("room")])
        self._signal.set()

    def close(self) -> None:
        """Stop the engine loop; the compute thread is shared and outlives runners."""
        self._closed = True
        self._signal.set()
