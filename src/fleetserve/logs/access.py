"""One access log line per HTTP request, errors included.

The gateway fills an :class:`Access` as it learns things (model, tenant, the reply's
queue and inference timings) and logs it when the response is done:

``22:52:41 INFO  access: POST /v1/encode/m 200 12.3ms model=m tenant=default
id=4f1c... in=24 out=1834 queue_ms=0.41 inference_ms=8.2``

Only these fields are logged: never headers, query strings or bodies (which may
carry keys).
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from dataclasses import dataclass, field

from . import kv

log = logging.getLogger("fleetserve.access")
_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")
# probes and scrapes: their lines at debug level (a load balancer asks every second)
PROBES = frozenset({"/healthz", "/readyz", "/metrics"})
PROBE_HEADER = "x-fleetserve-probe"  # fleetserve's own polling (the cluster's): debug too


def request_id(given: str | None) -> str:
    """The client's ``x-request-id`` if it is a sane token (at most 128 characters,
    no spaces or control characters), else a new one."""
    if given is not None and _ID.fullmatch(given):
        return given
    return uuid.uuid4().hex


@dataclass(slots=True)
class Access:
    """What one request's access line says; ``status`` 0 until the response starts."""

    method: str
    path: str
    request_id: str
    t0: float = field(default_factory=time.perf_counter)
    status: int = 0
    bytes_in: int | None = None
    bytes_out: int = 0
    model: str | None = None
    tenant: str | None = None
    code: str | None = None  # the error code of a failed request
    priority: str | None = None
    queue_ms: float | None = None
    inference_ms: float | None = None
    probe: bool = False  # a probe or fleetserve's own polling: its line at debug level

    def total_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1e3

    def emit(self) -> None:
        """Log the line: info, warning for 5xx (499: the client hung up, info); probes
        and metric scrapes at debug."""
        status = self.status or 499  # no response started: the client went away
        level = logging.WARNING if status >= 500 else logging.INFO
        if self.probe or self.path in PROBES:
            level = logging.DEBUG
        if not log.isEnabledFor(level):
            return
        fields = kv(
            model=self.model,
            tenant=self.tenant,
            code=self.code,
            id=self.request_id,
            priority=self.priority,
            queue_ms=_ms(self.queue_ms),
            inference_ms=_ms(self.inference_ms),
            bytes_in=self.bytes_in,
            bytes_out=self.bytes_out,
        )
        path = self.path[:256]
        if not path.isprintable() or " " in path:  # decoded: no forged lines, no spaces
            path = json.dumps(path)
        log.log(
            level,
            "%s %s %d %.1fms",
            self.method,
            path,
            status,
            self.total_ms(),
            extra=fields,
        )


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


__all__ = ["Access", "request_id"]
