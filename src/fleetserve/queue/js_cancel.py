"""Cancels across machines: core-NATS messages on ``<prefix>.cancel``.

A gateway publishes one message per cancelled request (headers only: its request id
and its deadline); every worker's JetStream queue subscribes and tells its listeners.
Nothing is stored: a worker that was not connected when a cancel went out runs the
work (the gateway drops the reply), as it did before cancels existed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..wire import headers as H
from .cancels import Cancel, CancelListener, Listeners

if TYPE_CHECKING:
    from nats.aio.client import Client

log = logging.getLogger("fleetserve.queue")
DEFAULT_TTL = 600.0  # a cancel that carries no deadline is kept this long


class CancelChannel:
    def __init__(self, prefix: str) -> None:
        self.subject = f"{prefix}.cancel"
        self.listeners = Listeners()
        self._nc: Client | None = None

    async def start(self, nc: Client) -> None:
        """Subscribe (nats-py subscribes again by itself after a reconnect)."""
        self._nc = nc
        await nc.subscribe(self.subject, cb=self._on_msg)

    def on_cancel(self, listener: CancelListener) -> Callable[[], None]:
        return self.listeners.add(listener)

    async def send(self, request_id: str, until: float) -> None:
        """Tell every worker; a failure is logged, never raised (the client is gone)."""
        if self._nc is None:
            return
        headers = {H.REQUEST_ID: request_id, H.DEADLINE: f"{until:.6f}"}
        try:
            await self._nc.publish(self.subject, b"", headers=headers)
        except Exception as exc:
            log.warning("could not send the cancel of %s: %s", request_id, exc)

    async def _on_msg(self, msg: Any) -> None:
        hdrs = msg.headers or {}
        rid = hdrs.get(H.REQUEST_ID)
        if not rid:
            return
        try:
            until = float(hdrs.get(H.DEADLINE) or "")
        except ValueError:
            until = time.time() + DEFAULT_TTL
        self.listeners.emit(Cancel(rid, until))
