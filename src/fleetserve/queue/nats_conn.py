"""Connecting to NATS: a clear error and a retry with backoff, never a traceback.

nats-py reconnects by itself once connected; these callbacks log each change in one
line and tell the queue, so that it can fail waiting requests with a retryable 503.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..wire import Unavailable

log = logging.getLogger("fleetserve.nats")


def _nats() -> Any:
    try:
        import nats
    except ImportError:
        raise Unavailable(
            "the NATS queue needs nats-py; install the extra: pip install 'fleetserve[nats]'"
        ) from None
    return nats


def redact(url: str) -> str:
    """``nats://user:secret@host:4222`` without the secret."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"


async def connect(
    url: str,
    *,
    name: str,
    retry_for: float = 30.0,
    on_disconnect: Callable[[], None] | None = None,
    on_reconnect: Callable[[], None] | None = None,
    closing: Callable[[], bool] = lambda: False,
) -> Any:
    """Connect, retrying with backoff for ``retry_for`` seconds; raises ``Unavailable``."""
    nats = _nats()

    connected = False

    async def error_cb(exc: Exception) -> None:
        if closing() or not connected:  # the connect loop below reports its own attempts
            return
        log.warning("nats: %s: %s", type(exc).__name__, exc)

    async def disconnected_cb() -> None:
        if closing():
            return
        log.warning("lost the connection to NATS at %s; reconnecting", redact(url))
        if on_disconnect is not None:
            on_disconnect()

    async def reconnected_cb() -> None:
        log.warning("reconnected to NATS at %s", redact(url))
        if on_reconnect is not None:
            on_reconnect()

    loop = asyncio.get_running_loop()
    end = loop.time() + retry_for
    delay = 0.1
    attempt = 0
    while True:
        attempt += 1
        try:
            # nats-py would retry the first connect forever by itself; connect once and
            # retry here with backoff and a limit, then let it reconnect without end
            nc = await nats.connect(
                url,
                name=name,
                connect_timeout=2,
                allow_reconnect=True,
                max_reconnect_attempts=1,  # 0 or allow_reconnect=False hang in nats-py 2.16
                reconnect_time_wait=0.25,
                error_cb=error_cb,
                disconnected_cb=disconnected_cb,
                reconnected_cb=reconnected_cb,
                ping_interval=5,
            )
            nc.options["max_reconnect_attempts"] = -1
            connected = True
            return nc
        except Exception as exc:  # NoServersError, OSError, TimeoutError, ...
            left = end - loop.time()
            why = str(exc) or type(exc).__name__
            if left <= 0:
                raise Unavailable(
                    f"cannot reach NATS at {redact(url)} after {attempt} attempts: {why}",
                    retry_after=1.0,
                ) from None
            log.warning("cannot reach NATS at %s (%s); retrying in %.1fs", redact(url), why, delay)
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 5.0)
