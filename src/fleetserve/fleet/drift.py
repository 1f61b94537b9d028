"""The fleet's accounting checked against what the process holds.

After every load and eviction the fleet compares what it charges (``Fleet.used``)
with what the process holds beyond its own base (its resident set on a CPU, the
device's allocated memory on a GPU). A difference over ``tolerance`` of the larger of
the two, and of what the load or eviction moved, is a *drift*: logged with the model
and the figures, and counted in ``fleetserve_memory_drift_total``; the difference
itself is the gauge ``fleetserve_memory_unaccounted_bytes`` at every check.

The base is what the process holds beside its models: set at the first check (the
interpreter, the runtimes' libraries, the first load's imports), and set again after
a check that finds modules imported since the last one (a first load on another
runtime imports it, which is the process's cost, not the model's). A check while
another load is under way is skipped: that load holds some of its reservation, not
all of it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from ..metrics import Metrics

log = logging.getLogger("fleetserve.fleet")
MIB = 1 << 20
TOLERANCE = 0.10


def _modules() -> int:
    return len(sys.modules)


class Drift:
    """Checks of ``accounted`` bytes against ``actual()`` (see the module)."""

    def __init__(
        self,
        actual: Callable[[], int],
        metrics: Metrics | None = None,
        *,
        tolerance: float = TOLERANCE,
        modules: Callable[[], int] = _modules,
    ) -> None:
        self.actual = actual
        self.metrics = metrics
        self.tolerance = tolerance
        self._modules = modules
        self.base: int | None = None
        self._seen = 0  # modules imported at the last check
        self.last = 0  # the difference at the last check (bytes; + more held than charged)

    def check(self, event: str, model: str, accounted: int, moved: int) -> int | None:
        """After ``event`` ("load", "evict") of ``model``, which moved ``moved`` bytes:
        the fleet charges ``accounted``. Returns the drift in bytes when it is over the
        tolerance (logged and counted), else None."""
        now, seen = self.actual(), self._modules()
        if now <= 0:  # nothing to read here (no /proc)
            return None
        if self.base is None or seen != self._seen:
            self.base, self._seen = now - accounted, seen
            log.debug(
                "memory base %.1f MiB (after the %s of %s)", self.base / MIB, event, model
            )  # fmt: skip
            return None
        held = now - self.base
        diff = held - accounted
        self.last = diff
        if self.metrics is not None:
            self.metrics.memory_unaccounted.set(diff)
        if abs(diff) <= self.tolerance * max(held, accounted, moved):
            return None
        log.warning(
            "memory drift after the %s of %s: the process holds %.1f MiB for its models, "
            "the fleet charges %.1f MiB (%+.1f MiB, %+.0f%%)",
            event, model, held / MIB, accounted / MIB, diff / MIB,
            100 * diff / max(accounted, 1),
        )  # fmt: skip
        if self.metrics is not None:
            self.metrics.memory_drift.labels(event).inc()
        return diff


__all__ = ["TOLERANCE", "Drift"]
