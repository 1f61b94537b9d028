"""Where spans go: a TracerProvider built from the settings.

- ``--otlp-endpoint`` set and ``opentelemetry-exporter-otlp`` installed: OTLP, over
  gRPC when the endpoint's port is 4317 (and the gRPC exporter is there), else over
  HTTP/protobuf (``/v1/traces`` is added to an endpoint without a path);
- otherwise the console exporter (JSON per span on stdout), saying why once.

The resource names the process: ``service.name`` is ``--service-name``, or
``fleetserve-<role>`` (``fleetserve-gateway``, ``fleetserve-worker``,
``fleetserve-server`` for the embedded server). Sampling follows the parent (the
client's ``traceparent``, or the gateway's for a worker); a new trace is kept with
probability ``--trace-sample-ratio``.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING
from urllib.parse import urlparse

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

    from ..settings import Settings

log = logging.getLogger("fleetserve.tracing")
OTLP_HINT = "pip install opentelemetry-exporter-otlp"


def provider_from(settings: Settings, role: str) -> TracerProvider:
    """A provider with a batching processor in front of the settings' exporter."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

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
    """OTLP to ``endpoint`` when it is set and the exporter is installed, else the console."""
    if endpoint:
        found = _otlp(endpoint)
        if found is not None:
            return found
        log.warning(
            "--otlp-endpoint %s is set but the OTLP exporter is not installed (%s): "
            "spans go to the console",
            endpoint,
            OTLP_HINT,
        )
    else:
        log.info("tracing: no --otlp-endpoint, spans go to the console")
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    return ConsoleSpanExporter()


def _otlp(endpoint: str) -> SpanExporter | None:
    url = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
    if url.port == 4317:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter as GrpcExporter,
            )

            grpc: SpanExporter = GrpcExporter(endpoint=url.geturl(), insecure=url.scheme == "http")
            return grpc
        except ImportError:
            pass
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter as HttpExporter,
        )
    except ImportError:
        return None
    full = url.geturl() if url.path not in ("", "/") else url._replace(path="/v1/traces").geturl()
    http: SpanExporter = HttpExporter(endpoint=full)
    return http
