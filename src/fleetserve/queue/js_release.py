"""Keep-alive releases across machines: core-NATS requests on ``<prefix>.keepalive``.

In distributed mode the keep-alives live in the workers' fleets. A gateway asked to
release a model (``DELETE /v1/models/{id}/keep-alive``) publishes the model id with a
reply inbox; every worker that serves the model releases it in its fleet and answers
with the seconds of keep-alive it had left. The gateway gathers the answers of the
workers its heartbeats know of, for at most a second. Nothing is stored: a worker that
is not connected at that moment keeps its keep-alive until it runs out. A multi-device
host's parent holds no model: it passes the release to its device processes
(:class:`Asks`) and answers for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from .local_proto import Release, Released

if TYPE_CHECKING:
    from nats.aio.client import Client

log = logging.getLogger("fleetserve.queue")
WAIT = 1.0  # seconds a gateway waits for the workers' answers


class Asks:
    """A multi-device host's parent: each release goes to its device processes over the
    local queue (``Release`` frames, answered ``Released``)."""

    def __init__(self) -> None:
        self._waiting: dict[int, asyncio.Future[float | None]] = {}  # by rid
        self._rids = itertools.count(1)

    def answered(self, f: Released) -> None:
        fut = self._waiting.get(f.rid)
        if fut is not None and not fut.done():
            fut.set_result(f.left)

    async def release(
        self, sends: Sequence[Callable[[Release], None]], model: str, timeout: float
    ) -> float | None:
        """Ask through each of ``sends``; the most seconds any device had left (None:
        none serves ``model``, or none answered within ``timeout``)."""
        loop = asyncio.get_running_loop()
        asked: dict[int, asyncio.Future[float | None]] = {}
        for send in sends:
            rid = next(self._rids)
            asked[rid] = self._waiting[rid] = loop.create_future()
            send(Release(rid, model))
        try:
            if asked:
                await asyncio.wait(list(asked.values()), timeout=timeout)
        finally:
            for rid in asked:
                self._waiting.pop(rid, None)
        lefts = [x for f in asked.values() if f.done() and (x := f.result()) is not None]
        return max(lefts, default=None)


def subject(prefix: str) -> str:
    return f"{prefix}.keepalive"


async def serve_releases(
    nc: Client, prefix: str, release: Callable[[str], float | Awaitable[float | None] | None]
) -> None:
    """A worker: answer each release with ``release(model)``'s seconds (``None``: it
    does not serve the model, and stays silent). ``release`` may be a coroutine
    function (a multi-device host asks its device processes)."""

    async def on_msg(msg: Any) -> None:
        try:
            model = bytes(msg.data).decode()
            answer = release(model)
            left = await answer if inspect.isawaitable(answer) else answer
            if left is not None and msg.reply:
                await msg.respond(json.dumps({"left_s": left}).encode())
        except Exception as exc:  # one bad message never stops the subscription
            log.warning("could not release a keep-alive: %s", exc)

    await nc.subscribe(subject(prefix), cb=on_msg)


async def release_everywhere(nc: Client, prefix: str, model: str, workers: int) -> float:
    """A gateway: release ``model`` on every worker; the most seconds any had left.
    Waits for ``workers`` answers (those its heartbeats know serve it), at most ``WAIT``."""
    answers: list[float] = []
    done = asyncio.Event()

    async def on_reply(msg: Any) -> None:
        with contextlib.suppress(ValueError, TypeError, KeyError):
            answers.append(float(json.loads(msg.data)["left_s"]))
        if len(answers) >= workers:
            done.set()

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=on_reply)
    try:
        await nc.publish(subject(prefix), model.encode(), reply=inbox)
        await nc.flush()
        if workers > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), WAIT)
    finally:
        await sub.unsubscribe()
    return max(answers, default=0.0)


__all__ = ["WAIT", "Asks", "release_everywhere", "serve_releases", "subject"]
