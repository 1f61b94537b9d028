"""Where spans go: one JSON line per span on stderr, and OTLP/HTTP for real, into a
receiver on loopback that decodes what the exporter sends."""

from __future__ import annotations

import gzip
import http.server
import json
import logging
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from fleetserve.tracing.export import LineConsoleExporter, exporter_for, traces_url

from ..conftest import ServerThread, tiny_settings
from .conftest import CLIENT_PARENT, CLIENT_SPAN, CLIENT_TRACE, TINY_ROUTE


def test_console_spans_are_one_json_line_each_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    exporter = exporter_for("")
    provider = TracerProvider(resource=Resource.create({"service.name": "lines"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    for name in ("first", "second"):
        with tracer.start_as_current_span(name, attributes={"k": "v\nw"}):
            pass
    provider.shutdown()
    out, err = capsys.readouterr()
    assert out == ""  # stdout is the program's, the logs and spans go to stderr
    # the spans' lines (a log line may sit among them: "spans go to stderr"); indented
    # JSON would give lines such as "{" alone, which do not parse
    lines = [line for line in err.splitlines() if line.startswith("{")]
    assert [json.loads(line)["name"] for line in lines] == ["first", "second"]
    assert json.loads(lines[0])["attributes"] == {"k": "v\nw"}


class Receiver(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP collector stand-in: keeps each POST's path, type and decoded body."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.got: list[tuple[str, str, ExportTraceServiceRequest]] = []
        self.received = threading.Event()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        req = ExportTraceServiceRequest.FromString(body)
        self.server.got.append((self.path, self.headers.get("content-type", ""), req))
        self.server.received.set()
        out = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rx = Receiver()
    thread = threading.Thread(target=rx.serve_forever, daemon=True)
    thread.start()
    yield rx
    rx.shutdown()
    rx.server_close()
    thread.join(5)


def test_spans_reach_an_otlp_http_collector(tiny_catalog: Path, receiver: Receiver) -> None:
    """A real server with ``--tracing`` and ``--otlp-endpoint`` (no path: the exporter
    posts to ``/v1/traces``); stopping it flushes the spans to the receiver."""
    settings = tiny_settings(tiny_catalog, tracing=True, otlp_endpoint=receiver.endpoint)
    srv = ServerThread(settings).start()
    rid = uuid.uuid4().hex
    try:
        headers = {"x-request-id": rid, "traceparent": CLIENT_PARENT}
        r = httpx.post(srv.url + TINY_ROUTE, json={"inputs": ["x"]}, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
    finally:
        srv.stop()  # shuts the tracer down: the batch processor flushes
    assert receiver.received.is_set()
    assert {(path, ctype) for path, ctype, _ in receiver.got} == {
        ("/v1/traces", "application/x-protobuf")
    }
    found = []  # (service.name, span) of the client's trace
    for _, _, req in receiver.got:
        for rs in req.resource_spans:
            attrs = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                found += [
                    (attrs["service.name"], s) for s in ss.spans if s.trace_id.hex() == CLIENT_TRACE
                ]
    gateway = [(svc, s) for svc, s in found if s.kind == PbSpan.SPAN_KIND_SERVER]
    assert len(gateway) == 1, found
    service, span = gateway[0]
    assert service == "fleetserve-server"
    assert span.name == "POST /v1/encode/{model}"
    assert span.parent_span_id.hex() == CLIENT_SPAN
    span_attrs = {kv.key: kv.value for kv in span.attributes}
    assert span_attrs["fleetserve.request_id"].string_value == rid
    assert span_attrs["http.response.status_code"].int_value == 200
    assert {s.name for _, s in found} >= {"fleetserve.queue.wait", "fleetserve.worker.batch"}


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("http://c:4318", "http://c:4318/v1/traces"),
        ("http://c:4318/", "http://c:4318/v1/traces"),
        ("c:4318", "http://c:4318/v1/traces"),
        ("https://h.example/otlp", "https://h.example/otlp/v1/traces"),
        ("http://c:4318/v1/traces", "http://c:4318/v1/traces"),
    ],
)
def test_the_http_exporter_posts_to_v1_traces(endpoint: str, url: str) -> None:
    assert traces_url(endpoint) == url
    exporter = exporter_for(endpoint)
    try:
        assert getattr(exporter, "_endpoint", None) == url
    finally:
        exporter.shutdown()


def test_the_grpc_port_without_the_grpc_exporter_says_what_to_install(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Port 4317 is OTLP/gRPC: OTLP/HTTP sent there would be lost without a word."""
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc", None)
    with caplog.at_level(logging.WARNING, "fleetserve.tracing"):
        exporter = exporter_for("http://127.0.0.1:4317")
    assert isinstance(exporter, LineConsoleExporter)
    assert "opentelemetry-exporter-otlp-proto-grpc" in caplog.text
    assert "4318" in caplog.text  # the OTLP/HTTP port, the other way
