"""The in-process WorkQueue: the embedded default.

One bounded FIFO per model; workers in the same event loop pull from it. Replies
resolve asyncio futures directly, so the reply bytes are handed over untouched.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Sequence

from ..wire import Envelope, Overloaded, Reply
from .base import Message, QueueStats
from .pending import Pending


class MemoryQueue:
    """A bounded per-model FIFO in one event loop."""

    def __init__(self, max_depth: int = 1024, retry_after: float = 1.0) -> None:
        self._max_depth = max_depth
        self._retry_after = retry_after
        self._queues: dict[str, deque[Message]] = {}
        self._inflight: dict[int, Message] = {}
        self._pending: dict[str, Pending] = {}
        self._ids = itertools.count(1)
        self._arrived = asyncio.Event()
        self._closed = False
        self.stats = QueueStats()
        self.dead: deque[tuple[Message, str]] = deque(maxlen=1000)

    async def start(self) -> None:
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        self._arrived.set()

    @property
    def healthy(self) -> bool:
        return not self._closed

    def depth(self, model: str) -> int:
        q = self._queues.get(model)
        return len(q) if q else 0

    async def refresh(self, models: Sequence[str]) -> None:
        return None

    async def publish(self, envelope: Envelope, body: bytes, payload: str | None = None) -> Pending:
        q = self._queues.setdefault(envelope.model, deque())
        if len(q) >= self._max_depth:
            raise Overloaded(
                f"queue for {envelope.model!r} is full ({self._max_depth} waiting)",
                retry_after=self._retry_after,
            )
        pending = Pending(envelope.request_id, self._forget)
        self._pending[envelope.request_id] = pending
        q.append(Message(envelope, body, next(self._ids), payload=payload))
        self._arrived.set()
        return pending

    async def pull(self, models: Sequence[str], budget: int, timeout: float) -> list[Message]:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not self._closed:
            got = self._take(models, budget)
            if got:
                return got
            self._arrived.clear()
            left = end - loop.time()
            if left <= 0:
                return []
            try:
                async with asyncio.timeout(left):
                    await self._arrived.wait()
            except TimeoutError:
                return []
        return []

    def _take(self, models: Sequence[str], budget: int) -> list[Message]:
        taken: list[Message] = []
        spent = 0
        while True:
            # oldest first across the requested models
            best: deque[Message] | None = None
            for m in models:
                q = self._queues.get(m)
                if q and (best is None or q[0].delivery_id < best[0].delivery_id):
                    best = q
            if best is None:
                break
            cost = best[0].envelope.cost_hint
            if taken and spent + cost > budget:
                break
            msg = best.popleft()
            self._inflight[msg.delivery_id] = msg
            taken.append(msg)
            spent += cost
        return taken

    async def ack(self, msg: Message) -> None:
        self._inflight.pop(msg.delivery_id, None)

    async def nak(self, msg: Message, delay: float = 0.0) -> None:
        if msg.delivery_id not in self._inflight:
            return
        if delay > 0:
            asyncio.get_running_loop().call_later(delay, self._requeue, msg)
        else:
            self._requeue(msg)

    def _requeue(self, msg: Message) -> None:
        if self._inflight.pop(msg.delivery_id, None) is None:
            return  # finished meanwhile
        msg.attempts += 1
        self.stats.bump(self.stats.redeliveries, msg.envelope.model)
        self._queues.setdefault(msg.envelope.model, deque()).appendleft(msg)
        self._arrived.set()

    async def touch(self, msg: Message) -> None:
        return None  # nothing here is redelivered by timeout

    async def term(self, msg: Message) -> None:
        self._inflight.pop(msg.delivery_id, None)

    async def dead_letter(self, msg: Message, reason: str) -> None:
        if self._inflight.pop(msg.delivery_id, None) is not None:
            self.stats.bump(self.stats.dead_letters, msg.envelope.model)
            self.dead.append((msg, reason))

    async def reply(self, msg: Message, reply: Reply) -> None:
        rid = msg.envelope.request_id
        pending = self._pending.pop(rid, None) if reply.final else self._pending.get(rid)
        if pending is not None:
            pending.resolve(reply)

    def _forget(self, request_id: str) -> None:
        self._pending.pop(request_id, None)
