"""``fleetserve worker``: models and a Worker, pulling from NATS JetStream.

It loads its models, sizes each consumer's ``ack_wait`` from the model's profile,
connects (retrying with backoff), then runs the worker, a heartbeat that tells
gateways which models it holds, a metrics refresher, and a small HTTP server for
``/healthz``, ``/readyz`` and ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from msgspec import UNSET
from rich.console import Console

from ..assembly import build_catalog, build_profiles, load_or_report, log_choices
from ..catalog import Catalog
from ..cluster.presence import Registry, announce_forever
from ..dashboard.fleet_local import worker_figures
from ..lifecycle import HEALTH_GRACE_S, Service, run_process
from ..logs.summary import ready_summary
from ..metrics import Metrics
from ..queue.factory import open_distributed, require_nats, watch_broker
from ..queue.js_release import serve_releases
from ..settings import Settings
from ..stack import Stack, ack_waits, build_stack, build_worker, until_running
from ..tracing import open_tracer
from ..wire.heartbeat import Heartbeat, Memory, ModelBeat
from .affinity import Affinity
from .devices import run_devices
from .health import HealthApp
from .loop import Worker

log = logging.getLogger("fleetserve.worker")


if TYPE_CHECKING:
    from ..adapters_setup import Adapters, Hosting
    from ..bench.tune.background import BackgroundTuner
    from ..lora.jobs.queue import JobQueue
    from ..queue import JetStreamQueue


class WorkerProcess(Service):
    """Tasks: "http" and "worker" (essential), "heartbeat" and "metrics"."""

    def __init__(
        self,
        settings: Settings,
        catalog: Catalog | None = None,
        console: Console | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``env``: what a background tune's child starts from (``main()``'s)."""
        super().__init__()
        require_nats(settings)
        self.env = env
        self.settings = settings
        self.catalog = catalog if catalog is not None else build_catalog(settings)
        self.console = console or Console(stderr=True)
        self.node = settings.worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.metrics = Metrics()
        self.tracer = open_tracer(settings, "worker")  # the null one unless --tracing
        self.stack = stack = build_stack(settings, self.catalog, self.metrics, self.console)
        self.profiles, self.choices = stack.profiles, stack.choices
        self.runners, self.fleet = stack.runners, stack.fleet
        self.peers = Registry()  # the other workers' heartbeats: what they hold
        self.worker: Worker | None = None
        self.adapters: Adapters | None = None
        self.hosting: Hosting | None = None  # the adapters' tiers, for hot-added runners too
        self.jobs: JobQueue | None = None
        self.js: JetStreamQueue | None = None
        self.port = 0
        self._busy = {m: (time.monotonic(), 0.0) for m in self.runners}
        self.background: BackgroundTuner | None = None  # --tune auto, once connected

    def _peer_holds(self, model: str) -> bool:
        """Another live worker has ``model`` resident or loading (from heartbeats)."""
        return any(
            h.id != self.node and h.model.state in ("resident", "loading")
            for h in self.peers.holders(model)
        )

    def _release_keep_alive(self, model: str) -> float | None:
        """A gateway's release: ``model``'s keep-alive here ends (None: not served here)."""
        return self.fleet.release_keep_alive(model) if model in self.runners else None

    def served_stack(self) -> Stack:
        """What serves the models (``hot_models.Served``)."""
        return self.stack

    def served_worker(self) -> Worker:
        if self.worker is None:
            raise RuntimeError("the worker is not built yet")
        return self.worker

    async def _watch_models(self, js: JetStreamQueue) -> None:
        """The fleet's hot adds and removes (``queue.js_models``): a model put there is
        served here too, one deleted is drained and unloaded."""
        from ..hot_models import HotModels
        from ..queue.js_models import SharedModels

        hot = HotModels(self, self.settings, self.catalog, self.metrics, self.console, listing=list)
        hot.hosting = self.hosting.host if self.hosting is not None else None
        bucket = await SharedModels(js.context(), self.settings.queue_prefix).open()
        self.spawn("models-watch", bucket.watch(hot.put, hot.forget))

    @property
    def ready(self) -> bool:
        return self.worker is not None and self.worker.ready and bool(self.js and self.js.healthy)

    def alive(self) -> bool:
        return (self.worker is None or self.worker.failed is None) and self.failed_stage() is None

    def describe(self) -> Heartbeat:
        host = self.fleet.room.host  # the tier of sleeping models
        return Heartbeat(
            id=self.node,
            pid=os.getpid(),
            host=socket.gethostname(),
            ready=self.ready,
            url=f"http://{self.settings.host}:{self.port}",
            device=self.settings.device,
            memory=Memory(budget=self.fleet.budget, used=self.fleet.used(),
                host_tier_budget=host.budget, host_tier_used=host.used),
            idle=self.worker is not None and self.worker.idle,
            models={
                m: ModelBeat(loaded=r.loaded, **self.fleet.info(m), precision=r.profile.precision,
                    hardware=r.profile.hardware, profile=self.choices[m].describe(),
                    tuning=self.background.info(m) if self.background else UNSET)
                for m, r in self.runners.items()
            },
            # the fleet view's: counters per model and the hot adapters (dashboard/fleet_local)
            **worker_figures(self.runners, self.js.stats if self.js else None, self.metrics),
        )  # fmt: skip

    async def start(self) -> None:
        app = HealthApp(self.metrics, alive=self.alive, ready=lambda: self.ready)
        self.port = await self.serve_http(
            app, self.settings.host, self.settings.worker_port, grace_s=HEALTH_GRACE_S
        )
        log_choices(self.choices, self.catalog, self.console)
        for m, r in self.runners.items():
            if not r.eager:  # loaded on its first request
                continue
            # a spinner on a terminal; the fleet logs the load (or why it failed)
            with self.console.status(f"Loading {m} ({r.profile.precision}, {r.profile.hardware})…"):
                await load_or_report(self.fleet, r, self.console)
        self.fleet.check_budget()  # now with what the pinned models measured
        waits = ack_waits(self.runners, self.settings)
        js, queue, self.store = await open_distributed(self.settings, self.node, waits)
        self.js = js
        watch_broker(js, self.metrics)
        keepalive = min(waits.values(), default=5.0) / 3
        nc = js.connection()
        await self.peers.listen(nc, self.settings.queue_prefix)
        # an admin's keep-alive releases
        await serve_releases(nc, self.settings.queue_prefix, self._release_keep_alive)
        from ..adapters_setup import host_adapters, open_registry, prepare_hosts

        # adapters uploaded through any gateway: from the NATS object store by default
        self.adapters = await open_registry(self.settings, self.catalog, nats=nc, declared=False)
        registry = self.adapters.registry
        self.hosting = host_adapters(
            self.settings, registry, self.runners, self.fleet, node=self.node
        )
        await prepare_hosts(self.settings, self.runners)
        self.worker = worker = build_worker(
            self.stack,
            queue,
            self.metrics,
            self.settings,
            self.tracer,
            keepalive=keepalive,
            shared_queue=True,
            publisher=queue,  # the parts of a large request, to the other workers
            affinity=Affinity(
                self.fleet,
                self.settings.affinity_wait,
                self._peer_holds,
                js.oldest_wait,  # JetStream's, refreshed every second
            ),
        )
        task = self.spawn("worker", worker.run(), essential=True)
        await self._watch_models(js)
        if self.settings.train:  # fine-tuning jobs, from their own JetStream stream
            from ..finetune_setup import job_runner, open_finetuning

            tuning = await open_finetuning(self.settings, self.catalog, registry, nats=nc)
            self.jobs = tuning.queue
            cpu = not self.settings.device.startswith("cuda")  # the budget is the host's memory
            runner = job_runner(
                self.settings, self.catalog, tuning, registry, self.node,
                budget=(lambda: self.fleet.budget) if cpu else None,
                room=(lambda *a: self.fleet.room.beside(*a)) if cpu else None,  # the fleet now
            )  # fmt: skip
            self.spawn("trainer", runner.run())  # a broken job fails alone
        await self._tune_in_background(js)
        beat = announce_forever(nc, self.settings.queue_prefix, self.describe)
        self.spawn("heartbeat", beat)
        self.spawn("metrics", self._refresh_metrics())
        await until_running(worker, task)
        log.info(
            "worker %s ready: %s; health on :%d",
            self.node, ready_summary(self.runners, self.settings.device), self.port,
        )  # fmt: skip

    async def _tune_in_background(self, js: JetStreamQueue) -> None:
        """``--tune auto``: tune what runs untuned, one worker per class and model,
        sharing the profiles through JetStream (``tune.fleetwide``)."""
        from ..bench.tune.host import ServerHost, publish_load, tuning_class

        cls = tuning_class(self.settings, self.profiles)
        if cls is None:  # a neighbour's tune steps aside for its load all the same
            self.spawn("host-traffic", publish_load(self))
            return
        from ..bench.tune.background import BackgroundTuner
        from ..bench.tune.fleetwide import FleetTuning

        shared = FleetTuning(
            js.context(), self.settings.queue_prefix, cls, self.node, self.settings.tune_lease
        )
        try:
            await shared.open()
        except Exception as exc:  # no KV here (permissions, a bucket of another shape)
            log.warning("--tune auto: the shared profiles cannot be opened (%s); not tuning", exc)
            return
        self.background = BackgroundTuner(
            self.settings, self.catalog, ServerHost(self), cls, self.env, shared
        )
        self.spawn("tuner", self.background.run())

    async def _refresh_metrics(self) -> None:
        m = self.metrics
        assert self.worker is not None
        queue = self.worker.queue
        while True:
            await asyncio.sleep(1.0)
            self.fleet.room.rebudget()  # the host's share as it is now (the heartbeat shows it)
            models = list(self.runners)  # hot adds and removes change them
            with contextlib.suppress(Exception):
                await queue.refresh(models)
            stats = queue.stats
            for model in models:
                m.queue_depth.labels(model).set(queue.depth(model))
                m.put_backs.labels(model).set(stats.put_backs.get(model, 0))
                m.redeliveries.labels(model).set(stats.redeliveries.get(model, 0))
                m.dead_letters.labels(model).set(stats.dead_letters.get(model, 0))
                now, busy = time.monotonic(), self.runners[model].busy_s
                t_prev, busy_prev = self._busy.get(model, (now, busy))
                if now > t_prev:
                    m.utilization.labels(model).set(min(1.0, (busy - busy_prev) / (now - t_prev)))
                self._busy[model] = (now, busy)

    async def stop(self) -> None:
        await self.stop_tasks()
        if self.jobs is not None:
            await self.jobs.close()
        if self.adapters is not None:
            from ..adapters_setup import settle_hosts

            await settle_hosts(self.runners)
            await self.adapters.close()
        if self.js is not None:
            await self.js.close()
        if self.worker is not None:
            self.worker.close()
        self.tracer.shutdown()


def tuned_processes(settings: Settings) -> int:
    """Processes per CPU device that the served models' profiles agree on (1 if they
    differ or say 1): ``fleetserve tune`` measures it, and the worker follows it."""
    if settings.device_list() or settings.device.startswith("cuda"):
        return 1
    profiles = build_profiles(settings)
    wanted = {profiles.choose(s).profile.processes for s in build_catalog(settings)}
    return wanted.pop() if len(wanted) == 1 else 1


async def run_worker(settings: Settings, env: Mapping[str, str] | None = None) -> None:
    if settings.tune == "quick":
        logging.getLogger("fleetserve").warning(
            "--tune %s applies to fleetserve serve; a worker serves the profiles it finds "
            "(tune this machine with fleetserve tune)",
            settings.tune,
        )
    n = tuned_processes(settings)
    if n > 1:  # the tuned layout: n processes, each on its share of the cores
        settings = dataclasses.replace(settings, devices=",".join(f"cpu:{i}" for i in range(n)))
    devices = settings.device_list()
    if len(devices) > 1:  # one puller, one process per device
        return await run_devices(settings)
    if devices:  # one device: this process is its worker
        settings = dataclasses.replace(settings, device=devices[0].replace("cpu:0", "cpu"))
    await run_process(WorkerProcess(settings, env=env), settings)
