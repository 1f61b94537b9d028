"""The fleet's charge checked against what the process holds.

After every load the fleet compares how the process's resident set (on a GPU, the
memory torch holds on the device) moved since the last check with how its charge for
weights moved (``Slots.weights``: activation peaks are charged for the budget, not
held while idle). The evictions made for the load are in the same interval: an evicted
model's memory is let go once the last batch that ran on it drops it, which may come
after the eviction itself, so it is looked at with the load that followed. A
difference over ``tolerance`` of what the interval moved is a *drift*: logged with the
model and the figures, and counted in ``fleetserve_memory_drift_total``. The sum of
the differences since the first check is ``fleetserve_memory_unaccounted_bytes``.

An interval in which modules were imported is not judged (a runtime's first load
brings its library, the process's cost and not a model's), nor is the first one, nor
one while another load is under way (the fleet skips those: that load holds part of
its reservation only). Each drift is reported once, in the interval it happened. A
difference under ``floor`` (4 MiB) is never one: the resident set moves that much by
itself.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from ..metrics import Metrics

log = logging.getLogger("fleetserve.fleet")
MIB = 1 << 20
TOLERANCE = 0.10
FLOOR = 4 * MIB  # below this a difference is the resident set's own noise (a 1 MiB
# model's load was judged 1.0 MiB off: thread stacks, the allocator's pages)


def _modules() -> int:
    return len(sys.modules)


class Drift:
    """Checks of the charge against ``actual()``, interval by interval (see the module)."""

    def __init__(
        self,
        actual: Callable[[], int],
        metrics: Metrics | None = None,
        *,
        tolerance: float = TOLERANCE,
        floor: int = FLOOR,
        modules: Callable[[], int] = _modules,
    ) -> None:
        self.actual = actual
        self.metrics = metrics
        self.tolerance = tolerance
        self.floor = floor
        self._modules = modules
        self._last: tuple[int, int, int] | None = None  # (held, charged, modules) then
        self.unaccounted = 0  # the differences' sum since the first check (bytes)

    def check(self, event: str, model: str, charged: int, moved: int, slack: int = 0) -> int | None:
        """After ``event`` of ``model``, the fleet charges ``charged`` for weights; the
        interval since the last check moved ``moved`` bytes of charge (the load's, and
        the evictions'). ``slack``: what may be held or not at any moment (the KV caches
        of generation, allocated as sequences run): a difference within it is none.
        The drift in bytes when it is over the tolerance (logged and counted), else
        None."""
        now, seen = self.actual(), self._modules()
        if now <= 0:  # nothing to read here (no /proc)
            return None
        last, self._last = self._last, (now, charged, seen)
        if last is None or last[2] != seen:
            return None
        grew, added = now - last[0], charged - last[1]
        diff = grew - added
        if abs(diff) <= slack:
            diff = 0
        else:
            diff -= slack if diff > 0 else -slack
        self.unaccounted += diff
        if self.metrics is not None:
            self.metrics.memory_unaccounted.set(self.unaccounted)
        if abs(diff) <= max(self.floor, self.tolerance * max(moved, abs(added), abs(grew))):
            return None
        log.warning(
            "memory drift at the %s of %s: since the last check the process grew "
            "%+.1f MiB and the fleet's charge %+.1f MiB (%+.1f MiB unaccounted)",
            event, model, grew / MIB, added / MIB, diff / MIB,
        )  # fmt: skip
        if self.metrics is not None:
            self.metrics.memory_drift.labels(event).inc()
        return diff


__all__ = ["FLOOR", "TOLERANCE", "Drift"]
