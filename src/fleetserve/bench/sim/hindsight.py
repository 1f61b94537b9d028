"""Eviction in hindsight, for the fleet simulator only (``--eviction hindsight``): the
simulator knows the requests to come, so GDSF and LRU can be set beside a policy that
knows them too.

``Hindsight`` evicts first the model whose leaving costs least per byte until it is
asked for again: its reload seconds over its bytes times the requests before its next
use; a model never asked for again leaves first of all. That is Belady's
farthest-next-use, weighed by cost and size. Where sizes and costs differ no simple
rule is optimal (the offline problem is NP-hard), so this is a mark of what foresight
gets, not a bound.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence

from ...fleet.policy import LRU, Resident


class Hindsight(LRU):
    """LRU's bookkeeping, ordered by each model's next use instead; ``next_use`` gives
    the requests before a model's next one (``math.inf``: none)."""

    name = "hindsight"

    def __init__(self, next_use: Callable[[str], float]) -> None:
        self.next_use = next_use

    def order(self, candidates: Iterable[Resident]) -> list[Resident]:
        return sorted(candidates, key=lambda r: (self.loss(r), r.last_used))

    def loss(self, r: Resident) -> float:
        """Reload seconds per byte per request until ``r`` is next asked for."""
        until = self.next_use(r.model)
        if math.isinf(until):
            return 0.0
        return max(r.reload_s, 1e-6) / (max(r.bytes, 1) * max(until, 1.0))


def until_next(uses: Sequence[int], arrived: int, waiting: bool) -> float:
    """The requests from the next to arrive (request ``arrived``) up to the next of
    ``uses`` (a model's requests, in order); one where a request for it ``waiting``
    came already, ``math.inf`` where none is to come."""
    if waiting:
        return 1.0
    j = bisect.bisect_left(uses, arrived)
    return uses[j] - arrived + 1 if j < len(uses) else math.inf
