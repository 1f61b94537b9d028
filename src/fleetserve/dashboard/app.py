"""The dashboard: a raw-ASGI sub-app that the gateway hands its routes to.

- ``GET /dashboard``: the page; ``GET /dashboard/static/<file>``: its scripts and styles;
- ``GET /dashboard/events``: server-sent events when a view's data changes;
- each view's JSON under its prefix, e.g. ``GET /v1/tuning/runs`` or ``GET /v1/fleet``
  (see ``views.py``).

The gateway tells it of every answered request (``observe``: the fleet view's
throughput and latency), and the server attaches the fleet view's source at start.

With an API key set, the page and its static files are open (they hold no data; the
page asks for the key), while the events and every view's data need
``Authorization: Bearer <key>``. Errors have the one shape
``{"error": {"code", "message", "field"}}``, and never carry a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from ..gateway.errors import body_response, error_response
from ..gateway.http import Receive, Scope, Send, header, respond
from ..settings import Settings
from ..wire import Encoding, FleetError, InternalError, NotFound
from ..wire.codec import accept_of
from . import events
from .assets import Asset, load_static, render_page
from .fleet import FleetView
from .fleet_sources import FleetSource
from .views import View, default_views

log = logging.getLogger("fleetserve.dashboard")

Authorize = Callable[[Scope], None]
PAGE = "/dashboard"
STATIC = "/dashboard/static/"
EVENTS = "/dashboard/events"


class Dashboard:
    def __init__(
        self,
        views: Sequence[View],
        *,
        authorize: Authorize | None = None,
        tick_s: float = 0.5,
        stream_s: float = 60.0,
        keepalive_s: float = 15.0,
    ) -> None:
        self.views = list(views)
        self._authorize = authorize
        self._tick_s = tick_s
        self._stream_s = stream_s
        self._keepalive_s = keepalive_s
        self._static = load_static()
        self._page = render_page(self._static, [v.script for v in self.views])
        self._closing = asyncio.Event()
        self._versions: tuple[float, dict[str, str]] = (-1.0, {})
        self._versions_lock = asyncio.Lock()
        self.fleet = next((v for v in self.views if isinstance(v, FleetView)), None)

    @classmethod
    def from_settings(cls, settings: Settings, authorize: Authorize | None = None) -> Dashboard:
        return cls(default_views(settings), authorize=authorize)

    def handles(self, path: str) -> bool:
        if path == PAGE or path.startswith(PAGE + "/"):
            return True
        return any(path.startswith(v.prefix) for v in self.views)

    def attach_fleet(self, source: FleetSource) -> None:
        """Where the fleet view reads the fleet (the server's parts), once they exist."""
        if self.fleet is not None:
            self.fleet.attach(source)

    def observe(self, model: str, seconds: float) -> None:
        """One answered request (the gateway's hot path: a deque append)."""
        if self.fleet is not None:
            self.fleet.recent.observe(model, seconds)

    def close(self) -> None:
        """End the open event streams (at shutdown)."""
        self._closing.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        accept = accept_of(header(scope, b"accept"), Encoding.JSON)
        try:
            if scope["method"] != "GET":
                raise NotFound(f"no route for {scope['method']} {path}", field="path")
            if path in (PAGE, PAGE + "/"):
                await self._asset(scope, send, self._page)
            elif path.startswith(STATIC):
                asset = self._static.get(path[len(STATIC) :])
                if asset is None:
                    raise NotFound(f"no dashboard file {path[len(STATIC) :]!r}", field="path")
                await self._asset(scope, send, asset)
            elif path == EVENTS:
                self._check(scope)
                await self._events(receive, send)
            else:
                await self._data(scope, send, path, accept)
        except FleetError as err:
            await respond(send, *error_response(err, accept))
        except Exception:
            log.exception("dashboard failure on %s", path)
            await respond(send, *error_response(InternalError("internal error"), accept))

    async def _data(self, scope: Scope, send: Send, path: str, accept: Encoding) -> None:
        for view in self.views:
            if path.startswith(view.prefix):
                self._check(scope)
                body = await view.data(path[len(view.prefix) :])
                status, headers, payload = body_response(200, body, accept)
                headers.append((b"cache-control", b"no-store"))
                await respond(send, status, headers, payload)
                return
        raise NotFound(f"no route for GET {path}", field="path")

    async def _asset(self, scope: Scope, send: Send, asset: Asset) -> None:
        if header(scope, b"if-none-match") == asset.etag.decode():
            await respond(send, 304, [(b"etag", asset.etag)], b"")
        else:
            await respond(send, 200, asset.headers(), asset.body)

    async def _events(self, receive: Receive, send: Send) -> None:
        try:
            await events.stream(
                receive,
                send,
                self.versions,
                closing=self._closing,
                tick_s=self._tick_s,
                max_s=self._stream_s,
                keepalive_s=self._keepalive_s,
            )
        except Exception:  # the response has started: nothing left to tell the client
            log.exception("dashboard event stream failed")

    def _check(self, scope: Scope) -> None:
        if self._authorize is not None:
            self._authorize(scope)

    async def versions(self) -> dict[str, str]:
        """Every view's version, computed at most once a tick for all open streams."""
        async with self._versions_lock:
            at, cached = self._versions
            now = time.monotonic()
            if now - at < self._tick_s / 2:
                return cached
            out = {}
            for view in self.views:
                try:
                    out[view.name] = await view.version()
                except Exception:
                    log.exception("dashboard view %s: version failed", view.name)
                    out[view.name] = cached.get(view.name, "")
            self._versions = (now, out)
            return out


__all__ = ["Dashboard"]
