"""``fleetserve.AsyncClient``: the coroutine twin of :class:`fleetserve.Client`.

Same methods, arguments, return types and errors; see :mod:`fleetserve.sdk.client`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, TypeVar, overload

import httpx

from . import _adapters as a
from . import _common as c
from .results import Quantized, RerankResult, SparseVector

T = TypeVar("T")
Array = c.Array
Texts = c.Texts


class AsyncClient(c.BaseClient):
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
        super().__init__(base_url, timeout, max_retries, max_backoff)
        self._http = httpx.AsyncClient(
            base_url=base_url, timeout=timeout, transport=transport, headers=c.auth_headers(api_key)
        )

    @overload
    async def encode(
        self,
        model: str,
        texts: Texts,
        *,
        output_dtype: Literal["float32", "float16"] = ...,
        dequantize: bool = ...,
        adapter: str | None = ...,
        timeout: float | None = ...,
        **options: Any,
    ) -> Array: ...
    @overload
    async def encode(
        self,
        model: str,
        texts: Texts,
        *,
        output_dtype: Literal["int8", "binary"],
        dequantize: Literal[True],
        adapter: str | None = ...,
        timeout: float | None = ...,
        **options: Any,
    ) -> Array: ...
    @overload
    async def encode(
        self,
        model: str,
        texts: Texts,
        *,
        output_dtype: Literal["int8", "binary"],
        dequantize: Literal[False] = ...,
        adapter: str | None = ...,
        timeout: float | None = ...,
        **options: Any,
    ) -> Quantized: ...
    @overload
    async def encode(
        self,
        model: str,
        texts: Texts,
        *,
        output_dtype: str,
        dequantize: bool = ...,
        adapter: str | None = ...,
        timeout: float | None = ...,
        **options: Any,
    ) -> Array | Quantized: ...
    async def encode(
        self,
        model: str,
        texts: Texts,
        *,
        output_dtype: str = "float32",
        dequantize: bool = False,
        adapter: str | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> Array | Quantized:
        """Dense embeddings, ``[n, dim]`` (see the module docstring for the dtypes)."""
        result: Array | Quantized
        options = {**options, "adapter": adapter}
        result = await self._run(
            c.encode_call(model, texts, output_dtype, dequantize, options), timeout
        )
        return result

    async def encode_multivector(
        self,
        model: str,
        texts: Texts,
        *,
        is_query: bool = False,
        max_tokens: int | None = None,
        output_dtype: str = "float32",
        dequantize: bool = False,
        adapter: str | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> list[Any]:
        """Token vectors: one ``[tokens, dim]`` array (or :class:`Quantized`) per input."""
        opts = {"is_query": is_query, "max_tokens": max_tokens, "adapter": adapter, **options}
        return await self._run(
            c.multivector_call(model, texts, output_dtype, dequantize, opts), timeout
        )

    async def encode_sparse(
        self,
        model: str,
        texts: Texts,
        *,
        adapter: str | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> list[SparseVector]:
        """Sparse embeddings (options: ``top_k``, ``return_tokens``, ``truncate``)."""
        options = {**options, "adapter": adapter}
        return await self._run(c.sparse_call(model, texts, options), timeout)

    async def score(
        self,
        model: str,
        query: str,
        items: list[str],
        *,
        truncate: bool = True,
        adapter: str | None = None,
        timeout: float | None = None,
    ) -> list[float]:
        """The score of each item against the query, in input order."""
        return await self._run(c.score_call(model, query, items, truncate, adapter), timeout)

    async def rerank(
        self,
        model: str,
        query: str,
        documents: list[str],
        *,
        top_n: int | None = None,
        return_documents: bool = False,
        timeout: float | None = None,
    ) -> list[RerankResult]:
        """The documents ranked against the query, best first (``top_n`` of them)."""
        call = c.rerank_call(model, query, documents, top_n, return_documents)
        return await self._run(call, timeout)

    async def extract(
        self,
        model: str,
        inputs: Texts,
        *,
        labels: list[str] | None = None,
        threshold: float | None = None,
        adapter: str | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> list[Any]:
        """Entities or labels, one result per input."""
        options = {**options, "adapter": adapter}
        return await self._run(c.extract_call(model, inputs, labels, threshold, options), timeout)

    # -- adapters (/v1/adapters) ------------------------------------------------------
    async def upload_adapter(
        self,
        path: str | Path,
        name: str,
        *,
        base: str | None = None,
        version: int | None = None,
        pinned: bool = False,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Upload the PEFT LoRA at ``path`` (its directory, or its safetensors file) as
        ``name`` (``name`` or ``tenant/name``); returns the adapter with its ``id``
        (``tenant/name@version``) and ``sha256``."""
        return await self._send(a.upload(path, name, base, version, pinned), timeout)

    async def list_adapters(
        self, base: str | None = None, *, timeout: float | None = None
    ) -> list[dict[str, Any]]:
        """The adapters this key sees (of ``base`` only, if given)."""
        return await self._send(a.listing(base), timeout)

    async def get_adapter(self, adapter: str, *, timeout: float | None = None) -> dict[str, Any]:
        """One adapter: ``tenant/name`` (the newest version) or ``tenant/name@N``."""
        return await self._send(a.get(adapter), timeout)

    async def delete_adapter(self, adapter: str, *, timeout: float | None = None) -> list[str]:
        """Delete a version, or every version of ``tenant/name``; returns the ids."""
        return await self._send(a.delete(adapter), timeout)

    async def _send(self, req: a.Request[T], timeout: float | None) -> T:
        t = self._t(timeout)
        for attempt in range(self.max_retries + 1):
            with c.network_errors(t):
                resp = await self._http.request(req.method, req.path, **req.kwargs(t))
            if resp.status_code not in c.RETRY_STATUSES or attempt == self.max_retries:
                return req.result(resp)
            await asyncio.sleep(c.backoff(resp, attempt, self.max_backoff))
        raise AssertionError("unreachable")

    async def _run(self, call: c.Call[T], timeout: float | None) -> T:
        t = self._t(timeout)
        headers = call.headers(t)
        for attempt in range(self.max_retries + 1):
            with c.network_errors(t):
                resp = await self._http.post(
                    call.path, content=call.body, headers=headers, timeout=t + 1
                )
            if resp.status_code not in c.RETRY_STATUSES or attempt == self.max_retries:
                return call.result(resp)
            await asyncio.sleep(c.backoff(resp, attempt, self.max_backoff))
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
