"""What the sync and async clients share: request building, decoding, retry policy."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
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
from .results import Quantized, RerankResult, SparseVector

MSGPACK = Encoding.MSGPACK.value
T = TypeVar("T")
Opts = dict[str, Any]
Array = np.ndarray[Any, Any]
Texts = str | list[str]


class BaseClient:
    """What the sync and async clients hold: the server and the retry policy."""

    def __init__(self, base_url: str, timeout: float, max_retries: int, max_backoff: float) -> None:
        self.base_url = base_url
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_backoff = max_backoff

    def _t(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else timeout


RETRY_STATUSES = (429, 503)


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request: where it goes, its msgpack body, and how to read the reply body."""

    path: str
    body: bytes
    decode: Callable[[Any], T]

    def headers(self, timeout: float | None) -> dict[str, str]:
        headers = {"content-type": MSGPACK, "accept": MSGPACK}
        if timeout is not None:
            headers["x-request-timeout"] = repr(float(timeout))
        return headers

    def result(self, resp: httpx.Response) -> T:
        raise_for_error(resp)
        return self.decode(loads(resp.content, Encoding.MSGPACK))


def _call(path: str, body: dict[str, Any], decode: Callable[[Any], T]) -> Call[T]:
    clean = {k: v for k, v in body.items() if v is not None}
    return Call(path, dumps(clean, Encoding.MSGPACK), decode)


def _model_path(route: str, model: str) -> str:
    return f"/v1/{route}/{quote(model, safe='/')}"


def encode_call(
    model: str, texts: str | list[str], output_dtype: str, dequantize: bool, options: Opts
) -> Call[Any]:
    body = {"inputs": texts, **options}
    if output_dtype != "float32":
        body["output_dtype"] = output_dtype

    def decode(reply: Any) -> Any:
        scales = reply.get("scales")
        return _vectors(reply, array_from_wire(reply["embeddings"]), scales, dequantize)

    return _call(_model_path("encode", model), body, decode)


def multivector_call(
    model: str, texts: str | list[str], output_dtype: str, dequantize: bool, options: Opts
) -> Call[list[Any]]:
    body = {"inputs": texts, **options}
    if output_dtype != "float32":
        body["output_dtype"] = output_dtype

    def decode(reply: Any) -> list[Any]:
        mats = [array_from_wire(m) for m in reply["embeddings"]]
        scales = reply.get("scales") or [None] * len(mats)
        return [_vectors(reply, m, s, dequantize) for m, s in zip(mats, scales, strict=True)]

    return _call(_model_path("encode", model), body, decode)


def _vectors(reply: Any, values: Any, scales: Any, dequantize: bool) -> Any:
    """A float array as sent, or the :class:`Quantized` form of int8 and binary vectors."""
    dtype = reply.get("output_dtype")
    if dtype not in ("int8", "binary"):
        return values
    scale_arr = None if scales is None else np.asarray(array_from_wire(scales), np.float32)
    dims = int(reply.get("dimensions") or values.shape[-1])
    q = Quantized(dtype, values, scale_arr, dims)
    return q.dequantize() if dequantize else q


def sparse_call(model: str, texts: str | list[str], options: Opts) -> Call[list[SparseVector]]:
    def decode(reply: Any) -> list[SparseVector]:
        return [
            SparseVector(
                np.asarray(array_from_wire(e["indices"]), np.uint32),
                np.asarray(array_from_wire(e["values"]), np.float32),
                e.get("tokens"),
            )
            for e in reply["embeddings"]
        ]

    return _call(_model_path("encode", model), {"inputs": texts, **options}, decode)


def score_call(
    model: str, query: str, items: list[str], truncate: bool, adapter: str | None = None
) -> Call[list[float]]:
    body = {"query": query, "items": items, "truncate": truncate, "adapter": adapter}
    return _call(_model_path("score", model), body, lambda r: [float(s) for s in r["scores"]])


def rerank_call(
    model: str, query: str, documents: list[str], top_n: int | None, return_documents: bool
) -> Call[list[RerankResult]]:
    body = {
        "model": model,
        "query": query,
        "documents": documents,
        "top_n": top_n,
        "return_documents": return_documents,
    }

    def decode(reply: Any) -> list[RerankResult]:
        return [
            RerankResult(
                int(r["index"]),
                float(r["relevance_score"]),
                (r.get("document") or {}).get("text"),
            )
            for r in reply["results"]
        ]

    return _call("/v1/rerank", body, decode)


def extract_call(
    model: str,
    inputs: str | list[str],
    labels: list[str] | None,
    threshold: float | None,
    options: Opts,
) -> Call[list[Any]]:
    body = {"inputs": inputs, "labels": labels, "threshold": threshold, **options}
    return _call(_model_path("extract", model), body, lambda r: list(r["results"]))


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
