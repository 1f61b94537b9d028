"""Payload offload as queue wrappers: large bodies and results travel by reference.

- The gateway's body over the threshold goes to the payload store; the message carries
  its key (``Fleetserve-Payload``) and an empty body.
- The worker reads it back at pull. A key that is gone sends the message to the
  dead-letter stream with the reason, and the client gets a 500.
- A result over the threshold goes the same way; the gateway reads it, then deletes
  both objects when the request completes or times out. The TTL sweeper
  (``storage.sweep_forever``) removes what a crashed process left behind.

:class:`OffloadingPublisher` wraps the gateway's side, :class:`OffloadingConsumer`
(``offload_consumer.py``) the worker's; :class:`OffloadingQueue` both, for a worker
that also publishes (the slices of a large request).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator

from ..storage import Offload
from ..wire import Envelope, Reply
from .base import PendingReply, Publisher, WorkQueue
from .offload_consumer import OffloadingConsumer

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


class OffloadingPublisher:
    """Wraps a Publisher: a large body goes to the store, a large result comes from it."""

    def __init__(self, publisher: Publisher, offload: Offload) -> None:
        self.publisher = publisher
        self.offload = offload

    @property
    def healthy(self) -> bool:
        return self.publisher.healthy

    async def start(self) -> None:
        await self.publisher.start()

    async def close(self) -> None:
        await self.publisher.close()

    async def publish(
        self, envelope: Envelope, body: bytes, payload: str | None = None
    ) -> _Pending:
        key = await self.offload.stash(envelope.request_id, "in", body)
        try:
            if key is None:
                pending = await self.publisher.publish(envelope, body, payload)
            else:
                pending = await self.publisher.publish(envelope, b"", key)
        except BaseException:
            await self.offload.discard(envelope.request_id)
            raise
        return _Pending(pending, self.offload, envelope)

    async def cancel(self, request_id: str, until: float) -> None:
        """Its payloads stay for the sweeper: a worker may be reading the body now."""
        await self.publisher.cancel(request_id, until)


class OffloadingQueue(OffloadingPublisher, OffloadingConsumer):
    """Wraps both sides of one queue (started and closed once, through the publisher)."""

    def __init__(self, inner: WorkQueue, offload: Offload) -> None:
        OffloadingPublisher.__init__(self, inner, offload)
        OffloadingConsumer.__init__(self, inner, offload)
