"""``fleetserve.Client`` and ``fleetserve.AsyncClient``: msgpack over httpx.

Both retry 429 and 503 (honouring Retry-After) up to ``max_retries`` times and
raise the same typed errors as the server's hierarchy (``fleetserve.InvalidInput``...).
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import Any, Self

import httpx
import numpy as np

from ._common import (
    RETRY_STATUSES,
    auth_headers,
    backoff,
    decode_encode_response,
    encode_request,
    network_errors,
)


class Client:
    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8080",
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        max_backoff: float = 10.0,
        api_key: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url, timeout=timeout, transport=transport, headers=auth_headers(api_key)
        )
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_backoff = max_backoff

    def encode(
        self, model: str, texts: str | list[str], *, timeout: float | None = None, **options: Any
    ) -> np.ndarray[Any, Any]:
        """Embeddings as a ``[n, dim]`` array (``output_dtype`` decides its dtype)."""
        t = self.timeout if timeout is None else timeout
        path, body, headers = encode_request(model, texts, options, t)
        resp = self._post(path, body, headers, t)
        return decode_encode_response(resp)

    def _post(
        self, path: str, body: bytes, headers: dict[str, str], timeout: float
    ) -> httpx.Response:
        for attempt in range(self.max_retries + 1):
            with network_errors(timeout):
                resp = self._http.post(path, content=body, headers=headers, timeout=timeout + 1)
            if resp.status_code not in RETRY_STATUSES or attempt == self.max_retries:
                return resp
            time.sleep(backoff(resp, attempt, self.max_backoff))
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncClient:
    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8080",
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        max_backoff: float = 10.0,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url, timeout=timeout, transport=transport, headers=auth_headers(api_key)
        )
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_backoff = max_backoff

    async def encode(
        self, model: str, texts: str | list[str], *, timeout: float | None = None, **options: Any
    ) -> np.ndarray[Any, Any]:
        t = self.timeout if timeout is None else timeout
        path, body, headers = encode_request(model, texts, options, t)
        resp = await self._post(path, body, headers, t)
        return decode_encode_response(resp)

    async def _post(
        self, path: str, body: bytes, headers: dict[str, str], timeout: float
    ) -> httpx.Response:
        for attempt in range(self.max_retries + 1):
            with network_errors(timeout):
                resp = await self._http.post(
                    path, content=body, headers=headers, timeout=timeout + 1
                )
            if resp.status_code not in RETRY_STATUSES or attempt == self.max_retries:
                return resp
            await asyncio.sleep(backoff(resp, attempt, self.max_backoff))
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
