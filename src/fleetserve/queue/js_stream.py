"""What both JetStream roles share: the connection and the work stream.

:class:`JsLink` connects (retrying with backoff), ensures the work stream, follows
disconnects and reconnects, and probes whether JetStream stores what is published.
The roles (``js_publisher.py``, ``js_consumer.py``) add their own parts through the
``_open``, ``_closing``, ``_disconnected`` and ``_restore`` hooks, each calling
``super()`` so that a class with both roles (``jetstream.py``) runs them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from .base import QueueStats
from .js_cancel import CancelChannel
from .js_health import Writes, probe_forever, probe_subject
from .js_options import StreamOptions
from .nats_conn import connect

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

log = logging.getLogger("fleetserve.queue")


class LinkOptions(TypedDict, total=False):
    """The keyword arguments of every JetStream queue class (each role passes them on)."""

    retry_after: float  # seconds a refused client is told to wait (1.0)
    node: str | None  # this process's name in subjects; None: a random one
    connect_for: float  # seconds to keep retrying the first connect (30.0)
    age_limit: float  # the consumer's: seconds before batch work goes ahead of interactive (2.0)
    probe_interval: float  # seconds between write probes; 0: none (2.0)


class JsLink:
    """One connection to NATS and the work stream, for a publisher, a consumer or both."""

    def __init__(
        self, url: str, options: StreamOptions | None = None, **link: Unpack[LinkOptions]
    ) -> None:
        self.url = url
        self.options = options or StreamOptions()
        self.retry_after = retry_after = link.get("retry_after", 1.0)
        self.node = link.get("node") or uuid.uuid4().hex[:12]
        self.connect_for = link.get("connect_for", 30.0)
        self.age_limit = link.get("age_limit", 2.0)
        probe_interval = link.get("probe_interval", 2.0)
        self.stats = QueueStats()
        self.nc: Client | None = None
        self.js: JetStreamContext | None = None
        self._closed = True
        self._reconnected_at = -1e9  # loop time of the last reconnect
        self._tasks: set[asyncio.Task[Any]] = set()
        self._cancels = CancelChannel(self.options.prefix)  # <prefix>.cancel, core NATS
        self.probe_interval = probe_interval  # seconds between write probes; 0: none
        # whether JetStream stores what is published; without probes, as a publish saw it
        self.writes = Writes(hold=None if probe_interval > 0 else retry_after)

    # -- lifecycle ----------------------------------------------------------------
    async def start(self) -> None:
        nc = self.nc = await connect(
            self.url,
            name=f"fleetserve-{self.node}",
            retry_for=self.connect_for,
            on_disconnect=self._on_disconnect,
            on_reconnect=self._on_reconnect,
            closing=lambda: self._closed,
        )
        js = self.js = nc.jetstream()
        await self._ensure_stream()
        await self._open(nc, js)
        await self._cancels.start(nc)
        self._closed = False
        if self.probe_interval > 0:
            probe = probe_forever(
                self.writes,
                js,
                self.options,
                self.probe_interval,
                lambda: self.connected,
                reconnected_at=lambda: self._reconnected_at,
            )
            self._spawn(probe)

    async def _open(self, nc: Client, js: JetStreamContext) -> None:
        """A role's own start, once connected and the work stream is there."""

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def context(self) -> JetStreamContext:
        """The JetStream context, once started (the role classes and the tuner's KV)."""
        if self.js is None:
            raise RuntimeError("the queue is not started")
        return self.js

    def connection(self) -> Client:
        """The NATS connection, once started (presence, releases and stores share it)."""
        if self.nc is None:
            raise RuntimeError("the queue is not started")
        return self.nc

    async def _ensure_stream(self) -> None:
        from nats.js import api

        o = self.options
        config = api.StreamConfig(
            name=o.stream,
            subjects=[f"{o.prefix}.work.>", probe_subject(o)],  # the write probe's own
            retention=api.RetentionPolicy.WORK_QUEUE,
            storage=api.StorageType(o.storage),
            num_replicas=o.replicas,
            max_msgs_per_subject=o.max_depth,
            discard=api.DiscardPolicy.NEW,
            discard_new_per_subject=True,
            max_bytes=o.max_bytes,
            max_age=o.max_age,
            duplicate_window=min(120.0, o.max_age),
        )
        js = self.context()
        try:
            await js.add_stream(config)
        except Exception as exc:
            if getattr(exc, "err_code", None) != 10058:  # exists with another config
                raise
            await js.update_stream(config)

    async def close(self) -> None:
        if self._closed and self.nc is None:
            return
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await self._closing()
        if self.nc is not None:
            with contextlib.suppress(Exception):  # unacked work is redelivered to others
                async with asyncio.timeout(2.0):
                    await self.nc.close()
        self.nc = None

    async def _closing(self) -> None:
        """A role's own close, before the connection closes."""

    @property
    def connected(self) -> bool:
        return not self._closed and self.nc is not None and bool(self.nc.is_connected)

    @property
    def healthy(self) -> bool:
        """Connected, and JetStream stores what is published (``/readyz``)."""
        return self.connected and self.writes.refused is None

    def _on_disconnect(self) -> None:
        if self._closed:
            return
        self._disconnected()

    def _disconnected(self) -> None:
        """A role's own response to a lost connection."""

    def _on_reconnect(self) -> None:
        self._reconnected_at = asyncio.get_running_loop().time()
        self._reconnected()
        if self.options.storage == "memory":  # a restarted server lost the streams
            self._spawn(self._restore_streams())

    def _reconnected(self) -> None:
        """A role's own response to a reconnect."""

    async def _restore_streams(self) -> None:
        try:
            await self._ensure_stream()
            await self._restore()
        except Exception as exc:
            log.warning("could not restore the streams after a reconnect: %s", exc)

    async def _restore(self) -> None:
        """A role's own streams, again after a memory-storage server restarted."""
