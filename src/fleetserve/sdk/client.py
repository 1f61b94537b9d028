"""``fleetserve.Client`` and ``fleetserve.AsyncClient``: msgpack over httpx.

Both retry 429 and 503 (honouring Retry-After) up to ``max_retries`` times and
raise the same typed errors as the server's hierarchy (``fleetserve.InvalidInput``...).
``timeout`` (per client or per call) is also the server-side deadline.

Methods (the async client's are coroutines with the same arguments):

- ``encode(model, texts, output_dtype=..., dequantize=False, **options)``: dense
  embeddings. ``"float32"`` (default) and ``"float16"`` give a ``[n, dim]`` array of that
  dtype. ``"int8"`` and ``"binary"`` give a :class:`Quantized` (``.values`` and
  ``.scales`` for int8; packed sign bits and ``.dimensions`` for binary, with
  ``.unpack()`` and :func:`unpack_bits`); ``dequantize=True`` gives the float32
  ``[n, dim]`` approximation instead (``values * scales``, or +1/-1 per bit). Options:
  ``normalize``, ``dimensions``, ``truncate``.
- ``encode_multivector(model, texts, is_query=False, max_tokens=None, ...)``: one
  ``[tokens, dim]`` array (or :class:`Quantized`) per input.
- ``encode_sparse(model, texts, **options)``: one :class:`SparseVector` per input.
- ``score(model, query, items)``: one float per item, in input order.
- ``rerank(model, query, documents, top_n=None, return_documents=False)``: Cohere's
  ``/v1/rerank``; :class:`RerankResult` list, best first.
- ``extract(model, inputs, labels=None, threshold=None, **options)``: the ``results``
  of ``/v1/extract``, one entry per input (entities for NER, labels and scores for
  zero-shot classification).
- ``adapter="tenant/name[@version]"`` on ``encode``, ``encode_multivector``,
  ``encode_sparse``, ``score`` and ``extract`` calls that LoRA adapter of the model.
- ``upload_adapter(path, name, base=None, version=None, pinned=False)``,
  ``list_adapters(base=None)``, ``get_adapter(id)`` and ``delete_adapter(id)``: the
  ``/v1/adapters`` resource (``path``: a PEFT adapter directory).
"""

from __future__ import annotations

import time
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, TypeVar, overload

import httpx

from . import _adapters as a
from . import _common as c
from .async_client import AsyncClient
from .results import Quantized, RerankResult, SparseVector

T = TypeVar("T")
Array = c.Array
Texts = c.Texts


class Client(c.BaseClient):
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
        super().__init__(base_url, timeout, max_retries, max_backoff)
        self._http = httpx.Client(
            base_url=base_url, timeout=timeout, transport=transport, headers=c.auth_headers(api_key)
        )

    @overload
    def encode(
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
    def encode(
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
    def encode(
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
    def encode(
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
    def encode(
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
        result = self._run(c.encode_call(model, texts, output_dtype, dequantize, options), timeout)
        return result

    def encode_multivector(
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
        return self._run(c.multivector_call(model, texts, output_dtype, dequantize, opts), timeout)

    def encode_sparse(
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
        return self._run(c.sparse_call(model, texts, options), timeout)

    def score(
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
        return self._run(c.score_call(model, query, items, truncate, adapter), timeout)

    def rerank(
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
        return self._run(call, timeout)

    def extract(
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
        return self._run(c.extract_call(model, inputs, labels, threshold, options), timeout)

    # -- adapters (/v1/adapters) ------------------------------------------------------
    def upload_adapter(
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
        return self._send(a.upload(path, name, base, version, pinned), timeout)

    def list_adapters(
        self, base: str | None = None, *, timeout: float | None = None
    ) -> list[dict[str, Any]]:
        """The adapters this key sees (of ``base`` only, if given)."""
        return self._send(a.listing(base), timeout)

    def get_adapter(self, adapter: str, *, timeout: float | None = None) -> dict[str, Any]:
        """One adapter: ``tenant/name`` (the newest version) or ``tenant/name@N``."""
        return self._send(a.get(adapter), timeout)

    def delete_adapter(self, adapter: str, *, timeout: float | None = None) -> list[str]:
        """Delete a version, or every version of ``tenant/name``; returns the ids."""
        return self._send(a.delete(adapter), timeout)

    def _send(self, req: a.Request[T], timeout: float | None) -> T:
        t = self._t(timeout)
        for attempt in range(self.max_retries + 1):
            with c.network_errors(t):
                resp = self._http.request(req.method, req.path, **req.kwargs(t))
            if resp.status_code not in c.RETRY_STATUSES or attempt == self.max_retries:
                return req.result(resp)
            time.sleep(c.backoff(resp, attempt, self.max_backoff))
        raise AssertionError("unreachable")

    def _run(self, call: c.Call[T], timeout: float | None) -> T:
        t = self._t(timeout)
        headers = call.headers(t)
        for attempt in range(self.max_retries + 1):
            with c.network_errors(t):
                resp = self._http.post(call.path, content=call.body, headers=headers, timeout=t + 1)
            if resp.status_code not in c.RETRY_STATUSES or attempt == self.max_retries:
                return call.result(resp)
            time.sleep(c.backoff(resp, attempt, self.max_backoff))
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


__all__ = ["AsyncClient", "Client"]
