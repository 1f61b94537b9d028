"""The drop-in routes' HTTP side (``gateway.compat`` holds their shapes): read the
route's body, run it as the native request of its task, and answer in the route's
shape. The native request keeps the client's headers (its key, its request id, its
deadline), so it is authenticated, limited, queued and logged as any other."""

from __future__ import annotations

import importlib.metadata
from typing import Any, Protocol

import msgspec

from ..catalog import Catalog
from ..settings import Settings
from ..wire import FleetError, Principal, Task
from ..wire.codec import dumps
from ..wire.types import Encoding
from . import compat
from .errors import body_response, status_of
from .http import Message, Receive, Scope, Send, read_body, respond

_JSON = [(b"content-type", b"application/json")]
_REPLACED = {b"content-type", b"accept", b"content-length"}
_PATH_TASKS = frozenset({Task.ENCODE, Task.SCORE, Task.EXTRACT, Task.GENERATE})


class RunsNative(Protocol):
    """What the gateway lends these routes: its catalog and settings, and its native
    inference path for one request."""

    catalog: Catalog
    settings: Settings

    async def run_native(
        self, scope: Scope, receive: Receive, send: Send, task: Task, model: str | None,
        principal: Principal,
    ) -> None: ...  # fmt: skip

    def models_info(self) -> list[dict[str, Any]]: ...


def handles(method: str, path: str) -> bool:
    if method == "POST":
        return path in compat.PATHS
    return method == "GET" and path in ("/info", "/models")


class _Captured:
    """The native route's response, kept instead of sent."""

    def __init__(self) -> None:
        self.status = 500
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []

    async def send(self, msg: Message) -> None:
        if msg["type"] == "http.response.start":
            self.status = int(msg["status"])
            self.headers = [(k, v) for k, v in msg.get("headers", []) if k.lower() not in _REPLACED]
        elif msg["type"] == "http.response.body":
            self.chunks.append(bytes(msg.get("body", b"")))


async def serve(
    gw: RunsNative, scope: Scope, receive: Receive, send: Send, principal: Principal
) -> None:
    method, path = scope["method"], scope["path"]
    if method == "GET":
        await _get(gw, path, send)
        return
    tei = path in compat.TEI  # until the body says which /rerank it is
    try:
        raw = await read_body(scope, receive, gw.settings.max_body_bytes)
        body = compat.decode(raw)
        route = compat.route_for(path, body)
        tei = route.tei
        native = route.request(body, compat.model_for(route, body, gw.catalog, _served(gw)))
    except FleetError as err:
        status, said = compat.error_body(tei, err, status_of(err.code))
        await respond(send, *body_response(status, said, Encoding.JSON, err.retry_after))
        return
    sent = msgspec.json.encode(native.body)
    inner = {
        **scope,
        "path": native.path,
        "headers": [
            *(h for h in scope["headers"] if h[0].lower() not in _REPLACED),
            (b"content-type", b"application/json"),
            (b"accept", b"application/json"),
            (b"content-length", str(len(sent)).encode()),
        ],
    }
    first = True

    async def receive_native() -> Message:
        nonlocal first
        if first:  # the native body; then the client's own messages (its hang-up)
            first = False
            return {"type": "http.request", "body": sent, "more_body": False}
        return await receive()

    got = _Captured()
    model = native.model if native.task in _PATH_TASKS else None
    await gw.run_native(inner, receive_native, got.send, native.task, model, principal)
    reply = msgspec.json.decode(b"".join(got.chunks)) if got.chunks else {}
    if got.status == 200:
        status, out = 200, dumps(route.reply(reply, body), Encoding.JSON)
    elif route.tei:
        status, said = compat.tei_error(got.status, reply)
        out = dumps(said, Encoding.JSON)
    else:
        status, out = got.status, dumps(reply, Encoding.JSON)
    await respond(send, status, [*got.headers, *_JSON], out)


async def _get(gw: RunsNative, path: str, send: Send) -> None:
    if path == "/models":  # infinity's listing: the native one
        body: object = {"object": "list", "data": gw.models_info()}
    else:
        route = compat.TEI["/embed"]
        try:
            spec = gw.catalog.get(compat.model_for(route, {}, gw.catalog, _served(gw)))
        except FleetError:
            spec = None
        version = importlib.metadata.version("fleetserve")
        body = compat.info(gw.catalog, spec, version, gw.settings.max_items)
    await respond(send, 200, _JSON, dumps(body, Encoding.JSON))


def _served(gw: RunsNative) -> list[str]:
    """The ids ``--models`` names (its patterns aside), in order."""
    return [m for m in gw.settings.model_list() if "*" not in m]
