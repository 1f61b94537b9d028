"""Assembly of fine-tuning jobs for each kind of process.

- The embedded server: a memory job queue, the job store in its adapter store, the
  routes, and a runner that trains one job at a time in a child process with
  ``train_threads`` threads. Each job it holds has a lease in the store
  (``lora/jobs/leases.py``): jobs left unfinished by a stopped server are queued again
  at start, and a running server takes up those of a killed one, but never a job
  another live server on the same store holds.
- A gateway: the routes, over the JetStream job queue and the store in the adapter
  store (the NATS object store by default), which every process shares.
- A worker started with ``--train``: the same queue and store, and a runner.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .catalog import Catalog
from .catalog.weights import weights_path
from .lora.jobs.leases import LeasedJobQueue, StoreLeases, requeue
from .lora.jobs.manager import FineTuning, TrainLimits
from .lora.jobs.queue import JobQueue, MemoryJobQueue
from .lora.jobs.room import Room, TrainMemory
from .lora.jobs.runner import JobRunner, Train
from .lora.jobs.specs import TrainBase
from .lora.jobs.store import JobStore
from .lora.registry import AdapterRegistry
from .lora.train import TrainResult, TrainSpec, train_in_child
from .settings import Settings
from .wire import InvalidInput, ModelNotFound

if TYPE_CHECKING:  # nats-py is optional (the nats extra)
    from nats.aio.client import Client as NATS

    from .gateway.finetune import FineTuneRoutes
    from .gateway.upload import Uploads

log = logging.getLogger("fleetserve.train")


@dataclass
class FineTuningParts:
    manager: FineTuning
    store: JobStore
    queue: JobQueue


async def open_finetuning(
    settings: Settings, catalog: Catalog, registry: AdapterRegistry, *, nats: NATS | None = None
) -> FineTuningParts:
    """The job store beside the adapters, and the job queue: in memory, or on
    JetStream given a NATS connection."""
    store = JobStore(registry.store)
    queue: JobQueue
    if nats is None:
        leases = StoreLeases(store, settings.train_lease_ttl)
        queue = LeasedJobQueue(MemoryJobQueue(settings.train_max_queued), leases)
    else:
        from .lora.jobs.queue_js import JetStreamJobQueue

        queue = await JetStreamJobQueue.open(
            nats,
            prefix=settings.queue_prefix,
            ack_wait=settings.train_ack_wait,
            storage=settings.stream_storage,
            max_queued=settings.train_max_queued,
            replicas=settings.stream_replicas,
        )

    def family(model: str) -> str | None:
        return catalog.get(model).family if model in catalog else None

    manager = FineTuning(store, queue, family, TrainLimits.from_settings(settings))
    return FineTuningParts(manager, store, queue)


def routes(
    settings: Settings, parts: FineTuningParts, uploads: Uploads | None = None
) -> FineTuneRoutes:
    """The /v1/files and /v1/fine_tuning/ routes; ``uploads`` (the adapter routes'
    :class:`~.gateway.upload.Uploads`) makes one bound for every upload."""
    from .gateway.finetune import FineTuneRoutes
    from .gateway.upload import Uploads

    uploads = uploads or Uploads.from_settings(settings)
    return FineTuneRoutes(parts.manager, max_file_bytes=settings.max_file_bytes, uploads=uploads)


def job_runner(
    settings: Settings,
    catalog: Catalog,
    parts: FineTuningParts,
    registry: AdapterRegistry,
    node: str = "",
    budget: Callable[[], int] | None = None,
    room: Room | None = None,
) -> JobRunner:
    """``budget`` and ``room``: the CPU fleet's memory budget and its ``beside`` (a
    training job's share is of that budget, and held in it while the job trains); None
    where the models' budget is a device's, not the host's."""
    memory = None
    if budget is not None and room is not None:
        memory = TrainMemory(lambda: training_share(settings, budget()), room)
    return JobRunner(
        parts.store,
        parts.queue,
        registry,
        base_resolver(settings, catalog),
        threads=max(1, settings.train_threads),
        max_attempts=settings.train_max_attempts,
        price_per_hour=settings.train_price_per_hour,
        node=node,
        train=limited_trainer(memory_limit(settings)),
        memory=memory,
        miner=settings.train_miner,
    )


def training_share(settings: Settings, budget: int) -> int:
    """``train_memory_share`` in bytes (0: none): a size, or a percent of ``budget``."""
    from .fleet.memory import parse_limit

    forms = "a size (1GiB, 600MiB), a percent of --memory-budget (25%) or 0 for none"
    share = settings.train_memory_share
    return parse_limit(share, "--train-memory-share", limit=budget, forms=forms)


def memory_limit(settings: Settings) -> int:
    """``train_memory_limit`` in bytes (0: none): a size, or a percent of the machine's
    memory (its cgroup's limit when lower); a ``ValueError`` at start for anything else."""
    from .catalog.hardware import memory_source
    from .fleet.memory import parse_limit

    forms = "a size (4GiB, 800MiB), a percent of memory (50%) or 0 for none"
    return parse_limit(
        settings.train_memory_limit, "--train-memory-limit", limit=memory_source()[0], forms=forms
    )


def limited_trainer(limit: int) -> Train:
    """Training in a child process whose data segment is capped at ``limit`` bytes."""

    async def train(
        spec: TrainSpec, on_event: Callable[[str, dict[str, Any]], None], cancel: asyncio.Event
    ) -> TrainResult:
        return await train_in_child(spec, on_event, cancel, memory_limit=limit)

    return train


def base_resolver(settings: Settings, catalog: Catalog) -> Callable[[str], Awaitable[TrainBase]]:
    """A base model's weights on this machine (fetched once if need be) and pooling."""

    async def base_of(model: str) -> TrainBase:
        if model not in catalog:
            raise InvalidInput(f"unknown base model {model!r} on this trainer", field="model")
        spec = catalog.get(model)
        try:
            path = await asyncio.to_thread(weights_path, spec, settings)
        except ModelNotFound as exc:
            raise InvalidInput(
                f"no weights for {model} here: {exc.message}", field="model"
            ) from None
        return TrainBase(str(path), spec.pooling, spec.normalize, spec.max_seq_len, spec.family)

    return base_of


async def requeue_unfinished(parts: FineTuningParts) -> int:
    """At the embedded server's start: jobs a stopped server left queued or running
    go back on the (memory) queue, and a running one resumes from its checkpoint;
    those whose lease a live server holds (one sharing this store) are left to it."""
    jobs = [j for j in await parts.store.jobs(None) if not j.status.finished]
    if isinstance(parts.queue, LeasedJobQueue):
        count = await parts.queue.take_up(jobs, "the server restarted; job queued again")
    else:
        count = 0
        for job in jobs:
            count += await requeue(parts.store, parts.queue, job,
                                   "the server restarted; job queued again")  # fmt: skip
    if count:
        log.info("fine-tuning: %d unfinished job(s) queued again", count)
    return count


async def keep_leases(parts: FineTuningParts) -> None:
    """The embedded server's leases renewed, and a killed server's jobs taken up."""
    if isinstance(parts.queue, LeasedJobQueue):
        await parts.queue.keep()
