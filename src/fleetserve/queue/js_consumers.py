"""The durable pull consumers of the work stream: one per lane (a model and a class).

A worker makes sure each lane it pulls has its consumer before it asks, and again after
a reconnect (a restarted server with memory storage lost them). ``add_consumer`` on a
durable that exists creates or updates it: nats-py 2.16 sends the legacy
``CONSUMER.DURABLE.CREATE`` request, which JetStream answers by applying the new
config where it may change (``ack_wait`` sized from a profile, say) and with an error
where it may not. While the broker is unreachable, or JetStream does not answer, it
waits with backoff.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..wire import Priority
from ..wire import headers as H
from .js_health import Backoff

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

    from .js_options import StreamOptions

Lane = tuple[str, Priority]  # a model and a class: one subject, one consumer
CALL_TIMEOUT = 2.0  # seconds for a JetStream API call (nats-py's default is 5)


def durable(lane: Lane) -> str:
    """Batch work keeps the consumer it had before classes existed (a work-queue
    stream allows one consumer per subject): ``w-<model>``; interactive work has
    ``wi-<model>`` (``-`` is a character tokens keep, so the names never clash)."""
    model, cls = lane
    kind = "w" if cls is Priority.BATCH else "wi"
    return f"{kind}-{H.subject_token(model)}"


class Consumers:
    """The lanes whose consumer this connection has made sure of."""

    def __init__(
        self, nc: Client, js: JetStreamContext, options: StreamOptions, ack_waits: dict[str, float]
    ) -> None:
        self.nc, self.js, self.options = nc, js, options
        self.ack_waits = ack_waits  # per model, sized from its profile (shared, updated)
        self._made: set[Lane] = set()
        self._backoff = Backoff(what="consumer creation")  # while the broker is away

    def reset(self) -> None:
        """After a reconnect: make sure of each again."""
        self._made.clear()

    async def ensure_one(self, lane: Lane) -> None:
        if lane in self._made:
            return
        from nats.js import api

        o = self.options
        model, cls = lane
        config = api.ConsumerConfig(
            durable_name=durable(lane),
            filter_subject=o.subject(model, cls),
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.ack_waits.get(model, o.ack_wait),
            max_deliver=o.max_deliver,
            max_ack_pending=100_000,
            max_waiting=4096,
        )
        await self.js.add_consumer(o.stream, config, timeout=CALL_TIMEOUT)  # or updates it
        self._made.add(lane)

    async def ensure(self, lanes: Sequence[Lane], timeout: float) -> bool:
        """Each lane's durable consumer exists (again, after a reconnect). While the
        broker is unreachable, or JetStream does not answer, waits with backoff (at most
        ``timeout``) and returns False: the worker pulls nothing and tries again."""
        loop = asyncio.get_running_loop()
        wait = self._backoff.wait(loop.time())
        if wait <= 0 and self.nc.is_connected:
            try:
                for lane in lanes:
                    await self.ensure_one(lane)
                self._backoff.succeeded()
                return True
            except Exception as exc:  # TimeoutError, NoRespondersError, a closed connection
                wait = self._backoff.failed(loop.time(), exc)
        elif not self.nc.is_connected:
            wait = max(wait, 0.05)  # nats-py reconnects by itself; check again soon
        await asyncio.sleep(min(max(wait, 0.0), max(timeout, 0.01)))
        return False


__all__ = ["CALL_TIMEOUT", "Consumers", "Lane", "durable"]
