"""The fleet's table of slots and what it adds up: what is held, what the pinned
models need, what is charged for weights (``Fleet`` alone changes the slots)."""

from __future__ import annotations

from collections.abc import Collection

from .member import Footprint, State, held_together
from .policy import Resident
from .slot import NOTHING, Slot


class Slots(dict[str, Slot]):
    """Every model of one device's fleet, by id, and what is held beside them."""

    def __init__(self) -> None:
        super().__init__()
        self.beside: dict[str, int] = {}  # bytes held beside the models, by holder

    def held(self, extra: Footprint = NOTHING, without: Collection[str] = ()) -> int:
        """Bytes held: every resident (and loading) model's weights and state plus the
        largest activation peak among them (one batch runs at a time), ``without``
        those models, with ``extra`` added, and what is held beside them."""
        models = held_together([*(s.held for m, s in self.items() if m not in without), extra])
        return models + sum(self.beside.values())

    @staticmethod
    def footprint(s: Slot) -> Footprint:
        """What ``s`` holds, or would once loaded."""
        if s.state in (State.RESIDENT, State.LOADING):
            return s.held
        return s.measured or s.member.expected()

    def pinned(self, but: str = "") -> list[Footprint]:
        """What each pinned model (``but`` one) holds, or will."""
        return [self.footprint(s) for m, s in self.items() if s.member.pinned and m != but]

    def pinned_bytes(self) -> dict[str, int]:
        """What each pinned model holds alone, or is expected to before it loads."""
        return {m: self.footprint(s).total for m, s in self.items() if s.member.pinned}

    def records(self) -> list[Resident]:
        return [s.record for s in self.values() if s.record is not None]

    def weights(self) -> int:
        """The charge for resident weights (what is held while idle)."""
        return sum(s.held.weights for s in self.values())

    def states(self) -> int:
        """The state models serve with (KV caches), held only while they run."""
        return sum(s.held.state for s in self.values())

    def peak(self) -> int:
        """The largest activation peak held for (one batch runs at a time)."""
        return max((s.held.peak for s in self.values()), default=0)

    def loading(self) -> bool:
        return any(s.state is State.LOADING for s in self.values())

    def resident(self) -> int:
        return sum(s.state is State.RESIDENT for s in self.values())


__all__ = ["Slots"]
