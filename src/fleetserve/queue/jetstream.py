"""The distributed WorkQueue: NATS JetStream.

- One work-queue stream, ``<PREFIX>_WORK``, with one subject per model and class
  (``<prefix>.work.<model token>`` for batch work, ``...<model token>.i`` for
  interactive work). Its per-subject limit, with ``discard new``, is
  the bounded queue: a full model answers ``Overloaded`` at publish.
- One durable pull consumer per model and class, shared by every worker that serves it.
- The envelope travels in headers (``wire.headers``); bodies are never decoded here.
- Replies go over core NATS to ``<prefix>.reply.<node>``, one subject per gateway.
- ``dead_letter`` copies the message, with the reason, to ``<PREFIX>_DLQ``.

Pulling lives in ``js_pull.py``; the dead-letter stream in ``dlq.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..storage.outage import is_nats_outage
from ..wire import Envelope, Overloaded, Priority, Reply, Unavailable
from ..wire import headers as H
from .base import Message, QueueStats
from .cancels import CancelListener
from .dlq import DeadLetters
from .js_cancel import CancelChannel
from .js_health import (
    FULL,
    Backoff,
    Writes,
    probe_forever,
    probe_subject,
    storage_refusal,
    unconfirmed,
)
from .js_pull import Puller
from .nats_conn import connect
from .pending import Pending

log = logging.getLogger("fleetserve.queue")
# after a reconnect, gateways may still be resubscribing to their reply subjects for
# this long; a reply sent meanwhile (or while disconnected) may be dropped by NATS
RESUBSCRIBE_WINDOW = 2.0


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """What Settings decide about the streams and consumers."""

    prefix: str = "fleetserve"
    storage: str = "file"  # or "memory"
    replicas: int = 1  # copies of each stream across a NATS cluster (JetStream allows 1-5)
    max_depth: int = 1024  # per model: waiting plus in flight
    max_bytes: int = -1
    max_age: float = 3600.0  # seconds a request may sit in the stream
    max_deliver: int = 5
    ack_wait: float = 5.0
    dlq_max_age: float = 7 * 86400.0

    @property
    def stream(self) -> str:
        return f"{self.prefix.upper().replace('.', '_')}_WORK"

    def subject(self, model: str, priority: Priority = Priority.BATCH) -> str:
        """A model's lane for a class: batch work on ``<prefix>.work.<model>``, as
        before classes existed, interactive work on ``<prefix>.work.<model>.i``."""
        base = f"{self.prefix}.work.{H.subject_token(model)}"
        return base if priority is Priority.BATCH else f"{base}.i"


class JetStreamQueue:
    """WorkQueue over NATS JetStream, for gateways and workers in separate processes."""

    def __init__(
        self,
        url: str,
        options: StreamOptions | None = None,
        *,
        retry_after: float = 1.0,
        node: str | None = None,
        connect_for: float = 30.0,
        age_limit: float = 2.0,
        probe_interval: float = 2.0,
    ) -> None:
        self.url = url
        self.options = options or StreamOptions()
        self.retry_after = retry_after
        self.node = node or uuid.uuid4().hex[:12]
        self.connect_for = connect_for
        self.age_limit = age_limit  # seconds before batch work goes ahead of interactive
        self.stats = QueueStats()
        self.nc: Any = None
        self.js: Any = None
        self._pending: dict[str, Pending] = {}
        self._closed = True
        self._reply_subject = f"{self.options.prefix}.reply.{self.node}"
        self.puller: Puller | None = None
        self.dlq: DeadLetters | None = None
        self._reconnected_at = -1e9  # loop time of the last reconnect
        self._unsure: set[int] = set()  # deliveries whose final reply may have been lost
        self._streamed: set[int] = set()  # deliveries that sent chunks: never redone
        self._tasks: set[asyncio.Task[Any]] = set()
        self._cancels = CancelChannel(self.options.prefix)  # <prefix>.cancel, core NATS
        self.probe_interval = probe_interval  # seconds between write probes; 0: none
        # whether JetStream stores what is published; without probes, as a publish saw it
        self.writes = Writes(hold=None if probe_interval > 0 else retry_after)
        self._backoff = Backoff(what="pulls")  # a pull that failed while the broker is away

    # -- lifecycle ----------------------------------------------------------------
    async def start(self) -> None:
        self.nc = await connect(
            self.url,
            name=f"fleetserve-{self.node}",
            retry_for=self.connect_for,
            on_disconnect=self._on_disconnect,
            on_reconnect=self._on_reconnect,
            closing=lambda: self._closed,
        )
        self.js = self.nc.jetstream()
        await self._ensure_stream()
        self.dlq = DeadLetters(self.nc, self.js, self.options, self.stats)
        await self.dlq.ensure()
        await self.dlq.watch_max_deliveries()
        self.puller = Puller(
            self.nc, self.js, self.options, self.stats, self.dlq, age_limit=self.age_limit
        )
        await self.puller.start()
        await self.nc.subscribe(self._reply_subject, cb=self._on_reply)
        await self._cancels.start(self.nc)
        self._closed = False
        if self.probe_interval > 0:
            self._spawn(
                probe_forever(
                    self.writes, self.js, self.options, self.probe_interval, lambda: self.connected
                )
            )

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ensure_stream(self) -> None:
        from nats.js import api

        o = self.options
        config = api.StreamConfig(
            name=o.stream,
            subjects=[f"{o.prefix}.work.>", probe_subject(o)],  # the write probe's own
            retention=api.RetentionPolicy.WORK_QUEUE,
            storage=api.StorageType(o.storage),
            num_replicas=o.replicas,
            max_msgs_per_subject=o.max_depth,
            discard=api.DiscardPolicy.NEW,
            discard_new_per_subject=True,
            max_bytes=o.max_bytes,
            max_age=o.max_age,
            duplicate_window=min(120.0, o.max_age),
        )
        try:
            await self.js.add_stream(config)
        except Exception as exc:
            if getattr(exc, "err_code", None) != 10058:  # exists with another config
                raise
            await self.js.update_stream(config)

    async def close(self) -> None:
        if self._closed and self.nc is None:
            return
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        if self.puller is not None:
            await self.puller.close()
        for p in list(self._pending.values()):
            p.fail(Unavailable("the gateway is shutting down", retry_after=1))
        if self.nc is not None:
            with contextlib.suppress(Exception):  # unacked work is redelivered to others
                async with asyncio.timeout(2.0):
                    await self.nc.close()
        self.nc = None

    @property
    def connected(self) -> bool:
        return not self._closed and self.nc is not None and bool(self.nc.is_connected)

    @property
    def healthy(self) -> bool:
        """Connected, and JetStream stores what is published (``/readyz``)."""
        return self.connected and self.writes.refused is None

    def _on_disconnect(self) -> None:
        """With memory storage a lost server loses the work: waiting requests get 503.

        With file storage what JetStream accepted survives a restart of the server, so
        waiting requests keep waiting (until their deadline) for the reply that comes
        once it, this gateway and the workers are back.
        """
        if self._closed:
            return
        if self.puller is not None:
            self.puller.reset()
        if self.options.storage == "file":
            return
        err = Unavailable("lost the connection to the queue; retry", retry_after=self.retry_after)
        for p in list(self._pending.values()):
            p.fail(err)
        self._pending.clear()

    def _on_reconnect(self) -> None:
        self._reconnected_at = asyncio.get_running_loop().time()
        if self.puller is not None:
            self.puller.reset()
        if self.options.storage == "memory":  # a restarted server lost the streams
            self._spawn(self._restore_streams())

    async def _restore_streams(self) -> None:
        try:
            await self._ensure_stream()
            if self.dlq is not None:
                await self.dlq.ensure()
        except Exception as exc:
            log.warning("could not restore the streams after a reconnect: %s", exc)

    def _reply_may_be_lost(self) -> bool:
        """Sent now, would a reply reach a gateway? Not surely while reconnecting."""
        if self.nc is None or not self.nc.is_connected:
            return True  # buffered; flushed on reconnect, maybe before gateways resubscribe
        return asyncio.get_running_loop().time() - self._reconnected_at < RESUBSCRIBE_WINDOW

    # -- gateway side -------------------------------------------------------------
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
            await self.js.publish(
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

    async def _on_reply(self, msg: Any) -> None:
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

    def on_cancel(self, listener: CancelListener) -> Callable[[], None]:
        return self._cancels.on_cancel(listener)

    # -- worker side --------------------------------------------------------------
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
