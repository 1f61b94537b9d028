"""Trivial apps for choosing the HTTP stack: the same reply through each framework."""

from __future__ import annotations

from typing import Any

REPLY = b'{"data":"' + b"A" * 2048 + b'"}'
_HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(REPLY)).encode())]


async def raw_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Raw ASGI, as fleetserve's gateway is written."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        msg = await receive()
        more = msg.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": REPLY})


def _starlette() -> Any:
    try:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response
        from starlette.routing import Route
    except ImportError:  # pragma: no cover
        return None

    async def echo(request: Request) -> Response:
        await request.body()
        return Response(REPLY, media_type="application/json")

    return Starlette(routes=[Route("/{path:path}", echo, methods=["POST"])])


starlette_app = _starlette()


def _limited_httptools() -> Any:
    """fleetserve's bounded httptools protocol with its default limits, for
    ``uvicorn --http benchmarks.echo:limited_httptools`` (http_limits.py)."""
    from fleetserve.http_limits import protocol_class
    from fleetserve.settings import Settings

    settings = Settings()
    return protocol_class(settings, settings.retry_after)


limited_httptools = _limited_httptools()
