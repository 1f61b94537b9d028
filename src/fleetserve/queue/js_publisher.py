"""The gateway's side of the JetStream queue: publish, await replies, cancel.

Requests go to the work stream, one subject per model and class, with the envelope
in headers (``wire.headers``); bodies are never decoded here. Replies come back over
core NATS to ``<prefix>.reply.<node>``, one subject per gateway.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Unpack

from ..wire import Envelope, Overloaded, Unavailable
from ..wire import headers as H
from .js_health import FULL, storage_refusal, unconfirmed
from .js_options import StreamOptions
from .js_stream import JsLink, LinkOptions
from .pending import Pending

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.js import JetStreamContext

log = logging.getLogger("fleetserve.queue")


class JsPublisher(JsLink):
    """The Publisher over NATS JetStream."""

    def __init__(
        self, url: str, options: StreamOptions | None = None, **link: Unpack[LinkOptions]
    ) -> None:
        super().__init__(url, options, **link)
        self._pending: dict[str, Pending] = {}
        self._reply_subject = f"{self.options.prefix}.reply.{self.node}"

    async def _open(self, nc: Client, js: JetStreamContext) -> None:
        await super()._open(nc, js)
        await nc.subscribe(self._reply_subject, cb=self._on_reply)

    async def _closing(self) -> None:
        await super()._closing()
        for p in list(self._pending.values()):
            p.fail(Unavailable("the gateway is shutting down", retry_after=1))

    def _disconnected(self) -> None:
        """With memory storage a lost server loses the work: waiting requests get 503.

        With file storage what JetStream accepted survives a restart of the server, so
        waiting requests keep waiting (until their deadline) for the reply that comes
        once it, this gateway and the workers are back.
        """
        super()._disconnected()
        if self.options.storage == "file":
            return
        err = Unavailable("lost the connection to the queue; retry", retry_after=self.retry_after)
        for p in list(self._pending.values()):
            p.fail(err)
        self._pending.clear()

    async def publish(self, envelope: Envelope, body: bytes, payload: str | None = None) -> Pending:
        if not self.connected:
            raise Unavailable("not connected to the queue", retry_after=self.retry_after)
        if self.writes.refused is not None and self.probe_interval > 0:
            # answered at once until a probe finds JetStream storing again
            raise Unavailable(self.writes.refused, retry_after=self.retry_after)
        reconnected = self._reconnected_at
        pending = Pending(envelope.request_id, self._forget)
        self._pending[envelope.request_id] = pending
        headers = H.envelope_headers(envelope, self._reply_subject, payload)
        try:
            await self.context().publish(
                self.options.subject(envelope.model, envelope.priority),
                body,
                headers=headers,
                timeout=5,
            )
        except Exception as exc:
            pending.cancel()
            why = storage_refusal(exc)
            # a timeout while connected all along (not a publish lost in a reconnect):
            # JetStream answers nothing when its stream's store has failed (a full disk)
            lost = reconnected != self._reconnected_at
            if why is None and isinstance(exc, TimeoutError) and self.connected and not lost:
                why = unconfirmed(5)
            if why is not None:
                self.writes.refuse(why)
                raise Unavailable(why, retry_after=self.retry_after) from None
            if getattr(exc, "err_code", None) == FULL:
                raise Overloaded(
                    f"queue for {envelope.model!r} is full "
                    f"({self.options.max_depth} waiting or in flight)",
                    retry_after=self.retry_after,
                ) from None
            log.warning("could not enqueue %s: %r", envelope.request_id, exc)  # may name hosts
            raise Unavailable(
                f"could not enqueue: {type(exc).__name__}; retry",
                retry_after=self.retry_after,
            ) from None
        self.writes.accept()  # it stored: ready, whatever a probe or publish saw before
        return pending

    async def _on_reply(self, msg: Msg) -> None:
        rid = (msg.headers or {}).get(H.REQUEST_ID)
        pending = self._pending.get(rid) if rid else None
        if pending is None:
            return  # late, duplicate, or cancelled: dropped
        try:
            reply = H.reply_from_headers(msg.headers, msg.data)
        except Exception as exc:
            self._pending.pop(rid or "", None)
            pending.fail(exc)
            return
        if reply.final:
            self._pending.pop(rid or "", None)
        pending.resolve(reply)

    def _forget(self, request_id: str) -> None:
        self._pending.pop(request_id, None)

    async def cancel(self, request_id: str, until: float) -> None:
        self._forget(request_id)
        await self._cancels.send(request_id, until)
