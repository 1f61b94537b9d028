"""The machine-local queue: one upstream puller feeding the device processes of a machine.

``fleetserve worker --devices a,b`` runs a :class:`LocalQueueServer` in its parent
process, on a Unix socket, in front of the one upstream WorkQueue (JetStream). Each
device process runs a normal Worker whose queue is a :class:`LocalQueueClient`.

- The parent pulls upstream only for the device processes that ask, within the sum
  of their budgets, and keeps what arrives in a local buffer, oldest first. Whichever
  device asks next takes it: work pulled too early moves without a network hop.
- A NAK puts the message back at the head of the local buffer, attempts + 1.
- Replies and settlements go upstream for the matching upstream message, in the
  order the device sent them; a second reply to one request is dropped here.
- When a device process goes away (a crash closes its socket), what it held goes
  back to the head of the buffer, attempts + 1, for the others; work it had already
  replied to is acked instead, and work that crashed ``max_deliver`` times is
  dead-lettered with an error reply.
- Buffered messages are kept alive upstream with ``touch``; a device's own touches
  are passed on, so a wedged device's work is still redelivered upstream in time.
- A cancel heard upstream removes the request's buffered messages (terminated
  upstream) and goes on to every device process, whose worker stops what it holds; a
  device's own cancels go upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..wire import InternalError, InvalidInput, Reply
from .base import PendingReply, WorkQueue
from .cancels import Cancel as CancelWork
from .cancels import concerns
from .js_release import Asks
from .local_buffer import Entry, LocalBuffer
from .local_proto import (
    Abandon,
    Cancel,
    Cancelled,
    Depths,
    Done,
    Hello,
    Publish,
    Pull,
    Pulled,
    Refresh,
    Released,
    Replied,
    SendReply,
    Settle,
    WireError,
    WireMsg,
    frame,
    parent_decoder,
    read_frame,
)
from .local_proto import LocalQueueClient as LocalQueueClient

log = logging.getLogger("fleetserve.queue.local")


@dataclass(eq=False)
class _Conn:
    writer: asyncio.StreamWriter
    info: dict[str, Any] = field(default_factory=dict)
    held: dict[int, Entry] = field(default_factory=dict)
    watchers: dict[int, tuple[asyncio.Task[None], PendingReply]] = field(default_factory=dict)
    closed: bool = False

    def send(self, obj: msgspec.Struct) -> None:
        if not self.closed and not self.writer.is_closing():
            self.writer.write(frame(obj))


class LocalQueueServer:
    """Serves device processes over a Unix socket from one upstream WorkQueue."""

    def __init__(
        self,
        upstream: WorkQueue,
        path: str,
        *,
        touch_every: float = 1.0,
        max_deliver: int = 0,
        age_limit: float = 2.0,
        on_hello: Callable[[dict[str, Any]], None] | None = None,
        on_lost: Callable[[dict[str, Any], int], None] | None = None,
    ) -> None:
        self.upstream = upstream
        self.path = path
        self.touch_every = touch_every
        self.max_deliver = max_deliver  # 0: a device crash never dead-letters
        self.on_hello = on_hello
        self.on_lost = on_lost
        self.buffer = LocalBuffer(upstream, age_limit)
        self.stats = self.buffer.stats
        self._conns: set[_Conn] = set()
        self._server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._serving: set[asyncio.Task[Any]] = set()  # one per connection
        self._handlers: set[asyncio.Task[Any]] = set()  # pulls
        self._ops: set[asyncio.Task[None]] = set()  # upstream operations: finished at close
        self._unlisten: Callable[[], None] | None = None  # from upstream cancels
        self._asks = Asks()  # keep-alive releases sent to the device processes

    # -- views ------------------------------------------------------------------------
    @property
    def clients(self) -> list[dict[str, Any]]:
        """What each connected device process announced about itself."""
        return [c.info for c in self._conns]

    def holding(self) -> list[tuple[dict[str, Any], int]]:
        """Each connected device process's announcement and how many requests it holds
        unanswered (one answered but not yet acked is done: a crash acks it)."""
        return [(c.info, sum(not e.replied for e in c.held.values())) for c in self._conns]

    @property
    def buffered(self) -> int:
        return len(self.buffer.entries)

    @property
    def in_flight(self) -> int:
        return sum(len(c.held) for c in self._conns)

    def depth(self, model: str) -> int:
        """Waiting upstream plus waiting here."""
        return self.buffer.depth(model)

    # -- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)
        self._unlisten = self.upstream.on_cancel(self._on_cancel)
        fetch, touch = self.buffer.fetch_forever(), self.buffer.touch_forever(self.touch_every)
        self._tasks.append(asyncio.create_task(fetch, name="local-queue-fetch"))
        self._tasks.append(asyncio.create_task(touch, name="local-queue-touch"))

    async def close(self) -> None:
        """Stop serving; what is still here goes back upstream (NAK) for anyone."""
        if self._server is not None:
            self._server.close()
        if self._unlisten is not None:
            self._unlisten()
        for c in list(self._conns):
            c.writer.close()  # its reader sees the end and drops it
        if self._serving:
            await asyncio.wait(list(self._serving), timeout=5.0)
        await _cancel([*self._tasks, *self._handlers])
        if self._ops:  # settlements already received still reach upstream
            await asyncio.wait(list(self._ops), timeout=5.0)
            await _cancel(list(self._ops))
        for e in self.buffer.drain():
            with contextlib.suppress(Exception):
                await self.upstream.nak(e.msg)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        self._server = None

    # -- connections ----------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._serving.add(task)
        conn = _Conn(writer)
        self._conns.add(conn)
        try:
            while (data := await read_frame(reader)) is not None:
                try:
                    self._on_frame(conn, parent_decoder.decode(data))
                except msgspec.DecodeError as exc:
                    log.warning("dropping a device connection that sent a bad frame: %s", exc)
                    break
        finally:
            self._drop(conn)
            writer.close()
            self._serving.discard(task)

    def _on_frame(self, conn: _Conn, f: Any) -> None:
        """Local state changes here, in frame order; upstream I/O runs in tasks."""
        if isinstance(f, Hello):
            conn.info = f.info
            if self.on_hello is not None:
                self.on_hello(f.info)
        elif isinstance(f, Pull):
            self._handle(self._pull(conn, f))
        elif isinstance(f, Settle):
            self._settle(conn, f)
        elif isinstance(f, SendReply):
            e = conn.held.get(f.id)
            if e is None or e.replied:  # settled, or answered already: dropped
                conn.send(Done(f.rid))
                return
            e.replied = f.reply.final  # chunks of a streamed reply pass on, in order
            self._chain(conn, f.rid, e, lambda: self._reply(e, f.reply))
        elif isinstance(f, Publish):
            self._op(self._publish(conn, f))
        elif isinstance(f, Cancel):
            watch = conn.watchers.pop(f.rid, None)
            if watch is not None:
                watch[0].cancel()
                watch[1].cancel()
        elif isinstance(f, Refresh):
            self._op(self._refresh(conn, f))
        elif isinstance(f, Abandon):
            self._op(self.upstream.cancel(f.request_id, f.until))
        elif isinstance(f, Released):
            self._asks.answered(f)

    async def release(self, model: str, timeout: float) -> float | None:
        """Every device process ends ``model``'s keep-alive (``js_release.Asks``)."""
        return await self._asks.release([c.send for c in self._conns], model, timeout)

    def _on_cancel(self, c: CancelWork) -> None:
        """Heard upstream: buffered messages of it go (never handed out); every device
        is told, the first with what was dropped here, so that it is counted once."""
        gone = [e for e in self.buffer.entries if concerns(e.msg.envelope, c.request_id)]
        for e in gone:
            self.buffer.entries.remove(e)
            self._op(self.upstream.term(e.msg))
        dropped = [*c.dropped, *(e.model for e in gone)]
        for i, conn in enumerate(list(self._conns)):
            conn.send(Cancelled(c.request_id, c.until, dropped if i == 0 else []))

    def _drop(self, conn: _Conn) -> None:
        """The device process is gone: what it held goes to the others."""
        conn.closed = True
        self._conns.discard(conn)
        self.buffer.forget(conn.held)
        for task, pending in conn.watchers.values():
            task.cancel()
            pending.cancel()
        conn.watchers.clear()
        lost = list(conn.held.values())
        conn.held.clear()
        again = []
        for e in lost:
            if e.replied:  # the answer went out; only the ack was missing
                self._chain(None, 0, e, functools.partial(self.upstream.ack, e.msg))
            elif self.max_deliver and e.attempts >= self.max_deliver:
                e.attempts += 1
                self._op(self._give_up(e))
            else:
                again.append(e)
        self.buffer.requeue(again)
        if lost and self.on_lost is not None:
            self.on_lost(conn.info, len(lost))

    # -- pulling ------------------------------------------------------------------------
    async def _pull(self, conn: _Conn, f: Pull) -> None:
        got = await self.buffer.want(
            conn.held, f.models, f.budget, f.timeout, interactive_only=f.interactive_only
        )
        msgs = [WireMsg(e.lid, e.msg.envelope, e.msg.body, e.attempts, e.msg.payload) for e in got]
        conn.send(Pulled(f.rid, msgs, {m: self.depth(m) for m in f.models}))

    # -- settling ---------------------------------------------------------------------
    def _settle(self, conn: _Conn, f: Settle) -> None:
        e = conn.held.get(f.id)
        if e is None:  # settled already, or never held by this device: nothing to do
            conn.send(Done(f.rid))
            return
        if f.how == "touch":
            self._chain(conn, f.rid, e, lambda: self.upstream.touch(e.msg))
            return
        if f.how not in ("ack", "nak", "term", "dead_letter"):
            conn.send(Done(f.rid, WireError.of(InvalidInput(f"unknown settlement {f.how!r}"))))
            return
        del conn.held[f.id]
        e.msg.attempts = e.attempts
        if f.how == "nak":  # back to the head here: no network hop
            if f.delay > 0:
                self.buffer.requeue_later(e, f.delay)
            else:
                self.buffer.requeue([e])
            conn.send(Done(f.rid))
        elif f.how == "ack":
            self._chain(conn, f.rid, e, lambda: self.upstream.ack(e.msg))
        elif f.how == "term":
            self._chain(conn, f.rid, e, lambda: self.upstream.term(e.msg))
        else:
            self._chain(conn, f.rid, e, lambda: self.upstream.dead_letter(e.msg, f.reason))

    async def _reply(self, e: Entry, reply: Reply) -> None:
        try:
            await self.upstream.reply(e.msg, reply)
        except BaseException:
            e.replied = False
            raise

    def _chain(
        self,
        conn: _Conn | None,
        rid: int,
        e: Entry,
        op: Callable[[], Awaitable[None]],
    ) -> None:
        """Run ``op`` upstream after the entry's previous operation, then answer ``rid``."""
        prev = e.tail
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        e.tail = done

        async def run() -> None:
            error = None
            try:
                if prev is not None:
                    await prev
                await op()
            except Exception as exc:
                log.warning("upstream operation failed: %s", exc)
                error = WireError.of(exc)
            finally:
                if not done.done():
                    done.set_result(None)
            if conn is not None:
                conn.send(Done(rid, error))

        self._op(run())

    async def _give_up(self, e: Entry) -> None:
        """It crashed a device process ``max_deliver`` times: answer 500, dead-letter it."""
        err = InternalError("the request crashed the device process it ran on")
        e.msg.attempts = e.attempts
        await self.upstream.reply(
            e.msg, Reply(content_type=e.msg.envelope.accept, error=err.to_body())
        )
        reason = f"device process crashed while running it (attempt {e.attempts})"
        await self.upstream.dead_letter(e.msg, reason)

    # -- publishing and the rest ----------------------------------------------------
    async def _publish(self, conn: _Conn, f: Publish) -> None:
        try:
            pending = await self.upstream.publish(f.envelope, f.body, f.payload)
        except Exception as exc:
            conn.send(Done(f.rid, WireError.of(exc)))
            return
        if conn.closed:
            pending.cancel()
            return
        timeout = max(f.envelope.deadline - time.time(), 0.0) + 1.0
        task = asyncio.create_task(self._watch(conn, f.rid, pending, timeout))
        conn.watchers[f.rid] = (task, pending)
        conn.send(Done(f.rid))

    async def _watch(self, conn: _Conn, rid: int, pending: PendingReply, timeout: float) -> None:
        """Pass the reply (each chunk of a streamed one) back to the publishing device."""
        try:
            async for reply in pending.stream(timeout):
                conn.send(Replied(rid, reply=reply))
        except Exception as exc:
            conn.send(Replied(rid, error=WireError.of(exc)))
        finally:
            conn.watchers.pop(rid, None)

    async def _refresh(self, conn: _Conn, f: Refresh) -> None:
        with contextlib.suppress(Exception):
            await self.upstream.refresh(f.models)
        conn.send(Depths(f.rid, {m: self.depth(m) for m in f.models}))

    def _handle(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    def _op(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._ops.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._ops.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("local queue operation failed: %s", task.exception())


async def _cancel(tasks: Sequence[asyncio.Future[Any]]) -> None:
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t


__all__ = ["LocalQueueClient", "LocalQueueServer"]
