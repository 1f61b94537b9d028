"""A client that hangs up cancels its work.

Once the request body is read, uvicorn's ``receive()`` waits until the client
disconnects and then returns ``{"type": "http.disconnect"}`` (it also returns that
once the response is complete; by then nothing here waits on it any more).

:class:`Watched` wraps the queue's handle on a published request. Waiting for the
reply, and for each chunk of a streamed reply, races the client's hang-up. If the
client goes first, the work is cancelled (``Publisher.cancel``: queued, batched or
generating, here or on any worker) and :class:`~fleetserve.wire.Cancelled` is raised:
the gateway counts the request as ``cancelled`` (499), and the response it writes
goes nowhere (uvicorn drops what is sent to a closed connection). A deadline that
passes cancels the work in the same way before the 504 goes out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Coroutine
from typing import Any, TypeVar

from ..queue import PendingReply, Publisher
from ..wire import Cancelled, DeadlineExceeded, Envelope, Reply
from .http import Receive

log = logging.getLogger("fleetserve.gateway")
T = TypeVar("T")


class Watched:
    """A :class:`~fleetserve.queue.PendingReply` that cancels its work when the client
    goes away or the deadline passes."""

    def __init__(
        self, pending: PendingReply, receive: Receive, queue: Publisher, envelope: Envelope
    ) -> None:
        self._inner = pending
        self._receive = receive
        self._queue = queue
        self._env = envelope
        self._watcher: asyncio.Task[None] | None = None
        self.cancelled = False  # the work was cancelled (client gone, or deadline)

    async def wait(self, timeout: float) -> Reply:
        try:
            return await self._race(self._inner.wait(timeout))
        finally:
            self._stop()

    async def stream(self, timeout: float) -> AsyncGenerator[Reply, None]:
        chunks = self._inner.stream(timeout)
        try:
            while True:
                reply = await self._race(_next(chunks))
                if reply is None:
                    return
                yield reply
                if reply.final:
                    return
        finally:
            await chunks.aclose()
            self._stop()

    def cancel(self) -> None:
        """Stop waiting (the work is not cancelled: use the queue for that)."""
        self._inner.cancel()
        self._stop()

    # -- the race -----------------------------------------------------------------
    async def _race(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro``'s result, unless the client hangs up first."""
        watcher = self._watch()
        task = asyncio.ensure_future(coro)
        if not watcher.done():
            try:
                await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:  # the server stops under the request
                task.cancel()  # ended before the caller closes the stream it reads
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task  # (closed while running: "aclose(): ... already running")
                raise
        if task.done():  # a reply that came with the hang-up is still a reply
            try:
                return task.result()
            except DeadlineExceeded:
                await self._abandon()
                raise
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await self._abandon()
        raise Cancelled("the client went away before the reply was ready")

    def _watch(self) -> asyncio.Task[None]:
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(_until_disconnect(self._receive))
        return self._watcher

    def _stop(self) -> None:
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()

    async def _abandon(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        self._inner.cancel()
        try:
            await self._queue.cancel(self._env.request_id, self._env.deadline)
        except Exception as exc:  # the client is gone either way; the work may run on
            log.warning("could not cancel %s: %s", self._env.request_id, exc)


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _next(chunks: AsyncGenerator[Reply, None]) -> Reply | None:
    return await anext(chunks, None)
