"""Real services in a thread with its own loop, each traced into its own in-memory
exporter, and helpers to read the finished spans."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from fleetserve.tracing.otel import OtelTracer

TINY_ROUTE = "/v1/encode/tiny/dense-bert"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
CLIENT_PARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


def traced(service: str) -> tuple[OtelTracer, InMemorySpanExporter]:
    """A tracer whose provider (resource ``service``) exports to memory at once."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OtelTracer(provider), exporter


def spans_of(
    trace_id: int, exporters: Sequence[InMemorySpanExporter], n: int, timeout: float = 10.0
) -> list[ReadableSpan]:
    """The finished spans of ``trace_id`` once there are ``n`` (workers end theirs after
    the reply is sent: it may reach the client first)."""
    end = time.monotonic() + timeout
    while True:
        got = [
            s
            for e in exporters
            for s in e.get_finished_spans()
            if s.context is not None and s.context.trace_id == trace_id
        ]
        if len(got) >= n or time.monotonic() > end:
            return got
        time.sleep(0.01)


def gateway_span(exporter: InMemorySpanExporter, request_id: str, timeout: float = 10.0) -> Any:
    """The gateway's server span of ``request_id`` (polled: it ends after the response)."""
    end = time.monotonic() + timeout
    while True:
        for s in exporter.get_finished_spans():
            if (
                s.kind is SpanKind.SERVER
                and (s.attributes or {}).get("fleetserve.request_id") == request_id
            ):
                return s
        if time.monotonic() > end:
            raise AssertionError(f"no gateway span for {request_id}")
        time.sleep(0.01)


def by_name(spans: Sequence[ReadableSpan]) -> dict[str, ReadableSpan]:
    out = {s.name: s for s in spans}
    assert len(out) == len(spans), [s.name for s in spans]
    return out


def check_one_trace(spans: Sequence[ReadableSpan]) -> ReadableSpan:
    """Gateway, queue wait, worker batch and reply: one trace, the worker's spans the
    gateway's children; returns the gateway's span."""
    named = by_name(spans)
    assert set(named) == {
        "POST /v1/encode/{model}",
        "fleetserve.queue.wait",
        "fleetserve.worker.batch",
        "fleetserve.reply",
    }
    gw = named["POST /v1/encode/{model}"]
    assert gw.context is not None
    for name in ("fleetserve.queue.wait", "fleetserve.worker.batch", "fleetserve.reply"):
        s = named[name]
        assert s.context is not None and s.parent is not None
        assert s.context.trace_id == gw.context.trace_id
        assert s.parent.span_id == gw.context.span_id, name
        assert s.attributes is not None
        assert s.attributes["fleetserve.model"] == "tiny/dense-bert"
        assert s.start_time is not None and gw.start_time is not None
        assert s.end_time is not None and gw.end_time is not None
        assert gw.start_time <= s.start_time <= s.end_time, name
        # the reply span may end just after the gateway's, which its publish woke
        assert s.start_time <= gw.end_time, name
        if name != "fleetserve.reply":
            assert s.end_time <= gw.end_time, name
    wait, batch = named["fleetserve.queue.wait"], named["fleetserve.worker.batch"]
    assert wait.end_time is not None and batch.start_time is not None
    assert wait.end_time <= batch.start_time  # the batch comes after the wait
    assert gw.attributes is not None and gw.attributes["http.response.status_code"] == 200
    assert [e.name for e in gw.events] == ["fleetserve.reply.received"]
    return gw
