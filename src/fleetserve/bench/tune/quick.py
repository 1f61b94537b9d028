"""``fleetserve serve --tune quick``: a short tune at first start, where nothing is tuned.

For each pinned model whose profile came from the rules or a fallback (no tuned
profile for this hardware class), run a quick search (at most ``QUICK_BUDGET_S``)
before the model loads, and write the result to the profile directory, so the next
start finds it tuned. ``/readyz`` stays 503 meanwhile. A tune that fails leaves the
rule's choice in place, with one warning.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from ...catalog import Catalog, ModelSpec
from ...catalog.profiles import Choice, Profiles
from ...catalog.weights import weights_path
from ...settings import Settings
from .options import windows
from .runs import RunStore
from .search import Options

if TYPE_CHECKING:
    from .tuner import Tuner

log = logging.getLogger("fleetserve.bench.tune")
QUICK_BUDGET_S = 90.0
OVERRUN_S = 15.0  # kept back from the search for a step that outruns its estimate
MODES = ("off", "quick", "auto")


def wanted(settings: Settings, catalog: Catalog, choices: dict[str, Choice]) -> list[str]:
    """The pinned (or named) models that would run on an untuned profile."""
    if settings.tune not in MODES:
        raise ValueError(f"setting tune must be one of {', '.join(MODES)}, not {settings.tune!r}")
    if settings.tune != "quick":  # auto tunes in the background (tune.background)
        return []
    named = set(settings.model_list())
    return [
        s.id
        for s in catalog
        if (s.pinned or s.id in named)
        and choices[s.id].how in ("rule", "fallback")
        and s.runtime != "external"
    ]


async def quick_tune(
    settings: Settings, catalog: Catalog, profiles: Profiles, models: list[str], console: Console
) -> list[str]:
    """Tune ``models`` briefly; the ids that now have a profile."""
    done: list[str] = []
    budget = min(settings.tune_budget, QUICK_BUDGET_S)
    if profiles.hardware_class != profiles.hw.hardware_class:
        log.warning(
            "--tune quick: not tuning for %s on a %s machine (--hardware-class asks for "
            "another class's profiles); serving with the rules' profiles",
            profiles.hardware_class,
            profiles.hw.hardware_class,
        )
        return done
    for model in models:
        console.print(
            f"[bold]tuning[/] {model} for {profiles.hardware_class} "
            f"(--tune quick, at most {budget:.0f}s)…"
        )
        try:
            tuner = _tuner(settings, catalog.get(model), profiles, budget, console)
            async with asyncio.timeout(budget):  # "at most" holds, whatever a step costs
                outcome = await tuner.run()
        except Exception as exc:  # a failed tune must not stop the server: the rules serve
            why = "it ran out of time" if isinstance(exc, TimeoutError) else str(exc)
            log.warning(
                "%s: the quick tune failed (%s); serving with the rules' profile", model, why
            )
            continue
        console.print(f"  tuned {model}: {outcome.run['winner']} -> {outcome.profile_file}")
        done.append(model)
    return done


def _tuner(
    settings: Settings, spec: ModelSpec, profiles: Profiles, budget: float, console: Console
) -> Tuner:
    from .tuner import Tuner

    tune_dir = Path(settings.tune_dir).expanduser()
    cache = Path(settings.cache_dir).expanduser()
    measure_s, knee_s = windows(budget, quick=True)
    opts = Options(
        budget_s=budget - OVERRUN_S,  # planned within this; cut at ``budget``
        quick=True,
        max_processes=1,  # fleetserve serve runs one process
        measure_s=measure_s,
        knee_s=knee_s,
        device=profiles.hw.kind if settings.device == "auto" else settings.device,
        cache_dir=cache,
    )
    path = weights_path(spec, settings)
    return Tuner(
        spec,
        path,
        profiles.hw,
        profiles.hardware_class,
        opts,
        RunStore(tune_dir),
        profile_dir=Path(settings.profile_dir),
        report_dir=tune_dir / "reports",
        catalog_dirs=(Path(settings.catalog),) if settings.catalog else (),
        console=console,
    )


__all__ = ["MODES", "QUICK_BUDGET_S", "quick_tune", "wanted"]
