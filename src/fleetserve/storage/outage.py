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
import logging
from collections.abc import Iterator

from ..logs.context import current_request_id
from ..wire import Unavailable
from .base import PayloadMissing

log = logging.getLogger("fleetserve.storage")

_KINDS = {"MemoryStore": "memory", "FileStore": "file", "S3Store": "s3", "NatsObjectStore": "nats"}


def kind_of(store: object) -> str:
    """``memory``, ``file``, ``s3``, ``nats`` or ``other``, by the store's class."""
    return _KINDS.get(type(store).__name__, "other")


def is_outage(kind: str, exc: BaseException) -> bool:
    """Whether ``exc`` from a store of ``kind`` says the store failed."""
    if isinstance(exc, FileNotFoundError | FileExistsError | PayloadMissing):
        return False
    if kind == "nats":
        return isinstance(exc, _nats_outages())
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


@contextlib.contextmanager
def unreachable(what: str, kind: str, url: str) -> Iterator[None]:
    """An outage in the block is logged in full and raised as ``Unavailable``
    ("the <what> is unreachable (<exception type>); retry")."""
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
            f"the {what} is unreachable ({type(exc).__name__}); retry", retry_after=1.0
        ) from None


def _nats_outages() -> tuple[type[Exception], ...]:
    """NATS briefly away: a restart, a reconnect, JetStream not yet up."""
    from nats.errors import (
        ConnectionClosedError,
        ConnectionReconnectingError,
        NoRespondersError,
        NoServersError,
        StaleConnectionError,
    )
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.errors import ServiceUnavailableError

    return (
        ConnectionClosedError,
        ConnectionReconnectingError,
        NoRespondersError,
        NoServersError,
        StaleConnectionError,
        NatsTimeout,
        ServiceUnavailableError,
    )


__all__ = ["is_outage", "kind_of", "unreachable"]
