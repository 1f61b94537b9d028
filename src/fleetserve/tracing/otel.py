"""The real tracer: the hooks of ``fleetserve.tracing`` as OpenTelemetry spans.

Imported only when tracing is on. The spans never read or change the ambient
OpenTelemetry context: the gateway's parent is the client's ``traceparent`` (or
none), the worker's is the trace context that came with the envelope. So the trace
crosses the queue only in what the message carries, in every mode.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time
from collections.abc import MutableMapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .hooks import NULL_SPAN, RequestTrace, Scope, Send, Span, Tracer

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.util.types import Attributes

    from ..wire import Envelope, Reply

_PROPAGATOR = TraceContextTextMapPropagator()  # W3C, whatever the global propagator is
_Attrs = dict[str, str | int | float]
_NATIVE = ("encode", "score", "extract", "generate")  # /v1/<task>/{model}
MAX_HEADER = 512  # characters of traceparent or tracestate we read (the SDK's limit)
_MAX_MEMBERS = 32  # W3C tracestate list members
# a tracestate member, as W3C (and the SDK's parser) spells it: key=value
_KEY = r"[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13}"
_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_MEMBER = re.compile(f"(?:{_KEY})=(?:{_VALUE})")


def _ns(t: float) -> int:
    return int(t * 1e9)


def context_of(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    """The parent a W3C trace context names; ``None`` when it is absent or malformed.

    What the propagator would warn about (a ``traceparent`` over 512 characters, a
    ``tracestate`` it cannot parse) is settled here first, quietly: a client must not
    be able to write a log line per request. A bad ``tracestate`` is dropped."""
    if not traceparent or len(traceparent) > MAX_HEADER:
        return None  # a fresh trace
    carrier = {"traceparent": traceparent}
    if tracestate and _quiet_state(tracestate):
        carrier["tracestate"] = tracestate
    try:
        ctx = _PROPAGATOR.extract(carrier)
    except Exception:  # never fail a request over its tracing headers
        return None
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def _quiet_state(tracestate: str) -> bool:
    """Whether ``tracestate`` parses without a warning: at most 512 characters and 32
    well-formed ``key=value`` members (duplicate keys the SDK drops quietly itself)."""
    if len(tracestate) > MAX_HEADER:
        return False
    members = [m for m in (m.strip(" \t") for m in tracestate.split(",")) if m]
    return len(members) <= _MAX_MEMBERS and all(_MEMBER.fullmatch(m) for m in members)


@functools.lru_cache(maxsize=1024)
def _envelope_context(traceparent: str | None, tracestate: str | None) -> Context | None:
    """``context_of``, remembered: a worker reads each envelope's three times (and the
    propagator keeps none longer than the W3C limits, 55 and 512 characters)."""
    return context_of(traceparent, tracestate)


def route_of(path: str) -> str:
    """The route template for span names: ``/v1/encode/{model}``, ``/v1/embeddings``."""
    parts = path.split("/", 3)
    if len(parts) == 4 and parts[1] == "v1" and parts[2] in _NATIVE:
        return f"/v1/{parts[2]}/{{model}}"
    return path


def _headers(scope: Scope) -> tuple[str | None, str | None]:
    """The request's ``traceparent`` (the first) and ``tracestate`` (joined)."""
    parent: str | None = None
    states: list[str] = []
    for k, v in scope.get("headers") or ():
        if k == b"traceparent" and parent is None:
            parent = bytes(v).decode("latin-1")
        elif k == b"tracestate":
            states.append(bytes(v).decode("latin-1"))
    return parent, ",".join(states) or None


def _envelope_attributes(env: Envelope) -> dict[str, str | int]:
    """What the gateway's span says of the request (the worker's repeat only the first
    two: the SDK's cost grows with every attribute)."""
    out: dict[str, str | int] = {
        "fleetserve.request_id": env.request_id,
        "fleetserve.model": env.model,
        "fleetserve.task": env.task.value,
        "fleetserve.tenant": env.tenant,
        "fleetserve.priority": env.priority.value,
        "fleetserve.cost_hint": env.cost_hint,
    }
    if env.adapter is not None:
        out["fleetserve.adapter"] = env.adapter
    return out


class _Request(RequestTrace):
    __slots__ = ("span",)

    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def watch(self, send: Send) -> Send:
        span = self.span

        async def watched(message: MutableMapping[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                status = int(message.get("status", 0))
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
            await send(message)

        return watched

    def stamp(self, env: Envelope) -> Envelope:
        self.span.set_attributes(_envelope_attributes(env))
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, trace.set_span_in_context(self.span, Context()))
        if "traceparent" not in carrier:
            return env
        return dataclasses.replace(
            env, traceparent=carrier["traceparent"], tracestate=carrier.get("tracestate")
        )

    def replied(self, reply: Reply) -> None:
        attrs: dict[str, float | str] = {k: float(v) for k, v in reply.timings.items()}
        if reply.error is not None:
            attrs["fleetserve.error"] = str(reply.error.get("error", {}).get("code", "unknown"))
        # a stream's first chunk (its time to first token), then its final reply
        name = "fleetserve.reply.received" if reply.final else "fleetserve.reply.first_chunk"
        self.span.add_event(name, attrs)

    def end(self) -> None:
        self.span.end()


class _Live(Span):
    """A worker span in a ``with`` block: ended on exit, an exception recorded."""

    __slots__ = ("span",)

    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self.span.record_exception(exc)
            self.span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        self.span.end()


class OtelTracer(Tracer):
    """Spans from ``provider`` (its resource names the process, its processors export)."""

    enabled = True

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("fleetserve")

    def request(self, scope: Scope) -> RequestTrace:
        parent, state = _headers(scope)
        method = str(scope.get("method", "POST"))
        path = str(scope.get("path", ""))
        route = route_of(path)
        attrs: Attributes = {
            "http.request.method": method,
            "http.route": route,
            "url.path": path,
        }
        span = self.tracer.start_span(
            f"{method} {route}",
            context=context_of(parent, state) or Context(),  # malformed: a fresh trace
            kind=SpanKind.SERVER,
            attributes=attrs,
        )
        return _Request(span)

    def _start(
        self, name: str, env: Envelope, kind: SpanKind, start: float, extra: _Attrs
    ) -> trace.Span | None:
        if len(env.traceparent or "") > 64 or len(env.tracestate or "") > 512:
            return None  # not what a gateway sends
        ctx = _envelope_context(env.traceparent, env.tracestate)
        if ctx is None:  # the gateway did not trace it: neither does the worker
            return None
        attrs: _Attrs = {
            "fleetserve.request_id": env.request_id,
            "fleetserve.model": env.model,
            **extra,
        }
        if env.part is not None:  # a slice another worker put back
            attrs["fleetserve.part"] = env.part.header()
        return self.tracer.start_span(
            name, context=ctx, kind=kind, start_time=_ns(start), attributes=attrs
        )

    def pulled(self, env: Envelope, attempts: int) -> None:
        now = time.time()
        start = min(env.enqueued_at or now, now)  # another host's clock may run ahead
        extra: _Attrs = {"fleetserve.attempt": attempts, "messaging.operation.type": "receive"}
        span = self._start("fleetserve.queue.wait", env, SpanKind.CONSUMER, start, extra)
        if span is not None:
            span.end(end_time=_ns(now))

    def batch(self, env: Envelope, start: float, end: float, items: int, infer_s: float) -> None:
        extra: _Attrs = {"fleetserve.items": items, "fleetserve.inference_ms": infer_s * 1e3}
        span = self._start("fleetserve.worker.batch", env, SpanKind.INTERNAL, start, extra)
        if span is not None:
            span.end(end_time=_ns(max(end, start)))

    def reply(self, env: Envelope, start: float | None = None, error: str | None = None) -> Span:
        at = time.time() if start is None else start
        extra: _Attrs = {"messaging.operation.type": "send"}
        if error is not None:
            extra["fleetserve.error"] = error
        span = self._start("fleetserve.reply", env, SpanKind.PRODUCER, at, extra)
        return NULL_SPAN if span is None else _Live(span)

    def shutdown(self) -> None:
        self.provider.shutdown()
