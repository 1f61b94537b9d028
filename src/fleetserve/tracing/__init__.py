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
from typing import TYPE_CHECKING

from .hooks import NULL_REQUEST, NULL_SPAN, NULL_TRACER, RequestTrace, Span, Tracer

if TYPE_CHECKING:
    from ..settings import Settings

log = logging.getLogger("fleetserve.tracing")

INSTALL_HINT = "install the extra: pip install 'fleetserve[otel]'"


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
