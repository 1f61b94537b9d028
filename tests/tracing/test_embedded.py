"""Embedded mode: the trace context rides in the envelope through the memory queue;
tracing off, the request path never imports OpenTelemetry."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from fleetserve.server import EmbeddedServer

from ..conftest import tiny_settings
from ..services import Services
from .conftest import (
    CLIENT_PARENT,
    CLIENT_TRACE,
    TINY_ROUTE,
    check_one_trace,
    gateway_span,
    spans_of,
    traced,
)

ROOT = Path(__file__).resolve().parents[2]


def test_an_embedded_request_is_one_trace(tiny_catalog: Path) -> None:
    tracer, exporter = traced("embedded")
    servers: list[EmbeddedServer] = []

    def build() -> list[Any]:
        srv = EmbeddedServer(tiny_settings(tiny_catalog), console=Console(quiet=True))
        srv.tracer = srv.worker.tracer = tracer  # the gateway is built with it at start
        servers.append(srv)
        return [srv]

    with Services(build=build):
        url = f"http://127.0.0.1:{servers[0].port}{TINY_ROUTE}"
        rids = [uuid.uuid4().hex for _ in range(2)]
        parents = [None, CLIENT_PARENT]
        for rid, parent in zip(rids, parents, strict=True):
            hdrs = {"x-request-id": rid, **({"traceparent": parent} if parent else {})}
            r = httpx.post(url, json={"inputs": ["one", "two"]}, headers=hdrs, timeout=30)
            assert r.status_code == 200, r.text
        first, second = (gateway_span(exporter, rid) for rid in rids)
        spans = spans_of(first.context.trace_id, [exporter], 4)
        check_one_trace(spans)
        batch = next(s for s in spans if s.name == "fleetserve.worker.batch")
        assert batch.attributes["fleetserve.items"] == 2
        assert second.context.trace_id == int(CLIENT_TRACE, 16)
        check_one_trace(spans_of(second.context.trace_id, [exporter], 4))


OFF = textwrap.dedent(
    """
    import json, sys
    import httpx
    from tests.conftest import ServerThread, tiny_settings

    srv = ServerThread(tiny_settings(sys.argv[1])).start()
    try:
        r = httpx.post(srv.url + sys.argv[2], json={"inputs": ["x"]}, timeout=30)
        tracer = type(srv.server.gateway.tracer).__name__, type(srv.server.worker.tracer).__name__
    finally:
        srv.stop()
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
    print(json.dumps({"status": r.status_code, "tracer": tracer, "otel": loaded}))
    """
)


@pytest.mark.slow
def test_tracing_off_imports_no_opentelemetry(tiny_catalog: Path) -> None:
    """A fresh interpreter serves a request with tracing off (the default): the hooks
    are the null tracer's, and no ``opentelemetry`` module was ever imported."""
    out = subprocess.run(
        [sys.executable, "-c", OFF, str(tiny_catalog), TINY_ROUTE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"status": 200, "tracer": ["Tracer", "Tracer"], "otel": []}
