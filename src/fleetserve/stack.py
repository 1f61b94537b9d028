"""One stack builder: profiles -> runners -> fleet -> worker, for every serving process.

``fleetserve serve`` (``server.py``), ``fleetserve worker`` (``worker/process.py``)
and each device child of ``--devices`` (``worker/device_child.py``) build what
serves their models here, and start its worker with :func:`until_running`, which
awaits the worker's ``started`` event instead of polling its flag.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from .assembly import build_fleet, build_profiles, build_runner, load_runtimes
from .catalog import Catalog, Profile
from .catalog.profiles import Choice, Profiles
from .fleet.manager import Fleet
from .fleet.memory import freeze_imports
from .metrics import Metrics
from .queue import Consumer, Publisher
from .runtimes import import_runtimes
from .settings import Settings
from .tracing import Tracer
from .worker import Worker
from .worker.affinity import Affinity
from .worker.runner import Runner


@dataclass(slots=True)
class Stack:
    """What serves one process's models: the profiles, each model's choice of them,
    its runner, and the fleet that holds the runners within the memory budget."""

    profiles: Profiles
    choices: dict[str, Choice]
    runners: dict[str, Runner]
    fleet: Fleet


def build_stack(settings: Settings, catalog: Catalog, metrics: Metrics, console: Console) -> Stack:
    """The profiles for this machine, a choice and a runner per model, then the fleet.
    The runtimes the models' loads use are imported first, before any runner exists,
    and frozen out of the garbage collector's walks (``freeze_imports``)."""
    profiles = build_profiles(settings)
    choices = {s.id: profiles.choose(s) for s in catalog}
    import_runtimes(name for s in catalog for name in load_runtimes(s, choices[s.id]))
    freeze_imports()
    runners = {s.id: build_runner(s, settings, metrics, choices[s.id]) for s in catalog}
    return Stack(profiles, choices, runners, build_fleet(settings, runners, metrics, console))


def rebuild(
    stack: Stack,
    models: Iterable[str],
    settings: Settings,
    catalog: Catalog,
    metrics: Metrics,
    console: Console,
) -> Stack:
    """The stack after ``models`` were tuned: the profiles read again, those models'
    choices and runners anew (the others kept), and a new fleet over them all."""
    profiles = build_profiles(settings)
    choices, runners = dict(stack.choices), dict(stack.runners)
    for model in models:
        spec = catalog.get(model)
        choices[model] = profiles.choose(spec)
        runners[model] = build_runner(spec, settings, metrics, choices[model])
    return Stack(profiles, choices, runners, build_fleet(settings, runners, metrics, console))


def ack_wait_for(profile: Profile, settings: Settings) -> float:
    """Seconds before unacked work is redelivered: 10 full batches, at least 2 s.

    In-progress acks every third of it keep work that waits in the worker alive.
    """
    if settings.ack_wait > 0:
        return settings.ack_wait
    p = profile
    full = p.cost.predict_ms(
        p.max_batch_tokens, max(1, p.max_batch_tokens // p.max_batch_size), p.max_batch_size
    )
    return max(2.0, 10 * full / 1e3)


def ack_waits(runners: Mapping[str, Runner], settings: Settings) -> dict[str, float]:
    """Each model's ``ack_wait`` (:func:`ack_wait_for`), from its runner's profile."""
    return {m: ack_wait_for(r.profile, settings) for m, r in runners.items()}


def build_worker(
    stack: Stack,
    queue: Consumer,
    metrics: Metrics,
    settings: Settings,
    tracer: Tracer,
    *,
    publisher: Publisher | None = None,
    keepalive: float | None = None,
    shared_queue: bool = False,
    affinity: Affinity | None = None,
) -> Worker:
    """The worker over the stack's runners and fleet, pulling from ``queue``.
    ``shared_queue``: other workers pull from the same queue (they take what it holds
    if it fails), and ``publisher`` (the same queue's other role) takes the parts of a
    request far larger than a batch."""
    return Worker(
        queue,
        stack.runners,
        metrics,
        publisher=publisher,
        max_deliver=settings.max_deliver,
        keepalive=keepalive,
        shared_queue=shared_queue,
        fleet=stack.fleet,
        affinity=affinity,
        tracer=tracer,
    )


async def until_running(worker: Worker, task: asyncio.Task[Any]) -> None:
    """Return once ``worker`` runs, or once its task (``worker.run()``) ended: a
    worker that failed to start shows in the process's health, not here."""
    started = asyncio.ensure_future(worker.started.wait())
    try:
        await asyncio.wait({started, task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        started.cancel()
