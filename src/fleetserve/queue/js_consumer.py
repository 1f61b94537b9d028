"""The worker's side of the JetStream queue: pull, settle, reply, dead-letter.

One durable pull consumer per model and class, shared by every worker that serves
it; pulling lives in ``js_pull.py``. Replies go over core NATS to the subject the
publishing gateway named. ``dead_letter`` copies the message, with the reason, to
``<PREFIX>_DLQ`` (``dlq.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Unpack

from ..storage.outage import is_nats_outage
from ..wire import Priority, Reply, Unavailable
from ..wire import headers as H
from .base import Message
from .cancels import CancelListener
from .dlq import DeadLetters
from .js_health import Backoff
from .js_options import StreamOptions
from .js_pull import Puller
from .js_stream import JsLink, LinkOptions

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

log = logging.getLogger("fleetserve.queue")
# after a reconnect, gateways may still be resubscribing to their reply subjects for
# this long; a reply sent meanwhile (or while disconnected) may be dropped by NATS
RESUBSCRIBE_WINDOW = 2.0


class JsConsumer(JsLink):
    """The Consumer over NATS JetStream."""

    def __init__(
        self, url: str, options: StreamOptions | None = None, **link: Unpack[LinkOptions]
    ) -> None:
        super().__init__(url, options, **link)
        self.puller: Puller | None = None
        self.dlq: DeadLetters | None = None
        self._unsure: set[int] = set()  # deliveries whose final reply may have been lost
        self._streamed: set[int] = set()  # deliveries that sent chunks: never redone
        self._backoff = Backoff(what="pulls")  # a pull that failed while the broker is away

    async def _open(self, nc: Client, js: JetStreamContext) -> None:
        await super()._open(nc, js)
        self.dlq = DeadLetters(nc, js, self.options, self.stats)
        await self.dlq.ensure()
        await self.dlq.watch_max_deliveries()
        self.puller = Puller(nc, js, self.options, self.stats, self.dlq, age_limit=self.age_limit)
        await self.puller.start()

    async def _closing(self) -> None:
        await super()._closing()
        if self.puller is not None:
            await self.puller.close()

    def _disconnected(self) -> None:
        super()._disconnected()
        if self.puller is not None:
            self.puller.reset()

    def _reconnected(self) -> None:
        super()._reconnected()
        if self.puller is not None:
            self.puller.reset()

    async def _restore(self) -> None:
        await super()._restore()
        if self.dlq is not None:
            await self.dlq.ensure()

    def _reply_may_be_lost(self) -> bool:
        """Sent now, would a reply reach a gateway? Not surely while reconnecting."""
        if self.nc is None or not self.nc.is_connected:
            return True  # buffered; flushed on reconnect, maybe before gateways resubscribe
        return asyncio.get_running_loop().time() - self._reconnected_at < RESUBSCRIBE_WINDOW

    def on_cancel(self, listener: CancelListener) -> Callable[[], None]:
        return self._cancels.on_cancel(listener)

    def _puller(self) -> Puller:
        if self.puller is None:
            raise Unavailable("the queue is not started")
        return self.puller

    async def pull(
        self,
        models: Sequence[str],
        budget: int,
        timeout: float,
        *,
        interactive_only: bool = False,
    ) -> list[Message]:
        if self._closed:
            return []
        classes = (Priority.INTERACTIVE,) if interactive_only else tuple(Priority)
        loop = asyncio.get_running_loop()
        wait = self._backoff.wait(loop.time())
        if wait > 0:
            await asyncio.sleep(min(max(timeout, 0.01), wait))
            return []
        try:
            got = await self._puller().pull(models, budget, timeout, classes)
        except Exception as exc:  # any JetStream call the pull makes, while the broker is away
            if not is_nats_outage(exc):
                raise
            self._backoff.failed(loop.time(), exc)  # logged once, when the outage starts
            return []
        self._backoff.succeeded()  # and once when it ends
        return got

    async def ack(self, msg: Message) -> None:
        self._streamed.discard(msg.delivery_id)
        if msg.delivery_id in self._unsure and msg.attempts < self.options.max_deliver:
            # its reply may have been dropped around a reconnect: do it again once the
            # gateways are back (a gateway that got the first reply drops the second)
            self._unsure.discard(msg.delivery_id)
            log.info("redoing %s: its reply may have been lost", msg.envelope.request_id)
            await self._puller().settle(msg, "nak", RESUBSCRIBE_WINDOW)
            return
        self._unsure.discard(msg.delivery_id)
        await self._puller().settle(msg, "ack")

    async def nak(self, msg: Message, delay: float = 0.0) -> None:
        self._unsure.discard(msg.delivery_id)
        self._streamed.discard(msg.delivery_id)
        await self._puller().settle(msg, "nak", delay)

    async def touch(self, msg: Message) -> None:
        await self._puller().touch(msg)

    async def term(self, msg: Message) -> None:
        self._unsure.discard(msg.delivery_id)
        self._streamed.discard(msg.delivery_id)
        await self._puller().settle(msg, "term")

    async def dead_letter(self, msg: Message, reason: str) -> None:
        puller = self._puller()
        raw = puller.held(msg)
        if raw is None:
            return
        assert self.dlq is not None
        self._unsure.discard(msg.delivery_id)
        self._streamed.discard(msg.delivery_id)
        try:
            await self.dlq.put(raw, reason, msg.attempts)
        except Exception as exc:  # the broker is away: delivered again, dead-lettered then
            log.warning("could not dead-letter %s (%s); put back", msg.envelope.request_id, exc)
            await puller.settle(msg, "nak", 1.0)
            return
        await puller.settle(msg, "term")

    async def reply(self, msg: Message, reply: Reply) -> None:
        if not msg.reply_to:
            return
        if not reply.final:
            self._streamed.add(msg.delivery_id)
        elif msg.delivery_id not in self._streamed and self._reply_may_be_lost():
            self._unsure.add(msg.delivery_id)
        headers, body = H.reply_headers(reply)
        headers[H.REQUEST_ID] = msg.envelope.request_id
        try:
            if self.nc is None:
                raise Unavailable("the queue is closed")
            await self.nc.publish(msg.reply_to, body, headers=headers)
        except Exception as exc:  # the message stays unacked and is redelivered
            log.warning("reply to %s failed: %s", msg.envelope.request_id, exc)

    def depth(self, model: str) -> int:
        return self.puller.depth(model) if self.puller is not None else 0

    def oldest_wait(self, model: str) -> float:
        """Seconds ``model``'s oldest waiting message has waited (as of ``refresh``)."""
        return self.puller.oldest_wait(model) if self.puller is not None else 0.0

    async def refresh(self, models: Sequence[str]) -> None:
        if self.puller is not None and self.healthy:
            await self.puller.refresh(models)
