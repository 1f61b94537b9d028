"""Minimal ASGI plumbing: read a bounded body (whole or as it arrives), send a complete
response."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from ..wire import Cancelled, InvalidInput, PayloadTooLarge

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = logging.getLogger("fleetserve.gateway")


def header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return None


def declared_length(scope: Scope, limit: int) -> int | None:
    """The body's Content-Length, if sent; 413 at once when it exceeds ``limit``."""
    declared = header(scope, b"content-length")
    if declared is None:
        return None
    try:
        n = int(declared)
    except ValueError:
        raise InvalidInput("content-length is not an integer", field="content-length") from None
    if n > limit:
        raise PayloadTooLarge(f"body of {n} bytes exceeds the limit of {limit}", field="body")
    return n


def cut_off(scope: Scope, got: int, declared: int | None) -> Cancelled:
    """The error (and the log line) for a body the client hung up in the middle of: a
    499 in the access log, and nothing of it is kept."""
    of = f" of {declared}" if declared is not None else ""
    message = f"upload cut off after {got}{of} bytes: the client hung up"
    log.warning("%s %s: %s", scope.get("method", ""), scope.get("path", ""), message)
    return Cancelled(message, field="body")


async def body_chunks(scope: Scope, receive: Receive, limit: int) -> AsyncIterator[bytes]:
    """The body's chunks as they arrive, failing with 413 as soon as it exceeds
    ``limit`` bytes, and with :func:`cut_off` when the client hangs up before its end
    (fewer bytes than its Content-Length, or no final chunk)."""
    declared = declared_length(scope, limit)
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise cut_off(scope, size, declared)
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"body exceeds the limit of {limit} bytes", field="body")
        if chunk:
            yield chunk
        if not msg.get("more_body", False):
            break
    if declared is not None and size < declared:
        raise cut_off(scope, size, declared)


async def read_body(
    scope: Scope, receive: Receive, limit: int, grow: Callable[[int], None] | None = None
) -> bytes:
    """The whole body, failing with 413 as soon as it exceeds ``limit`` bytes, and with
    :func:`cut_off` (never a partial body) when the client hangs up before its end.
    ``grow`` hears the bytes read so far after each chunk (a request memory reservation:
    it raises to refuse the body before the rest of it arrives)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in body_chunks(scope, receive, limit):
        chunks.append(chunk)
        size += len(chunk)
        if grow is not None:
            grow(size)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def respond(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
