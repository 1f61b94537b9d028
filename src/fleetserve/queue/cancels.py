"""Cancels: a request whose client is gone (or whose deadline passed) stops its work.

The gateway calls ``WorkQueue.cancel``. Each queue passes the cancel to the workers it
serves, wherever they are: the in-process queue calls its listeners directly, JetStream
publishes a core-NATS message on ``<prefix>.cancel`` that every worker hears, and the
machine-local queue passes the ones it hears upstream on to its device processes.

A queue that removes waiting messages of the request at once (they were never pulled)
says so in ``Cancel.dropped``, to one listener only, so that they are counted once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..wire import Envelope

log = logging.getLogger("fleetserve.queue")


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop the work of ``request_id`` (and of its slices: ``Envelope.part.parent``)."""

    request_id: str
    until: float  # time.time() after which none of it can run anyway (its deadline)
    dropped: tuple[str, ...] = ()  # models of messages removed before any worker pulled them


CancelListener = Callable[[Cancel], None]


def concerns(envelope: Envelope, request_id: str) -> bool:
    """Whether a cancel of ``request_id`` stops this message: the request or its slice."""
    part = envelope.part
    return envelope.request_id == request_id or (part is not None and part.parent == request_id)


class Listeners:
    """The cancel listeners of one queue; each ``add`` returns its removal."""

    def __init__(self) -> None:
        self._listeners: list[CancelListener] = []

    def add(self, listener: CancelListener) -> Callable[[], None]:
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    def __bool__(self) -> bool:
        return bool(self._listeners)

    def emit(self, cancel: Cancel) -> None:
        """Tell every listener; ``dropped`` goes to the first only (counted once)."""
        for i, listener in enumerate(list(self._listeners)):
            try:
                listener(cancel if i == 0 else replace(cancel, dropped=()))
            except Exception:  # one broken listener must not keep the others uninformed
                log.exception("a cancel listener failed")
