"""Pulling from JetStream within a cost budget, oldest first across models.

Each model has one durable pull consumer; a worker keeps at most one pull request
open per model, on its own inbox subject, so status replies (404 no messages, 408
expired) are attributed without ambiguity. A pull first asks every model for what is
ready now (``no_wait``); if nothing is, it long-polls with ``no_wait`` plus
``expires``, which the server ends as soon as it has delivered what was ready.

The batch size asked for comes from the budget and a running average of each model's
cost hints. What arrives beyond the budget is put back at once (NAK, no delay) so
that another worker takes it; the put-back rate is counted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..wire import FleetError, InternalError
from ..wire import headers as H
from .base import Message, QueueStats

if TYPE_CHECKING:
    from .dlq import DeadLetters
    from .jetstream import StreamOptions

log = logging.getLogger("fleetserve.queue")
MAX_BATCH = 256


@dataclass(slots=True)
class _Request:
    left: int  # messages the server may still deliver for it
    until: float  # loop time after which it is surely over


class Puller:
    def __init__(
        self,
        nc: Any,
        js: Any,
        options: StreamOptions,
        stats: QueueStats,
        dlq: DeadLetters,
    ) -> None:
        self.nc = nc
        self.js = js
        self.options = options
        self.stats = stats
        self.dlq = dlq
        self._inbox = f"{nc.new_inbox()}"
        self._buffer: list[tuple[int, str, Any]] = []  # (stream seq, model, raw msg)
        self._open: dict[str, _Request] = {}
        self._arrived = asyncio.Event()
        self._consumers: set[str] = set()
        self._avg_cost: dict[str, float] = {}
        self._pending: dict[str, int] = {}  # num_pending as last seen
        self._oldest: dict[str, float | None] = {}  # its oldest message's enqueue time
        self._naked: dict[str, int] = {}  # naked by us, not yet redelivered
        self._held: dict[int, Any] = {}
        self._ids = 0
        self._closed = False
        self._sub: Any = None
        self.ack_waits: dict[str, float] = {}  # per model, sized from its profile

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(f"{self._inbox}.*", cb=self._on_msg)

    async def close(self) -> None:
        self._closed = True
        self._arrived.set()
        for _, _, raw in self._buffer:  # delivered to us but never handed out
            await _quietly(raw.nak())
        self._buffer.clear()

    def reset(self) -> None:
        """After a reconnect, open requests are gone with the old connection."""
        self._open.clear()
        self._consumers.clear()

    # -- consumers ----------------------------------------------------------------
    def _durable(self, model: str) -> str:
        return f"w-{H.subject_token(model)}"

    async def _ensure_consumer(self, model: str) -> None:
        if model in self._consumers:
            return
        from nats.js import api

        o = self.options
        config = api.ConsumerConfig(
            durable_name=self._durable(model),
            filter_subject=o.subject(model),
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.ack_waits.get(model, o.ack_wait),
            max_deliver=o.max_deliver,
            max_ack_pending=100_000,
            max_waiting=4096,
        )
        try:
            await self.js.add_consumer(o.stream, config)
        except Exception as exc:
            if getattr(exc, "err_code", None) != 10148:  # exists with another config
                raise
            await self.js.update_consumer(o.stream, config)
        self._consumers.add(model)

    # -- deliveries -----------------------------------------------------------------
    async def _on_msg(self, raw: Any) -> None:
        token = raw.subject.rsplit(".", 1)[1]
        model = H.model_from_token(token)
        req = self._open.get(model)
        hdrs = raw.headers or {}
        status = hdrs.get("Status")
        if not raw.reply:  # a status: 404 no messages, 408 expired, 409 ...
            if status is not None:
                self._open.pop(model, None)
                pend = hdrs.get("Nats-Pending-Messages")
                if pend is not None and pend.isdigit():
                    self._pending[model] = int(pend)
                self._arrived.set()
            return
        if req is not None:
            req.left -= 1
            if req.left <= 0:
                self._open.pop(model, None)
        meta = raw.metadata
        self._pending[model] = meta.num_pending
        if meta.num_delivered > 1:
            self.stats.bump(self.stats.redeliveries, model)
            waiting = self._naked.get(model, 0)
            if waiting:
                self._naked[model] = waiting - 1
        self._buffer.append((meta.sequence.stream, model, raw))
        self._arrived.set()

    def _ask(self, model: str, budget: int, expires: float | None) -> None:
        avg = self._avg_cost.get(model, 1.0)
        batch = max(1, min(MAX_BATCH, int(budget / max(avg, 1.0))))
        req: dict[str, Any] = {"batch": batch, "no_wait": True}
        loop = asyncio.get_running_loop()
        if expires:
            req["expires"] = int(expires * 1e9)
        self._open[model] = _Request(batch, loop.time() + (expires or 0.0) + 2.0)
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.options.stream}.{self._durable(model)}"
        reply = f"{self._inbox}.{H.subject_token(model)}"
        task = asyncio.ensure_future(
            self.nc.publish(subject, json.dumps(req).encode(), reply=reply)
        )
        task.add_done_callback(_log_failure)

    def _expire_stale(self) -> None:
        now = asyncio.get_running_loop().time()
        for m, r in list(self._open.items()):
            if r.until < now:
                del self._open[m]

    async def pull(self, models: Sequence[str], budget: int, timeout: float) -> list[Message]:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        for m in models:
            await self._ensure_consumer(m)
        wanted = set(models)
        if not any(m in wanted for _, m, _ in self._buffer):
            # what is ready now, from every model at once
            asked = [m for m in models if m not in self._open]
            for m in asked:
                self._ask(m, budget, None)
            while any(m in self._open for m in asked) and not self._closed:
                self._arrived.clear()
                if await _wait(self._arrived, end - loop.time()) is False:
                    break
        while not self._closed:
            got = await self._take(wanted, budget)
            if got:
                return got
            left = end - loop.time()
            if left <= 0:
                return []
            self._expire_stale()
            for m in models:
                if m not in self._open:
                    self._ask(m, budget, max(left, 0.001))
            self._arrived.clear()
            if await _wait(self._arrived, left) is False:
                return await self._take(wanted, budget)
        return []

    async def _take(self, wanted: set[str], budget: int) -> list[Message]:
        mine = sorted((b for b in self._buffer if b[1] in wanted), key=lambda b: b[0])
        if not mine:
            return []
        self._buffer = [b for b in self._buffer if b[1] not in wanted]
        out: list[Message] = []
        spent = 0
        for _, model, raw in mine:
            msg = await self._to_message(model, raw)
            if msg is None:
                continue
            cost = msg.envelope.cost_hint
            prev = self._avg_cost.get(model)
            self._avg_cost[model] = cost if prev is None else 0.8 * prev + 0.2 * cost
            if out and spent + cost > budget:  # over-pulled: put it back for anyone
                self.stats.bump(self.stats.put_backs, model)
                await self.settle(msg, "nak")
                continue
            out.append(msg)
            spent += cost
        return out

    async def _to_message(self, model: str, raw: Any) -> Message | None:
        try:
            routed = H.routed_from_headers(raw.headers)
        except FleetError as err:
            await self.dlq.put(raw, f"malformed message: {err.message}", raw.metadata.num_delivered)
            await self.dlq.answer(raw, InternalError("the request message was malformed"))
            await _quietly(raw.term())
            return None
        self._ids += 1
        self._held[self._ids] = raw
        return Message(
            routed.envelope,
            raw.data,
            self._ids,
            attempts=raw.metadata.num_delivered,
            reply_to=routed.reply_to,
            payload=routed.payload,
        )

    # -- settling -------------------------------------------------------------------
    def held(self, msg: Message) -> Any:
        return self._held.get(msg.delivery_id)

    async def settle(self, msg: Message, how: str, delay: float = 0.0) -> None:
        raw = self._held.pop(msg.delivery_id, None)
        if raw is None:
            return  # already settled
        if how == "ack":  # confirmed, so a finished request is surely not redelivered
            await _quietly(raw.ack_sync(timeout=2.0))
        elif how == "nak":
            model = msg.envelope.model
            self._naked[model] = self._naked.get(model, 0) + 1
            await _quietly(raw.nak(delay or None))
        else:
            await _quietly(raw.term())

    async def touch(self, msg: Message) -> None:
        raw = self._held.get(msg.delivery_id)
        if raw is not None:
            await _quietly(raw.in_progress())

    # -- depth ----------------------------------------------------------------------
    def depth(self, model: str) -> int:
        return self._pending.get(model, 0) + self._naked.get(model, 0)

    def oldest_wait(self, model: str) -> float:
        """Seconds the oldest message not yet delivered for ``model`` has waited, as of
        the last ``refresh`` (0 when none waits)."""
        at = self._oldest.get(model)
        return max(0.0, time.time() - at) if at else 0.0

    async def _oldest_at(self, model: str, after: int) -> float | None:
        """When the first message for ``model`` past stream sequence ``after`` was
        enqueued (the consumer has delivered everything up to ``after``)."""
        try:
            raw = await self.js.get_msg(
                self.options.stream, seq=after + 1, subject=self.options.subject(model), next=True
            )
            return float((raw.headers or {}).get(H.ENQUEUED_AT) or 0.0) or None
        except Exception:  # taken meanwhile, or the connection is down
            return None

    async def refresh(self, models: Sequence[str]) -> None:
        for m in models:
            try:
                info = await self.js.consumer_info(self.options.stream, self._durable(m))
                self._pending[m] = info.num_pending
                self._oldest[m] = None
                if info.num_pending:
                    self._oldest[m] = await self._oldest_at(m, info.delivered.stream_seq)
            except Exception:  # no consumer yet: everything stored is waiting
                subject = self.options.subject(m)
                try:
                    si = await self.js.stream_info(self.options.stream, subjects_filter=subject)
                except Exception:
                    continue  # the connection is down; keep the last figure
                self._pending[m] = (si.state.subjects or {}).get(subject, 0)
                self._oldest[m] = await self._oldest_at(m, 0) if self._pending[m] else None


async def _wait(event: asyncio.Event, timeout: float) -> bool:
    if timeout <= 0:
        return False
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def _quietly(coro: Any) -> None:
    try:
        await coro
    except Exception as exc:  # redelivery covers a lost ack or nak
        log.debug("settle failed: %s", exc)


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("pull request failed: %s", task.exception())
