"""Affinity: which models a worker on a shared queue pulls for, and when.

Loading a model costs seconds; serving one already resident costs milliseconds. So a
worker pulls first for the models it holds (resident or loading), together with cold
ones whose oldest request has waited ``wait`` seconds: their holders do not keep up,
and another copy pays. Other cold models it takes only when idle and no other live
worker holds them (from the heartbeats). A model that failed to load here is left to
the workers that hold it while its cool-down lasts. A fleet of many models over a few
workers so settles instead of thrashing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..fleet.manager import Fleet, State
from ..queue import Consumer, Message

# a sleeping model counts as cold: pulled for as a held one, it would be woken here
# while another worker holds it resident, and the two would trade it back and forth
HELD = (State.RESIDENT, State.LOADING)


@dataclass(frozen=True)
class Affinity:
    fleet: Fleet
    wait: float  # seconds a cold model's oldest request may wait (--affinity-wait)
    peer_holds: Callable[[str], bool]  # another live worker has it resident or loading
    oldest_wait: Callable[[str], float]  # the queue's, as of its last refresh

    async def pull(
        self,
        queue: Consumer,
        models: Sequence[str],
        budget: int,
        timeout: float,
        idle: Callable[[], bool],
        *,
        interactive_only: bool = False,
    ) -> list[Message]:
        hot = [m for m in models if self.fleet.state(m) in HELD]
        cold = [m for m in models if m not in hot]
        overdue = [m for m in cold if self.oldest_wait(m) >= self.wait and not self._left(m)]
        if hot or overdue:
            msgs = await queue.pull(
                overdue + hot, budget, timeout, interactive_only=interactive_only
            )
            if msgs:
                return msgs
        spare = [m for m in cold if m not in overdue and not self.peer_holds(m)]
        if not spare or not idle():
            if not hot and not overdue:
                await asyncio.sleep(timeout)
            return []
        wait = 0.05 if hot else timeout
        return await queue.pull(spare, budget, wait, interactive_only=interactive_only)

    def _left(self, model: str) -> bool:
        """Failed here, and held elsewhere: left to the holders for the cool-down."""
        return self.fleet.failed(model) and self.peer_holds(model)
