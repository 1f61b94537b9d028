"""Hot add and remove for a gateway in distributed mode (``fleetserve gateway``).

The gateway holds no model: ``POST /v1/models`` puts the spec in the fleet's models
bucket (``queue.js_models``) and routes to the model at once (a request waits in
JetStream until a worker has built its runner); ``DELETE /v1/models/{id}`` stops
routing to it and deletes its entry, and every worker that serves it drains it (its
queued requests get a 404 naming it) and unloads it. The DELETE answers once no live
worker's heartbeat lists the model any more (the drains are done), or after
``drain_s`` (a worker that still drains then is logged). Each gateway's catalog follows
the bucket, so a change made through one gateway holds at all of them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..catalog import Catalog, ModelSpec

log = logging.getLogger("fleetserve.models")
POLL_S = 0.1  # how often a DELETE looks at the heartbeats while workers drain


class Bucket(Protocol):
    """The fleet's models bucket as a gateway writes it (``queue.js_models``)."""

    async def put(self, model: str, fields: Mapping[str, object]) -> None: ...

    async def delete(self, model: str) -> None: ...


class SharedAdmin:
    """A ``model_routes.ModelAdmin`` over ``bucket``; ``listing``: the gateway's
    ``GET /v1/models`` entries."""

    def __init__(
        self,
        bucket: Bucket,
        catalog: Catalog,
        listing: Callable[[], list[dict[str, Any]]],
        *,
        held: Callable[[str], list[str]] = lambda model: [],
        drain_s: float = 0.0,
    ) -> None:
        """``held``: the live workers whose heartbeats list a model; ``drain_s``: how
        long a DELETE waits for them to drain it."""
        self.bucket, self.catalog, self.listing = bucket, catalog, listing
        self.held, self.drain_s = held, drain_s

    async def add(self, spec: ModelSpec, fields: Mapping[str, object]) -> dict[str, Any]:
        await self.bucket.put(spec.id, fields)
        self.catalog.add(spec)
        return next(m for m in self.listing() if m["id"] == spec.id)

    async def remove(self, model: str) -> None:
        self.catalog.get(model)  # ModelNotFound naming it
        self.catalog.discard(model)
        await self.bucket.delete(model)
        give_up = time.monotonic() + self.drain_s
        while (left := self.held(model)) and time.monotonic() < give_up:
            await asyncio.sleep(POLL_S)
        if left:
            log.warning(
                "%s: removed; %s still drain it after %gs", model, ", ".join(left), self.drain_s
            )

    # -- the bucket's watch (every gateway's, this one's own changes too) ------------
    async def on_put(self, model: str, fields: dict[str, object]) -> None:
        spec = ModelSpec.from_dict(fields)
        if model in self.catalog and self.catalog.get(model) == spec:
            return
        self.catalog.add(spec)
        log.info("the fleet serves %s (%s)", model, spec.family)

    async def on_delete(self, model: str) -> None:
        if model in self.catalog:
            self.catalog.discard(model)
            log.info("the fleet no longer serves %s", model)
