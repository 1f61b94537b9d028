"""The hooks without servers: the null tracer, parsing trace context, the settings,
the exporters, sampling, and the trace context in the NATS headers."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from fleetserve.settings import Settings
from fleetserve.tracing import NULL_REQUEST, NULL_SPAN, NULL_TRACER, Tracer, open_tracer
from fleetserve.tracing.export import exporter_for, provider_from
from fleetserve.tracing.otel import OtelTracer, context_of, route_of
from fleetserve.wire import Encoding, Envelope, Reply, Task
from fleetserve.wire import headers as H

from .conftest import CLIENT_PARENT, CLIENT_TRACE, traced


def envelope(**kw: Any) -> Envelope:
    base: dict[str, Any] = {
        "request_id": "r1",
        "model": "org/m",
        "task": Task.ENCODE,
        "content_type": Encoding.JSON,
        "accept": Encoding.JSON,
        "cost_hint": 3,
        "deadline": time.time() + 30,
        "enqueued_at": time.time(),
    }
    return Envelope(**{**base, **kw})


def scope(*headers: tuple[bytes, bytes], path: str = "/v1/encode/org/m") -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": path, "headers": list(headers)}


async def _send(message: Any) -> None:
    return None


def test_the_null_tracer_hands_everything_back_untouched() -> None:
    env = envelope()
    trace = NULL_TRACER.request(scope())
    assert trace is NULL_REQUEST
    assert trace.watch(_send) is _send
    assert trace.stamp(env) is env
    assert NULL_TRACER.reply(env) is NULL_SPAN
    with NULL_TRACER.reply(env, error="x") as span:
        assert span is NULL_SPAN
    assert NULL_TRACER.pulled(env, 1) is None
    assert NULL_TRACER.batch(env, 0.0, 1.0, 1, 0.1) is None
    assert not NULL_TRACER.enabled


def test_the_trace_context_rides_in_the_nats_headers() -> None:
    env = envelope(traceparent=CLIENT_PARENT, tracestate="fs=1,other=2")
    h = H.envelope_headers(env, "reply.here")
    assert h["traceparent"] == CLIENT_PARENT and h["tracestate"] == "fs=1,other=2"
    back = H.routed_from_headers(h).envelope
    assert (back.traceparent, back.tracestate) == (CLIENT_PARENT, "fs=1,other=2")
    plain = H.envelope_headers(envelope(), "reply.here")
    assert "traceparent" not in plain and "tracestate" not in plain
    assert H.routed_from_headers(plain).envelope.traceparent is None


@pytest.mark.parametrize(
    "value",
    ["", "garbage", f"{CLIENT_PARENT}-x", "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
     "01-" + "a" * 32, "\u00ff" * 40, "00-" + CLIENT_TRACE + "-" + "0" * 16 + "-01"],
)  # fmt: skip
def test_a_malformed_traceparent_names_no_parent(value: str) -> None:
    assert context_of(value) is None
    assert context_of(value, "fs=1") is None


def test_a_wellformed_traceparent_names_its_parent() -> None:
    assert context_of(CLIENT_PARENT) is not None
    assert context_of(CLIENT_PARENT, "=bad,,") is not None  # a bad tracestate is dropped


def test_span_names_use_the_route_template() -> None:
    assert route_of("/v1/encode/org/model-1") == "/v1/encode/{model}"
    assert route_of("/v1/generate/x") == "/v1/generate/{model}"
    assert route_of("/v1/embeddings") == "/v1/embeddings"


def test_the_worker_does_not_trace_what_the_gateway_did_not() -> None:
    tracer, exporter = traced("wk")
    env = envelope()  # no trace context
    tracer.pulled(env, 1)
    tracer.batch(env, time.time(), time.time(), 1, 0.0)
    with tracer.reply(env) as span:
        assert span is NULL_SPAN
    assert exporter.get_finished_spans() == ()


async def test_a_reply_span_records_the_exception_that_ends_it() -> None:
    tracer, exporter = traced("wk")
    trace = tracer.request(scope())
    env = trace.stamp(envelope())
    with pytest.raises(RuntimeError), tracer.reply(env):
        raise RuntimeError("the connection is gone")
    await trace.watch(_send)({"type": "http.response.start", "status": 503})
    trace.replied(Reply(error={"error": {"code": "unavailable"}}, timings={"queue_ms": 1.5}))
    trace.end()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["fleetserve.reply"].status.status_code.name == "ERROR"
    assert spans["fleetserve.reply"].events[0].name == "exception"
    gw = spans["POST /v1/encode/{model}"]
    assert gw.status.status_code.name == "ERROR"
    assert gw.attributes is not None and gw.attributes["http.response.status_code"] == 503
    event = gw.events[0]
    assert event.name == "fleetserve.reply.received"
    assert event.attributes == {"queue_ms": 1.5, "fleetserve.error": "unavailable"}


def test_unsampled_requests_export_nothing_but_still_carry_the_decision() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF, resource=Resource.create({}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = OtelTracer(provider)
    trace = tracer.request(scope())
    env = trace.stamp(envelope())
    assert env.traceparent is not None and int(env.traceparent[-2:], 16) & 1 == 0  # not sampled
    tracer.pulled(env, 1)
    with tracer.reply(env):
        pass
    trace.end()
    assert exporter.get_finished_spans() == ()


def test_settings_turn_tracing_on(caplog: pytest.LogCaptureFixture) -> None:
    assert not Settings().tracing
    assert open_tracer(Settings(), "gateway") is NULL_TRACER
    assert Settings.load(env={"FLEETSERVE_TRACING": "1"}).tracing
    parser = argparse.ArgumentParser()
    Settings.add_arguments(parser)
    args = vars(parser.parse_args(["--tracing", "--otlp-endpoint", "http://c:4318"]))
    on = Settings.load(cli=args, overrides={"service_name": "edge"})
    assert (on.tracing, on.otlp_endpoint, on.trace_sample_ratio) == (True, "http://c:4318", 1.0)
    with caplog.at_level(logging.WARNING, "fleetserve.tracing"):
        tracer = open_tracer(on, "gateway")
    try:
        assert isinstance(tracer, OtelTracer)
        assert tracer.provider.resource.attributes["service.name"] == "edge"
    finally:
        tracer.shutdown()
    with pytest.raises(ValueError, match="trace-sample-ratio"):
        provider_from(Settings(tracing=True, trace_sample_ratio=1.5), "worker")


def test_the_default_service_name_says_the_role() -> None:
    provider = provider_from(Settings(tracing=True), "worker")
    try:
        assert provider.resource.attributes["service.name"] == "fleetserve-worker"
        assert provider.resource.attributes["fleetserve.role"] == "worker"
    finally:
        provider.shutdown()


def test_without_the_otlp_exporter_spans_go_to_the_console(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("grpc", "http"):  # the package, and its module another test imported
        for mod in ("", ".trace_exporter"):
            monkeypatch.setitem(sys.modules, f"opentelemetry.exporter.otlp.proto.{name}{mod}", None)
    with caplog.at_level(logging.WARNING, "fleetserve.tracing"):
        assert isinstance(exporter_for("http://127.0.0.1:4318"), ConsoleSpanExporter)
        assert isinstance(exporter_for("127.0.0.1:4317"), ConsoleSpanExporter)
    assert "opentelemetry-exporter-otlp" in caplog.text
    assert isinstance(exporter_for(""), ConsoleSpanExporter)


def test_without_the_extra_tracing_is_off_and_says_how_to_install(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "fleetserve.tracing.otel", None)
    with caplog.at_level(logging.WARNING, "fleetserve.tracing"):
        tracer: Tracer = open_tracer(Settings(tracing=True), "server")
    assert tracer is NULL_TRACER
    assert "pip install 'fleetserve[otel]'" in caplog.text
