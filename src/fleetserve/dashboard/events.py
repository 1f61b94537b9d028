"""``GET /dashboard/events``: server-sent events when a view's data changes.

The stream opens with ``hello`` (every view's version), then sends ``change`` (one view's
new version) whenever a version changes, and a comment every ``keepalive_s`` so that
proxies keep it open and a dead client is noticed. It ends after ``max_s`` (the page
reconnects at once and compares versions, so nothing is missed), when the client goes,
or when the server shuts down (``Dashboard.close``, called before the HTTP server stops:
uvicorn's graceful shutdown would otherwise wait for the open stream).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

from ..gateway.http import Receive, Send

log = logging.getLogger("fleetserve.dashboard")

Versions = Callable[[], Awaitable[dict[str, str]]]
HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache, no-store"),
    (b"x-accel-buffering", b"no"),
]


def event(name: str, data: object) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def stream(
    receive: Receive,
    send: Send,
    versions: Versions,
    *,
    closing: asyncio.Event,
    tick_s: float,
    max_s: float,
    keepalive_s: float,
) -> None:
    gone = asyncio.Event()
    watcher = asyncio.create_task(_watch_disconnect(receive, gone))
    loop = asyncio.get_running_loop()
    try:
        last = await versions()
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        hello = b"retry: 2000\n\n" + event("hello", {"versions": last})
        await send({"type": "http.response.body", "body": hello, "more_body": True})
        end = loop.time() + max_s
        ping = loop.time() + keepalive_s
        while not await _wait_any((gone, closing), tick_s):
            if loop.time() >= end:
                break  # time to reconnect
            current = await versions()
            chunk = b"".join(
                event("change", {"view": k, "version": v})
                for k, v in current.items()
                if last.get(k) != v
            )
            last = current
            if not chunk and loop.time() >= ping:
                chunk = b": ping\n\n"
            if chunk:
                ping = loop.time() + keepalive_s
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        watcher.cancel()


async def _watch_disconnect(receive: Receive, gone: asyncio.Event) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


async def _wait_any(events: tuple[asyncio.Event, ...], timeout: float) -> bool:
    """Whether one of ``events`` is set within ``timeout`` seconds."""
    if any(e.is_set() for e in events):
        return True
    waits = [asyncio.create_task(e.wait()) for e in events]
    done, pending = await asyncio.wait(waits, timeout=timeout, return_when="FIRST_COMPLETED")
    for t in pending:
        t.cancel()
    return bool(done)


__all__ = ["event", "stream"]
