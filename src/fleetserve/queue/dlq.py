"""The dead-letter stream: messages that must not run again, kept with the reason.

Two ways in:

- a worker dead-letters a message that failed ``max_deliver`` times with an error,
  or whose headers do not parse;
- a message whose worker died (or overran ``ack_wait``) ``max_deliver`` times gets
  no further delivery from JetStream, which emits an advisory; whichever worker takes
  the advisory (a queue group) moves the message here and answers the gateway.

``fleetserve dlq list|replay|purge`` manages it (``list_entries``, ``replay``, ``purge``).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..wire import FleetError, InternalError
from ..wire import headers as H
from .base import QueueStats

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

    from .js_options import StreamOptions

log = logging.getLogger("fleetserve.dlq")


def dlq_stream(options: StreamOptions) -> str:
    return f"{options.prefix.upper().replace('.', '_')}_DLQ"


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int
    subject: str  # the original work subject
    model: str
    request_id: str
    reason: str
    attempts: int
    size: int
    headers: dict[str, str]
    data: bytes


class DeadLetters:
    def __init__(
        self, nc: Client, js: JetStreamContext, options: StreamOptions, stats: QueueStats
    ) -> None:
        self.nc = nc
        self.js = js
        self.options = options
        self.stats = stats
        self.stream = dlq_stream(options)

    async def ensure(self) -> None:
        from nats.js import api

        o = self.options
        config = api.StreamConfig(
            name=self.stream,
            subjects=[f"{o.prefix}.dlq.>"],
            storage=api.StorageType(o.storage),
            num_replicas=o.replicas,
            max_age=o.dlq_max_age,
        )
        try:
            await self.js.add_stream(config)
        except Exception as exc:
            if getattr(exc, "err_code", None) != 10058:
                raise
            await self.js.update_stream(config)

    async def put(self, raw: Any, reason: str, attempts: int) -> None:
        """Keep ``raw`` (a delivered or fetched message) with ``reason``."""
        headers = {k: v for k, v in (raw.headers or {}).items() if isinstance(k, str)}
        headers.pop(H.MSG_ID, None)
        headers[H.DLQ_REASON] = reason[:500]
        headers[H.DLQ_SUBJECT] = raw.subject
        headers[H.DLQ_ATTEMPTS] = str(attempts)
        work = f"{self.options.prefix}.work."
        subject = raw.subject[len(work) :] if raw.subject.startswith(work) else raw.subject
        token = subject.split(".", 1)[0]  # the model's token (a lane may follow it)
        await self.js.publish(f"{self.options.prefix}.dlq.{token}", raw.data, headers=headers)
        model = headers.get(H.MODEL) or H.model_from_token(token)
        self.stats.bump(self.stats.dead_letters, model)
        log.warning("dead-lettered %s: %s", headers.get(H.REQUEST_ID, "?"), reason)

    async def answer(self, raw: Any, err: FleetError) -> None:
        """Tell the waiting gateway, when the headers say where it waits."""
        h = raw.headers or {}
        rid, to = h.get(H.REQUEST_ID), h.get(H.REPLY_TO)
        if not rid or not to:
            return
        body = json.dumps(err.to_body()).encode()
        try:
            await self.nc.publish(to, body, headers={H.REQUEST_ID: rid, H.ERROR: "1"})
        except Exception as exc:
            log.debug("could not answer %s: %s", rid, exc)

    # -- workers died max_deliver times -------------------------------------------
    async def watch_max_deliveries(self) -> None:
        subject = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{self.options.stream}.*"
        await self.nc.subscribe(subject, queue="fleetserve-dlq", cb=self._on_advisory)

    async def _on_advisory(self, msg: Any) -> None:
        try:
            adv = json.loads(msg.data)
            seq, deliveries = int(adv["stream_seq"]), int(adv.get("deliveries", 0))
            raw = await self.js.get_msg(self.options.stream, seq)
        except Exception as exc:  # already gone (acked late, or another worker moved it)
            log.debug("max-deliveries advisory not handled: %s", exc)
            return
        reason = (
            f"delivered {deliveries} times without an ack: the worker died or "
            "overran ack_wait each time"
        )
        try:
            await self.put(raw, reason, deliveries)
        except Exception as exc:  # the broker is away: it stays in the work stream
            log.warning("could not dead-letter message %d: %s", seq, exc)
            return
        await self.answer(raw, InternalError("the request failed on every worker that took it"))
        try:
            await self.js.delete_msg(self.options.stream, seq)
        except Exception as exc:
            log.debug("could not delete %d: %s", seq, exc)

    # -- admin ----------------------------------------------------------------------
    async def list_entries(self, limit: int = 100) -> list[Entry]:
        info = await self.js.stream_info(self.stream)
        out: list[Entry] = []
        seq = info.state.first_seq
        while seq and seq <= info.state.last_seq and len(out) < limit:
            try:
                raw = await self.js.get_msg(self.stream, seq)
            except Exception:
                seq += 1
                continue
            h = {k: v for k, v in (raw.headers or {}).items() if isinstance(k, str)}
            out.append(
                Entry(
                    seq=seq,
                    subject=h.get(H.DLQ_SUBJECT, ""),
                    model=h.get(H.MODEL, ""),
                    request_id=h.get(H.REQUEST_ID, ""),
                    reason=h.get(H.DLQ_REASON, ""),
                    attempts=int(h.get(H.DLQ_ATTEMPTS, "0") or 0),
                    size=len(raw.data or b""),
                    headers=h,
                    data=raw.data or b"",
                )
            )
            seq += 1
        return out

    async def replay(self, seqs: list[int] | None, timeout: float) -> int:
        """Publish entries back to their work subjects with a fresh deadline; returns count."""
        entries = await self.list_entries(limit=1 << 30)
        n = 0
        for e in entries:
            if seqs is not None and e.seq not in seqs:
                continue
            h = {k: v for k, v in e.headers.items() if not k.startswith("Fleetserve-Dlq-")}
            h[H.DEADLINE] = repr(time.time() + timeout)
            await self.js.publish(e.subject, e.data, headers=h)
            await self.js.delete_msg(self.stream, e.seq)
            n += 1
        return n

    async def purge(self) -> int:
        info = await self.js.stream_info(self.stream)
        n = int(info.state.messages)
        await self.js.purge_stream(self.stream)
        return n
