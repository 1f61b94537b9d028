"""The in-process WorkQueue: the embedded default.

One bounded FIFO per model and priority class; workers in the same event loop pull
from it, interactive work first (oldest first across models), then batch work. Batch
work whose oldest message has waited ``age_limit`` seconds gets one message into a
pull that interactive work filled, so that it never starves. Replies resolve
asyncio futures directly, so the reply bytes are handed over untouched.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence

from ..wire import Envelope, Overloaded, Priority, Reply
from .base import Message, QueueStats
from .cancels import Cancel, CancelListener, Listeners, concerns
from .pending import Pending


class MemoryQueue:
    """A bounded per-model FIFO in one event loop."""

    def __init__(
        self, max_depth: int = 1024, retry_after: float = 1.0, age_limit: float = 2.0
    ) -> None:
        self._max_depth = max_depth
        self._retry_after = retry_after
        self._age_limit = age_limit
        self._queues: dict[tuple[str, Priority], deque[Message]] = {}
        self._inflight: dict[int, Message] = {}
        self._pending: dict[str, Pending] = {}
        self._ids = itertools.count(1)
        self._arrived = asyncio.Event()
        self._closed = False
        self.stats = QueueStats()
        self.dead: deque[tuple[Message, str]] = deque(maxlen=1000)
        self._cancels = Listeners()  # the workers in this process

    async def start(self) -> None:
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        self._arrived.set()

    @property
    def healthy(self) -> bool:
        return not self._closed

    def depth(self, model: str) -> int:
        return sum(len(self._queues.get((model, p), ())) for p in Priority)

    async def refresh(self, models: Sequence[str]) -> None:
        return None

    async def publish(self, envelope: Envelope, body: bytes, payload: str | None = None) -> Pending:
        q = self._queues.setdefault((envelope.model, envelope.priority), deque())
        if self.depth(envelope.model) >= self._max_depth:
            raise Overloaded(
                f"queue for {envelope.model!r} is full ({self._max_depth} waiting)",
                retry_after=self._retry_after,
            )
        pending = Pending(envelope.request_id, self._forget)
        self._pending[envelope.request_id] = pending
        q.append(Message(envelope, body, next(self._ids), payload=payload))
        self._arrived.set()
        return pending

    async def pull(
        self,
        models: Sequence[str],
        budget: int,
        timeout: float,
        *,
        interactive_only: bool = False,
    ) -> list[Message]:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not self._closed:
            got = self._take(models, budget, interactive_only)
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

    def _head(self, models: Sequence[str], priority: Priority) -> deque[Message] | None:
        """The lane of ``priority`` whose first message is oldest, across ``models``."""
        best: deque[Message] | None = None
        for m in models:
            q = self._queues.get((m, priority))
            if q and (best is None or q[0].delivery_id < best[0].delivery_id):
                best = q
        return best

    def _starving(self, models: Sequence[str]) -> bool:
        q = self._head(models, Priority.BATCH)
        return q is not None and time.time() - q[0].envelope.enqueued_at > self._age_limit

    def _take(
        self, models: Sequence[str], budget: int, interactive_only: bool = False
    ) -> list[Message]:
        """Interactive first, then batch, each oldest first across models, within the
        budget (the first always); batch work that waited ``age_limit`` gets one in."""
        taken: list[Message] = []
        spent = 0
        classes = (Priority.INTERACTIVE,) if interactive_only else tuple(Priority)
        for cls in classes:
            while (q := self._head(models, cls)) is not None:
                cost = q[0].envelope.cost_hint
                if taken and spent + cost > budget:
                    break
                taken.append(self._pop(q))
                spent += cost
        filled = all(m.envelope.interactive for m in taken)  # the budget went to queries
        if not interactive_only and filled and self._starving(models):
            q = self._head(models, Priority.BATCH)
            assert q is not None
            taken.append(self._pop(q))  # one old batch request as well
        return taken

    def _pop(self, q: deque[Message]) -> Message:
        msg = q.popleft()
        self._inflight[msg.delivery_id] = msg
        return msg

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
        lane = (msg.envelope.model, msg.envelope.priority)
        self._queues.setdefault(lane, deque()).appendleft(msg)
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

    async def cancel(self, request_id: str, until: float) -> None:
        """Waiting messages of the request go at once (never pulled); the workers here
        stop what they hold of it."""
        dropped: list[str] = []
        for lane in self._queues.values():
            gone = [m for m in lane if concerns(m.envelope, request_id)]
            for m in gone:
                lane.remove(m)
                dropped.append(m.envelope.model)
        self._forget(request_id)
        self._cancels.emit(Cancel(request_id, until, tuple(dropped)))

    def on_cancel(self, listener: CancelListener) -> Callable[[], None]:
        return self._cancels.add(listener)
