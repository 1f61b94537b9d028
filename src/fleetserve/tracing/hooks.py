"""The tracing hooks every stage calls, and their null objects: what ``tracing.otel``
implements as OpenTelemetry spans. Below the package's ``__init__``, which picks the
tracer and imports ``otel`` only when tracing is on, so that ``otel`` need not import it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..wire import Envelope, Reply

Scope = MutableMapping[str, Any]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


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
