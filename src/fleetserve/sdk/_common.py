"""What the sync and async clients share: request building, decoding, retry policy."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np

from ..wire import (
    DeadlineExceeded,
    Encoding,
    FleetError,
    InternalError,
    Unavailable,
    error_from_body,
)
from ..wire.codec import array_from_wire, dumps, loads

MSGPACK = Encoding.MSGPACK.value
RETRY_STATUSES = (429, 503)


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


def encode_request(
    model: str, texts: str | list[str], options: dict[str, Any], timeout: float | None
) -> tuple[str, bytes, dict[str, str]]:
    body = {"inputs": texts, **options}
    headers = {"content-type": MSGPACK, "accept": MSGPACK}
    if timeout is not None:
        headers["x-request-timeout"] = repr(float(timeout))
    return f"/v1/encode/{quote(model, safe='/')}", dumps(body, Encoding.MSGPACK), headers


def decode_encode_response(resp: httpx.Response) -> np.ndarray[Any, Any]:
    raise_for_error(resp)
    body = loads(resp.content, Encoding.MSGPACK)
    return array_from_wire(body["embeddings"])


def raise_for_error(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    raise error_of(resp)


def error_of(resp: httpx.Response) -> FleetError:
    retry_after = _retry_after(resp)
    ct = resp.headers.get("content-type", "")
    try:
        enc = Encoding.MSGPACK if "msgpack" in ct else Encoding.JSON
        body = loads(resp.content, enc)
    except FleetError:
        return InternalError(f"HTTP {resp.status_code}: {resp.text[:200]}")
    return error_from_body(body, retry_after=retry_after)


def _retry_after(resp: httpx.Response) -> float | None:
    raw = resp.headers.get("retry-after")
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


def backoff(resp: httpx.Response, attempt: int, cap: float) -> float:
    """Seconds to wait before retrying: Retry-After when given, else jittered exponential."""
    ra = _retry_after(resp)
    if ra is not None:
        return min(ra, cap)
    return float(min(cap, 0.1 * 2**attempt) * (0.5 + random.random() / 2))


@contextlib.contextmanager
def network_errors(timeout: float) -> Iterator[None]:
    """Raise transport failures as the same typed errors the server would send."""
    try:
        yield
    except httpx.TimeoutException:
        raise DeadlineExceeded(f"no response within {timeout:.3f}s") from None
    except httpx.TransportError as exc:
        raise Unavailable(f"cannot reach the server: {exc}") from None
