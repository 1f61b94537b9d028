"""A serving process as the background tuner's host (see :class:`.background.Host`):
the embedded server, or a distributed worker."""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ...catalog import Catalog
from ...catalog.profiles import Choice, Profiles
from ...catalog.weights import weights_path
from ...settings import Settings

log = logging.getLogger("fleetserve.bench.tune")

if TYPE_CHECKING:
    from ...fleet.manager import Fleet
    from ...metrics import Metrics
    from ...worker import Worker
    from ...worker.runner import Runner


class Parts(Protocol):
    """What the host reads of ``server.EmbeddedServer`` or ``worker.WorkerProcess``."""

    @property
    def settings(self) -> Settings: ...
    @property
    def catalog(self) -> Catalog: ...
    @property
    def choices(self) -> MutableMapping[str, Choice]: ...
    @property
    def runners(self) -> Mapping[str, Runner]: ...
    @property
    def fleet(self) -> Fleet: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def worker(self) -> Worker | None: ...


class ServerHost:
    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    def choice(self, model: str) -> Choice:
        return self.parts.choices[model]

    def reread(self, model: str) -> Choice:
        from ...assembly import build_profiles

        return build_profiles(self.parts.settings).choose(self.parts.catalog.get(model))

    def loaded(self, model: str) -> bool:
        return self.parts.runners[model].loaded

    def busy(self) -> bool:
        p = self.parts
        worker = p.worker
        if worker is None or not worker.idle:
            return True
        queue = worker.queue
        return any(queue.depth(m) or p.fleet.info(m)["inflight"] for m in p.runners)

    def memory(self) -> tuple[int, int]:
        return self.parts.fleet.used(), self.parts.fleet.budget

    def weights(self, model: str) -> Path:
        return weights_path(self.parts.catalog.get(model), self.parts.settings)

    def keep(self, model: str, choice: Choice) -> None:
        """What runs stays (the same engine and batch budget) and takes ``choice``'s
        figures: its cost model, priority cap and memory figure."""
        from ...assembly import build_runner

        p = self.parts
        new = build_runner(p.catalog.get(model), p.settings, p.metrics, choice)
        p.runners[model].refigure(new)
        p.choices[model] = choice

    async def swap(self, model: str, choice: Choice) -> tuple[bool, str]:
        from ...assembly import build_runner
        from ...worker.swap import swap_profile

        p = self.parts
        spec = p.catalog.get(model)
        new = build_runner(spec, p.settings, p.metrics, choice)
        result = await swap_profile(p.fleet, p.runners[model], new)
        if result.swapped:
            p.choices[model] = choice
        return result.swapped, result.reason


async def publish_load(parts: Parts) -> None:
    """What a process that does not tune runs in the tuner's place: its load, published
    for a neighbour's background tune to step aside (:mod:`.hosttraffic`)."""
    from .hosttraffic import publish_forever

    await publish_forever(ServerHost(parts).busy, parts.settings.tune_lock)


def tuning_class(settings: Settings, profiles: Profiles) -> str | None:
    """The class a ``--tune auto`` process tunes for; ``None`` (with a warning where
    ``--hardware-class`` asks for another class's profiles: a profile is measured where
    it runs) when it does not tune."""
    if settings.tune != "auto":
        return None
    asked, here = profiles.hardware_class, profiles.hw.hardware_class
    if asked != here:
        log.warning(
            "--tune auto: not tuning for %s on a %s machine (--hardware-class asks for "
            "another class's profiles)", asked, here,
        )  # fmt: skip
        return None
    return asked


__all__ = ["Parts", "ServerHost", "publish_load", "tuning_class"]
