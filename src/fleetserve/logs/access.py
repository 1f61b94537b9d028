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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import clip, kv

log = logging.getLogger("fleetserve.access")
# no "/": a worker names the parts of a request "{id}/{attempt}/{start}"
_ID = re.compile(r"[A-Za-z0-9._:+=-]{1,128}")
# probes and scrapes: their lines at debug level (a load balancer asks every second)
PROBES = frozenset({"/healthz", "/readyz", "/metrics"})
PROBE_HEADER = "x-fleetserve-probe"  # fleetserve's own polling (the cluster's): debug too
# what the header may quiet: GETs of what fleetserve polls itself (cluster.supervisor)
POLLED = PROBES | {"/v1/models"}
FIELD_MAX = 200  # model, tenant, code and path in the line: cut to this many characters


def request_id(given: str | None) -> str:
    """The client's ``x-request-id`` if it is a sane token (at most 128 characters,
    no spaces or control characters), else a new one."""
    if given is not None and _ID.fullmatch(given):
        return given
    return uuid.uuid4().hex


def _header(scope: Mapping[str, Any], name: bytes) -> str | None:
    for k, v in scope.get("headers") or ():
        if k == name:
            return bytes(v).decode("latin-1")
    return None


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
    probe: bool = False  # sent PROBE_HEADER: fleetserve's own polling (see ``quiet``)
    given_id: bool = False  # ``request_id`` is the client's (``x-request-id``)

    @classmethod
    def of(cls, scope: Mapping[str, object]) -> Access:
        """The record of an ASGI HTTP request: its id (the client's if sane), declared
        size and whether it says it is fleetserve's own polling."""
        given = _header(scope, b"x-request-id")
        rid = request_id(given)
        access = cls(str(scope.get("method", "")), str(scope.get("path", "")), rid)
        access.given_id = rid == given
        declared = _header(scope, b"content-length")
        access.bytes_in = int(declared) if declared is not None and declared.isdigit() else None
        access.probe = _header(scope, PROBE_HEADER.encode()) is not None
        return access

    def envelope_id(self) -> str:
        """The id the request goes to the queue under: unique even when two clients send
        the same ``x-request-id`` (it keys the pending replies and JetStream's
        de-duplication), which stays its prefix. Responses and logs say the client's."""
        if not self.given_id:
            return self.request_id
        return f"{self.request_id}.{uuid.uuid4().hex[:8]}"

    def quiet(self, status: int) -> bool:
        """Whether the line is at debug level: a GET of a probe or scrape path, or a
        successful GET of what fleetserve polls itself that says so (the header alone
        hides nothing else: any client can send it)."""
        if self.method != "GET":
            return False
        return self.path in PROBES or (self.probe and self.path in POLLED and status < 400)

    def total_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1e3

    def emit(self) -> None:
        """Log the line: info, warning for 5xx (499: the client hung up, info); probes
        and metric scrapes at debug."""
        status = self.status or 499  # no response started: the client went away
        level = logging.WARNING if status >= 500 else logging.INFO
        if self.quiet(status):
            level = logging.DEBUG
        if not log.isEnabledFor(level):
            return
        fields = kv(
            model=_clip(self.model),
            tenant=_clip(self.tenant),
            code=_clip(self.code),
            id=self.request_id,
            priority=self.priority,
            queue_ms=_ms(self.queue_ms),
            inference_ms=_ms(self.inference_ms),
            bytes_in=self.bytes_in,
            bytes_out=self.bytes_out,
        )
        path = clip(self.path, FIELD_MAX)
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


def _clip(v: str | None) -> str | None:
    return None if v is None else clip(v, FIELD_MAX)


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


__all__ = ["POLLED", "PROBES", "PROBE_HEADER", "Access", "request_id"]
