"""A worker's own small HTTP surface: ``/healthz``, ``/readyz`` and ``/metrics``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..metrics import Metrics

Scope = dict[str, Any]
_JSON = [(b"content-type", b"application/json")]
_TEXT = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]


class HealthApp:
    def __init__(
        self, metrics: Metrics, *, alive: Callable[[], bool], ready: Callable[[], bool]
    ) -> None:
        self.metrics = metrics
        self.alive = alive
        self.ready = ready

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/healthz":
            ok = self.alive()
            status, headers, body = (200 if ok else 503), _JSON, json.dumps({"alive": ok})
        elif path == "/readyz":
            ok = self.ready()
            status, headers, body = (200 if ok else 503), _JSON, json.dumps({"ready": ok})
        elif path == "/metrics":
            status, headers, body = 200, _TEXT, self.metrics.render().decode()
        else:
            status, headers, body = 404, _JSON, json.dumps({"error": {"code": "not_found"}})
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body.encode()})
