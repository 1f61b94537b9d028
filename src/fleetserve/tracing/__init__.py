"""Traces across the queue: OpenTelemetry spans for one request, end to end.

One request is one trace, across processes:

- ``fleetserve.gateway`` (SERVER): the HTTP request, from its first byte to its
  response; it continues a client's ``traceparent`` (a malformed one starts afresh);
- ``fleetserve.queue.wait`` (CONSUMER): from the publish to a worker pulling it;
- ``fleetserve.worker.batch``: from the pull through batch forming to the end of the
  forward pass of the batch that held the request's last item;
- ``fleetserve.reply`` (PRODUCER): postprocessing and publishing the reply; the
  gateway's span records a ``fleetserve.reply.received`` event when it arrives (a
  stream's span also ``fleetserve.reply.first_chunk`` when its first chunk does).

The worker's spans are children of the gateway's, whose W3C trace context rides in
the envelope (``Envelope.traceparent``/``tracestate``): in the ``traceparent`` and
``tracestate`` NATS headers in distributed mode, in the envelope itself in memory.

Off (the default), or without the ``otel`` extra, every hook here is a no-op on a
shared null object: nothing of OpenTelemetry is imported and nothing is allocated
per request. ``open_tracer`` picks the real tracer (``tracing.otel``) from settings.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..settings import Settings
    from ..wire import Envelope, Reply

log = logging.getLogger("fleetserve.tracing")

Scope = MutableMapping[str, Any]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
INSTALL_HINT = "install the extra: pip install 'fleetserve[otel]'"


class RequestTrace:
    """The gateway's span of one HTTP request; this base class records nothing."""

    __slots__ = ()

    def watch(self, send: Send) -> Send:
        """``send``, seen by the span (it records the response status)."""
        return send

    def stamp(self, env: Envelope) -> Envelope:
        """``env`` carrying this span's trace context to the worker."""
        return env

    def replied(self, reply: Reply) -> None:
        """The worker's reply arrived (for a stream: its first chunk, then its last)."""

    def end(self) -> None:
        """The response is sent."""


class Span:
    """A worker-side span in a ``with`` block; this base class records nothing."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


NULL_REQUEST = RequestTrace()
NULL_SPAN = Span()


class Tracer:
    """The hooks at the stage boundaries of the request path. This base class is the
    null tracer: tracing off, each hook is one method call that does nothing."""

    enabled = False

    def request(self, scope: Scope) -> RequestTrace:
        """The gateway: an inference request came in (``scope`` is its ASGI scope)."""
        return NULL_REQUEST

    def pulled(self, env: Envelope, attempts: int) -> None:
        """A worker pulled ``env``: its wait in the queue ends now."""

    def batch(self, env: Envelope, start: float, end: float, items: int, infer_s: float) -> None:
        """``env``'s items went through batches from ``start`` to ``end`` (``time.time()``)."""

    def reply(self, env: Envelope, start: float | None = None, error: str | None = None) -> Span:
        """A span around sending ``env``'s reply (from ``start``: its postprocessing)."""
        return NULL_SPAN

    def shutdown(self) -> None:
        """Flush what is still buffered for the exporter."""


NULL_TRACER = Tracer()


def open_tracer(settings: Settings, role: str) -> Tracer:
    """The tracer ``settings`` ask for, for a process of ``role`` (``server``,
    ``gateway``, ``worker``): the null tracer unless ``--tracing`` is on. Without the
    ``otel`` extra it says how to install it and runs without traces."""
    if not settings.tracing:
        return NULL_TRACER
    try:
        from .export import provider_from
        from .otel import OtelTracer
    except ImportError as exc:
        log.warning("--tracing is on but OpenTelemetry is missing (%s): %s", exc, INSTALL_HINT)
        return NULL_TRACER
    return OtelTracer(provider_from(settings, role))


__all__ = [
    "NULL_REQUEST",
    "NULL_SPAN",
    "NULL_TRACER",
    "RequestTrace",
    "Span",
    "Tracer",
    "open_tracer",
]
