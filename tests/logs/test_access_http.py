"""Access lines as a gateway serves hostile and broken requests: huge model names cut,
the probe header honoured only for polling, a handler that raises answered with a 500
(headers and access line included), streams' outcomes and timings, and error codes
from the handlers that answer themselves."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import msgspec
import pytest

from fleetserve.catalog import Catalog, ModelSpec
from fleetserve.gateway import Gateway
from fleetserve.gateway.adapter_routes import AdapterRoutes
from fleetserve.gateway.wiring import Hooks, Routes
from fleetserve.lifecycle import shutdown, start_http
from fleetserve.logs import FIELDS, JsonFormatter
from fleetserve.metrics import Metrics
from fleetserve.queue import MemoryQueue
from fleetserve.settings import Settings
from fleetserve.wire import Encoding, InvalidInput, Principal, Reply

from ..hangup import AsyncHangup

MODEL = "gen/stub"
TIMINGS = {"queue_ms": 1.5, "inference_ms": 2.5}

Serve = Callable[..., Awaitable[str]]


def event(n: int) -> bytes:
    return b"data: " + json.dumps({"n": n}).encode() + b"\n\n"


async def worker(queue: MemoryQueue, hold: asyncio.Event) -> None:
    """A stand-in worker. A stream: a chunk, then by the prompt: ``fail`` an error,
    ``hold`` nothing until ``hold`` is set, else the end with the worker's timings."""
    while True:
        for msg in await queue.pull([MODEL], 1 << 20, 0.05):
            body = json.loads(msg.body)
            if body.get("stream"):
                await queue.reply(msg, Reply(event(0), Encoding.JSON, final=False))
                if body.get("prompt") == "fail":
                    err = InvalidInput("went wrong", field="x").to_body()
                    await queue.reply(msg, Reply(error=err, timings=TIMINGS))
                    await queue.ack(msg)
                    continue
                if body.get("prompt") == "hold":
                    await hold.wait()
            await queue.reply(msg, Reply(b"data: [DONE]\n\n", timings=TIMINGS))
            await queue.ack(msg)


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Starts a gateway (its keyword arguments: ``Gateway``'s) over a memory queue with
    a stand-in worker; returns its URL."""
    async with AsyncExitStack() as stack:
        hold = asyncio.Event()
        stack.callback(hold.set)

        async def start(**kw: Any) -> str:
            kw.setdefault("hooks", Hooks(ready=lambda: True))
            spec = ModelSpec(id=MODEL, family="generate", runtime="torch", sources=("/x",))
            queue = MemoryQueue(16, 1.0)
            await queue.start()
            stack.push_async_callback(queue.close)
            gw = Gateway(
                Settings.load(overrides={"port": 0}),
                Catalog([spec]),
                queue,
                Metrics(),
                **kw,
            )
            server, task, port = await start_http(gw, "127.0.0.1", 0)
            stack.push_async_callback(shutdown, server, [task])
            work = asyncio.create_task(worker(queue, hold))
            stack.callback(work.cancel)
            return f"http://127.0.0.1:{port}"

        yield start


@pytest.fixture
def access(caplog: pytest.LogCaptureFixture) -> Callable[[str], Awaitable[logging.LogRecord]]:
    """The access record of a request id, waited for: it is logged once the response
    is sent, so a client may read the response first."""
    caplog.set_level(logging.DEBUG)

    async def find(rid: str) -> logging.LogRecord:
        async with asyncio.timeout(5):
            while True:
                for r in caplog.records:
                    if r.name == "fleetserve.access" and fields(r).get("id") == rid:
                        return r
                await asyncio.sleep(0.005)

    return find


def fields(record: logging.LogRecord) -> dict[str, Any]:
    return dict(getattr(record, FIELDS, None) or {})


Find = Callable[[str], Awaitable[logging.LogRecord]]


async def test_a_huge_model_name_is_cut_on_the_access_line(serve: Serve, access: Find) -> None:
    url = await serve()
    body = {"model": "m" * 100_000, "input": "x"}
    async with httpx.AsyncClient() as c:
        r = await c.post(url + "/v1/embeddings", json=body, headers={"x-request-id": "huge"})
    assert r.status_code == 404
    record = await access("huge")
    model = fields(record)["model"]
    assert len(model) <= 200 and model.endswith("\u2026")
    assert len(JsonFormatter().format(record)) < 1000


async def test_the_probe_header_quiets_only_polling(serve: Serve, access: Find) -> None:
    url = await serve()
    probe = {"x-fleetserve-probe": "cluster"}
    async with httpx.AsyncClient(base_url=url) as c:
        r = await c.get("/v1/models", headers={**probe, "x-request-id": "poll"})
        assert r.status_code == 200
        r = await c.post(
            f"/v1/generate/{MODEL}", json={"prompt": "hi"}, headers={**probe, "x-request-id": "w"}
        )
        assert r.status_code == 200
        r = await c.get("/v1/nowhere", headers={**probe, "x-request-id": "miss"})
        assert r.status_code == 404
    assert (await access("poll")).levelno == logging.DEBUG
    assert (await access("w")).levelno == logging.INFO  # real work: never hidden
    assert (await access("miss")).levelno == logging.INFO


async def test_a_handler_that_raises_gets_a_500_with_its_headers(
    serve: Serve, access: Find, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> list[dict[str, Any]]:
        raise RuntimeError("models_info failed")

    url = await serve(hooks=Hooks(ready=lambda: True, models_info=broken))
    async with httpx.AsyncClient(base_url=url) as c:
        r = await c.get("/v1/models", headers={"x-request-id": "boom-1"})
        assert r.status_code == 500
        assert r.headers["x-request-id"] == "boom-1" and "x-total-time-ms" in r.headers
        assert r.json()["error"]["code"] == "internal_error" and "Traceback" not in r.text
        assert (await c.get("/healthz")).status_code == 200  # the server goes on
    record = await access("boom-1")
    assert record.getMessage().startswith("GET /v1/models 500 ")
    assert fields(record)["code"] == "internal_error"
    logged = [x for x in caplog.records if x.exc_info and "models_info failed" in str(x.exc_info)]
    assert len(logged) == 1  # once, by the gateway (not uvicorn's too)


async def test_a_handler_that_raises_after_it_started_is_a_500_on_the_line(
    access: Find,
) -> None:
    async def half(scope: Any, receive: Any, send: Any, principal: Principal) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("half way")

    queue = MemoryQueue(4, 1.0)
    gw = Gateway(
        Settings(),
        Catalog([]),
        queue,
        Metrics(),
        hooks=Hooks(ready=lambda: True),
        routes=Routes(adapters=half),
    )
    sent: list[dict[str, Any]] = []

    async def send(m: dict[str, Any]) -> None:
        sent.append(m)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    headers = [(b"x-request-id", b"half-1")]
    scope = {"type": "http", "method": "GET", "path": "/v1/adapters", "headers": headers}
    await gw(scope, receive, send)  # raises nothing
    record = await access("half-1")
    assert record.getMessage().startswith("GET /v1/adapters 500 ")
    assert fields(record)["code"] == "internal_error"
    assert [m["type"] for m in sent] == ["http.response.start"]  # no second start


async def test_a_stream_has_its_timings_and_no_made_up_ones(serve: Serve, access: Find) -> None:
    url = await serve()
    body = {"prompt": "hi", "stream": True}
    async with httpx.AsyncClient(base_url=url) as c:
        r = await c.post(f"/v1/generate/{MODEL}", json=body, headers={"x-request-id": "s-ok"})
        assert r.status_code == 200 and r.text.endswith("[DONE]\n\n")
        r2 = await c.post(f"/v1/generate/{MODEL}", json={**body, "prompt": "fail"},
                          headers={"x-request-id": "s-fail"})  # fmt: skip
        assert "event: error" in r2.text
    assert r.headers["x-request-id"] == "s-ok" and "x-total-time-ms" in r.headers
    assert "x-queue-time-ms" not in r.headers and "x-inference-time-ms" not in r.headers
    ok = fields(await access("s-ok"))
    assert ok["queue_ms"] == 1.5 and ok["inference_ms"] == 2.5 and ok.get("code") is None
    failed = fields(await access("s-fail"))
    assert failed["code"] == "invalid_input" and failed["queue_ms"] == 1.5


async def test_a_stream_the_client_drops_says_cancelled(serve: Serve, access: Find) -> None:
    url = await serve()
    body = {"prompt": "hold", "stream": True}
    client = await AsyncHangup.post(url, f"/v1/generate/{MODEL}", body, {"x-request-id": "s-gone"})
    await client.read_until(b'data: {"n": 0}')
    await client.close()
    record = await access("s-gone")
    assert fields(record)["code"] == "cancelled"


async def test_errors_of_handlers_that_answer_themselves_have_code_and_tenant(
    serve: Serve, access: Find, tmp_path: Path
) -> None:
    registry = cast(Any, SimpleNamespace(limits=SimpleNamespace(max_bytes=0)))
    url = await serve(routes=Routes(adapters=AdapterRoutes(registry)))
    async with httpx.AsyncClient(base_url=url) as c:
        h = {"x-request-id": "ad-1", "x-tenant": "acme", "accept": "application/msgpack"}
        r = await c.request("PATCH", "/v1/adapters", headers=h)
        assert r.status_code == 404
        assert msgspec.msgpack.decode(r.content)["error"]["code"] == "not_found"
        r = await c.get("/v1/tuning/runs/nope", headers={"x-request-id": "tune-1"})
        assert r.status_code == 404
    adapters = fields(await access("ad-1"))
    assert adapters["code"] == "not_found" and adapters["tenant"] == "acme"
    tuning = fields(await access("tune-1"))
    assert tuning["code"] == r.json()["error"]["code"] and tuning["tenant"] == "default"
