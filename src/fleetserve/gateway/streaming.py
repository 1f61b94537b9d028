"""A streamed reply relayed to the client as server-sent events: each chunk's bytes (the
SSE lines the worker wrote) as they come."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from ..logs.access import Access
from ..queue.base import PendingReply
from ..tracing import RequestTrace
from ..wire import Envelope, FleetError, InternalError, Reply, error_from_body
from .errors import stopping
from .http import Send
from .keepalive import Grant
from .routes import sse_error

STOP_SEND_S = 1.0  # how long a stream cancelled at its server's stop may take to end


async def relay(
    send: Send,
    pending: PendingReply,
    env: Envelope,
    trace: RequestTrace,
    *,
    access: Access,
    grant: Grant | None,
    ended: Callable[[str], None],
) -> None:
    """Errors before the first chunk are plain HTTP errors (raised); after it, the status
    is sent already, so an error becomes an SSE ``error`` event and the stream ends.
    ``access`` learns the outcome's code and the worker's timings (its last chunk has
    them); ``ended`` hears the code once the last byte is sent."""
    chunks = pending.stream(env.deadline - time.time())
    first = await anext(chunks)  # errors here propagate as HTTP errors
    trace.replied(first)  # its first chunk (or its whole, one-chunk reply)
    timings(access, first)  # known now: in the headers (stamped), else left out
    if first.error is not None:
        raise error_from_body(first.error, retry_after=first.timings.get("retry_after"))
    headers = [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache"),
        (b"x-request-id", access.request_id.encode()),
        (b"x-priority", env.priority.value.encode()),
        *(grant.headers() if grant is not None else ()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    code, bound = "ok", None  # bound: the stop's sends wait at most that long
    try:
        await send({"type": "http.response.body", "body": first.body, "more_body": True})
        if not first.final:
            async for reply in chunks:
                if reply.final or reply.error is not None:
                    trace.replied(reply)  # the stream's end, with the worker's timings
                    timings(access, reply)
                if reply.error is not None:
                    code = str(reply.error.get("error", {}).get("code", "internal"))
                    body = sse_error(reply.error)
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                    break
                await send({"type": "http.response.body", "body": reply.body, "more_body": True})
    except FleetError as err:
        code = err.code
        body = sse_error(err.to_body())
        await send({"type": "http.response.body", "body": body, "more_body": True})
    except asyncio.CancelledError:  # its server stopped under it (Gateway: a 503)
        told = stopping()
        code, bound = told.code, STOP_SEND_S  # a client that reads no more holds nothing
        body = sse_error(told.to_body())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(bound):
                await send({"type": "http.response.body", "body": body, "more_body": True})
        raise
    except Exception:
        code = InternalError.code
        raise
    finally:
        access.code = None if code == "ok" else code
        await chunks.aclose()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(bound):
                await send({"type": "http.response.body", "body": b""})
        ended(code)


def timings(access: Access, reply: Reply) -> None:
    """The worker's timings, where the reply has them, on the access line."""
    access.queue_ms = reply.timings.get("queue_ms", access.queue_ms)
    access.inference_ms = reply.timings.get("inference_ms", access.inference_ms)


__all__ = ["relay", "timings"]
