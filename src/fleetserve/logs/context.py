"""The request a task works for, so that a log line deep below the gateway (a store
that failed, say) names it without every layer passing the id down.

The gateway sets it around each HTTP request, a worker around the work it does for
one message. asyncio copies the context into each task it creates, so it follows the
request into the tasks and threads (``asyncio.to_thread``) that serve it, and ends
with them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

_REQUEST_ID: ContextVar[str | None] = ContextVar("fleetserve_request_id", default=None)


def current_request_id() -> str:
    """The id of the request this code runs for; "-" outside any."""
    return _REQUEST_ID.get() or "-"


@contextlib.contextmanager
def for_request(request_id: str) -> Iterator[None]:
    """Code in the block (and the tasks it starts) runs for ``request_id``."""
    token = _REQUEST_ID.set(request_id)
    try:
        yield
    finally:
        _REQUEST_ID.reset(token)


__all__ = ["current_request_id", "for_request"]
