"""How much to pull and what to put back: pure decisions, shared with the simulator.

A pull asks the queue for ``pull_batch`` messages: the budget divided by a high
quantile of the lane's recent costs, not their mean. On a mixed workload (many small
requests, a few large ones) the mean is dragged down by the small ones, so a pull
sized from it brings several large requests that do not fit and must be put back.
Sized from the 90th percentile, a pull rarely overshoots; when it undershoots, the
worker pulls again as soon as its batch former has room.

``keep`` decides, for messages that arrived in one pull, which to keep: each one
while the cost so far stays within the budget (the first is always kept). The rest
are put back at once for another worker. The worker asks with the room its batch
former has left, so the queue keeps to the budget exactly.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

from ..wire import Envelope

MAX_BATCH = 256  # messages one pull request may ask for
QUANTILE = 0.9
WINDOW = 256  # recent costs remembered per lane


class CostWindow:
    """The recent costs of one lane (model and class)."""

    def __init__(self, size: int = WINDOW) -> None:
        self._costs: deque[int] = deque(maxlen=size)

    def __len__(self) -> int:
        return len(self._costs)

    def add(self, cost: int) -> None:
        self._costs.append(max(1, int(cost)))

    def quantile(self, q: float = QUANTILE) -> float:
        """The ``q`` quantile of recent costs (1.0 before any were seen)."""
        if not self._costs:
            return 1.0
        ordered = sorted(self._costs)
        return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def pull_batch(budget: int, window: CostWindow, q: float = QUANTILE) -> int:
    """Messages to ask for so that, at the lane's ``q`` cost, they fit ``budget``."""
    return max(1, min(MAX_BATCH, int(budget / max(window.quantile(q), 1.0))))


def keep(costs: Sequence[int], budget: int) -> list[bool]:
    """Which of ``costs`` (in arrival order) to keep; the first always is."""
    out: list[bool] = []
    spent = 0
    for cost in costs:
        fits = not out or spent + cost <= budget
        out.append(fits)
        if fits:
            spent += cost
    return out


def priority_order(envs: Sequence[Envelope]) -> list[int]:
    """Indices of ``envs`` in the order to serve them: interactive first, then batch,
    each in arrival order."""
    return sorted(range(len(envs)), key=lambda i: not envs[i].interactive)


def choose(
    envs: Sequence[Envelope], budget: int, age_limit: float, now: float = 0.0
) -> tuple[list[int], list[int]]:
    """Which of ``envs`` (in arrival order) to keep, in the order to serve them, and
    which to put back: interactive first, within ``budget`` (the first always kept).
    If no batch request is kept although one has waited more than ``age_limit``
    seconds, the oldest such is kept as well: batch work never starves."""
    order = priority_order(envs)
    flags = keep([envs[i].cost_hint for i in order], budget)
    kept = [i for i, f in zip(order, flags, strict=True) if f]
    back = [i for i, f in zip(order, flags, strict=True) if not f]
    waiting = [i for i in back if not envs[i].interactive]
    if waiting and all(envs[i].interactive for i in kept):
        oldest = min(waiting, key=lambda i: envs[i].enqueued_at)
        if (now or time.time()) - envs[oldest].enqueued_at > age_limit:
            kept.append(oldest)
            back.remove(oldest)
    return kept, back
