"""One model's place in the fleet: its state, what it holds, its uses and failures."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..wire import FleetError, Unavailable
from .member import Footprint, Member, State
from .policy import Resident

NOTHING = Footprint()


@dataclass(eq=False)
class Slot:
    """What the fleet manager keeps of one member (``Fleet`` alone changes it)."""

    member: Member
    state: State = State.COLD
    held: Footprint = NOTHING  # while resident (or reserved while loading)
    measured: Footprint | None = None  # what its last load measured
    load_s: float = 0.0  # how long its last load took (not a wake)
    wake_s: float = 0.0  # how long its last wake took (0: never woken)
    inflight: int = 0
    error: FleetError | None = None
    failed_at: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    record: Resident | None = None  # the policy's view while resident
    no_room: FleetError | None = None  # the last attempt found no room ...
    no_room_until: float = 0.0  # ... and those queued behind it get that answer until

    def take(self) -> None:
        """One use more: a request's, or a hold that keeps it from eviction as one."""
        self.inflight += 1
        if self.record is not None:
            self.record.busy = True

    def give(self) -> bool:
        """One use back; whether it is idle now."""
        self.inflight = max(0, self.inflight - 1)
        if self.record is not None:
            self.record.busy = self.inflight > 0
        return self.inflight == 0

    def fail(self, exc: Exception, now: float, cooldown: float) -> FleetError:
        """Its load failed at ``now``: remember why, the message only, none of the
        load's frames (they hold whatever it had allocated); its requests get that
        answer for ``cooldown`` seconds."""
        if isinstance(exc, FleetError):
            err = exc.fresh(retry_after=exc.retry_after or cooldown)
        else:
            err = Unavailable(
                f"model {self.member.model_id!r} failed to load: {type(exc).__name__}: {exc}"[:500],
                retry_after=cooldown,
            )
        self.state, self.held, self.error, self.failed_at = State.FAILED, NOTHING, err, now
        self.record = None
        return err


__all__ = ["NOTHING", "Slot"]
