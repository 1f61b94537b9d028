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
- Fine-tuning jobs (OpenAI's ``/v1/files`` and ``/v1/fine_tuning/jobs``):
  ``upload_file``, ``list_files``, ``get_file``, ``create_fine_tuning_job``,
  ``get_fine_tuning_job``, ``list_fine_tuning_jobs``, ``fine_tuning_events``,
  ``cancel_fine_tuning_job``, ``wait_fine_tuning_job`` and ``fine_tune`` (upload,
  create, wait); see :mod:`fleetserve.sdk._finetune`.
- ``add_model(spec)`` and ``remove_model(id)`` (admin): serve a model on the running
  server without a restart (``spec``: a catalog spec's fields), or remove it.

Long lists: a call of more than a few dozen items (or 64 KiB) on ``encode``,
``encode_multivector``, ``encode_sparse``, ``score``, ``rerank`` or ``extract`` goes
as chunks sized from the limits the server advertises in ``GET /v1/models`` (fetched
once per client; safe defaults where it says nothing), ``max_in_flight`` of them at a
time, and comes back as the one result a single request returns, in input order.
``timeout`` applies to each request. A failed chunk fails the call with its error,
naming the item's index in the whole list. ``progress=True`` (per call, or per client)
shows one rich progress bar over the items on stderr; a ``rich.progress.Progress``
gets a task of its own instead.

``priority="interactive" | "batch"`` (per call, or per client) is sent as
``X-Priority``; unset, the server decides by predicted cost, except that the chunks of
a split call go as ``batch``.
"""

from __future__ import annotations

import itertools
import threading
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
from ._finetune import FineTuneMethods
from ._pipeline import Bar, in_threads
from .async_client import AsyncClient
from .records import AdapterInfo
from .results import Quantized, RerankResult, SparseVector

if TYPE_CHECKING:
    from rich.progress import Progress

T = TypeVar("T")
Array = c.Array
Texts = c.Texts


class Client(FineTuneMethods, c.BaseClient):
    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8080",
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        max_backoff: float = 10.0,
        api_key: str | None = None,
        transport: httpx.BaseTransport | None = None,
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
        self._http = httpx.Client(
            base_url=base_url, timeout=timeout, transport=transport, headers=c.auth_headers(api_key)
        )
        self._limits_lock = threading.Lock()

    @overload
    def encode(
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
    def encode(
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
    def encode(
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
    def encode(
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
    def encode(
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
        result = self._job(job, timeout, priority, progress)
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
        priority: str | None = None,
        progress: bool | Progress | None = None,
        timeout: float | None = None,
        **options: object,
    ) -> list[Any]:
        """Token vectors: one ``[tokens, dim]`` array (or :class:`Quantized`) per input."""
        opts = {"is_query": is_query, "max_tokens": max_tokens, "adapter": adapter, **options}
        job = k.multivector_job(model, texts, output_dtype, dequantize, opts)
        return self._job(job, timeout, priority, progress)

    def encode_sparse(
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
        return self._job(job, timeout, priority, progress)

    def score(
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
        return self._job(job, timeout, priority, progress)

    def rerank(
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
        return self._job(job, timeout, priority, progress)

    def extract(
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
        return self._job(job, timeout, priority, progress)

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
    ) -> AdapterInfo:
        """Upload the PEFT LoRA at ``path`` (its directory, or its safetensors file) as
        ``name`` (``name`` or ``tenant/name``); returns the adapter with its ``id``
        (``tenant/name@version``) and ``sha256``."""
        return self._send(a.upload(path, name, base, version, pinned), timeout)

    def list_adapters(
        self, base: str | None = None, *, timeout: float | None = None
    ) -> list[AdapterInfo]:
        """The adapters this key sees (of ``base`` only, if given)."""
        return self._send(a.listing(base), timeout)

    def get_adapter(self, adapter: str, *, timeout: float | None = None) -> AdapterInfo:
        """One adapter: ``tenant/name`` (the newest version) or ``tenant/name@N``."""
        return self._send(a.get(adapter), timeout)

    def delete_adapter(self, adapter: str, *, timeout: float | None = None) -> list[str]:
        """Delete a version, or every version of ``tenant/name``; returns the ids."""
        return self._send(a.delete(adapter), timeout)

    # -- models (POST /v1/models, DELETE /v1/models/{id}: admin) -------------------
    def add_model(
        self, spec: Mapping[str, object], *, timeout: float | None = None
    ) -> dict[str, Any]:
        """Serve a model on the running server without a restart: ``spec`` holds a
        catalog spec's fields (``id``, ``sources``, ``family``...), or ``{"source":
        DIR}`` alone for the server to infer them. Returns its ``GET /v1/models``
        entry; ``Conflict`` if the id is served, ``InvalidInput`` naming a bad key or
        a source outside the server's ``--model-roots``."""
        return self._send(m.add(spec), timeout)

    def remove_model(self, model: str, *, timeout: float | None = None) -> dict[str, Any]:
        """Remove ``model``: its queued requests get 404, those under way finish (the
        call waits for them: give a ``timeout`` past the longest), then it is unloaded."""
        return self._send(m.remove(model), timeout)

    def _send(self, req: a.Request[T], timeout: float | None) -> T:
        t = self._t(timeout)
        deadline = time.monotonic() + t
        for attempt in itertools.count():
            with c.network_errors(t):
                resp = self._http.request(req.method, req.path, **req.kwargs(t))
            wait = c.retry_wait(resp, attempt, self.max_retries, self.max_backoff, deadline)
            if wait is None:
                return req.result(resp)
            time.sleep(wait)
        raise AssertionError("unreachable")

    def _job(
        self,
        job: c.Job[T],
        timeout: float | None,
        priority: str | None,
        progress: bool | Progress | None,
    ) -> T:
        """One request, or the chunks of a long list pipelined (see the module docstring)."""
        chosen = self._priority(priority)
        sizes = sizes_if_large(job.items)
        if sizes is not None and self._limits is None:
            self._fetch_limits()
        spans = None if sizes is None else self._spans(job, sizes)
        with Bar(self._show(progress), job.count, job.model) as bar:
            if spans is None:
                out = self._run(job.whole(), timeout, chosen)
                bar.advance(job.count)
                return out
            bulk = chosen or Priority.BATCH  # a split call is bulk work

            def send(call: c.Call[T]) -> T:
                return self._run(call, timeout, bulk)

            return in_threads(job, spans, send, self.max_in_flight, bar)

    def _fetch_limits(self) -> None:
        with self._limits_lock:
            if self._limits is not None:
                return
            try:
                resp: httpx.Response | None = self._http.get(c.MODELS, timeout=self.timeout)
            except httpx.HTTPError:
                resp = None
            self._keep_limits(resp)

    def _run(self, call: c.Call[T], timeout: float | None, priority: Priority | None = None) -> T:
        t = self._t(timeout)
        headers = call.headers(t, priority)
        deadline = time.monotonic() + t
        for attempt in itertools.count():
            with c.network_errors(t):
                resp = self._http.post(call.path, content=call.body, headers=headers, timeout=t + 1)
            wait = c.retry_wait(resp, attempt, self.max_retries, self.max_backoff, deadline)
            if wait is None:
                return call.result(resp)
            time.sleep(wait)
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
