"""A new profile loading beside the served one (``worker.swap``): the model's slot held
so that no load of it starts, room for the newcomer made as for a load and counted as
the model's, then what it holds once the swap is over."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from .member import Footprint, State
from .room import Room
from .slots import Slots


class Swaps:
    """The fleet's side of a profile swap, over its slots and its room."""

    def __init__(self, slots: Slots, room: Room) -> None:
        self._slots = slots
        self._room = room

    @contextlib.asynccontextmanager
    async def holding(self, model: str) -> AsyncIterator[State]:
        """``model``'s slot for the block (no load of it starts) and, if resident, a use
        of it (it is not evicted, like one with work in flight); yields its state."""
        s = self._slots[model]
        async with s.lock:
            if s.state is State.SLEEPING:  # a new profile loads afresh
                self._room.drop_sleeper(s, "swap")
            used = s.state is State.RESIDENT
            if used:
                s.take()
            try:
                yield s.state
            finally:
                if used and s.give():
                    self._room.changed.set()

    async def reserve(self, model: str, need: Footprint) -> Footprint:
        """Inside ``holding``: room for ``need`` beside resident ``model``, made as for a
        load (the policy evicts others) but never waited for (``Unavailable``), counted
        as ``model``'s until ``settle``. Returns what it held before."""
        s = self._slots[model]
        await self._room.make(model, need, self._room.clock(), wait=False)
        before = s.held  # nothing awaited since the room was found: it is still there
        s.held = Footprint(
            before.weights + need.weights, max(before.peak, need.peak), 0, before.state + need.state
        )
        self._room.gauges()
        return before

    async def settle(self, model: str, held: Footprint | None) -> None:
        """Inside ``holding``, the swap over: resident ``model`` holds ``held`` (the new
        profile's, or what ``reserve`` returned if none came); ``None``: it is not
        resident, and its next load makes room for its new profile's expected bytes."""
        s = self._slots[model]
        if held is None:
            s.measured = None
            return
        s.held = s.measured = held
        if s.record is not None:
            s.record.bytes = held.kept
        self._room.gauges()
        if self._room.used() > self._room.budget:  # it measured more than expected
            await self._room.shed(model)


__all__ = ["Swaps"]
