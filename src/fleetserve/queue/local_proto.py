"""The machine-local queue's wire: msgpack frames over a Unix socket.

Each frame is a 4-byte big-endian length, then one msgpack-encoded tagged struct.
Device processes (clients) send requests; every request but ``Hello``, ``Cancel``
and ``Abandon`` carries an ``rid`` that the parent echoes in its answer. The parent
also sends ``Cancelled`` unasked: a cancel it heard upstream. The envelope
and the reply travel as the ``wire`` dataclasses themselves (msgspec encodes them).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from ..wire import Envelope, FleetError, Reply, Unavailable, error_from_body
from .base import Message, QueueStats
from .cancels import Cancel as CancelWork
from .cancels import CancelListener, Listeners
from .pending import Pending

log = logging.getLogger("fleetserve.queue.local")
_LEN = struct.Struct(">I")
MAX_FRAME = 1 << 30


class WireError(msgspec.Struct, frozen=True):
    """A FleetError in transit: its body and its retry-after."""

    body: dict[str, Any]
    retry_after: float | None = None

    @classmethod
    def of(cls, exc: BaseException) -> WireError:
        if isinstance(exc, FleetError):
            return cls(exc.to_body(), exc.retry_after)
        # its text may name hosts, paths or URLs: the log has it, the device its type
        log.warning("the local queue failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
        message = f"internal error ({type(exc).__name__})"
        return cls({"error": {"code": "internal_error", "message": message}})

    def exception(self) -> FleetError:
        return error_from_body(self.body, retry_after=self.retry_after)


class WireMsg(msgspec.Struct, frozen=True):
    """One delivery handed to a device process; ``id`` names it in later requests."""

    id: int
    envelope: Envelope
    body: bytes
    attempts: int
    payload: str | None = None


# -- device process -> parent ----------------------------------------------------------
class Hello(msgspec.Struct, tag="hello"):
    info: dict[str, Any]


class Pull(msgspec.Struct, tag="pull"):
    rid: int
    models: list[str]
    budget: int
    timeout: float
    interactive_only: bool = False


class Settle(msgspec.Struct, tag="settle"):
    """``how``: ack, nak, touch, term or dead_letter."""

    rid: int
    id: int
    how: str
    delay: float = 0.0
    reason: str = ""


class SendReply(msgspec.Struct, tag="reply"):
    rid: int
    id: int
    reply: Reply


class Publish(msgspec.Struct, tag="publish"):
    rid: int
    envelope: Envelope
    body: bytes
    payload: str | None = None


class Cancel(msgspec.Struct, tag="cancel"):
    """Stop waiting for the reply to the publish ``rid``."""

    rid: int


class Refresh(msgspec.Struct, tag="refresh"):
    rid: int
    models: list[str]


class Abandon(msgspec.Struct, tag="abandon"):
    """Cancel the work of ``request_id`` everywhere (``WorkQueue.cancel`` upstream)."""

    request_id: str
    until: float


class Released(msgspec.Struct, tag="released"):
    """The answer to ``Release``: the seconds of keep-alive ``model`` had left (None:
    this device does not serve it)."""

    rid: int
    left: float | None = None


# -- parent -> device process ----------------------------------------------------------
class Done(msgspec.Struct, tag="done"):
    rid: int
    error: WireError | None = None


class Pulled(msgspec.Struct, tag="pulled"):
    rid: int
    msgs: list[WireMsg]
    depths: dict[str, int]


class Depths(msgspec.Struct, tag="depths"):
    rid: int
    depths: dict[str, int]


class Replied(msgspec.Struct, tag="replied"):
    """The reply to the publish ``rid``, or why there is none."""

    rid: int
    reply: Reply | None = None
    error: WireError | None = None


class Cancelled(msgspec.Struct, tag="cancelled"):
    """A cancel heard upstream: the device's worker stops that work wherever it is.
    ``dropped``: models of messages the parent removed from its buffer (counted once)."""

    request_id: str
    until: float
    dropped: list[str] = msgspec.field(default_factory=list)


class Release(msgspec.Struct, tag="release"):
    """A gateway's keep-alive release heard upstream (``queue/js_release.py``): the
    device ends ``model``'s keep-alive and answers ``Released``."""

    rid: int
    model: str


ToParent = Hello | Pull | Settle | SendReply | Publish | Cancel | Refresh | Abandon | Released
ToDevice = Done | Pulled | Depths | Replied | Cancelled | Release

_encoder = msgspec.msgpack.Encoder()
parent_decoder = msgspec.msgpack.Decoder(ToParent)
device_decoder = msgspec.msgpack.Decoder(ToDevice)


def frame(obj: msgspec.Struct) -> bytes:
    data = _encoder.encode(obj)
    return _LEN.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The next frame's bytes; ``None`` at a clean or broken end of the stream."""
    try:
        head = await reader.readexactly(_LEN.size)
        (size,) = _LEN.unpack(head)
        if size > MAX_FRAME:
            log.warning("closing a local queue connection: a frame of %d bytes", size)
            return None
        return await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


# -- the device-side WorkQueue ---------------------------------------------------------
class LocalQueueClient:
    """The WorkQueue a device process uses: every call goes to the parent's local queue.

    ``depth`` is cached from the last pull or ``refresh``. When the parent goes away,
    ``lost`` is set, pulls return nothing and settling is a no-op: the parent's
    upstream queue redelivers what was held.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.stats = QueueStats()
        self.lost = asyncio.Event()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._pending: dict[int, Pending] = {}  # by the rid of their publish
        self._depths: dict[str, int] = {}
        self._rids = itertools.count(1)
        self._closed = True
        self._cancels = Listeners()
        # ends a model's keep-alive here; the seconds it had left (None: not served here)
        self.on_release: Callable[[str], float | None] | None = None

    async def start(self) -> None:
        self._reader, self._writer = await asyncio.open_unix_connection(self.path)
        self._closed = False
        self.lost.clear()
        self._task = asyncio.create_task(self._read_loop(self._reader), name="local-queue-client")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._fail_all()

    @property
    def healthy(self) -> bool:
        return not self._closed and not self.lost.is_set()

    def announce(self, info: dict[str, Any]) -> None:
        """Tell the parent about this device process (device, pid, ready, url)."""
        self._send(Hello(info))

    # -- plumbing -------------------------------------------------------------------
    def _send(self, obj: msgspec.Struct) -> bool:
        if not self.healthy or self._writer is None or self._writer.is_closing():
            return False
        self._writer.write(frame(obj))
        return True

    async def _call(self, make: Callable[[int], msgspec.Struct], rid: int = 0) -> Any:
        """Send ``make(rid)`` and wait for its answer; ``None`` if the parent is gone."""
        rid = rid or next(self._rids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[rid] = fut
        if not self._send(make(rid)):
            self._calls.pop(rid, None)
            return None
        assert self._writer is not None
        with contextlib.suppress(ConnectionError):
            await self._writer.drain()
        try:
            return await fut
        finally:
            self._calls.pop(rid, None)

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while (data := await read_frame(reader)) is not None:
                try:
                    f = device_decoder.decode(data)
                except msgspec.DecodeError as exc:
                    log.error("the local queue sent a bad frame: %s", exc)
                    break
                if isinstance(f, Cancelled):
                    self._cancels.emit(CancelWork(f.request_id, f.until, tuple(f.dropped)))
                    continue
                if isinstance(f, Release):
                    self._send(Released(f.rid, self._release(f.model)))
                    continue
                if isinstance(f, Replied):
                    final = f.reply is None or f.reply.final
                    pending = self._pending.pop(f.rid, None) if final else self._pending.get(f.rid)
                    if pending is None:
                        continue  # cancelled, or waited too long: dropped
                    if f.reply is not None:
                        pending.resolve(f.reply)
                    else:
                        err = f.error or WireError({"error": {"code": "unavailable"}})
                        pending.fail(err.exception())
                    continue
                fut = self._calls.get(f.rid)
                if fut is not None and not fut.done():
                    fut.set_result(f)
        finally:
            self.lost.set()
            self._fail_all()

    def _release(self, model: str) -> float | None:
        if self.on_release is None:
            return None
        try:
            return self.on_release(model)
        except Exception:  # one bad release never stops the connection
            log.exception("could not release the keep-alive of %r", model)
            return None

    def _fail_all(self) -> None:
        for fut in self._calls.values():
            if not fut.done():
                fut.set_result(None)
        self._calls.clear()
        err = Unavailable("lost the device's local queue; retry", retry_after=1.0)
        for p in self._pending.values():
            p.fail(err)
        self._pending.clear()

    def _forget(self, rid: int) -> None:
        if self._pending.pop(rid, None) is not None:
            self._send(Cancel(rid))  # the parent stops waiting too

    async def _settle(self, make: Callable[[int], msgspec.Struct]) -> None:
        answer = await self._call(make)
        if isinstance(answer, Done) and answer.error is not None:
            raise answer.error.exception()

    # -- WorkQueue --------------------------------------------------------------------
    async def publish(self, envelope: Envelope, body: bytes, payload: str | None = None) -> Pending:
        rid = next(self._rids)
        pending = Pending(envelope.request_id, lambda _: self._forget(rid))
        self._pending[rid] = pending
        try:
            answer = await self._call(lambda r: Publish(r, envelope, body, payload), rid)
        except BaseException:
            self._pending.pop(rid, None)
            raise
        if not isinstance(answer, Done) or answer.error is not None:
            self._pending.pop(rid, None)
            if isinstance(answer, Done) and answer.error is not None:
                raise answer.error.exception()
            raise Unavailable("not connected to the local queue", retry_after=1.0)
        return pending

    async def pull(
        self,
        models: Sequence[str],
        budget: int,
        timeout: float,
        *,
        interactive_only: bool = False,
    ) -> list[Message]:
        if not self.healthy:  # as if nothing came: a pull loop must not spin
            await asyncio.sleep(max(timeout, 0.0))
            return []
        answer = await self._call(
            lambda r: Pull(r, list(models), budget, timeout, interactive_only)
        )
        if not isinstance(answer, Pulled):
            return []
        self._depths.update(answer.depths)
        out = []
        for w in answer.msgs:
            if w.attempts > 1:
                self.stats.bump(self.stats.redeliveries, w.envelope.model)
            out.append(Message(w.envelope, w.body, w.id, attempts=w.attempts, payload=w.payload))
        return out

    async def ack(self, msg: Message) -> None:
        await self._settle(lambda r: Settle(r, msg.delivery_id, "ack"))

    async def nak(self, msg: Message, delay: float = 0.0) -> None:
        await self._settle(lambda r: Settle(r, msg.delivery_id, "nak", delay=delay))

    async def touch(self, msg: Message) -> None:
        await self._settle(lambda r: Settle(r, msg.delivery_id, "touch"))

    async def term(self, msg: Message) -> None:
        await self._settle(lambda r: Settle(r, msg.delivery_id, "term"))

    async def dead_letter(self, msg: Message, reason: str) -> None:
        self.stats.bump(self.stats.dead_letters, msg.envelope.model)
        await self._settle(lambda r: Settle(r, msg.delivery_id, "dead_letter", reason=reason))

    async def reply(self, msg: Message, reply: Reply) -> None:
        await self._settle(lambda r: SendReply(r, msg.delivery_id, reply))

    def depth(self, model: str) -> int:
        return self._depths.get(model, 0)

    async def refresh(self, models: Sequence[str]) -> None:
        answer = await self._call(lambda r: Refresh(r, list(models)))
        if isinstance(answer, Depths):
            self._depths.update(answer.depths)

    async def cancel(self, request_id: str, until: float) -> None:
        self._send(Abandon(request_id, until))  # no answer: the parent passes it upstream

    def on_cancel(self, listener: CancelListener) -> Callable[[], None]:
        return self._cancels.add(listener)
