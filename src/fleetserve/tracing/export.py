"""Where spans go: a TracerProvider built from the settings.

- ``--otlp-endpoint`` set: OTLP (the ``otel`` extra has the HTTP exporter). Port 4317
  without a path is OTLP/gRPC, the collectors' gRPC port: it needs the gRPC exporter,
  and without it the spans go to the console with a warning that names the package
  (HTTP sent to a gRPC port would be lost without a word). Anything else is OTLP/HTTP (protobuf):
  ``/v1/traces`` is appended to the endpoint's path unless it already ends with it, as
  for ``OTEL_EXPORTER_OTLP_ENDPOINT``;
- otherwise the console: one JSON line per span on stderr, where the logs go, so that
  stdout stays clean and line-based collectors see one record per line.

The resource names the process: ``service.name`` is ``--service-name``, or
``fleetserve-<role>`` (``fleetserve-gateway``, ``fleetserve-worker``,
``fleetserve-server`` for the embedded server). Sampling follows the parent (the
client's ``traceparent``, or the gateway's for a worker); a new trace is kept with
probability ``--trace-sample-ratio``.

Imported only when tracing is on (``open_tracer``), so the SDK is imported at the top.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

if TYPE_CHECKING:
    from ..settings import Settings

log = logging.getLogger("fleetserve.tracing")
OTLP_HINT = "pip install 'fleetserve[otel]': it has opentelemetry-exporter-otlp-proto-http"
GRPC_HINT = "pip install opentelemetry-exporter-otlp-proto-grpc"
GRPC_PORT = 4317
TRACES_PATH = "/v1/traces"


class LineConsoleExporter(ConsoleSpanExporter):
    """The console exporter, one compact JSON object per line on the current
    ``sys.stderr`` (looked up at each export, as the log handler does)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        out = sys.stderr
        out.write("".join(span.to_json(indent=None) + "\n" for span in spans))
        out.flush()
        return SpanExportResult.SUCCESS


def provider_from(settings: Settings, role: str) -> TracerProvider:
    """A provider with a batching processor in front of the settings' exporter."""
    ratio = settings.trace_sample_ratio
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"--trace-sample-ratio must be between 0 and 1, not {ratio}")
    resource = Resource.create(
        {
            "service.name": settings.service_name or f"fleetserve-{role}",
            "service.namespace": "fleetserve",
            "service.instance.id": f"{socket.gethostname()}-{os.getpid()}",
            "fleetserve.role": role,
        }
    )
    provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(BatchSpanProcessor(exporter_for(settings.otlp_endpoint)))
    return provider


def exporter_for(endpoint: str) -> SpanExporter:
    """OTLP to ``endpoint`` when it is set and its exporter is installed, else the console."""
    if not endpoint:
        log.info("tracing: no --otlp-endpoint, spans go to stderr")
        return LineConsoleExporter()
    url = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
    if url.port == GRPC_PORT and url.path in ("", "/"):
        grpc = _grpc(url.geturl(), insecure=url.scheme == "http")
        if grpc is not None:
            return grpc
        log.warning(
            "--otlp-endpoint %s is OTLP/gRPC (port %d) but the gRPC exporter is not "
            "installed (%s): spans go to stderr. For OTLP/HTTP, use port 4318",
            endpoint,
            GRPC_PORT,
            GRPC_HINT,
        )
        return LineConsoleExporter()
    http = _http(traces_url(endpoint))
    if http is not None:
        return http
    log.warning(
        "--otlp-endpoint %s is set but the OTLP exporter is not installed (%s): spans go to stderr",
        endpoint,
        OTLP_HINT,
    )
    return LineConsoleExporter()


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP URL for ``endpoint``: ``http://c:4318`` -> ``http://c:4318/v1/traces``,
    ``https://h/otlp`` -> ``https://h/otlp/v1/traces``; one that ends with it is kept."""
    url = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
    if url.path.endswith(TRACES_PATH):
        return url.geturl()
    return url._replace(path=url.path.rstrip("/") + TRACES_PATH).geturl()


def _grpc(endpoint: str, insecure: bool) -> SpanExporter | None:
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter as GrpcExporter,
        )
    except ImportError:
        return None
    exporter: SpanExporter = GrpcExporter(endpoint=endpoint, insecure=insecure)
    return exporter


def _http(endpoint: str) -> SpanExporter | None:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter as HttpExporter,
        )
    except ImportError:
        return None
    exporter: SpanExporter = HttpExporter(endpoint=endpoint)
    return exporter
