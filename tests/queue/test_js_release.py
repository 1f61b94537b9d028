"""Keep-alive releases on a multi-device host, and a gateway's release while the broker
is away.

Before, ``DevicePool`` never served releases: a gateway counted the host among the
model's holders, waited the full second, and answered ``released: false``; and a
gateway without its queue connection answered the release with a 500."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest

from fleetserve.cluster import NatsServer
from fleetserve.gateway.process import GatewayProcess
from fleetserve.queue import MemoryQueue
from fleetserve.queue.js_release import WAIT, release_everywhere, serve_releases
from fleetserve.queue.local import LocalQueueClient, LocalQueueServer
from fleetserve.settings import Settings
from fleetserve.wire import Unavailable


@pytest.fixture
async def server() -> AsyncIterator[LocalQueueServer]:
    where = tempfile.mkdtemp(prefix="fs-rel-")  # short: socket paths are limited
    srv = LocalQueueServer(MemoryQueue(), os.path.join(where, "q.sock"))
    await srv.start()
    yield srv
    await srv.close()
    shutil.rmtree(where, ignore_errors=True)


async def _device(srv: LocalQueueServer, left: float | None, serves: bool = True) -> Any:
    c = LocalQueueClient(srv.path)
    if serves:
        c.on_release = lambda model: left if model == "m/a" else None
    await c.start()
    return c


async def test_the_local_queue_asks_every_device_and_keeps_the_most_left(
    server: LocalQueueServer,
) -> None:
    """Before, there was no way to reach a device process's keep-alives."""
    devices = [await _device(server, 5.0), await _device(server, None), await _device(server, 0)]
    devices.append(await _device(server, 9.0, serves=False))  # no release hook: silent
    try:
        async with asyncio.timeout(5):
            while len(server.clients) < 4:
                await asyncio.sleep(0.01)
        assert await server.release("m/a", timeout=1.0) == 5.0
        assert await server.release("m/other", timeout=1.0) is None
    finally:
        for d in devices:
            await d.close()
    assert await server.release("m/a", timeout=1.0) is None  # no devices: nobody asked


async def test_an_async_release_answers_the_gateway_well_before_its_wait(
    nats_server: NatsServer,
) -> None:
    """Before, serve_releases took only a plain function: a host that asks its device
    processes could not answer, and the gateway waited out WAIT for it."""
    nc = await nats.connect(nats_server.url)
    prefix = f"rel{time.monotonic_ns()}"

    async def release(model: str) -> float | None:
        await asyncio.sleep(0.01)  # asking the device processes
        return 7.0 if model == "m/a" else None

    try:
        await serve_releases(nc, prefix, release)
        start = time.monotonic()
        assert await release_everywhere(nc, prefix, "m/a", workers=1) == 7.0
        assert time.monotonic() - start < WAIT / 2
    finally:
        await nc.close()


class _Broken:
    connected = True

    class nc:  # stands for a nats-py client whose connection just dropped
        @staticmethod
        def new_inbox() -> str:
            return "_INBOX.x"

        @staticmethod
        async def subscribe(*args: Any, **kwargs: Any) -> Any:
            raise ConnectionResetError("nats://10.0.0.7:4222 went away")


async def test_a_gateway_without_its_queue_answers_a_release_with_503() -> None:
    """Before, a missing connection or a failing publish was a 500 internal error."""
    gateway = GatewayProcess(Settings(nats="nats://127.0.0.1:1", retry_after=3.0))
    with pytest.raises(Unavailable) as missing:
        await gateway._release_keep_alive("m/a")
    assert missing.value.retry_after == 3.0 and "not connected" in missing.value.message
    gateway.js = _Broken()
    with pytest.raises(Unavailable) as broken:
        await gateway._release_keep_alive("m/a")
    assert "10.0.0.7" not in broken.value.message and broken.value.retry_after == 3.0
