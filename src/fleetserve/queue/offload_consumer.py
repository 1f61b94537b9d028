"""The worker's side of payload offload (``offload.py``): bodies read back at pull,
large results stashed at reply; everything else passes straight through."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from ..storage import Offload, PayloadMissing
from ..wire import InternalError, Reply, Unavailable
from .base import Consumer, Message, QueueStats
from .cancels import CancelListener

log = logging.getLogger("fleetserve.offload")


class OffloadingConsumer:
    """Wraps a Consumer: an offloaded body is read back, a large result stashed."""

    def __init__(self, consumer: Consumer, offload: Offload) -> None:
        self.consumer = consumer
        self.offload = offload

    @property
    def stats(self) -> QueueStats:
        return self.consumer.stats

    @property
    def healthy(self) -> bool:
        return self.consumer.healthy

    async def start(self) -> None:
        await self.consumer.start()

    async def close(self) -> None:
        await self.consumer.close()

    async def pull(
        self,
        models: Sequence[str],
        budget: int,
        timeout: float,
        *,
        interactive_only: bool = False,
    ) -> list[Message]:
        out: list[Message] = []
        got = await self.consumer.pull(models, budget, timeout, interactive_only=interactive_only)
        away = False  # the store failed once in this pull: the rest are not tried
        for i, msg in enumerate(got):
            if msg.payload is None or time.time() > msg.envelope.deadline:
                out.append(msg)  # expired work is dropped unread by the worker
                continue
            if away:  # each would wait out its own timeout on a store that hangs
                await self.consumer.nak(msg, 1.0)
                continue
            try:
                msg.body = await self.offload.load(msg.payload)
            except PayloadMissing as exc:
                err = InternalError("the request's offloaded body is missing", field="payload")
                reply = Reply(content_type=msg.envelope.accept, error=err.to_body())
                await self.consumer.reply(msg, reply)
                await self.consumer.dead_letter(msg, f"payload missing: {exc}")
                continue
            except Unavailable:  # an outage (storage/outage.py, logged there): again later
                away = True
                log.warning(
                    "could not read %s's body: the payload store is away; "
                    "put back with the rest of the pull",
                    msg.envelope.request_id,
                )
                await self.consumer.nak(msg, 1.0)
                continue
            except Exception:  # a bug, not an outage: it raises; the pull goes back first
                for m in [*out, *got[i:]]:
                    with contextlib.suppress(Exception):
                        await self.consumer.nak(m)
                raise
            out.append(msg)
        return out

    async def reply(self, msg: Message, reply: Reply) -> None:
        if reply.error is None and reply.final:
            key = await self.offload.stash(msg.envelope.request_id, "out", reply.body)
            if key is not None:
                reply = Reply(b"", reply.content_type, timings=reply.timings, payload=key)
        await self.consumer.reply(msg, reply)

    async def ack(self, msg: Message) -> None:
        await self.consumer.ack(msg)

    async def nak(self, msg: Message, delay: float = 0.0) -> None:
        await self.consumer.nak(msg, delay)

    async def touch(self, msg: Message) -> None:
        await self.consumer.touch(msg)

    async def term(self, msg: Message) -> None:
        await self.consumer.term(msg)

    async def dead_letter(self, msg: Message, reason: str) -> None:
        await self.consumer.dead_letter(msg, reason)

    def depth(self, model: str) -> int:
        return self.consumer.depth(model)

    async def refresh(self, models: Sequence[str]) -> None:
        await self.consumer.refresh(models)

    def on_cancel(self, listener: CancelListener) -> Callable[[], None]:
        return self.consumer.on_cancel(listener)
