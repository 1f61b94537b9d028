"""``fleetserve lora add|list|rm`` through the SDK against the ``/v1/adapters`` routes,
and the SDK's adapter methods, sync and async; the table fits 80 columns."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

import fleetserve.sdk
from fleetserve import AsyncClient, Client
from fleetserve.cli import main
from fleetserve.gateway.adapters import AdapterRoutes
from fleetserve.lora.store import AdapterStore
from fleetserve.storage import MemoryStore
from fleetserve.wire import AdapterNotFound, Forbidden, InvalidInput

from .lora.kit import ALICE, BASE, READER, Kit, kit_fixture, registry_on  # noqa: F401


def asgi_app(kit: Kit) -> Any:
    routes = AdapterRoutes(registry_on(AdapterStore(MemoryStore()), kit))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        bearer = dict(scope["headers"]).get(b"authorization", b"")
        await routes(scope, receive, send, READER if bearer == b"Bearer reader" else ALICE)

    return app


def sync_transport(app: Any) -> httpx.MockTransport:
    """The ASGI app behind a sync client: each request runs on a loop of its own."""

    def handle(request: httpx.Request) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport) as c:
                r = await c.request(
                    request.method,
                    str(request.url),
                    headers=request.headers,
                    content=request.read(),
                )
            return httpx.Response(r.status_code, headers=r.headers, content=r.content)

        return asyncio.run(go())

    return httpx.MockTransport(handle)


@pytest.fixture
def server(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> httpx.MockTransport:
    transport = sync_transport(asgi_app(kit))
    real = fleetserve.sdk.Client

    def client(url: str, **kwargs: Any) -> Client:
        assert url == "http://adapters.test"
        return real(url, transport=transport, **kwargs)

    monkeypatch.setattr(fleetserve.sdk, "Client", client)
    return transport


def test_add_list_rm(
    server: httpx.MockTransport, kit: Kit, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--url", "http://adapters.test"]
    assert main(["lora", "add", str(kit.lora.dir), "--name", "legal-v1", "--base", BASE, *url]) == 0
    out = capsys.readouterr().out
    assert "added alice/legal-v1@1 for tiny/bert" in out and "tiny/bert:alice/legal-v1@1" in out
    assert main(["lora", "add", str(kit.lora2.dir), "--name", "legal-v1", "--pinned", *url]) == 0
    capsys.readouterr()
    assert main(["lora", "list", *url]) == 0
    table = capsys.readouterr().out
    assert "alice/legal-v1@1" in table and "alice/legal-v1@2" in table and " yes" in table
    assert max(len(line) for line in table.splitlines()) <= 80, table
    assert main(["lora", "rm", "alice/legal-v1@1", *url]) == 0
    assert "deleted alice/legal-v1@1" in capsys.readouterr().out
    assert main(["lora", "rm", "alice/legal-v1@1", *url]) == 1
    assert "no adapter alice/legal-v1@1 (adapter_not_found)" in capsys.readouterr().out
    assert main(["lora", "add", str(kit.work), "--name", "x", *url]) == 1
    assert "has no adapter_config.json" in capsys.readouterr().out


def test_the_sync_sdk(server: httpx.MockTransport, kit: Kit, tmp_path: Path) -> None:
    with Client("http://adapters.test", transport=server) as c:
        info = c.upload_adapter(kit.lora.dir / "adapter_model.safetensors", "a", base=BASE)
        assert info["id"] == "alice/a@1"
        assert c.upload_adapter(kit.lora.dir, "a", version=4)["id"] == "alice/a@4"
        assert [a["id"] for a in c.list_adapters()] == ["alice/a@1", "alice/a@4"]
        assert c.list_adapters(base="x/y") == []
        assert c.get_adapter("alice/a")["version"] == 4
        assert c.delete_adapter("alice/a") == ["alice/a@1", "alice/a@4"]
        with pytest.raises(AdapterNotFound, match="alice/a"):
            c.get_adapter("alice/a")
        pickled = tmp_path / "pickled"
        pickled.mkdir()
        (pickled / "adapter_config.json").write_bytes(kit.lora.config)
        (pickled / "adapter_model.bin").write_bytes(b"\x80\x04.")
        with pytest.raises(InvalidInput, match=r"adapter_model\.bin: pickled"):
            c.upload_adapter(pickled, "p")
    with (
        Client("http://adapters.test", transport=server, api_key="reader") as c,
        pytest.raises(Forbidden),
    ):
        c.upload_adapter(kit.lora.dir, "a")


async def test_the_async_sdk(kit: Kit) -> None:
    transport = httpx.ASGITransport(app=asgi_app(kit))
    async with AsyncClient("http://t", transport=transport) as c:
        info = await c.upload_adapter(kit.lora.dir, "b", base=BASE, pinned=True)
        assert info["id"] == "alice/b@1" and info["pinned"]
        assert [a["id"] for a in await c.list_adapters(BASE)] == ["alice/b@1"]
        assert (await c.get_adapter("alice/b@1"))["sha256"] == info["sha256"]
        assert await c.delete_adapter("alice/b@1") == ["alice/b@1"]


def test_native_calls_send_the_adapter_field() -> None:
    sent: list[dict[str, Any]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        import msgspec

        sent.append(msgspec.msgpack.decode(request.content))
        return httpx.Response(
            200,
            headers={"content-type": "application/msgpack"},
            content=msgspec.msgpack.encode({"scores": [0.5], "results": [[]]}),
        )

    with Client("http://t", transport=httpx.MockTransport(handle)) as c:
        c.score("m", "q", ["a"], adapter="alice/x@2")
        c.extract("m", "text", adapter="alice/x")
        c.score("m", "q", ["a"])
    assert sent[0]["adapter"] == "alice/x@2" and sent[1]["adapter"] == "alice/x"
    assert "adapter" not in sent[2]
