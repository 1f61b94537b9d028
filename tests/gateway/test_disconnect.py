"""A client that hangs up cancels its work: the gateway tells the queue, the request
counts as ``cancelled``, never ``ok``; a deadline that passes cancels it too.

The first tests serve a stand-in worker on a memory queue; the last ones run the tiny
generator end to end, embedded and in distributed mode (a gateway and a worker, each
with its own connection to one real nats-server)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetserve.catalog import Catalog, ModelSpec
from fleetserve.cluster import NatsServer
from fleetserve.gateway import Gateway
from fleetserve.gateway.process import GatewayProcess
from fleetserve.gateway.wiring import Hooks
from fleetserve.lifecycle import shutdown, start_http
from fleetserve.metrics import Metrics
from fleetserve.queue import MemoryQueue
from fleetserve.queue.cancels import Cancel
from fleetserve.settings import Settings
from fleetserve.wire import Encoding, Reply
from fleetserve.worker.process import WorkerProcess

from ..conftest import NO_USER_PROFILES, TINY_CLASS, ServerThread, tiny_settings
from ..hangup import AsyncHangup, Hangup, metric, metrics
from ..services import Services
from ..tiny_generate import build_llama
from ..tinymodels import write_spec
from ..waiting import wait_for

MODEL = "gen/stub"
CHAT = "tiny/chat"
LONG = 3000  # max_tokens of a chat that would run for seconds if nobody stopped it
BATCH = ("fleetserve_batch_size_count", "fleetserve_batch_size_sum")
PROFILE = {"cpu": {"precision": "fp32", "max_batch_tokens": 8192, "max_batch_size": 8}}


class Stub:
    """A gateway over a memory queue, and what its queue heard of cancels."""

    def __init__(self, url: str, queue: MemoryQueue, metrics: Metrics) -> None:
        self.url = url
        self.queue = queue
        self.metrics = metrics
        self.cancels: list[Cancel] = []
        queue.on_cancel(self.cancels.append)

    def requests(self, route: str, code: str) -> float:
        labels = {"route": route, "model": MODEL, "code": code}
        return self.metrics.registry.get_sample_value("fleetserve_requests_total", labels) or 0.0

    async def heard(self, n: int = 1) -> list[Cancel]:
        async with asyncio.timeout(10):
            while len(self.cancels) < n:
                await asyncio.sleep(0.005)
        return self.cancels


@pytest.fixture
async def stub() -> AsyncIterator[Stub]:
    spec = ModelSpec(id=MODEL, family="generate", runtime="torch", sources=("/nowhere",))
    settings = Settings.load(overrides={"port": 0})
    queue, metrics = MemoryQueue(16, 1.0), Metrics()
    await queue.start()
    gw = Gateway(settings, Catalog([spec]), queue, metrics, hooks=Hooks(ready=lambda: True))
    server, task, port = await start_http(gw, "127.0.0.1", 0)
    yield Stub(f"http://127.0.0.1:{port}", queue, metrics)
    await shutdown(server, [task])
    await queue.close()


def event(n: int) -> bytes:
    return f'data: {{"n": {n}}}\n\n'.encode()


async def test_a_waiting_client_that_hangs_up_cancels_its_queued_work(stub: Stub) -> None:
    # no worker: the request waits in the queue until its client goes
    path, headers = f"/v1/generate/{MODEL}", {"x-request-id": "gone-1"}
    client = await AsyncHangup.post(stub.url, path, {"prompt": "hi"}, headers)
    async with asyncio.timeout(10):
        while stub.queue.depth(MODEL) == 0:
            await asyncio.sleep(0.005)
    await client.close()
    (cancel,) = await stub.heard()
    assert cancel.request_id.startswith("gone-1.") and cancel.until > time.time()
    assert cancel.dropped == (MODEL,)  # removed from the queue: no worker will pull it
    assert stub.queue.depth(MODEL) == 0
    async with asyncio.timeout(10):
        while not stub.requests("generate", "cancelled"):
            await asyncio.sleep(0.005)
    assert stub.requests("generate", "ok") == 0


async def test_a_streaming_client_that_hangs_up_mid_stream_cancels_its_work(stub: Stub) -> None:
    pulled: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def worker() -> None:  # one chunk, then it would go on for long
        for msg in await stub.queue.pull([MODEL], 1 << 20, 5):
            await stub.queue.reply(msg, Reply(event(0), Encoding.JSON, final=False))
            pulled.set_result(None)
            await asyncio.sleep(60)

    task = asyncio.create_task(worker())
    body = {"model": MODEL, "messages": [], "stream": True}
    headers = {"x-request-id": "gone-2"}
    client = await AsyncHangup.post(stub.url, "/v1/chat/completions", body, headers)
    await client.read_until(b'data: {"n": 0}')
    await pulled
    await client.close()
    (cancel,) = await stub.heard()
    assert cancel.request_id.startswith("gone-2.") and cancel.dropped == ()  # a worker holds it
    async with asyncio.timeout(10):
        while not stub.requests("chat", "cancelled"):
            await asyncio.sleep(0.005)
    assert stub.requests("chat", "ok") == 0
    task.cancel()


async def test_a_deadline_that_passes_cancels_the_work_too(stub: Stub) -> None:
    async with httpx.AsyncClient() as c:
        headers = {"x-request-timeout": "0.2", "x-request-id": "late-1"}
        r = await c.post(f"{stub.url}/v1/generate/{MODEL}", json={"prompt": "hi"}, headers=headers)
    assert r.status_code == 504
    (cancel,) = await stub.heard()
    assert cancel.request_id.startswith("late-1.") and cancel.dropped == (MODEL,)
    assert stub.queue.depth(MODEL) == 0
    assert stub.requests("generate", "deadline_exceeded") == 1


async def test_answered_requests_cancel_nothing(stub: Stub) -> None:
    async def worker() -> None:
        while True:
            for msg in await stub.queue.pull([MODEL], 1 << 20, 5):
                if b"stream" in msg.body:
                    await stub.queue.reply(msg, Reply(event(0), Encoding.JSON, final=False))
                await stub.queue.reply(msg, Reply(b"data: [DONE]\n\n", Encoding.JSON))
                await stub.queue.ack(msg)

    task = asyncio.create_task(worker())
    async with httpx.AsyncClient() as c:
        plain = await c.post(f"{stub.url}/v1/generate/{MODEL}", json={"prompt": "hi"})
        body = {"prompt": "hi", "stream": True}
        streamed = await c.post(f"{stub.url}/v1/generate/{MODEL}", json=body)
    task.cancel()
    assert plain.status_code == streamed.status_code == 200
    assert streamed.text == event(0).decode() + "data: [DONE]\n\n"
    assert stub.cancels == [] and stub.requests("generate", "ok") == 2


# -- the tiny generator, end to end ----------------------------------------------------
@pytest.fixture(scope="module")
def chat_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("disconnect")
    llama = build_llama(root / "llama", max_positions=4096)
    cat = root / "catalog"
    write_spec(cat, CHAT, llama, family="generate", max_seq_len=4096, profiles=PROFILE)
    return cat


def chat_body(max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": CHAT,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }


def check_generation_stopped(gateway: str, worker: str) -> None:
    """A long streamed chat whose client hangs up after its first chunk stops: counted
    cancelled (generating) by the worker and cancelled (never ok) by the gateway, and
    no later step of the engine runs its sequence."""
    client = Hangup(gateway, "/v1/chat/completions", chat_body(LONG, True))
    client.read_until(b'"delta":{"content"')  # a chunk of generated text
    client.close()
    assert wait_for(lambda: metric(worker, "fleetserve_cancelled_total", where="generating") == 1)
    assert wait_for(lambda: metric(gateway, "fleetserve_requests_total", code="cancelled") == 1)
    assert metric(gateway, "fleetserve_requests_total", code="ok") == 0
    # steps and rows from one scrape: a step that began before the cancel landed may
    # still end (one row, its own) after the cancel was counted
    steps, rows = metrics(worker, BATCH, model=CHAT)
    assert steps < LONG / 2  # it stopped long before its max_tokens
    # a short chat now runs alone: every step it takes is one sequence wide
    r = httpx.post(gateway + "/v1/chat/completions", json=chat_body(8, False), timeout=60)
    assert r.status_code == 200, r.text
    now_steps, now_rows = metrics(worker, BATCH, model=CHAT)
    assert now_steps > steps and now_rows - rows == now_steps - steps


def test_an_embedded_generation_stops_when_its_client_hangs_up(chat_catalog: Path) -> None:
    srv = ServerThread(tiny_settings(chat_catalog, models=CHAT)).start()
    try:
        check_generation_stopped(srv.url, srv.url)
    finally:
        srv.stop()


@pytest.fixture
def distributed(chat_catalog: Path, nats_server: NatsServer) -> Iterator[tuple[str, str]]:
    base = {
        "port": 0,
        "worker_port": 0,
        "catalog": str(chat_catalog),
        "models": CHAT,
        "device": "cpu",
        "torch_threads": 1,
        "nats": nats_server.url,
        "queue_prefix": f"disc{time.monotonic_ns()}",
        "stream_storage": "memory",
        "profile_dir": NO_USER_PROFILES,
        "hardware_class": TINY_CLASS,
    }
    settings = Settings.load(overrides=base)
    gateway, worker = GatewayProcess(settings), WorkerProcess(settings)
    with Services(worker, gateway):
        gw, wk = f"http://127.0.0.1:{gateway.port}", f"http://127.0.0.1:{worker.port}"
        assert wait_for(lambda: httpx.get(gw + "/readyz").status_code == 200, 60)
        yield gw, wk


def test_a_distributed_generation_stops_by_the_cancel_message(
    distributed: tuple[str, str],
) -> None:
    gateway, worker = distributed
    check_generation_stopped(gateway, worker)
