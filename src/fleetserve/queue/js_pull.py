"""Pulling from JetStream within a cost budget: interactive work first, then batch
work, each oldest first across models.

Each model has two lanes, one per priority class, each a subject with one durable
pull consumer. A worker keeps at most one pull request open per lane, on its own
inbox subject, so status replies (404 no messages, 408 expired) are attributed
without ambiguity. A pull first asks every lane for what is ready now (``no_wait``);
if nothing is, it long-polls with ``no_wait`` plus ``expires``, which the server ends
as soon as it has delivered what was ready.

The batch size asked for comes from the budget and a high quantile of the lane's
recent costs (``queue.sizing``). What arrives beyond the budget is put back at once
(NAK, no delay) so that another worker takes it; the put-back rate is counted. Batch
work older than ``age_limit`` gets one message into a pull that interactive work
filled, so that it never starves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..wire import FleetError, InternalError, Priority
from ..wire import headers as H
from .base import Message, QueueStats
from .js_consumers import Consumers, Lane, durable
from .sizing import CostWindow, choose, pull_batch

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

    from .dlq import DeadLetters
    from .js_options import StreamOptions

log = logging.getLogger("fleetserve.queue")
_CLASS_TOKEN = {Priority.INTERACTIVE: "i", Priority.BATCH: "b"}
_TOKEN_CLASS = {v: k for k, v in _CLASS_TOKEN.items()}


@dataclass(slots=True)
class _Request:
    left: int  # messages the server may still deliver for it
    until: float  # loop time after which it is surely over


class Puller:
    def __init__(
        self,
        nc: Client,
        js: JetStreamContext,
        options: StreamOptions,
        stats: QueueStats,
        dlq: DeadLetters,
        age_limit: float = 2.0,
    ) -> None:
        self.nc = nc
        self.age_limit = age_limit
        self.js = js
        self.options = options
        self.stats = stats
        self.dlq = dlq
        self._inbox = f"{nc.new_inbox()}"
        self._buffer: list[tuple[int, Lane, Any]] = []  # (stream seq, lane, raw msg)
        self._open: dict[Lane, _Request] = {}
        self._arrived = asyncio.Event()
        self._costs: dict[Lane, CostWindow] = {}
        self._pending: dict[Lane, int] = {}  # num_pending as last seen
        self._oldest: dict[Lane, float | None] = {}  # its oldest message's enqueue time
        self._naked: dict[Lane, int] = {}  # naked by us, not yet redelivered
        self._held: dict[int, Any] = {}
        self._ids = 0
        self._closed = False
        self._sub: Any = None
        self._keeper: asyncio.Future[None] | None = None
        self._wanted_at: dict[Lane, float] = {}  # loop time each lane was last pulled
        self.ack_waits: dict[str, float] = {}  # per model, sized from its profile
        self.consumers = Consumers(nc, js, options, self.ack_waits)  # one per lane

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(f"{self._inbox}.>", cb=self._on_msg)
        self._keeper = asyncio.ensure_future(self._keep_buffered())

    async def _keep_buffered(self) -> None:
        """Delivered here but not yet handed out (the worker's batch former is full):
        kept ours while the worker still pulls their lane, so that JetStream does not
        redeliver them after ``ack_wait``; put back once it has not for ``ack_wait``
        (it pulls other models now: another worker takes them)."""
        loop = asyncio.get_running_loop()
        while not self._closed:  # ack_waits may change after start
            wait = min([self.options.ack_wait, *self.ack_waits.values()])
            await asyncio.sleep(wait / 3)
            now = loop.time()
            stale = [b for b in self._buffer if now - self._wanted_at.get(b[1], now) > wait]
            if stale:
                self._buffer = [b for b in self._buffer if b not in stale]
            for _, lane, raw in stale:
                self.stats.bump(self.stats.put_backs, lane[0])
                await _quietly(raw.nak())
            for _, _, raw in list(self._buffer):
                await _quietly(raw.in_progress())

    async def close(self) -> None:
        self._closed = True
        self._arrived.set()
        if self._keeper is not None:
            self._keeper.cancel()
        for _, _, raw in self._buffer:  # delivered to us but never handed out
            await _quietly(raw.nak())
        self._buffer.clear()

    def reset(self) -> None:
        """After a reconnect, open requests are gone with the old connection."""
        self._open.clear()
        self.consumers.reset()

    # -- lanes (their consumers: js_consumers.py) ----------------------------------------
    def _lane_of(self, subject: str) -> Lane | None:
        """The lane of a delivery (its work subject) or a status (our inbox)."""
        work = f"{self.options.prefix}.work."
        if subject.startswith(work):
            token, _, cls = subject[len(work) :].partition(".")
            return H.model_from_token(token), _TOKEN_CLASS.get(cls, Priority.BATCH)
        if subject.startswith(self._inbox + "."):
            token, _, cls = subject[len(self._inbox) + 1 :].partition(".")
            return H.model_from_token(token), _TOKEN_CLASS.get(cls, Priority.BATCH)
        return None

    # -- deliveries -----------------------------------------------------------------
    async def _on_msg(self, raw: Any) -> None:
        lane = self._lane_of(raw.subject)
        if lane is None:
            return
        req = self._open.get(lane)
        hdrs = raw.headers or {}
        status = hdrs.get("Status")
        if not raw.reply:  # a status: 404 no messages, 408 expired, 409 ...
            if status is not None:
                # (its Nats-Pending-Messages is what was left of this pull request's
                # batch, not what waits in the stream: refresh() reads that)
                self._open.pop(lane, None)
                self._arrived.set()
            return
        if req is not None:
            req.left -= 1
            if req.left <= 0:
                self._open.pop(lane, None)
        meta = raw.metadata
        self._pending[lane] = meta.num_pending
        if meta.num_delivered > 1:
            self.stats.bump(self.stats.redeliveries, lane[0])
            waiting = self._naked.get(lane, 0)
            if waiting:
                self._naked[lane] = waiting - 1
        self._buffer.append((meta.sequence.stream, lane, raw))
        self._arrived.set()

    def _ask(self, lane: Lane, budget: int, expires: float | None) -> None:
        batch = pull_batch(budget, self._costs.setdefault(lane, CostWindow()))
        req: dict[str, Any] = {"batch": batch, "no_wait": True}
        loop = asyncio.get_running_loop()
        if expires:
            req["expires"] = int(expires * 1e9)
        self._open[lane] = _Request(batch, loop.time() + (expires or 0.0) + 2.0)
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.options.stream}.{durable(lane)}"
        reply = f"{self._inbox}.{H.subject_token(lane[0])}.{_CLASS_TOKEN[lane[1]]}"
        task = asyncio.ensure_future(
            self.nc.publish(subject, json.dumps(req).encode(), reply=reply)
        )
        task.add_done_callback(_log_failure)

    def _starving(self, lane: Lane) -> bool:
        at = self._oldest.get(lane)
        return at is not None and time.time() - at > self.age_limit

    def _expire_stale(self) -> None:
        now = asyncio.get_running_loop().time()
        for m, r in list(self._open.items()):
            if r.until < now:
                del self._open[m]

    async def pull(
        self,
        models: Sequence[str],
        budget: int,
        timeout: float,
        classes: Sequence[Priority] = (Priority.INTERACTIVE, Priority.BATCH),
    ) -> list[Message]:
        """Up to ``budget`` from the lanes of ``models`` and ``classes``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        lanes = [(m, p) for p in classes for m in models]
        if not await self.consumers.ensure(lanes, timeout):
            return []
        for lane in lanes:
            self._wanted_at[lane] = loop.time()
        wanted = set(lanes)
        if not any(lane in wanted for _, lane, _ in self._buffer):
            # what is ready now: interactive lanes first, then batch lanes for the
            # budget they left (asking both at once would put back what did not fit)
            room = budget
            for cls in classes:
                asked = [lane for lane in lanes if lane[1] is cls and lane not in self._open]
                if room <= 0:  # only a lane whose work waited too long (as of refresh)
                    asked = [lane for lane in asked if self._starving(lane)]
                for lane in asked:
                    self._ask(lane, max(room, 1), None)
                while any(lane in self._open for lane in asked) and not self._closed:
                    self._arrived.clear()
                    if await _wait(self._arrived, end - loop.time()) is False:
                        break
                room = budget - sum(_cost(raw) for _, lane, raw in self._buffer if lane in wanted)
        while not self._closed:
            got = await self._take(wanted, budget)
            if got:
                return got
            left = end - loop.time()
            if left <= 0:
                return []
            self._expire_stale()
            for lane in lanes:
                if lane not in self._open:
                    self._ask(lane, budget, max(left, 0.001))
            self._arrived.clear()
            if await _wait(self._arrived, left) is False:
                return await self._take(wanted, budget)
        return []

    async def _take(self, wanted: set[Lane], budget: int) -> list[Message]:
        mine = [b for b in self._buffer if b[1] in wanted]
        if not mine:
            return []
        self._buffer = [b for b in self._buffer if b[1] not in wanted]
        msgs: list[Message] = []
        for _, lane, raw in sorted(mine, key=lambda b: b[0]):  # oldest first
            msg = await self._to_message(raw)
            if msg is not None:
                self._costs.setdefault(lane, CostWindow()).add(msg.envelope.cost_hint)
                msgs.append(msg)
        kept, back = choose([m.envelope for m in msgs], budget, self.age_limit)
        for i in back:  # over-pulled: put it back for anyone
            self.stats.bump(self.stats.put_backs, msgs[i].envelope.model)
            await self.settle(msgs[i], "nak")
        out = [msgs[i] for i in kept]
        return out

    async def _to_message(self, raw: Any) -> Message | None:
        try:
            routed = H.routed_from_headers(raw.headers)
        except FleetError as err:
            try:
                await self.dlq.put(
                    raw, f"malformed message: {err.message}", raw.metadata.num_delivered
                )
            except Exception as exc:  # the broker is away: it comes back to us, or another
                log.warning("could not dead-letter a malformed message (%s); put back", exc)
                await _quietly(raw.nak(1.0))
                return None
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
            lane = (msg.envelope.model, msg.envelope.priority)
            self._naked[lane] = self._naked.get(lane, 0) + 1
            await _quietly(raw.nak(delay or None))
        else:
            await _quietly(raw.term())

    async def touch(self, msg: Message) -> None:
        raw = self._held.get(msg.delivery_id)
        if raw is not None:
            await _quietly(raw.in_progress())

    # -- depth ----------------------------------------------------------------------
    def depth(self, model: str) -> int:
        return sum(
            self._pending.get((model, p), 0) + self._naked.get((model, p), 0) for p in Priority
        )

    def oldest_wait(self, model: str) -> float:
        """Seconds the oldest message not yet delivered for ``model`` has waited, as of
        the last ``refresh`` (0 when none waits)."""
        ats = [at for p in Priority if (at := self._oldest.get((model, p)))]
        return max(0.0, time.time() - min(ats)) if ats else 0.0

    async def _oldest_at(self, lane: Lane, after: int) -> float | None:
        """When the first message of ``lane`` past stream sequence ``after`` was
        enqueued (the consumer has delivered everything up to ``after``)."""
        try:
            raw = await self.js.get_msg(
                self.options.stream, seq=after + 1, subject=self.options.subject(*lane), next=True
            )
            return float((raw.headers or {}).get(H.ENQUEUED_AT) or 0.0) or None
        except Exception:  # taken meanwhile, or the connection is down
            return None

    async def refresh(self, models: Sequence[str]) -> None:
        for lane in [(m, p) for m in models for p in Priority]:
            try:
                info = await self.js.consumer_info(self.options.stream, durable(lane))
                self._pending[lane] = info.num_pending
                self._oldest[lane] = None
                if info.num_pending:
                    self._oldest[lane] = await self._oldest_at(lane, info.delivered.stream_seq)
            except Exception:  # no consumer yet: everything stored is waiting
                subject = self.options.subject(*lane)
                try:
                    si = await self.js.stream_info(self.options.stream, subjects_filter=subject)
                except Exception:
                    continue  # the connection is down; keep the last figure
                self._pending[lane] = n = (si.state.subjects or {}).get(subject, 0)
                self._oldest[lane] = await self._oldest_at(lane, 0) if n else None


def _cost(raw: Any) -> int:
    """A delivery's cost hint, before its headers are parsed (1 if they do not say)."""
    value = (raw.headers or {}).get(H.COST, "1")
    return int(value) if value.isdigit() else 1


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
