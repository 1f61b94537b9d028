"""``/v1/adapters`` through the ASGI callable: multipart, msgpack and JSON uploads,
list/get/delete, scopes (403), other tenants (404), bad input (400), races (409)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest

from fleetserve.gateway.adapter_routes import AdapterRoutes
from fleetserve.gateway.http import Receive, Scope, Send, header
from fleetserve.lora.store import AdapterStore
from fleetserve.storage import MemoryStore
from fleetserve.wire import Principal

from ..lora.kit import ADMIN, ALICE, BASE, BOB, READER, Kit, kit_fixture, registry_on  # noqa: F401

WHO = {"alice": ALICE, "bob": BOB, "reader": READER, "admin": ADMIN}


def app_for(routes: AdapterRoutes) -> Any:
    """The gateway's part: authenticate (here: a header names the caller), then call."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        principal: Principal = WHO[header(scope, b"x-who") or "alice"]
        await routes(scope, receive, send, principal)

    return app


@pytest.fixture
async def http(kit: Kit) -> AsyncIterator[httpx.AsyncClient]:
    store = AdapterStore(MemoryStore())
    routes = AdapterRoutes(registry_on(store, kit, max_bytes=64 * 1024))
    transport = httpx.ASGITransport(app=app_for(routes))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        client.store = store  # type: ignore[attr-defined]
        yield client


def multipart(kit: Kit, weights_name: str = "adapter_model.safetensors") -> dict[str, Any]:
    return {
        "files": [
            ("files", ("adapter_config.json", kit.lora.config, "application/json")),
            ("files", (weights_name, kit.lora.weights, "application/octet-stream")),
        ]
    }


async def test_multipart_upload_list_get_delete(http: httpx.AsyncClient, kit: Kit) -> None:
    r = await http.post("/v1/adapters", data={"name": "legal", "base": BASE}, **multipart(kit))
    assert r.status_code == 201, r.text
    info = r.json()
    assert info["id"] == "alice/legal@1" and info["model"] == f"{BASE}:alice/legal@1"
    assert len(info["sha256"]) == 64 and info["rank"] == 4 and info["base"] == BASE
    listed = (await http.get("/v1/adapters")).json()
    assert listed["object"] == "list" and [a["id"] for a in listed["data"]] == ["alice/legal@1"]
    assert (await http.get("/v1/adapters", params={"base": "x/y"})).json()["data"] == []
    got = await http.get("/v1/adapters/alice/legal")
    assert got.status_code == 200 and got.json() == info
    assert (await http.get("/v1/adapters/alice%2Flegal%401")).json()["id"] == info["id"]
    gone = await http.delete("/v1/adapters/alice/legal")
    assert gone.status_code == 200 and gone.json()["deleted"] == ["alice/legal@1"]
    missing = await http.get("/v1/adapters/alice/legal")
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "code": "adapter_not_found",
        "message": "no adapter alice/legal",
        "field": "adapter",
    }


async def test_msgpack_and_json_uploads(http: httpx.AsyncClient, kit: Kit) -> None:
    body = {"name": "mp", "config": kit.lora.config, "weights": kit.lora.weights, "version": 3}
    r = await http.post(
        "/v1/adapters",
        content=msgspec.msgpack.encode(body),
        headers={"content-type": "application/msgpack", "accept": "application/msgpack"},
    )
    assert r.status_code == 201 and r.headers["content-type"] == "application/msgpack"
    assert msgspec.msgpack.decode(r.content)["id"] == "alice/mp@3"
    as_json = {
        "name": "alice/js",
        "base": BASE,
        "pinned": True,
        "config": json.loads(kit.lora.config),
        "weights": base64.b64encode(kit.lora.weights).decode(),
    }
    r = await http.post("/v1/adapters", json=as_json)
    assert r.status_code == 201 and r.json()["id"] == "alice/js@1" and r.json()["pinned"]


async def test_scopes_and_tenants(http: httpx.AsyncClient, kit: Kit) -> None:
    up = await http.post("/v1/adapters", data={"name": "mine"}, **multipart(kit))
    assert up.status_code == 201
    r = await http.post(
        "/v1/adapters", data={"name": "x"}, headers={"x-who": "reader"}, **multipart(kit)
    )
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    assert "adapters:write" in r.json()["error"]["message"]
    assert (
        await http.delete("/v1/adapters/alice/mine", headers={"x-who": "reader"})
    ).status_code == 403
    assert (
        await http.get("/v1/adapters/alice/mine", headers={"x-who": "reader"})
    ).status_code == 200
    for method in ("GET", "DELETE"):
        r = await http.request(method, "/v1/adapters/alice/mine", headers={"x-who": "bob"})
        assert r.status_code == 404 and "alice/mine" in r.json()["error"]["message"]
    assert (await http.get("/v1/adapters", headers={"x-who": "bob"})).json()["data"] == []
    r = await http.post("/v1/adapters", data={"name": "bob/x"}, **multipart(kit))
    assert r.status_code == 403
    r = await http.post(
        "/v1/adapters", data={"name": "public/x"}, headers={"x-who": "admin"}, **multipart(kit)
    )
    assert r.status_code == 201
    assert len((await http.get("/v1/adapters", headers={"x-who": "bob"})).json()["data"]) == 1


@pytest.mark.parametrize(
    ("extra", "status", "words"),
    [
        ({"weights_name": "adapter_model.bin"}, 400, "adapter_model.bin: pickled weights"),
        ({"data": {"name": "x", "color": "red"}}, 400, "unknown form field 'color'"),
        ({"data": {"base": BASE}}, 400, "field name is required"),
        ({"data": {"name": "x", "version": "0"}}, 400, "version must be a positive integer"),
        ({"data": {"name": "x", "base": "nope"}}, 400, "base 'nope' is not a model"),
        ({"data": {"name": "Bad Name!"}}, 400, "is not 'tenant/name'"),
    ],
)
async def test_bad_uploads_are_400s_that_store_nothing(
    http: httpx.AsyncClient,
    kit: Kit,
    extra: dict[str, Any],
    status: int,
    words: str,
) -> None:
    files = multipart(kit, extra.get("weights_name", "adapter_model.safetensors"))
    r = await http.post("/v1/adapters", data=extra.get("data", {"name": "x"}), **files)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"]
    assert await http.store.keys() == []  # type: ignore[attr-defined]


async def test_bad_bodies(http: httpx.AsyncClient, kit: Kit) -> None:
    r = await http.post("/v1/adapters", json={"name": "x", "config": {}, "weights": "@@"})
    assert r.status_code == 400 and "not base64" in r.json()["error"]["message"]
    r = await http.post("/v1/adapters", json={"name": "x", "config": "{}", "wait": 1})
    assert r.status_code == 400 and r.json()["error"]["field"] == "wait"
    r = await http.post("/v1/adapters", json={"name": "x", "config": "{}"})
    assert r.status_code == 400 and r.json()["error"]["field"] == "weights"
    big = {"name": "x", "config": "{}", "weights": base64.b64encode(bytes(3 << 20)).decode()}
    assert (await http.post("/v1/adapters", json=big)).status_code == 413
    r = await http.post(
        "/v1/adapters",
        content=b"--b\r\ncontent-disposition: form-data; name=name\r\n\r\nx\r\n",
        headers={"content-type": "multipart/form-data; boundary=b"},
    )
    assert r.status_code == 400 and "cut short" in r.json()["error"]["message"]
    assert (await http.put("/v1/adapters/alice/x")).status_code == 404
    r = await http.get("/v1/adapters/alice/x@zero")
    assert r.status_code == 400 and "version" in r.json()["error"]["message"]


class _HeldBases:
    """The kit's bases, with the first upload held inside ``create`` until let go, so
    that a second upload of the same name surely arrives while the first is in flight
    (two plain concurrent posts only overlap by luck: CI saw [201, 201])."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    def family(self, model: str) -> str | None:
        return self.inner.family(model)  # type: ignore[no-any-return]

    async def shapes(self, model: str) -> Any:
        if not self.entered.is_set():
            self.entered.set()
            await self.release.wait()
        return await self.inner.shapes(model)


async def test_two_uploads_at_once_one_201_one_409(kit: Kit) -> None:
    registry = registry_on(AdapterStore(MemoryStore()), kit, max_bytes=64 * 1024)
    bases = registry.bases = _HeldBases(registry.bases)
    transport = httpx.ASGITransport(app=app_for(AdapterRoutes(registry)))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        first = asyncio.create_task(
            http.post("/v1/adapters", data={"name": "race"}, **multipart(kit))
        )
        await asyncio.wait_for(bases.entered.wait(), 30)
        second = await http.post("/v1/adapters", data={"name": "race"}, **multipart(kit))
        bases.release.set()
        assert (await first).status_code == 201
    assert second.status_code == 409, second.text
    conflict = second.json()["error"]
    assert conflict["code"] == "conflict" and "alice/race" in conflict["message"]
