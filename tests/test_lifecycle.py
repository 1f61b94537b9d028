"""A process's stop is bounded (lifecycle.py): a health port's request in flight holds
it for at most its grace, and a task that ignores its cancel for at most the patience;
each says so in one line."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import pytest

from fleetserve.lifecycle import Service
from fleetserve.settings import Settings


class Proc(Service):
    def __init__(self) -> None:
        super().__init__()
        self.settings = Settings()


async def test_a_request_in_flight_holds_a_health_port_s_stop_for_its_grace_only() -> None:
    started = asyncio.Event()

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        started.set()
        await asyncio.sleep(60)  # a request that would hold the stop for a minute

    p = Proc()
    port = await p.serve_http(app, "127.0.0.1", 0, grace_s=0.5)
    async with httpx.AsyncClient() as client:
        call = asyncio.create_task(client.get(f"http://127.0.0.1:{port}/health", timeout=30))
        await started.wait()
        t0 = time.monotonic()
        await p.stop_tasks()
        assert time.monotonic() - t0 < 5
        with contextlib.suppress(httpx.HTTPError):
            await call  # (cut off, or answered 500)


async def test_a_task_that_ignores_its_cancel_is_left_behind_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    p = Proc()
    task = p.spawn("stubborn", stubborn())
    p.spawn("polite", asyncio.sleep(60))
    await asyncio.sleep(0)
    t0 = time.monotonic()
    await p.stop_tasks(patience_s=0.2)
    assert time.monotonic() - t0 < 2
    assert p.tasks["polite"].cancelled() and not task.done()
    assert "the stubborn task did not stop within 0.2 s" in caplog.text
    release.set()
    await task
