"""A watch of a JetStream key-value bucket that ends whole.

nats.py follows a watch with an ordered consumer whose heartbeat and flow-control
checks are tasks of their own; they end only when the watcher is stopped. A watch
left to its cancel outlived its caller, and each process printed "Task was destroyed
but it is pending!" twice at its stop.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nats.js.kv import KeyValue


@contextlib.asynccontextmanager
async def watching(kv: KeyValue, keys: str = ">") -> AsyncIterator[KeyValue.KeyWatcher]:
    """The entries of ``kv`` under ``keys`` (those there are, ``None``, then each
    change), the watch stopped when the block ends, by a cancel too."""
    watcher = await kv.watch(keys)
    try:
        yield watcher
    finally:
        with contextlib.suppress(Exception):  # the connection may be gone already
            await watcher.stop()  # type: ignore[no-untyped-call]
