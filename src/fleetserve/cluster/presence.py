"""Which workers hold which models: workers announce, gateways listen.

Every worker publishes a small JSON heartbeat on ``<prefix>.workers`` (core NATS)
every ``every`` seconds. A gateway keeps the latest from each and forgets workers
not heard from for three intervals; ``GET /v1/models`` shows the result.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("fleetserve.presence")
EVERY = 2.0


def subject(prefix: str) -> str:
    return f"{prefix}.workers"


async def announce_forever(
    nc: Any, prefix: str, describe: Callable[[], dict[str, Any]], every: float = EVERY
) -> None:
    """The worker side: publish ``describe()`` now and then every ``every`` seconds."""
    while True:
        try:
            await nc.publish(subject(prefix), json.dumps(describe()).encode())
        except Exception as exc:  # disconnected: the next beat tries again
            log.debug("heartbeat not sent: %s", exc)
        await asyncio.sleep(every)


class Registry:
    """The gateway side: the latest heartbeat of every live worker."""

    def __init__(self, every: float = EVERY) -> None:
        self.every = every
        self._seen: dict[str, tuple[float, dict[str, Any]]] = {}

    async def listen(self, nc: Any, prefix: str) -> None:
        await nc.subscribe(subject(prefix), cb=self._on_beat)

    async def _on_beat(self, msg: Any) -> None:
        try:
            beat = json.loads(msg.data)
            self._seen[str(beat["id"])] = (time.monotonic(), beat)
        except (ValueError, KeyError, TypeError):
            log.debug("ignored a malformed heartbeat")

    def workers(self) -> list[dict[str, Any]]:
        cutoff = time.monotonic() - 3 * self.every
        for wid, (at, _) in list(self._seen.items()):
            if at < cutoff:
                del self._seen[wid]
        return [beat for _, beat in self._seen.values()]

    def holders(self, model: str) -> list[dict[str, Any]]:
        """The live workers serving ``model``, with whether each has it loaded."""
        out = []
        for beat in self.workers():
            info = (beat.get("models") or {}).get(model)
            if info is not None:
                out.append(
                    {"id": beat["id"], "ready": bool(beat.get("ready")), "url": beat.get("url"),
                     "pid": beat.get("pid"), **info}
                )  # fmt: skip
        return out
