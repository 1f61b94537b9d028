"""``fleetserve.AsyncClient``: the coroutine twin of :class:`fleetserve.Client`.

Same methods, arguments, return types and errors; see :mod:`fleetserve.sdk.client`
(the fine-tuning calls: :class:`~fleetserve.sdk._finetune.AsyncFineTuneMethods`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, TypeVar, overload

import httpx

from ..wire import Priority
from . import _adapters as a
from . import _calls as k
from . import _common as c
from . import _models as m
from ._chunks import sizes_if_large
from ._finetune import AsyncFineTuneMethods
from ._pipeline import Bar, in_tasks
from .records import AdapterInfo
from .results import Quantized, RerankResult, SparseVector

if TYPE_CHECKING:
    from rich.progress import Progress

T = TypeVar("T")
Array = c.Array
Texts = c.Texts


class AsyncClient(AsyncFineTuneMethods, c.BaseClient):
    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8080",
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        max_backoff: float = 10.0,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        max_in_flight: int = 4,
        progress: bool = False,
        priority: str | None = None,
    ) -> None:
        super().__init__(
            base_url,
            timeout,
            max_retries,
            max_backoff,
            max_in_flight=max_in_flight,
            progress=progress,
            priority=priority,
        )
        self._http = httpx.AsyncClient(
            base_url=base_url, timeout=timeout, transport=transport, headers=c.auth_headers(api_key)
        )
        self._limits_lock = asyncio.Lock()

    @overload
    async def encode(
        self,
        model: str,
        texts: Texts,
        *,
        output_dtype: Literal["float32", "float16"] = ...,
        dequantize: bool = ...,
        adapter: str | None = ...,
        priority: str | None = ...,
        progress: bool | Progress | None = ...,
        timeout: float | None = ...,
        **options: object,
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
        priority: str | None = ...,
        progress: bool | Progress | None = ...,
        timeout: float | None = ...,
        **options: object,
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
        priority: str | None = ...,
        progress: bool | Progress | None = ...,
        timeout: float | None = ...,
        **options: object,
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
        priority: str | None = ...,
        progress: bool | Progress | None = ...,
        timeout: float | None = ...,
        **options: object,
    ) -> Array | Quantized: ...
    async def encode(
        self,
        model: str,
        texts: Texts,
        *,
        output_dtype: str = "float32",
        dequantize: bool = False,
        adapter: str | None = None,
        priority: str | None = None,
        progress: bool | Progress | None = None,
        timeout: float | None = None,
        **options: object,
    ) -> Array | Quantized:
        """Dense embeddings, ``[n, dim]`` (see the module docstring for the dtypes)."""
        result: Array | Quantized
        job = k.encode_job(model, texts, output_dtype, dequantize, {**options, "adapter": adapter})
        result = await self._job(job, timeout, priority, progress)
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
        priority: str | None = None,
        progress: bool | Progress | None = None,
        timeout: float | None = None,
        **options: object,
    ) -> list[Any]:
        """Token vectors: one ``[tokens, dim]`` array (or :class:`Quantized`) per input."""
        opts = {"is_query": is_query, "max_tokens": max_tokens, "adapter": adapter, **options}
        job = k.multivector_job(model, texts, output_dtype, dequantize, opts)
        return await self._job(job, timeout, priority, progress)

    async def encode_sparse(
        self,
        model: str,
        texts: Texts,
        *,
        adapter: str | None = None,
        priority: str | None = None,
        progress: bool | Progress | None = None,
        timeout: float | None = None,
        **options: object,
    ) -> list[SparseVector]:
        """Sparse embeddings (options: ``top_k``, ``return_tokens``, ``truncate``)."""
        job = k.sparse_job(model, texts, {**options, "adapter": adapter})
        return await self._job(job, timeout, priority, progress)

    async def score(
        self,
        model: str,
        query: str,
        items: list[str],
        *,
        truncate: bool = True,
        adapter: str | None = None,
        priority: str | None = None,
        progress: bool | Progress | None = None,
        timeout: float | None = None,
    ) -> list[float]:
        """The score of each item against the query, in input order."""
        job = k.score_job(model, query, items, truncate, adapter)
        return await self._job(job, timeout, priority, progress)

    async def rerank(
        self,
        model: str,
        query: str,
        documents: list[str],
        *,
        top_n: int | None = None,
        return_documents: bool = False,
        priority: str | None = None,
        progress: bool | Progress | None = None,
        timeout: float | None = None,
    ) -> list[RerankResult]:
        """The documents ranked against the query, best first (``top_n`` of them)."""
        job = k.rerank_job(model, query, documents, top_n, return_documents)
        return await self._job(job, timeout, priority, progress)

    async def extract(
        self,
        model: str,
        inputs: Texts,
        *,
        labels: list[str] | None = None,
        threshold: float | None = None,
        adapter: str | None = None,
        priority: str | None = None,
        progress: bool | Progress | None = None,
        timeout: float | None = None,
        **options: object,
    ) -> list[Any]:
        """Entities or labels, one result per input."""
        job = k.extract_job(model, inputs, labels, threshold, {**options, "adapter": adapter})
        return await self._job(job, timeout, priority, progress)

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
    ) -> AdapterInfo:
        """Upload the PEFT LoRA at ``path`` (its directory, or its safetensors file) as
        ``name`` (``name`` or ``tenant/name``); returns the adapter with its ``id``
        (``tenant/name@version``) and ``sha256``."""
        return await self._send(a.upload(path, name, base, version, pinned), timeout)

    async def list_adapters(
        self, base: str | None = None, *, timeout: float | None = None
    ) -> list[AdapterInfo]:
        """The adapters this key sees (of ``base`` only, if given)."""
        return await self._send(a.listing(base), timeout)

    async def get_adapter(self, adapter: str, *, timeout: float | None = None) -> AdapterInfo:
        """One adapter: ``tenant/name`` (the newest version) or ``tenant/name@N``."""
        return await self._send(a.get(adapter), timeout)

    async def delete_adapter(self, adapter: str, *, timeout: float | None = None) -> list[str]:
        """Delete a version, or every version of ``tenant/name``; returns the ids."""
        return await self._send(a.delete(adapter), timeout)

    # -- models (POST /v1/models, DELETE /v1/models/{id}: admin) -------------------
    async def add_model(
        self, spec: Mapping[str, object], *, timeout: float | None = None
    ) -> dict[str, Any]:
        """Serve a model on the running server without a restart: ``spec`` holds a
        catalog spec's fields (``id``, ``sources``, ``family``...), or ``{"source":
        DIR}`` alone for the server to infer them. Returns its ``GET /v1/models``
        entry; ``Conflict`` if the id is served, ``InvalidInput`` naming a bad key or
        a source outside the server's ``--model-roots``."""
        return await self._send(m.add(spec), timeout)

    async def remove_model(self, model: str, *, timeout: float | None = None) -> dict[str, Any]:
        """Remove ``model``: its queued requests get 404, those under way finish (the
        call waits for them: give a ``timeout`` past the longest), then it is unloaded."""
        return await self._send(m.remove(model), timeout)

    async def _send(self, req: a.Request[T], timeout: float | None) -> T:
        t = self._t(timeout)
        deadline = time.monotonic() + t
        for attempt in itertools.count():
            with c.network_errors(t):
                resp = await self._http.request(req.method, req.path, **req.kwargs(t))
            wait = c.retry_wait(resp, attempt, self.max_retries, self.max_backoff, deadline)
            if wait is None:
                return req.result(resp)
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def _job(
        self,
        job: c.Job[T],
        timeout: float | None,
        priority: str | None,
        progress: bool | Progress | None,
    ) -> T:
        """One request, or the chunks of a long list pipelined (see ``fleetserve.Client``)."""
        chosen = self._priority(priority)
        sizes = sizes_if_large(job.items)
        if sizes is not None and self._limits is None:
            await self._fetch_limits()
        spans = None if sizes is None else self._spans(job, sizes)
        with Bar(self._show(progress), job.count, job.model) as bar:
            if spans is None:
                out = await self._run(job.whole(), timeout, chosen)
                bar.advance(job.count)
                return out
            bulk = chosen or Priority.BATCH  # a split call is bulk work

            async def send(call: c.Call[T]) -> T:
                return await self._run(call, timeout, bulk)

            return await in_tasks(job, spans, send, self.max_in_flight, bar)

    async def _fetch_limits(self) -> None:
        async with self._limits_lock:
            if self._limits is not None:
                return
            try:
                resp: httpx.Response | None = await self._http.get(c.MODELS, timeout=self.timeout)
            except httpx.HTTPError:
                resp = None
            self._keep_limits(resp)

    async def _run(
        self, call: c.Call[T], timeout: float | None, priority: Priority | None = None
    ) -> T:
        t = self._t(timeout)
        headers = call.headers(t, priority)
        deadline = time.monotonic() + t
        for attempt in itertools.count():
            with c.network_errors(t):
                resp = await self._http.post(
                    call.path, content=call.body, headers=headers, timeout=t + 1
                )
            wait = c.retry_wait(resp, attempt, self.max_retries, self.max_backoff, deadline)
            if wait is None:
                return call.result(resp)
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
