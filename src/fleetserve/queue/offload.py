"""Payload offload as a WorkQueue wrapper: large bodies and results travel by reference.

- The gateway's body over the threshold goes to the payload store; the message carries
  its key (``Fleetserve-Payload``) and an empty body.
- The worker reads it back at pull. A key that is gone sends the message to the
  dead-letter stream with the reason, and the client gets a 500.
- A result over the threshold goes the same way; the gateway reads it, then deletes
  both objects when the request completes or times out. The TTL sweeper
  (``storage.sweep_forever``) removes what a crashed process left behind.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence

from ..storage import Offload, PayloadMissing
from ..wire import Envelope, InternalError, Reply, Unavailable
from .base import Message, PendingReply, QueueStats, WorkQueue
from .cancels import CancelListener

log = logging.getLogger("fleetserve.offload")


class _Pending:
    def __init__(self, inner: PendingReply, offload: Offload, envelope: Envelope) -> None:
        self._inner = inner
        self._offload = offload
        self._env = envelope

    async def wait(self, timeout: float) -> Reply:
        done = False
        try:
            reply = await self._inner.wait(timeout)
            done = True
            if reply.payload is not None:
                reply.body = await self._offload.load(reply.payload)
                reply.payload = None
            return reply
        finally:
            # a caller that gives up before the deadline leaves the objects to the sweeper:
            # the request may still be running, and its worker still needs the body
            if done or time.time() >= self._env.deadline:
                await self._offload.discard(self._env.request_id)

    async def stream(self, timeout: float) -> AsyncGenerator[Reply, None]:
        """Chunks pass through; only the final reply may be offloaded."""
        done = False
        try:
            async for reply in self._inner.stream(timeout):
                if reply.payload is not None:
                    reply.body = await self._offload.load(reply.payload)
                    reply.payload = None
                done = reply.final
                yield reply
        finally:
            if done or time.time() >= self._env.deadline:
                await self._offload.discard(self._env.request_id)

    def cancel(self) -> None:
        self._inner.cancel()


class OffloadingQueue:
    """Wraps any WorkQueue; everything but payloads passes straight through."""

    def __init__(self, inner: WorkQueue, offload: Offload) -> None:
        self.inner = inner
        self.offload = offload

    @property
    def stats(self) -> QueueStats:
        return self.inner.stats

    @property
    def healthy(self) -> bool:
        return self.inner.healthy

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    async def publish(
        self, envelope: Envelope, body: bytes, payload: str | None = None
    ) -> _Pending:
        key = await self.offload.stash(envelope.request_id, "in", body)
        try:
            if key is None:
                pending = await self.inner.publish(envelope, body, payload)
            else:
                pending = await self.inner.publish(envelope, b"", key)
        except BaseException:
            await self.offload.discard(envelope.request_id)
            raise
        return _Pending(pending, self.offload, envelope)

    async def pull(
        self,
        models: Sequence[str],
        budget: int,
        timeout: float,
        *,
        interactive_only: bool = False,
    ) -> list[Message]:
        out: list[Message] = []
        got = await self.inner.pull(models, budget, timeout, interactive_only=interactive_only)
        away = False  # the store failed once in this pull: the rest are not tried
        for i, msg in enumerate(got):
            if msg.payload is None or time.time() > msg.envelope.deadline:
                out.append(msg)  # expired work is dropped unread by the worker
                continue
            if away:  # each would wait out its own timeout on a store that hangs
                await self.inner.nak(msg, 1.0)
                continue
            try:
                msg.body = await self.offload.load(msg.payload)
            except PayloadMissing as exc:
                err = InternalError("the request's offloaded body is missing", field="payload")
                reply = Reply(content_type=msg.envelope.accept, error=err.to_body())
                await self.inner.reply(msg, reply)
                await self.inner.dead_letter(msg, f"payload missing: {exc}")
                continue
            except Unavailable:  # an outage (storage/outage.py, logged there): again later
                away = True
                log.warning(
                    "could not read %s's body: the payload store is away; "
                    "put back with the rest of the pull",
                    msg.envelope.request_id,
                )
                await self.inner.nak(msg, 1.0)
                continue
            except Exception:  # a bug, not an outage: it raises; the pull goes back first
                for m in [*out, *got[i:]]:
                    with contextlib.suppress(Exception):
                        await self.inner.nak(m)
                raise
            out.append(msg)
        return out

    async def reply(self, msg: Message, reply: Reply) -> None:
        if reply.error is None and reply.final:
            key = await self.offload.stash(msg.envelope.request_id, "out", reply.body)
            if key is not None:
                reply = Reply(b"", reply.content_type, timings=reply.timings, payload=key)
        await self.inner.reply(msg, reply)

    async def ack(self, msg: Message) -> None:
        await self.inner.ack(msg)

    async def nak(self, msg: Message, delay: float = 0.0) -> None:
        await self.inner.nak(msg, delay)

    async def touch(self, msg: Message) -> None:
        await self.inner.touch(msg)

    async def term(self, msg: Message) -> None:
        await self.inner.term(msg)

    async def dead_letter(self, msg: Message, reason: str) -> None:
        await self.inner.dead_letter(msg, reason)

    def depth(self, model: str) -> int:
        return self.inner.depth(model)

    async def refresh(self, models: Sequence[str]) -> None:
        await self.inner.refresh(models)

    async def cancel(self, request_id: str, until: float) -> None:
        """Its payloads stay for the sweeper: a worker may be reading the body now."""
        await self.inner.cancel(request_id, until)

    def on_cancel(self, listener: CancelListener) -> Callable[[], None]:
        return self.inner.on_cancel(listener)
