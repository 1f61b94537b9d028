"""Which workers hold which models: workers announce, gateways listen.

Every worker publishes a small JSON heartbeat (``wire.heartbeat.Heartbeat``) on
``<prefix>.workers`` (core NATS) every ``every`` seconds. A gateway keeps the latest
from each and forgets workers not heard from for three intervals; ``GET /v1/models``
shows the result.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from ..wire.heartbeat import Heartbeat, ModelBeat, decode_heartbeat, encode_heartbeat

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg

log = logging.getLogger("fleetserve.presence")
EVERY = 2.0


def subject(prefix: str) -> str:
    return f"{prefix}.workers"


async def announce_forever(
    nc: NATS, prefix: str, describe: Callable[[], Heartbeat], every: float = EVERY
) -> None:
    """The worker side: publish ``describe()`` now and then every ``every`` seconds."""
    while True:
        try:
            await nc.publish(subject(prefix), encode_heartbeat(describe()))
        except Exception as exc:  # disconnected: the next beat tries again
            log.debug("heartbeat not sent: %s", exc)
        await asyncio.sleep(every)


@dataclass(frozen=True)
class Holder:
    """A live worker that serves one model: the worker's id and address, and the
    model's entry in its heartbeat."""

    id: str
    ready: bool
    url: str | None
    pid: int | None
    model: ModelBeat

    def as_dict(self) -> dict[str, object]:
        """As ``GET /v1/models`` lists it under ``workers``: the worker's fields, then
        the model's."""
        info: dict[str, object] = msgspec.to_builtins(self.model)
        return {"id": self.id, "ready": self.ready, "url": self.url, "pid": self.pid, **info}


class Registry:
    """The gateway side: the latest heartbeat of every live worker."""

    def __init__(self, every: float = EVERY) -> None:
        self.every = every
        self._seen: dict[str, tuple[float, Heartbeat]] = {}

    async def listen(self, nc: NATS, prefix: str) -> None:
        await nc.subscribe(subject(prefix), cb=self._on_beat)

    async def _on_beat(self, msg: Msg) -> None:
        try:
            beat = decode_heartbeat(msg.data)
        except msgspec.DecodeError:
            log.debug("ignored a malformed heartbeat")
            return
        self._seen[beat.id] = (time.monotonic(), beat)

    def workers(self) -> list[Heartbeat]:
        cutoff = time.monotonic() - 3 * self.every
        for wid, (at, _) in list(self._seen.items()):
            if at < cutoff:
                del self._seen[wid]
        return [beat for _, beat in self._seen.values()]

    def holders(self, model: str) -> list[Holder]:
        """The live workers serving ``model``, with whether each has it loaded."""
        return [
            Holder(beat.id, beat.ready, beat.url, beat.pid, info)
            for beat in self.workers()
            if (info := beat.models.get(model)) is not None
        ]
