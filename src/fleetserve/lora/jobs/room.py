"""A training job's share of the fleet's memory budget, held while its child trains.

The runner asks ``held_share`` for the share (``train_memory_share``, its bytes as the
budget is now): it waits for room in the fleet (``Room.beside``: idle models are
evicted as for a load) until there is some or the job is cancelled, and the feed says
once that it waits; the bytes are counted in the fleet until the block ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from ...wire import Cancelled

# holds ``nbytes`` of the budget for ``holder`` for a block; ``waiting`` told once if it waits
Room = Callable[[str, int, Callable[[], None]], contextlib.AbstractAsyncContextManager[None]]


@dataclass(frozen=True)
class TrainMemory:
    """A training job's share of the fleet's memory budget: ``share()`` its bytes (0:
    none), as the budget is now; ``room`` holds them while the child runs."""

    share: Callable[[], int]
    room: Room


@contextlib.asynccontextmanager
async def held_share(
    memory: TrainMemory | None,
    job_id: str,
    share: int,
    note: Callable[[str], None],
    cancel: asyncio.Event,
) -> AsyncIterator[None]:
    """``share`` bytes of the fleet's budget held for the block, waited for until
    there is room or ``cancel`` is set (``Cancelled``); nothing where there is no
    ``memory`` or no share. ``note`` goes to the job's feed."""
    if memory is None or share <= 0:
        yield
        return
    mib = share / (1 << 20)

    def waiting() -> None:
        note(f"waiting for {mib:.0f} MiB of the memory budget (train_memory_share)")

    async with contextlib.AsyncExitStack() as stack:
        held = memory.room(f"training job {job_id}", share, waiting)
        entered = asyncio.ensure_future(stack.enter_async_context(held))
        stopped = asyncio.ensure_future(cancel.wait())
        try:
            await asyncio.wait({entered, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # (a cancel of this task goes on out once both have ended)
            stopped.cancel()
            if not entered.done():
                entered.cancel()
            await asyncio.wait({entered, stopped})
        if entered.cancelled():
            raise Cancelled("cancelled while waiting for memory")
        entered.result()  # its error, if it failed
        note(f"{mib:.0f} MiB of the memory budget held for training")
        yield


__all__ = ["Room", "TrainMemory", "held_share"]
