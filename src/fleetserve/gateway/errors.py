"""The one place where errors become HTTP responses."""

from __future__ import annotations

import contextlib
import math

from ..logs.access import Access
from ..wire import Encoding, FleetError, InternalError, Unavailable
from ..wire.codec import dumps, encoding_of, loads
from .http import Message, Send, respond

STATUS: dict[str, int] = {
    "invalid_input": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "adapter_not_found": 404,
    "conflict": 409,
    "not_found": 404,
    "model_not_found": 404,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "overloaded": 429,
    "internal_error": 500,
    "unavailable": 503,
    "deadline_exceeded": 504,
    "cancelled": 499,  # nginx's Client Closed Request: the client hung up
}


def status_of(code: str) -> int:
    return STATUS.get(code, 500)


def error_response(
    err: FleetError, encoding: Encoding = Encoding.JSON
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers and body for an error, in the client's encoding."""
    status = status_of(err.code)
    return body_response(status, err.to_body(), encoding, err.retry_after)


def body_response(
    status: int, body: object, encoding: Encoding, retry_after: float | None = None
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    headers = [(b"content-type", encoding.value.encode())]
    if retry_after is not None or status in (429, 503):
        secs = max(1, math.ceil(retry_after if retry_after is not None else 1.0))
        headers.append((b"retry-after", str(secs).encode()))
    return status, headers, dumps(body, encoding)


def stamped(send: Send, access: Access) -> Send:
    """``send`` for one request: each response (errors from any route included) gets
    ``x-request-id`` and the timing headers that it lacks, and ``access`` records the
    status, the bytes sent and, from an error body (any route's: they all answer with
    :meth:`FleetError.to_body`), its code for the access line.

    Queue and inference time are the reply's where known; unknown, a stream
    (``text/event-stream``) goes without them, anything else says 0."""
    error_encoding: list[Encoding] = []  # set: an error response whose code is unknown

    async def stamp(message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            access.status = int(message["status"])
            headers = list(message.get("headers", ()))
            have = {bytes(k).lower(): bytes(v) for k, v in headers}
            kind_of = have.get(b"content-type", b"").decode("latin-1")
            if access.status >= 400 and access.code is None:
                with contextlib.suppress(FleetError):  # not JSON or msgpack: no error body
                    error_encoding.append(encoding_of(kind_of))
            stream = kind_of.startswith("text/event-stream")
            extra = [
                (name, value.encode())
                for name, value in (
                    (b"x-request-id", access.request_id),
                    (b"x-queue-time-ms", _ms(access.queue_ms, stream)),
                    (b"x-inference-time-ms", _ms(access.inference_ms, stream)),
                    (b"x-total-time-ms", f"{access.total_ms():.3f}"),
                )
                if name not in have and value is not None
            ]
            if extra:
                message = {**message, "headers": [*headers, *extra]}
        elif kind == "http.response.body":
            body = message.get("body", b"")
            access.bytes_out += len(body)
            if error_encoding and access.code is None and body:
                access.code = _error_code(body, error_encoding.pop())
        await send(message)

    return stamp


def _ms(value: float | None, stream: bool) -> str | None:
    if value is None:
        return None if stream else "0.000"
    return f"{value:.3f}"


def _error_code(body: bytes, encoding: Encoding) -> str | None:
    """The ``code`` of an error body (``{"error": {"code": ...}}``), if it is one."""
    if not body or len(body) > 65536:
        return None
    try:
        doc = loads(body, encoding)
    except FleetError:
        return None
    err = doc.get("error") if isinstance(doc, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, str) and code else None


async def crashed(send: Send, access: Access, encoding: Encoding = Encoding.JSON) -> None:
    """After a handler raised something no FleetError (the caller logged it): a 500
    ``internal_error`` through ``send`` (the stamped one: id and timing headers), or,
    where a response was already started, a 500 on the access line only."""
    await _late(send, access, InternalError("internal error"), 500, encoding)


def stopping(retry_after: float | None = None) -> Unavailable:
    """What a request its server stopped under is told (``stopped``, and a stream's
    error event, ``streaming.relay``)."""
    return Unavailable("the server is stopping; retry", retry_after=retry_after)


async def stopped(send: Send, access: Access, retry_after: float) -> None:
    """A request its server stopped under (its stop's grace ran out, and uvicorn
    cancelled it): a 503 ``unavailable`` with Retry-After, for the client to try again
    elsewhere or later; where a response was already started (a stream: ``relay`` sent
    its error event), a 503 on the access line only."""
    await _late(send, access, stopping(retry_after), 503)


async def _late(
    send: Send, access: Access, err: FleetError, status: int, encoding: Encoding = Encoding.JSON
) -> None:
    """``err`` through ``send``, or on the access line only where a response was
    already started or the client is gone."""
    access.code = err.code
    if access.status:
        access.status = status
        return
    try:
        await respond(send, *error_response(err, encoding))
    except Exception:  # the client may be gone: nothing more to tell it
        access.status = status
