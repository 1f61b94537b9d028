"""The worker: pull within a cost budget, preprocess, batch, forward, reply, then ack.

Stages run as tasks in one TaskGroup. A stage that crashes fails the worker: every
request it holds gets a retryable 503 at once, what is still queued for its models
is answered the same way, and ``ready`` turns false so ``/readyz`` reports 503.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..fleet.manager import Fleet
from ..fleet.policy import GDSF
from ..metrics import Metrics
from ..queue import Consumer, Message, Publisher
from ..tracing import NULL_TRACER, Tracer
from ..wire import (
    Envelope,
    FleetError,
    InternalError,
    InvalidInput,
    ModelNotFound,
    Task,
    Unavailable,
)
from .adapter_wait import submit_when_hot
from .affinity import Affinity
from .batcher import Job
from .cancel import Canceller
from .ledger import Ledger
from .parts import Parts, outputs_body, plan, prepared_of
from .records import Record
from .retire import drained, removed
from .runner import Runner

log = logging.getLogger("fleetserve.worker")

# Small requests are pre- and postprocessed on the event loop: a thread hop costs
# more than tokenizing a sentence or encoding a few vectors.
INLINE_BODY_BYTES = 2048
INLINE_OUTPUT_VALUES = 4096
UNBOUNDED = 1 << 62  # a fleet with no memory budget
FULL_POLL = 0.02  # seconds between pulls for interactive work while the formers are full


class Worker:
    def __init__(
        self,
        queue: Consumer,
        runners: Mapping[str, Runner],
        metrics: Metrics,
        *,
        publisher: Publisher | None = None,
        pull_timeout: float = 0.25,
        max_deliver: int = 1,
        keepalive: float | None = None,
        shared_queue: bool = False,
        fleet: Fleet | None = None,
        affinity: Affinity | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.queue = queue
        self.runners = dict(runners)
        self.metrics = metrics
        if fleet is None:  # no budget given: every model may stay (tests, the tuner)
            fleet = Fleet(UNBOUNDED, GDSF(), metrics=metrics)
            for r in self.runners.values():
                fleet.add(r)
        self.fleet = fleet
        self.pull_timeout = pull_timeout
        self.max_deliver = max_deliver  # 1: a failed batch is answered 500 at once
        self.keepalive = keepalive  # seconds between in-progress acks for held work
        self.shared_queue = shared_queue  # other workers pull from the same queue
        self.affinity = affinity  # a shared queue: pull for the models held here first
        self.failed: BaseException | None = None
        self.running = False
        self.started = asyncio.Event()  # set once it runs (what its starter awaits)
        # a request far larger than a batch is shared as parts through ``publisher``
        # (none: it is served whole here)
        self.publisher = publisher
        self._parts = Parts(publisher, self._spawner) if publisher is not None else None
        self.ledger = Ledger(  # every message held here, from pull to its ending
            queue,
            metrics,
            tracer or NULL_TRACER,
            fleet,
            self._parts,
            self._spawner,
            self._postprocess,
            max_deliver=max_deliver,
        )
        self._cpu = ThreadPoolExecutor(1, thread_name_prefix="worker-cpu")
        self._tg: asyncio.TaskGroup | None = None
        self._runs: dict[str, asyncio.Task[None]] = {}  # each model's batch loop
        self._retiring: set[str] = set()  # hot removes: new work is answered 404
        # work whose client went away stops wherever it is
        self.cancels = Canceller(queue, metrics, self.ledger)

    @property
    def tracer(self) -> Tracer:
        """Spans per request (``fleetserve.tracing``): its pull here, the ledger's replies."""
        return self.ledger.tracer

    @tracer.setter
    def tracer(self, tracer: Tracer) -> None:
        self.ledger.tracer = tracer

    @property
    def pull_budget(self) -> int:
        """The largest batch budget of its models (now: a profile swap resizes one)."""
        return max((r.waiting.max_batch_tokens for r in self.runners.values()), default=1)

    @property
    def ready(self) -> bool:
        """Running, not failed, and the eager (pinned or named) models have loaded
        (the named ones may have been evicted since: they load again on use)."""
        return (
            self.running
            and self.failed is None
            and all(r.ever_loaded for r in self.runners.values() if r.eager)
        )

    @property
    def idle(self) -> bool:
        """Nothing waits in any model's batch former and no load is under way."""
        return self.ledger.idle and self._pending_tokens() == 0

    async def run(self) -> None:
        """Run the stages until cancelled. A crashed stage is logged and fails the worker."""
        unlisten = self.queue.on_cancel(self.cancels.heard)  # clients that went away
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                self.running = True
                self.started.set()
                self.metrics.worker_up.set(1)
                for m, r in self.runners.items():
                    self._runs[m] = tg.create_task(r.run(self.ledger))
                tg.create_task(self._pull_loop())
                if self.keepalive:
                    tg.create_task(self.ledger.keepalive(self.keepalive))
        except Exception as exc:  # TaskGroup wraps stage crashes in an ExceptionGroup
            self.failed = exc
            log.error("worker stage crashed; failing the worker", exc_info=exc)
            for r in self.runners.values():
                r.waiting.drain()
            err = Unavailable("the worker failed; retry later", retry_after=1.0)
            await self.ledger.give_back(err, list(self.runners), self.shared_queue)
        finally:
            unlisten()
            self.running = False
            self.metrics.worker_up.set(0)

    # -- intake -----------------------------------------------------------------
    def _pending_tokens(self) -> int:
        """Tokens waiting here: in the batch formers, and in requests whose model loads."""
        return self.ledger.waiting_tokens() + sum(
            r.waiting.pending_tokens for r in self.runners.values()
        )

    async def _pull_loop(self) -> None:
        """Pull while the batch formers have room (up to two budgets). When they are
        full, only interactive work comes in (it goes first), polled every
        ``FULL_POLL`` seconds until room frees up: a query never waits in the queue
        behind the bulk work this worker already holds."""
        while True:
            models = list(self.runners)  # hot adds and removes change them
            high_water = 2 * self.pull_budget
            for m in models:
                self.metrics.queue_depth.labels(m).set(self.queue.depth(m))
            pending = self._pending_tokens()
            full = pending >= high_water
            room = high_water - pending
            wait = self.pull_timeout
            if full:  # interactive work only, up to one budget of it waiting here
                self.ledger.room.clear()
                room = self.pull_budget - self._interactive_tokens()
                if room <= 0:
                    await self.ledger.room.wait()
                    continue
                wait = FULL_POLL
            if self.affinity is None:
                msgs = await self.queue.pull(models, room, wait, interactive_only=full)
            else:
                msgs = await self.affinity.pull(
                    self.queue, models, room, wait, lambda: self.idle, interactive_only=full
                )
            for msg in msgs:
                await self._admit(msg)

    def _interactive_tokens(self) -> int:
        return sum(r.waiting.interactive_tokens_pending for r in self.runners.values())

    async def _admit(self, msg: Message) -> None:
        env = msg.envelope
        self.tracer.pulled(env, msg.attempts)  # its wait in the queue ends here
        if await self.cancels.pulled(msg):  # its client went away while it was queued
            return
        if env.model in self._retiring:  # removed: what had not started gets a 404
            await self.ledger.answer(msg, removed(env.model))
            return
        runner = self.runners.get(env.model)
        if runner is None:
            await self.ledger.answer(
                msg, ModelNotFound(f"this worker does not serve {env.model!r}")
            )
            return
        if env.task not in runner.tasks:
            serves = ", ".join(sorted(t.value for t in runner.tasks))
            await self.ledger.answer(
                msg,
                InvalidInput(
                    f"model {env.model!r} ({runner.spec.family}) does not serve the "
                    f"{env.task.value} route; it serves: {serves}",
                    field="model",
                ),
            )
            return
        if self.fleet.try_acquire(env.model, env.keep_alive):
            await self._prepare(msg, runner)
            return
        # cold, loading or failed: the fleet loads it without holding up the pull loop
        if self._tg is None:
            raise RuntimeError("worker is not running")
        self._tg.create_task(self._admit_after_load(self.ledger.park(msg), runner))

    async def _admit_after_load(self, parked: Record, runner: Runner) -> None:
        msg = parked.msg
        env = msg.envelope
        model = env.model
        if time.time() > env.deadline:  # answered 504 already: load nothing for it
            self.ledger.unpark(parked)
            await self.ledger.drop(msg)
            return
        try:
            t0 = time.perf_counter()
            await self.fleet.acquire(
                model,
                timeout=max(0.0, env.deadline - time.time()),
                keep_alive=env.keep_alive,
                wait=not self.shared_queue,
            )
            if time.perf_counter() - t0 > 0.01 and runner.loaded:
                log.debug("%s resident after %.1fs", model, time.perf_counter() - t0)
        except FleetError as err:
            self.ledger.unpark(parked)
            failed = self.fleet.failed(model)
            held = self.affinity is not None and self.affinity.peer_holds(model)
            others = not failed or held  # someone else may serve it
            if self.shared_queue and others and msg.attempts + 1 < self.max_deliver:
                # no room here, or it failed here only: another worker takes it
                await self.ledger.put_back(msg, delay=min(err.retry_after or 1.0, 5.0))
                return
            await self.ledger.answer(msg, err)
            return
        self.ledger.unpark(parked)
        await self._prepare(msg, runner)

    async def _prepare(self, msg: Message, runner: Runner) -> None:
        """Preprocess and hand to the runner. The caller holds a use of the model: the
        job gives it back when answered, or this does if no job comes of it."""
        env = msg.envelope
        pulled_at = time.time()
        self.metrics.queue_lag.labels(env.model).set(max(pulled_at - env.enqueued_at, 0.0))
        if pulled_at > env.deadline:  # the gateway has answered 504: drop it, do not compute
            self.fleet.release(env.model)
            await self.ledger.drop(msg)
            return
        loop = asyncio.get_running_loop()
        try:
            if env.part is not None:  # prepared by the worker that holds its request
                prepared = prepared_of(msg.body)
            elif len(msg.body) <= INLINE_BODY_BYTES:
                prepared = runner.family.preprocess(env, msg.body)
            else:
                prepared = await loop.run_in_executor(
                    self._cpu, runner.family.preprocess, env, msg.body
                )
        except FleetError as err:
            self.fleet.release(env.model)
            await self.ledger.answer(msg, err)
            return
        except Exception:
            self.fleet.release(env.model)
            log.exception("preprocess failed for request %s", env.request_id)
            await self.ledger.answer(msg, InternalError("preprocessing failed"))
            return
        self.metrics.stage_latency.labels(env.model, "queue").observe(
            max(pulled_at - env.enqueued_at, 0.0)
        )
        if await self.cancels.pulled(msg):  # cancelled while its model loaded, or meanwhile
            self.fleet.release(env.model)
            return
        job = self.ledger.open(msg, prepared, pulled_at)
        ranges = plan(job, self.pull_budget) if self._may_share(env) else None
        # shared only while few others wait: behind a backlog parts would wait for it
        if (
            ranges is not None
            and self._parts is not None
            and self.queue.depth(env.model) < len(ranges)
        ):
            self.metrics.slices.labels(env.model).inc(len(ranges) - 1)
            job.spans = await self._parts.share(job, ranges, self.ledger, runner.submit)
            if job.settled:  # cancelled while its parts went out
                return
        if env.adapter is None:
            runner.submit(job)
        elif self._tg is not None:  # its adapter loads without holding up the pull loop
            self.ledger.heat(job)  # counted in the pull budget while it waits
            self._tg.create_task(submit_when_hot(runner, job, env.adapter, self.ledger))

    def _may_share(self, env: Envelope) -> bool:
        """Whether a large request may be sliced: other workers pull from this queue,
        it has a publisher for the parts, and its model runs batches (a generation is
        one sequence)."""
        return (
            self.shared_queue
            and self._parts is not None
            and env.task not in (Task.GENERATE, Task.CHAT)
        )

    # -- completion -------------------------------------------------------------
    def _spawner(self) -> Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]:
        if self._tg is None:
            raise RuntimeError("worker is not running")
        return self._tg.create_task

    async def _postprocess(self, job: Job, done: float) -> None:
        """Its reply body, from its outputs (its chunks so far are sent; ``done``: its
        last forward pass ended); the ledger answers it (held till then, so that a
        crash meanwhile still answers it)."""
        env = job.msg.envelope
        runner = self.runners[env.model]
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        if job.outputs is None:  # a job always has at least one item
            raise RuntimeError(f"job {env.request_id} finished without outputs")
        try:
            if env.part is not None:  # the raw outputs, for the worker holding its request
                body = outputs_body(job.outputs)
            elif _values(job.outputs) <= INLINE_OUTPUT_VALUES:
                body = runner.family.postprocess(env, job.prepared, job.outputs)
            else:
                body = await loop.run_in_executor(
                    self._cpu, runner.family.postprocess, env, job.prepared, job.outputs
                )
        except FleetError as err:
            await self.ledger.fail(job, err)
            return
        except Exception:
            log.exception("postprocess failed for request %s", env.request_id)
            await self.ledger.fail(job, InternalError("postprocessing failed"))
            return
        self.metrics.stage_latency.labels(env.model, "postprocess").observe(
            time.perf_counter() - t0
        )
        self.metrics.stage_latency.labels(env.model, "inference").observe(job.infer_s)
        timings = {
            "queue_ms": max(job.pulled_at - env.enqueued_at, 0.0) * 1e3,
            "inference_ms": job.infer_s * 1e3,
        }
        await self.ledger.reply(job, body, timings, done)

    # -- hot add and remove (worker/retire.py) ---------------------------------
    def add_runner(self, runner: Runner) -> None:
        """A hot add: serve ``runner``'s model from now on (the fleet holds it already)."""
        self.runners[runner.model_id] = runner
        if self._tg is not None:
            self._runs[runner.model_id] = self._tg.create_task(runner.run(self.ledger))

    async def retire(self, model: str, timeout: float) -> bool:
        """A hot remove: what is queued for ``model`` is answered 404 naming it, what
        is held finishes (``timeout``: past the longest deadline), then its batch loop
        stops and the fleet unloads it. False if the drain timed out."""
        self._retiring.add(model)  # stays so if cancelled: the model is leaving anyway
        done = await drained(self.ledger, self.queue, model, timeout)
        self._retiring.discard(model)
        if (task := self._runs.pop(model, None)) is not None:
            task.cancel()
        self.fleet.remove(model)
        self.runners.pop(model).close()
        return done

    def close(self) -> None:
        for r in self.runners.values():
            r.close()
        self._cpu.shutdown(wait=False, cancel_futures=True)


def _values(outputs: list[Any]) -> int:
    """Roughly how many numbers the outputs hold (decides inline or thread postprocess)."""
    return sum(o.size if isinstance(o, np.ndarray) else 1 for o in outputs)
