"""The fleet's hot-added models in their JetStream bucket: a watch sees what was there,
then each change; a bad entry is skipped; a cancelled watch leaves no task behind."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest

from fleetserve.cluster import NatsServer
from fleetserve.queue.js_models import SharedModels, key

from ..waiting import tasks_left


async def test_a_watch_follows_puts_and_deletes_and_ends_whole(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        models = await SharedModels(nc.jetstream(), f"mod{time.monotonic_ns()}").open()
        await models.put("org/before", {"family": "dense"})
        seen: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

        async def on_put(model: str, fields: dict[str, object]) -> None:
            await seen.put(("put", model))

        async def on_delete(model: str) -> None:
            await seen.put(("delete", model))

        before = asyncio.all_tasks()
        watch = asyncio.create_task(models.watch(on_put, on_delete))
        assert await asyncio.wait_for(seen.get(), 10) == ("put", "org/before")
        await models.kv.put(key("org/bad"), b"[1, 2]")  # not a mapping
        await models.put("org/after.", {"family": "dense"})
        assert await asyncio.wait_for(seen.get(), 10) == ("put", "org/after.")
        assert "org/bad: the fleet's model change was not applied" in caplog.text
        await models.delete("org/before")
        assert await asyncio.wait_for(seen.get(), 10) == ("delete", "org/before")

        watch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watch
        # before, the ordered consumer's heartbeat and flow-control checks outlived it
        assert not await tasks_left(before)
    finally:
        await nc.close()
