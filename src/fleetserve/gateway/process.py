"""``fleetserve gateway``: the HTTP API in front of NATS JetStream, with no models.

``/readyz`` follows the NATS connection. ``/v1/models`` lists the catalog with the
live workers that hold each model (from their heartbeats). A sweeper removes payloads
that crashed processes left in the store.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from rich.console import Console

from ..assembly import build_catalog, build_profiles
from ..catalog import Catalog
from ..catalog.spec import Profile
from ..cluster.presence import Registry
from ..gateway_setup import build_dashboard
from ..lifecycle import Service, run_process
from ..metrics import Metrics
from ..queue.factory import open_distributed, require_nats, watch_broker
from ..settings import Settings
from ..storage import sweep_forever
from ..tracing import open_tracer
from ..wire import Unavailable
from .app import Gateway
from .auth import Authenticator
from .readiness import not_ready
from .request_limits import RequestLimits
from .shared_models import SharedAdmin
from .wiring import Hooks, Routes

if TYPE_CHECKING:
    from ..adapters_setup import Adapters
    from ..lora.jobs.queue import JobQueue
    from ..queue import JetStreamQueue

log = logging.getLogger("fleetserve.gateway")


class GatewayProcess(Service):
    """Tasks: "http" (essential) and "payload-sweeper"."""

    def __init__(
        self, settings: Settings, catalog: Catalog | None = None, console: Console | None = None
    ) -> None:
        super().__init__()
        require_nats(settings)
        self.auth = Authenticator.from_settings(settings)  # a bad key setting fails here
        self.settings = settings
        self.catalog = catalog if catalog is not None else build_catalog(settings)
        self.console = console or Console(stderr=True)
        self.node = f"gw-{socket.gethostname()}-{os.getpid()}"
        self.metrics = Metrics().without_worker_gauges()
        self.tracer = open_tracer(settings, "gateway")  # the null one unless --tracing
        self.registry = Registry()
        self.js: JetStreamQueue | None = None
        self.dashboard = build_dashboard(settings, self.auth)
        self.gateway: Gateway | None = None
        self.adapters: Adapters | None = None
        self.jobs: JobQueue | None = None
        self.port = 0

    def not_ready(self) -> str:
        """Why ``/readyz`` is 503 ("" when it is 200): ``gateway.readiness``."""
        connected = bool(self.js is not None and self.js.connected)
        return not_ready(connected, self.catalog, self.registry.workers())

    def models_info(self) -> list[dict[str, Any]]:
        out = []
        for spec in self.catalog:
            holders = self.registry.holders(spec.id)
            out.append(
                {
                    "id": spec.id,
                    "object": "model",
                    "owned_by": "fleetserve",
                    "family": spec.family,
                    "runtime": spec.runtime,
                    "max_seq_len": spec.max_seq_len,
                    "workers": [h.as_dict() for h in holders],
                    "resident_on": [h.id for h in holders if h.model.state == "resident"],
                    "state": _fleet_state(h.model.state for h in holders),
                    "pinned": spec.pinned,
                    "bytes": max((h.model.bytes or 0 for h in holders), default=0),
                    "keep_alive": spec.keep_alive,
                    "loaded": any(h.model.loaded for h in holders),
                    "limits": {  # the workers' batch budgets are theirs: not known here
                        "max_body_bytes": self.settings.max_body_bytes,
                        "max_seq_len": spec.max_seq_len,
                        "request_timeout_s": self.settings.request_timeout,
                        **RequestLimits.from_settings(self.settings).advertised(),
                    },
                }
            )
        return out

    async def _release_keep_alive(self, model: str) -> float:
        """Every worker that serves ``model`` ends its keep-alive (over NATS)."""
        from ..queue.js_release import release_everywhere

        nc = self.js.nc if self.js is not None else None
        if nc is None or self.js is None or not self.js.connected:
            raise Unavailable(
                "cannot release keep-alives: not connected to the queue; retry",
                retry_after=self.settings.retry_after,
            )
        workers = len(self.registry.holders(model))
        try:
            return await release_everywhere(nc, self.settings.queue_prefix, model, workers)
        except Exception as exc:  # nats-py's: the connection dropped meanwhile
            log.warning("keep-alive release of %r failed: %s: %s", model, type(exc).__name__, exc)
            raise Unavailable(
                "cannot release keep-alives: the queue did not take the request; retry",
                retry_after=self.settings.retry_after,
            ) from None

    def _interactive_cost(self) -> Callable[[str], int]:
        """Each model's interactive threshold, from its profile for this machine's class
        (the workers' may differ; the threshold is in predicted tokens, not time)."""
        profiles = build_profiles(self.settings)
        costs = {s.id: profiles.choose(s).profile.interactive_cost for s in self.catalog}
        return lambda model: costs.get(model, Profile.interactive_cost)

    async def start(self) -> None:
        js, queue, store = await open_distributed(self.settings, self.node)
        self.js = js
        watch_broker(js, self.metrics)
        nc = js.connection()
        await self.registry.listen(nc, self.settings.queue_prefix)
        from ..adapters_setup import open_registry  # the NATS object store by default

        self.adapters = await open_registry(self.settings, self.catalog, nats=nc)
        from ..finetune_setup import open_finetuning, routes  # jobs go to --train workers

        tuning = await open_finetuning(self.settings, self.catalog, self.adapters.registry, nats=nc)
        self.jobs = tuning.queue
        from ..queue.js_models import SharedModels  # hot adds and removes, fleet-wide

        bucket = await SharedModels(js.context(), self.settings.queue_prefix).open()
        s = self.settings
        models = SharedAdmin(
            bucket,
            self.catalog,
            self.models_info,
            held=lambda model: [h.id for h in self.registry.holders(model)],
            # the longest request a worker may be finishing, then its next heartbeat
            drain_s=max(s.request_timeout, s.generation_timeout, s.max_request_timeout)
            + 3 * self.registry.every,
        )
        self.spawn("models-watch", bucket.watch(models.on_put, models.on_delete))
        self.gateway = Gateway(
            self.settings,
            self.catalog,
            queue,
            self.metrics,
            hooks=Hooks(
                # connected: a request then gets the queue's own 503 (storage full, say);
                # /readyz also asks queue.healthy, false while JetStream refuses writes
                ready=lambda: bool(self.js is not None and self.js.connected),
                # /readyz waits for a ready worker too; requests queue for one meanwhile
                not_ready=self.not_ready,
                alive=lambda: self.failed_stage() is None,
                models_info=self.models_info,
                interactive_cost=self._interactive_cost(),
                release_keep_alive=self._release_keep_alive,
            ),
            routes=Routes(
                adapters=self.adapters.routes,
                calls=self.adapters.calls,
                finetune=routes(self.settings, tuning, self.adapters.routes.uploads),
                models=models,
            ),
            dashboard=self.dashboard,
            authenticator=self.auth,
            tracer=self.tracer,
        )
        from ..dashboard.fleet_sources import ClusterFleet

        self.dashboard.attach_fleet(ClusterFleet.of(self))  # heartbeats, JetStream
        self.port = await self.serve_http(
            self.gateway, self.settings.host, self.settings.port,
            grace_s=self.settings.stop_grace or None, http_first=True,
        )  # fmt: skip
        ttl = self.settings.payload_ttl
        sweeper = sweep_forever(store, ttl, every=max(1.0, ttl / 4))
        self.spawn("payload-sweeper", sweeper)
        log.info("API listening on http://%s:%d", self.settings.host, self.port)

    async def stop(self) -> None:
        self.dashboard.close()  # end open event streams, or uvicorn waits for them
        if self.gateway is not None:
            self.gateway.stopping = True  # a request cancelled from here on is answered 503
        await self.stop_tasks()  # its requests answered (http_first), then the rest
        if self.jobs is not None:
            await self.jobs.close()
        if self.adapters is not None:
            await self.adapters.close()
        if self.js is not None:
            await self.js.close()
        self.tracer.shutdown()


def _fleet_state(states: Iterable[object]) -> str:
    """A model's state across the fleet: resident somewhere, else loading, else failed
    everywhere it was tried, else cold."""
    seen = set(states)
    for state in ("resident", "loading", "failed"):
        if state in seen:
            return state
    return "cold"


async def run_gateway(settings: Settings) -> None:
    await run_process(GatewayProcess(settings), settings)
