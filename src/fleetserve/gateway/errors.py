"""The one place where errors become HTTP responses."""

from __future__ import annotations

import math

from ..logs.access import Access
from ..wire import Encoding, FleetError
from ..wire.codec import dumps
from .http import Message, Send

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
    ``x-request-id`` and the timing headers that it lacks (a failed request: queue
    and inference time as far as known, else 0), and ``access`` records the status and
    bytes sent for the access line."""

    async def stamp(message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            access.status = int(message["status"])
            have = {k.lower() for k, _ in message.get("headers", ())}
            extra = [
                (name, value.encode())
                for name, value in (
                    (b"x-request-id", access.request_id),
                    (b"x-queue-time-ms", f"{access.queue_ms or 0.0:.3f}"),
                    (b"x-inference-time-ms", f"{access.inference_ms or 0.0:.3f}"),
                    (b"x-total-time-ms", f"{access.total_ms():.3f}"),
                )
                if name not in have
            ]
            if extra:
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
        elif kind == "http.response.body":
            access.bytes_out += len(message.get("body", b""))
        await send(message)

    return stamp
