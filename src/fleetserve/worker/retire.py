"""A hot remove inside one worker (``Worker.retire``): the model's messages still in
the queue are pulled and answered 404 naming it (``removed``), what the worker already
holds for it finishes, and only then does its runner stop and the fleet unload it."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from ..wire import ModelNotFound

POLL_S = 0.05  # how often a drain looks at what is left (bounded by the deadlines)


class Holds(Protocol):
    """The ledger as a drain sees it."""

    def holds(self, model: str) -> int: ...


class Depth(Protocol):
    """The queue as a drain sees it."""

    def depth(self, model: str) -> int: ...


def removed(model: str) -> ModelNotFound:
    """The answer to a request for ``model`` that had not started when it was removed."""
    return ModelNotFound(
        f"model {model!r} was removed from this server while the request waited; "
        "add it again (POST /v1/models) to serve it",
        field="model",
    )


async def drained(ledger: Holds, queue: Depth, model: str, timeout: float) -> bool:
    """Wait until nothing for ``model`` is held here or queued (the pull loop answers
    what it pulls for a retiring model); False if ``timeout`` seconds passed first.
    Every held request has a deadline, so a timeout past the longest one is a bound."""
    end = time.monotonic() + timeout
    while ledger.holds(model) or queue.depth(model):
        left = end - time.monotonic()
        if left <= 0:
            return False
        await asyncio.sleep(min(POLL_S, left))
    return True
