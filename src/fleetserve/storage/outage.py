"""A store that is away or failing, told apart from what its callers handle.

S3 or NATS unreachable (a restart, a reconnect, a network partition) and a file system
error are outages: the caller gets a 503 to retry, naming the kind of failure and
never its text. An S3 client's text names the hosts it tried (the endpoint, the
cloud's metadata address) and a file system's the paths; the log keeps all of it,
with the request it failed. A missing key or a create that lost its race is no
outage: it passes through, for the caller to handle.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator

from ..logs.context import current_request_id
from ..wire import Unavailable
from .base import PayloadMissing

log = logging.getLogger("fleetserve.storage")

_KINDS = {"MemoryStore": "memory", "FileStore": "file", "S3Store": "s3", "NatsObjectStore": "nats"}


def kind_of(store: object) -> str:
    """``memory``, ``file``, ``s3``, ``nats`` or ``other``, by the store's class (or
    the nearest base class that is one of ours: a subclass keeps its base's kind)."""
    for cls in type(store).__mro__:
        if cls.__name__ in _KINDS:
            return _KINDS[cls.__name__]
    return "other"


def is_outage(kind: str, exc: BaseException) -> bool:
    """Whether ``exc`` from a store of ``kind`` says the store failed."""
    if isinstance(exc, FileNotFoundError | FileExistsError | PayloadMissing):
        return False
    if kind == "nats":
        return is_nats_outage(exc)
    if kind == "s3":
        from obstore.exceptions import (
            AlreadyExistsError,
            BaseError,
            NotFoundError,
            NotModifiedError,
            PreconditionError,
        )

        handled = (AlreadyExistsError, NotFoundError, NotModifiedError, PreconditionError)
        return isinstance(exc, BaseError | OSError) and not isinstance(exc, handled)
    return kind == "file" and isinstance(exc, OSError)


def is_nats_outage(exc: BaseException) -> bool:
    """NATS briefly away or slow: a restart, a reconnect, JetStream not yet up, a call
    that timed out, a lost socket. The one test of it, for stores and the queue alike."""
    return isinstance(exc, _nats_outages())


@contextlib.contextmanager
def unreachable(what: str, kind: str, url: str, retry_after: float | None = None) -> Iterator[None]:
    """An outage in the block is logged in full and raised as ``Unavailable``
    ("the <what> is unreachable (<exception type>); retry"), with ``retry_after`` (the
    ``retry_after`` setting, threaded by whoever opened the store; None: the gateway's
    error mapping sends its default)."""
    try:
        yield
    except Exception as exc:
        if not is_outage(kind, exc):
            raise
        log.warning(
            "the %s %s failed (request %s): %s: %s",
            what,
            url,
            current_request_id(),
            type(exc).__name__,
            exc,
            exc_info=exc,
        )
        raise Unavailable(
            f"the {what} is unreachable ({type(exc).__name__}); retry", retry_after=retry_after
        ) from None


@functools.cache
def _nats_outages() -> tuple[type[BaseException], ...]:
    from nats.errors import (
        ConnectionClosedError,
        ConnectionReconnectingError,
        NoRespondersError,
        NoServersError,
        StaleConnectionError,
    )
    from nats.js.errors import ServiceUnavailableError

    return (
        ConnectionClosedError,
        ConnectionReconnectingError,
        NoRespondersError,
        NoServersError,
        StaleConnectionError,
        ServiceUnavailableError,
        TimeoutError,  # nats-py's TimeoutError is one, as is an asyncio timeout
        OSError,  # a socket error (ConnectionError included)
    )


__all__ = ["is_nats_outage", "is_outage", "kind_of", "unreachable"]
