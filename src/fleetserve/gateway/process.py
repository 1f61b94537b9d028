"""``fleetserve gateway``: the HTTP API in front of NATS JetStream, with no models.

``/readyz`` follows the NATS connection. ``/v1/models`` lists the catalog with the
live workers that hold each model (from their heartbeats). A sweeper removes payloads
that crashed processes left in the store.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any

from rich.console import Console

from ..catalog import Catalog
from ..cluster.presence import Registry
from ..metrics import Metrics
from ..queue.factory import open_distributed, require_nats
from ..server import build_catalog, run_process, shutdown, start_http
from ..settings import Settings
from ..storage import sweep_forever
from .app import Gateway

log = logging.getLogger("fleetserve.gateway")


class GatewayProcess:
    def __init__(
        self, settings: Settings, catalog: Catalog | None = None, console: Console | None = None
    ) -> None:
        require_nats(settings)
        self.settings = settings
        self.catalog = catalog if catalog is not None else build_catalog(settings)
        self.console = console or Console(stderr=True)
        self.node = f"gw-{socket.gethostname()}-{os.getpid()}"
        self.metrics = Metrics()
        self.registry = Registry()
        self.js: Any = None
        self.gateway: Gateway | None = None
        self.port = 0
        self._http: Any = None
        self._tasks: list[asyncio.Task[Any]] = []

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
                    "workers": holders,
                    "loaded": any(h.get("loaded") for h in holders),
                }
            )
        return out

    async def start(self) -> None:
        self.js, queue, store = await open_distributed(self.settings, self.node)
        await self.registry.listen(self.js.nc, self.settings.queue_prefix)
        self.gateway = Gateway(
            self.settings,
            self.catalog,
            queue,
            self.metrics,
            ready=lambda: bool(self.js is not None and self.js.healthy),
            models_info=self.models_info,
        )
        self._http, task, self.port = await start_http(
            self.gateway, self.settings.host, self.settings.port
        )
        self._tasks.append(task)
        ttl = self.settings.payload_ttl
        sweeper = sweep_forever(store, ttl, every=max(1.0, ttl / 4))
        self._tasks.append(asyncio.create_task(sweeper, name="payload-sweeper"))
        self.console.print(
            f"[bold green]fleetserve gateway[/] API listening on "
            f"http://{self.settings.host}:{self.port}"
        )

    async def wait(self) -> None:
        if self._tasks:
            await self._tasks[0]

    async def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.dashboard.close()  # end open event streams, or uvicorn waits
        await shutdown(self._http, self._tasks)
        if self.js is not None:
            await self.js.close()


async def run_gateway(settings: Settings) -> None:
    await run_process(GatewayProcess(settings), settings)
