"""A process's stop (lifecycle.py): its requests in flight are answered by the tasks
that still run; it is bounded: a health port's request in flight holds it for at most
its grace, and a task that ignores its cancel for at most the patience; each says so in
one line."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx
import pytest

from fleetserve.lifecycle import Service, start_http
from fleetserve.settings import Settings

from .waiting import async_wait_for


class Proc(Service):
    def __init__(self) -> None:
        super().__init__()
        self.settings = Settings()


async def test_a_request_in_flight_is_answered_by_the_tasks_that_run_until_it_is() -> None:
    """The request waits for a task of the process (an embedded server's worker): the
    stop lets it finish before it cancels that task. Before, the task was cancelled at
    once and the request waited out its deadline."""
    jobs: asyncio.Queue[asyncio.Future[bytes]] = asyncio.Queue()
    asked = asyncio.Event()

    async def refused() -> bool:  # the server takes no new connection: its stop began
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return True
        writer.close()
        return False

    async def worker() -> None:
        while True:
            job = await jobs.get()
            await async_wait_for(refused, 10, "the stop to begin")
            job.set_result(b"done")

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        job = asyncio.get_running_loop().create_future()
        await jobs.put(job)
        asked.set()
        body = await asyncio.wait_for(job, 10)  # the request's deadline
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    p = Proc()
    p.spawn("worker", worker())
    port = await p.serve_http(app, "127.0.0.1", 0, http_first=True)
    async with httpx.AsyncClient() as client:
        call = asyncio.create_task(client.get(f"http://127.0.0.1:{port}/work", timeout=30))
        await asked.wait()
        t0 = time.monotonic()
        await p.stop_tasks()
        r = await call
    assert (r.status_code, r.content) == (200, b"done")
    assert time.monotonic() - t0 < 5 and p.tasks["worker"].cancelled()


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


@pytest.mark.parametrize("port", [-1, 65536, 99999])
async def test_a_port_out_of_range_is_one_clear_error(port: int) -> None:
    with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{port}: a port is 0 to"):
        await start_http(object(), "127.0.0.1", port)
