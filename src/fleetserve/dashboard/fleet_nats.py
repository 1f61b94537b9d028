"""The fleet as a distributed gateway sees it: the workers' heartbeats, and the queue
read from JetStream itself.

- Workers: the latest heartbeat of each live worker (``cluster.presence.Registry``);
  a heartbeat carries its models, memory against the budget, hot adapters and
  counters (``fleet_local.worker_figures``).
- Lag per model and class: what KEDA's nats-jetstream scaler reads, the durable
  consumer's ``num_pending`` (and ``num_ack_pending``: in flight on the workers),
  plus the age of its oldest undelivered message (its ``Fleetserve-Enqueued-At``
  header). One ``stream_info`` call finds the lanes that hold anything; only those
  are asked further, so an idle fleet costs one request per refresh.
- Dead letters: the messages held in the dead-letter stream, per model.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from ..wire import Priority
from ..wire import headers as H

if TYPE_CHECKING:
    from ..queue.jetstream import JetStreamQueue

log = logging.getLogger("fleetserve.dashboard")
READ_TIMEOUT = 2.0  # seconds for one reading of every lane


def durable(model: str, priority: Priority) -> str:
    """The lane's durable consumer, as ``queue.js_consumers.durable`` names it."""
    kind = "w" if priority is Priority.BATCH else "wi"
    return f"{kind}-{H.subject_token(model)}"


def lane_of(subject: str, prefix: str) -> tuple[str, Priority] | None:
    """The model and class of a work subject (``<prefix>.work.<token>[.i]``)."""
    work = f"{prefix}.work."
    if not subject.startswith(work):
        return None
    token, _, cls = subject[len(work) :].partition(".")
    try:
        model = H.model_from_token(token)
    except (ValueError, IndexError):
        return None
    return model, Priority.INTERACTIVE if cls == "i" else Priority.BATCH


class JetStreamLanes:
    """Lag per lane and dead letters per model, read from JetStream on demand."""

    def __init__(self, queue: JetStreamQueue) -> None:
        self.queue = queue
        self._last: tuple[list[dict[str, object]], dict[str, int]] = ([], {})

    async def read(self) -> tuple[list[dict[str, object]], dict[str, int]]:
        """``(lanes, dead letters per model)``; the last figures while NATS is down."""
        if not self.queue.healthy or self.queue.js is None:
            return self._last
        try:
            async with asyncio.timeout(READ_TIMEOUT):  # a slow NATS holds up no event stream
                self._last = (await self._lanes(), await self._dead_letters())
        except Exception as exc:
            log.debug("fleet view: JetStream not readable now: %s", exc)
        return self._last

    async def _lanes(self) -> list[dict[str, object]]:
        js, o = self.queue.context(), self.queue.options
        info = await js.stream_info(o.stream, subjects_filter=f"{o.prefix}.work.>")
        out: list[dict[str, object]] = []
        for subject, stored in sorted((info.state.subjects or {}).items()):
            lane = lane_of(subject, o.prefix)
            if lane is None or not stored:
                continue
            model, cls = lane
            waiting, inflight, after = stored, 0, 0
            try:
                ci = await js.consumer_info(o.stream, durable(model, cls))
                waiting, inflight = int(ci.num_pending), int(ci.num_ack_pending)
                after = int(ci.delivered.stream_seq or 0)
            except Exception:  # no worker made its consumer yet: all of it waits
                pass
            age = await self._age(subject, after) if waiting else 0.0
            out.append(
                {"model": model, "class": cls.value, "waiting": waiting,
                 "inflight": inflight, "age_s": age}
            )  # fmt: skip
        return out

    async def _age(self, subject: str, after: int) -> float:
        """Seconds the first message of ``subject`` past ``after`` has waited."""
        try:
            raw = await self.queue.context().get_msg(
                self.queue.options.stream, seq=after + 1, subject=subject, next=True
            )
            at = float((raw.headers or {}).get(H.ENQUEUED_AT) or 0.0)
        except Exception:  # taken meanwhile
            return 0.0
        return max(0.0, time.time() - at) if at else 0.0

    async def _dead_letters(self) -> dict[str, int]:
        from ..queue.dlq import dlq_stream

        o = self.queue.options
        try:
            info = await self.queue.context().stream_info(
                dlq_stream(o), subjects_filter=f"{o.prefix}.dlq.>"
            )
        except Exception:  # no dead-letter stream (yet)
            return {}
        out: dict[str, int] = {}
        for subject, n in (info.state.subjects or {}).items():
            token = subject.rsplit(".", 1)[-1]
            try:
                out[H.model_from_token(token)] = out.get(H.model_from_token(token), 0) + int(n)
            except (ValueError, IndexError):
                continue
        return out


__all__ = ["JetStreamLanes", "durable", "lane_of"]
