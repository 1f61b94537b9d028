"""Where the fleet view's figures come from, in each mode.

- :class:`EmbeddedFleet`: ``fleetserve serve``, one process: its one worker, read
  directly (fleet, runners, the in-process queue's lanes and counters).
- :class:`ClusterFleet`: ``fleetserve gateway``: the workers' heartbeats and the
  JetStream consumers (``fleet_nats``).

Both give the same :class:`Gathered`; :mod:`.fleet` adds what the gateway itself saw
(throughput, latency, errors) and the registered adapters.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .fleet_local import memory_lanes, normalize, worker_state

if TYPE_CHECKING:
    from ..adapters_setup import Adapters
    from ..bench.tune.background import BackgroundTuner
    from ..catalog import Catalog
    from ..cluster.presence import Registry
    from ..fleet.manager import Fleet
    from ..metrics import Metrics
    from ..queue.jetstream import JetStreamQueue
    from ..queue.memory import MemoryQueue
    from ..settings import Settings
    from ..worker import Worker
    from ..worker.runner import Runner
    from .fleet_nats import JetStreamLanes


@dataclass
class Gathered:
    workers: list[dict[str, Any]]  # fleet_local.normalize's shape
    lanes: list[dict[str, Any]]  # {model, class, waiting, inflight, age_s}
    dead_letters: dict[str, int] | None = None  # held in the dead-letter stream, if known
    notes: list[str] = field(default_factory=list)  # what the page should say


class FleetSource(Protocol):
    """What a fleet view reads: the catalog, the gateway's metrics, the adapters."""

    mode: str  # "embedded" or "distributed"

    @property
    def catalog(self) -> Catalog: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def adapters(self) -> Adapters | None: ...

    async def gather(self) -> Gathered: ...


class EmbeddedParts(Protocol):
    """The parts of ``server.EmbeddedServer`` read here (attributes it may replace)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def catalog(self) -> Catalog: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def fleet(self) -> Fleet: ...
    @property
    def runners(self) -> Mapping[str, Runner]: ...
    @property
    def queue(self) -> MemoryQueue: ...
    @property
    def worker(self) -> Worker: ...
    @property
    def adapters(self) -> Adapters | None: ...
    @property
    def background(self) -> BackgroundTuner | None: ...


class EmbeddedFleet:
    """The embedded server: one worker, its in-process queue."""

    mode = "embedded"

    def __init__(self, server: EmbeddedParts) -> None:
        self.server = server
        self.node = f"embedded@{socket.gethostname()}"

    @property
    def catalog(self) -> Catalog:
        return self.server.catalog

    @property
    def metrics(self) -> Metrics:
        return self.server.metrics

    @property
    def adapters(self) -> Adapters | None:
        return self.server.adapters

    async def gather(self) -> Gathered:
        s = self.server
        worker = worker_state(
            self.node, s.fleet, s.runners, s.queue.stats, s.metrics,
            ready=s.worker.ready, device=s.settings.device,
            tuning=s.background.info if s.background is not None else None,
        )  # fmt: skip
        return Gathered([worker], memory_lanes(s.queue), None)


class ClusterFleet:
    """A distributed gateway: heartbeats and JetStream."""

    mode = "distributed"

    def __init__(
        self,
        registry: Registry,
        lanes: JetStreamLanes,
        catalog: Catalog,
        metrics: Metrics,
        adapters: Callable[[], Adapters | None] = lambda: None,
    ) -> None:
        self.registry = registry
        self.lanes = lanes
        self._catalog = catalog
        self._metrics = metrics
        self._adapters = adapters  # read each time: the process opens them at start

    @classmethod
    def of(cls, process: Any) -> ClusterFleet:
        """For a started ``gateway.process.GatewayProcess``."""
        from .fleet_nats import JetStreamLanes

        queue: JetStreamQueue = process.js
        return cls(
            process.registry, JetStreamLanes(queue), process.catalog, process.metrics,
            lambda: process.adapters,
        )  # fmt: skip

    @property
    def catalog(self) -> Catalog:
        return self._catalog

    @property
    def metrics(self) -> Metrics:
        return self._metrics

    @property
    def adapters(self) -> Adapters | None:
        return self._adapters()

    async def gather(self) -> Gathered:
        workers = sorted(
            (normalize(b.as_dict()) for b in self.registry.workers()), key=lambda w: w["id"]
        )
        lanes, dead = await self.lanes.read()
        notes = [] if workers else ["No worker has announced itself yet (heartbeats every 2 s)."]
        return Gathered(workers, lanes, dead, notes)


__all__ = ["ClusterFleet", "EmbeddedFleet", "EmbeddedParts", "FleetSource", "Gathered"]
