"""Assembly of the adapter machinery a process serves: the registry over the cold
tier (the adapter store), the warm tier on local disk, the hot tier in memory, the
``/v1/adapters`` routes and the resolution of adapter calls at the gateway.

A gateway needs the registry, the routes and the calls; a worker the registry, the
warm and hot tiers; the embedded server all of them, sharing one registry, so that a
delete is seen by the worker at once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .catalog import Catalog
from .fleet.manager import Fleet
from .fleet.memory import mib, parse_size
from .gateway.adapter_routes import AdapterRoutes
from .gateway.calls import RegistryCalls
from .gateway.upload import Uploads
from .lora.bases import CatalogBases
from .lora.declared import register_declared
from .lora.registry import AdapterRegistry
from .lora.store import open_adapter_store
from .lora.tiers import AdapterCache
from .lora.validate import Limits
from .settings import Settings
from .worker.lora_tier import HotTier
from .worker.runner import Runner

log = logging.getLogger("fleetserve")


@dataclass
class Adapters:
    registry: AdapterRegistry
    routes: AdapterRoutes
    calls: RegistryCalls

    async def close(self) -> None:
        await self.registry.store.close()


async def open_registry(
    settings: Settings, catalog: Catalog, *, nats: Any = None, declared: bool = True
) -> Adapters:
    """The registry over ``settings.adapter_store`` (the NATS object store given a
    connection), with the catalog's declared adapters registered."""
    store = await open_adapter_store(settings, nats=nats)
    registry = AdapterRegistry(
        store, limits=Limits.from_settings(settings), bases=CatalogBases(catalog, settings)
    )
    if declared:
        for info in await register_declared(registry, catalog, settings):
            log.info("adapter %s of %s registered from the catalog", info.id, info.base)
    uploads = Uploads.from_settings(settings)  # shared with /v1/files (finetune_setup)
    routes = AdapterRoutes(registry, max_body_bytes=settings.max_body_bytes, uploads=uploads)
    return Adapters(registry, routes, RegistryCalls(registry))


async def prepare_hosts(settings: Settings, runners: Mapping[str, Runner]) -> None:
    """With ``adapter_hosts=eager``, the adapter hosts of the loaded models now: their
    graphs with LoRA slots, or their torch copies."""
    if settings.adapter_hosts not in ("eager", "lazy"):
        raise ValueError(f"adapter_hosts must be eager or lazy, not {settings.adapter_hosts!r}")
    if settings.adapter_hosts == "lazy":
        return
    for model, r in runners.items():
        if r.loaded:
            try:
                await r.adapters.prepare()
            except Exception as exc:  # adapters then fail alone; the base serves
                log.warning("%s: no adapter host (slots or a torch copy): %s", model, exc)


async def settle_hosts(runners: Mapping[str, Runner]) -> None:
    """At stop: wait for the adapter hosts' background work (a fit of the LoRA slots)."""
    for r in runners.values():
        await r.adapters.settle()


@dataclass(frozen=True)
class Hosting:
    """Where a process's runners find their adapters (the warm tier on this disk) and
    keep them hot (the hot tier); a runner added later (a hot add) is hosted with
    ``host``."""

    cache: AdapterCache
    tier: HotTier

    def host(self, runner: Runner) -> None:
        runner.adapters.host(self.cache, self.tier)


def host_adapters(
    settings: Settings,
    registry: AdapterRegistry,
    runners: Mapping[str, Runner],
    fleet: Fleet,
    node: str = "",
) -> Hosting:
    """Let every runner that can host adapters serve them: the warm tier on this disk,
    the hot tier within ``adapter_hot_bytes`` of the fleet's memory budget, whose
    bytes count against that budget."""
    cache = AdapterCache.from_settings(registry, settings, node)
    cap = parse_size(settings.adapter_hot_bytes, limit=fleet.budget)
    tier = HotTier(cap)
    fleet.room.adapters = lambda: tier.held
    hosting = Hosting(cache, tier)
    for r in runners.values():
        hosting.host(r)
        r.adapters.room = fleet.room_beside  # a torch copy makes room before it loads
    log.info("adapters: %s hot, %s on disk", mib(cap), mib(cache.max_bytes))
    return hosting
