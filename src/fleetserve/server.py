"""The embedded default: gateway, in-process queue and one worker in one process."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from .assembly import build_catalog, load_or_report, log_choices
from .catalog import Catalog

if TYPE_CHECKING:
    from .adapters_setup import Adapters
    from .bench.tune.background import BackgroundTuner
    from .finetune_setup import FineTuningParts
    from .gateway.finetune import FineTuneRoutes
from .bench.tune.quick import wanted as quick_wanted
from .catalog.sources import is_present
from .catalog_watch import CatalogWatch
from .families.base import AnyFamily, Embeds
from .gateway import Gateway
from .gateway.auth import Authenticator
from .gateway.request_limits import RequestLimits
from .gateway.wiring import Hooks, Routes
from .gateway_setup import build_dashboard
from .hot_models import HotModels, writable_dir
from .lifecycle import Service, run_process
from .logs.summary import ready_summary
from .metrics import Metrics
from .queue import MemoryQueue
from .settings import Settings
from .stack import Stack, build_stack, build_worker, rebuild, until_running
from .tracing import open_tracer
from .worker import Worker

log = logging.getLogger("fleetserve.server")


class EmbeddedServer(Service):
    """Everything in one event loop: uvicorn, the gateway, the queue and a worker."""

    def __init__(
        self,
        settings: Settings,
        catalog: Catalog | None = None,
        console: Console | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``env``: the environment the background tuner's child processes start from
        (``main()`` passes its own; the settings are added to it)."""
        super().__init__()
        self.auth = Authenticator.from_settings(settings)  # a bad key setting fails first
        self.settings = settings
        self.catalog = catalog if catalog is not None else build_catalog(settings)
        self.console = console or Console(stderr=True)
        self.metrics = Metrics()
        self.tracer = open_tracer(settings, "server")  # the null one unless --tracing
        self.queue = MemoryQueue(
            settings.max_queue_depth, settings.retry_after, age_limit=settings.batch_age_limit
        )
        self._take(build_stack(settings, self.catalog, self.metrics, self.console))
        self.tuning = quick_wanted(settings, self.catalog, self.choices)  # --tune quick
        self._tune_ends = 0.0  # when the quick tune's budget runs out (monotonic)
        self.background = self._background(env)  # --tune auto
        self.worker = self._new_worker()
        self.dashboard = build_dashboard(settings, self.auth)
        self.hot = HotModels(  # POST /v1/models, DELETE /v1/models/{id}, the watcher
            self, settings, self.catalog, self.metrics, self.console,
            listing=self.models_info, catalog_dir=writable_dir(settings), tracked=self._tracked,
        )  # fmt: skip
        self.watch = (  # the catalog directory's files as read now: those served
            CatalogWatch(Path(settings.catalog).expanduser(), self.hot)
            if settings.catalog and settings.watch_catalog
            else None
        )
        self.gateway: Gateway | None = None  # at start: with the adapters and fine-tuning
        self.port = 0
        self.adapters: Adapters | None = None
        self.finetuning: FineTuningParts | None = None
        from .dashboard.fleet_sources import EmbeddedFleet

        self.dashboard.attach_fleet(EmbeddedFleet(self))  # the fleet view's data

    async def _release_keep_alive(self, model: str) -> float:
        """An admin ends ``model``'s keep-alive (the fleet now: quick tuning rebuilds it)."""
        return self.fleet.release_keep_alive(model)

    def served_stack(self) -> Stack:
        """What serves the models now (``hot_models.Served``)."""
        return self.stack

    def served_worker(self) -> Worker:
        return self.worker

    def _tracked(self, model: str, added: bool) -> None:
        """A hot add or remove: the background tuner looks at the model, or no more."""
        if self.background is not None and added:  # a removed one's state stays: harmless
            from .bench.tune.states import State as TuneState

            self.background.states.setdefault(model, TuneState())

    def alive(self) -> bool:
        """No worker stage crashed and no task died (``/healthz`` says 503 otherwise)."""
        return self.worker.failed is None and self.failed_stage() is None

    def models_info(self) -> list[dict[str, Any]]:
        out = []
        hf_cache = Path(self.settings.hf_cache).expanduser()
        for spec in self.catalog:
            r = self.runners[spec.id]
            out.append(
                {
                    **self.fleet.info(spec.id),
                    "memory": r.memory,
                    "id": spec.id,
                    "object": "model",
                    "owned_by": "fleetserve",
                    "family": spec.family,
                    "runtime": r.profile.runtime or spec.runtime,
                    "precision": r.profile.precision,
                    "hardware": r.profile.hardware,
                    "profile": self.choices[spec.id].describe(),
                    "tuning": (
                        self.background.info(spec.id)
                        if self.background is not None
                        else {"state": "off"}
                    ),
                    "loaded": r.loaded,
                    "present": is_present(
                        spec.sources, hf_cache, Path(self.settings.cache_dir).expanduser()
                    ),
                    "tasks": sorted(t.value for t in r.tasks),
                    "dimensions": _dim(r.family_or_none) or spec.dimensions,
                    "max_seq_len": spec.max_seq_len,
                    "adapters": r.adapters.info(),
                    "limits": {  # what the SDK sizes the chunks of a long call from
                        "max_body_bytes": self.settings.max_body_bytes,
                        "max_batch_tokens": r.waiting.max_batch_tokens,
                        "max_batch_size": r.profile.max_batch_size,
                        "max_seq_len": spec.max_seq_len,
                        "request_timeout_s": self.settings.request_timeout,
                        **RequestLimits.from_settings(self.settings).advertised(),
                    },
                }
            )
        return out

    async def start(self) -> None:
        await self._open_adapters()
        self.gateway = self._new_gateway(await self._open_training())
        self.port = await self.serve_http(
            self.gateway, self.settings.host, self.settings.port,
            grace_s=self.settings.stop_grace or None, http_first=True,
        )  # fmt: skip
        log.info("API listening on http://%s:%d", self.settings.host, self.port)
        log.info("hardware %s", self.profiles.hw.summary())
        log_choices(self.choices, self.catalog, self.console)
        if self.tuning:
            await self._quick_tune()
        if self.adapters is not None:  # the runners as tuning left them
            from .adapters_setup import host_adapters

            hosting = host_adapters(self.settings, self.adapters.registry, self.runners, self.fleet)
            self.hot.hosting = hosting.host  # hot-added models serve adapters too
        await self._load_models()
        if self.adapters is not None:
            from .adapters_setup import prepare_hosts

            await prepare_hosts(self.settings, self.runners)
        await self.queue.start()
        task = self.spawn("worker", self.worker.run())  # a crash shows in /healthz, not an exit
        await until_running(self.worker, task)
        await self._start_training()
        if self.watch is not None:
            self.spawn("catalog-watch", self.watch.run())
        if self.background is not None:  # after the start: the server is ready at once
            self.spawn("tuner", self.background.run())
        else:  # it does not tune; a neighbour's tune steps aside for its load
            from .bench.tune.host import publish_load

            self.spawn("host-traffic", publish_load(self))
        log.info("ready: %s", ready_summary(self.runners, self.settings.device))

    def _background(self, env: Mapping[str, str] | None) -> BackgroundTuner | None:
        from .bench.tune.host import ServerHost, tuning_class

        cls = tuning_class(self.settings, self.profiles)
        if cls is None:
            return None
        from .bench.tune.background import BackgroundTuner

        return BackgroundTuner(self.settings, self.catalog, ServerHost(self), cls, env)

    async def _open_adapters(self) -> None:
        """The adapter registry (cold tier), shared by the gateway and the worker."""
        from .adapters_setup import open_registry

        self.adapters = await open_registry(self.settings, self.catalog)

    async def _open_training(self) -> FineTuneRoutes:
        """The fine-tuning job store and its routes (the jobs start with the worker)."""
        from .finetune_setup import open_finetuning, routes

        assert self.adapters is not None
        self.finetuning = await open_finetuning(self.settings, self.catalog, self.adapters.registry)
        return routes(self.settings, self.finetuning, self.adapters.routes.uploads)

    def _new_gateway(self, finetune: FineTuneRoutes) -> Gateway:
        assert self.adapters is not None
        return Gateway(
            self.settings,
            self.catalog,
            self.queue,
            self.metrics,
            hooks=Hooks(
                ready=lambda: self.worker.ready and not self.tuning,
                not_ready=self.not_ready,
                ready_in=self.ready_in,
                alive=self.alive,
                models_info=self.models_info,
                memory=lambda: self.fleet.memory(),  # the fleet of the moment
                interactive_cost=lambda model: self.choices[model].profile.interactive_cost,
                release_keep_alive=self._release_keep_alive,
            ),
            routes=Routes(self.adapters.routes, self.adapters.calls, finetune, self.hot),
            dashboard=self.dashboard,
            authenticator=self.auth,
            tracer=self.tracer,
        )

    async def _start_training(self) -> None:
        """Fine-tuning jobs: trained here, one at a time, each in a child process."""
        from .finetune_setup import job_runner, keep_leases, requeue_unfinished

        assert self.adapters is not None and self.finetuning is not None
        registry = self.adapters.registry
        await requeue_unfinished(self.finetuning)
        cpu = not self.settings.device.startswith("cuda")  # the budget is the host's memory
        runner = job_runner(
            self.settings, self.catalog, self.finetuning, registry,
            budget=(lambda: self.fleet.budget) if cpu else None,
            room=(lambda *a: self.fleet.room.beside(*a)) if cpu else None,  # the fleet now
        )  # fmt: skip
        self.spawn("trainer", runner.run())
        self.spawn("train-leases", keep_leases(self.finetuning))  # one owner per job

    def _take(self, stack: Stack) -> None:
        """Serve with ``stack`` (built at first, rebuilt after a quick tune)."""
        self.stack = stack
        self.profiles, self.choices = stack.profiles, stack.choices
        self.runners, self.fleet = stack.runners, stack.fleet

    def _new_worker(self) -> Worker:
        return build_worker(self.stack, self.queue, self.metrics, self.settings, self.tracer)

    def not_ready(self) -> str:
        """Why requests get 503 now ("" when they do not): a quick tune, or loading."""
        if self.tuning:
            left = self.ready_in() or 0.0
            return (
                f"tuning {', '.join(self.tuning)} for this machine (--tune quick), about "
                f"{left:.0f} s left"
            )
        return "" if self.worker.ready else "the models loaded at start are loading"

    def ready_in(self) -> float | None:
        """Seconds until requests are served, where known: a quick tune's budget left."""
        return max(1.0, self._tune_ends - time.monotonic()) if self.tuning else None

    async def _quick_tune(self) -> None:
        """Tune the untuned pinned models briefly, then serve them with what won."""
        from .bench.tune.quick import QUICK_BUDGET_S, quick_tune

        each = min(self.settings.tune_budget, QUICK_BUDGET_S)
        self._tune_ends = time.monotonic() + each * len(self.tuning)

        tuned = await quick_tune(
            self.settings, self.catalog, self.profiles, self.tuning, self.console
        )
        if tuned:
            self.worker.close()  # never ran: only its CPU thread to release
            self._take(
                rebuild(self.stack, tuned, self.settings, self.catalog, self.metrics, self.console)
            )
            self.worker = self._new_worker()
            log_choices(
                {m: self.choices[m] for m in tuned}, self.catalog.restrict(tuned), self.console
            )
        self.tuning = []

    async def _load_models(self) -> None:
        """The eager models now; the others on first use."""
        for spec in self.catalog:
            r = self.runners[spec.id]
            if not r.eager:
                continue
            with self.console.status(  # a spinner on a terminal; the fleet logs the load
                f"Loading {spec.id} ({r.profile.runtime or spec.runtime}, "
                f"{r.profile.precision}, {r.profile.hardware})…"
            ):
                await load_or_report(self.fleet, r, self.console)
        self.fleet.check_budget()  # now with what the pinned models measured

    async def stop(self) -> None:
        self.dashboard.close()  # end open event streams, or uvicorn waits for them
        if self.gateway is not None:
            self.gateway.stopping = True  # a request cancelled from here on is answered 503
        await self.stop_tasks()  # its requests answered (http_first), then the rest
        await self.queue.close()
        self.worker.close()
        if self.finetuning is not None:
            await self.finetuning.queue.close()
        if self.adapters is not None:
            from .adapters_setup import settle_hosts

            await settle_hosts(self.runners)
            await self.adapters.close()
        self.tracer.shutdown()


async def serve(settings: Settings, env: Mapping[str, str] | None = None) -> None:
    await run_process(EmbeddedServer(settings, env=env), settings)


def _dim(family: AnyFamily | None) -> int | None:
    """The width of a loaded embedding family's vectors (None: not loaded, or none)."""
    return family.dim if isinstance(family, Embeds) else None
