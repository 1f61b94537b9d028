"""One request is one trace across a real gateway, a real nats-server and a real worker.

The gateway and the worker run as their processes' services in one thread, each
traced by a provider of its own (its own resource and in-memory exporter): the
worker's spans can find their parent only in the message's NATS headers, which a
plain subscriber to the work subjects reads too.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fleetserve.cluster import NatsServer
from fleetserve.gateway.process import GatewayProcess
from fleetserve.worker.process import WorkerProcess

from ..conftest import tiny_settings
from ..services import Services
from .conftest import (
    CLIENT_PARENT,
    CLIENT_SPAN,
    CLIENT_TRACE,
    TINY_ROUTE,
    check_one_trace,
    gateway_span,
    spans_of,
    traced,
)

BODY = {"inputs": ["a traced request"]}


class Stack:
    def __init__(self, running: Services, gateway: GatewayProcess) -> None:
        self.running = running
        self.url = f"http://127.0.0.1:{gateway.port}"
        self.gw: InMemorySpanExporter = InMemorySpanExporter()
        self.wk: InMemorySpanExporter = InMemorySpanExporter()
        self.published: dict[str, dict[str, str]] = {}  # request id -> the NATS headers

    def post(self, headers: Any = None) -> tuple[httpx.Response, str]:
        rid = uuid.uuid4().hex
        hdrs = [(b"x-request-id", rid.encode()), *(headers or [])]
        r = httpx.post(self.url + TINY_ROUTE, json=BODY, headers=hdrs, timeout=30)
        assert r.status_code == 200, r.text
        return r, rid

    def headers_of(self, rid: str, timeout: float = 5.0) -> dict[str, str]:
        """The NATS headers of the message for the client's ``rid`` (the queue's id is
        ``rid`` itself or, when the client named it, ``rid`` with a unique suffix)."""
        end = time.monotonic() + timeout
        while True:
            for key, h in list(self.published.items()):
                if key == rid or key.startswith(rid + "."):
                    return h
            if time.monotonic() > end:
                raise AssertionError(f"no message for {rid}")
            time.sleep(0.01)


@pytest.fixture(scope="module")
def stack(tiny_catalog: Path, nats_server: NatsServer) -> Iterator[Stack]:
    prefix = f"trace{time.monotonic_ns()}"
    settings = tiny_settings(
        tiny_catalog,
        nats=nats_server.url,
        queue_prefix=prefix,
        stream_storage="memory",
        worker_port=0,
    )
    (gw_tracer, gw_exp), (wk_tracer, wk_exp) = traced("gw"), traced("wk")
    procs: dict[str, Any] = {}
    published: dict[str, dict[str, str]] = {}

    def build() -> list[Any]:
        worker, gateway = WorkerProcess(settings), GatewayProcess(settings)
        worker.tracer, gateway.tracer = wk_tracer, gw_tracer  # read when they start
        procs.update(worker=worker, gateway=gateway)
        return [worker, gateway]

    with Services(build=build) as running:

        async def listen() -> Any:  # what went over the wire, as any NATS client sees it
            nc = await nats.connect(nats_server.url)

            async def seen(msg: Any) -> None:
                h = dict(msg.headers or {})
                published[h.get("Fleetserve-Request-Id", "")] = h

            await nc.subscribe(f"{prefix}.work.>", cb=seen)
            await nc.flush()
            return nc

        nc = running.call(listen())
        st = Stack(running, procs["gateway"])
        st.gw, st.wk, st.published = gw_exp, wk_exp, published
        try:
            yield st
        finally:
            running.call(nc.close())


def test_one_request_is_one_trace_across_the_queue(stack: Stack) -> None:
    _, rid = stack.post()
    gw = gateway_span(stack.gw, rid)
    assert gw.parent is None  # no traceparent from the client: a new trace
    spans = spans_of(gw.context.trace_id, [stack.gw, stack.wk], 4)
    check_one_trace(spans)
    # each side exported its own: the worker's three spans, under its own resource
    assert len(spans_of(gw.context.trace_id, [stack.wk], 3)) == 3
    for s in spans_of(gw.context.trace_id, [stack.wk], 3):
        assert s.resource.attributes["service.name"] == "wk"
        assert s.parent is not None and s.parent.is_remote  # it came from outside
    assert gw.resource.attributes["service.name"] == "gw"
    # the W3C header on the NATS message names the gateway's span
    sent = stack.headers_of(rid)
    ctx = gw.context
    assert sent["traceparent"] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    assert "tracestate" not in sent


def test_a_client_traceparent_is_continued(stack: Stack) -> None:
    _, rid = stack.post([(b"traceparent", CLIENT_PARENT.encode()), (b"tracestate", b"fs=t1")])
    gw = gateway_span(stack.gw, rid)
    assert gw.context.trace_id == int(CLIENT_TRACE, 16)
    assert gw.parent is not None and gw.parent.span_id == int(CLIENT_SPAN, 16)
    check_one_trace(spans_of(int(CLIENT_TRACE, 16), [stack.gw, stack.wk], 4))
    sent = stack.headers_of(rid)
    assert sent["traceparent"].split("-")[1] == CLIENT_TRACE
    assert sent["tracestate"] == "fs=t1"


MALFORMED: list[list[tuple[bytes, bytes]]] = [
    [(b"traceparent", b"garbage")],
    [(b"traceparent", b"00-" + b"0" * 32 + b"-" + CLIENT_SPAN.encode() + b"-01")],  # zero id
    [(b"traceparent", b"ff-" + CLIENT_TRACE.encode() + b"-" + CLIENT_SPAN.encode() + b"-01")],
    [(b"traceparent", CLIENT_PARENT.encode() + b"-extra")],  # version 00 takes no more
    [(b"traceparent", b"00-" + b"a" * 600)],  # too long
    [(b"traceparent", b"\xff\xfe-\xc3\xa9")],  # not even ASCII
    [(b"traceparent", b""), (b"tracestate", b"fs=t1")],  # a tracestate alone
]


def test_a_malformed_traceparent_gets_a_200_and_a_fresh_trace(stack: Stack) -> None:
    for headers in MALFORMED:
        _, rid = stack.post(headers)
        gw = gateway_span(stack.gw, rid)
        assert gw.parent is None, headers
        assert gw.context.trace_id != int(CLIENT_TRACE, 16)
        check_one_trace(spans_of(gw.context.trace_id, [stack.gw, stack.wk], 4))


def test_a_malformed_tracestate_is_dropped_and_the_trace_continues(stack: Stack) -> None:
    _, rid = stack.post([(b"traceparent", CLIENT_PARENT.encode()), (b"tracestate", b"=,\xff=")])
    gw = gateway_span(stack.gw, rid)
    assert gw.context.trace_id == int(CLIENT_TRACE, 16)
    assert "tracestate" not in stack.headers_of(rid)


def test_an_error_before_the_queue_is_a_traced_4xx(stack: Stack) -> None:
    r = httpx.post(stack.url + "/v1/encode/no/such-model", json=BODY, timeout=10)
    assert r.status_code == 404
    end = time.monotonic() + 5
    while time.monotonic() < end:
        codes = [
            (s.attributes or {}).get("http.response.status_code")
            for s in stack.gw.get_finished_spans()
            if (s.attributes or {}).get("url.path") == "/v1/encode/no/such-model"
        ]
        if codes:
            break
        time.sleep(0.01)
    assert codes == [404]
