"""The SDK's inference calls as jobs: the request for any run of the items, and how
the results of consecutive runs join into the one result a single request returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar
from urllib.parse import quote

import numpy as np

from ..wire import Encoding
from ..wire.codec import array_from_wire, dumps
from ._chunks import catalog_id, estimate_tokens, item_bytes
from ._common import Call, Job
from .results import Quantized, RerankResult, SparseVector

T = TypeVar("T")
Opts = dict[str, object]


def _call(path: str, body: dict[str, object], decode: Callable[[Any], T]) -> Call[T]:
    clean = {k: v for k, v in body.items() if v is not None}
    return Call(path, dumps(clean, Encoding.MSGPACK), decode)


def _model_path(route: str, model: str) -> str:
    return f"/v1/{route}/{quote(model, safe='/')}"


def _concat(parts: list[list[Any]], starts: list[int]) -> list[Any]:
    return [x for part in parts for x in part]


def _stack(parts: list[Any], starts: list[int]) -> Any:
    """Rows of float arrays, or of :class:`Quantized` vectors, one after another."""
    first = parts[0]
    if not isinstance(first, Quantized):
        return np.concatenate(parts, axis=0)
    scales = None if first.scales is None else np.concatenate([p.scales for p in parts])
    values = np.concatenate([p.values for p in parts], axis=0)
    return Quantized(first.dtype, values, scales, first.dimensions)


def _encode_body(inputs: object, output_dtype: str, options: Opts) -> dict[str, object]:
    body = {"inputs": inputs, **options}
    if output_dtype != "float32":
        body["output_dtype"] = output_dtype
    return body


def encode_job(
    model: str, texts: str | list[str], output_dtype: str, dequantize: bool, options: Opts
) -> Job[Any]:
    def decode(reply: Any) -> Any:
        scales = reply.get("scales")
        return _vectors(reply, array_from_wire(reply["embeddings"]), scales, dequantize)

    def make(inputs: object) -> Call[object]:
        body = _encode_body(inputs, output_dtype, options)
        return _call(_model_path("encode", model), body, decode)

    return Job(catalog_id(model), texts, "inputs", make, _stack)


def multivector_job(
    model: str, texts: str | list[str], output_dtype: str, dequantize: bool, options: Opts
) -> Job[list[object]]:
    def decode(reply: Any) -> list[Any]:
        mats = [array_from_wire(m) for m in reply["embeddings"]]
        scales = reply.get("scales") or [None] * len(mats)
        return [_vectors(reply, m, s, dequantize) for m, s in zip(mats, scales, strict=True)]

    def make(inputs: object) -> Call[list[object]]:
        body = _encode_body(inputs, output_dtype, options)
        return _call(_model_path("encode", model), body, decode)

    return Job(catalog_id(model), texts, "inputs", make, _concat)


def _vectors(reply: Any, values: Any, scales: Any, dequantize: bool) -> Any:
    """A float array as sent, or the :class:`Quantized` form of int8 and binary vectors."""
    dtype = reply.get("output_dtype")
    if dtype not in ("int8", "binary"):
        return values
    scale_arr = None if scales is None else np.asarray(array_from_wire(scales), np.float32)
    dims = int(reply.get("dimensions") or values.shape[-1])
    q = Quantized(dtype, values, scale_arr, dims)
    return q.dequantize() if dequantize else q


def sparse_job(model: str, texts: str | list[str], options: Opts) -> Job[list[SparseVector]]:
    def decode(reply: Any) -> list[SparseVector]:
        return [
            SparseVector(
                np.asarray(array_from_wire(e["indices"]), np.uint32),
                np.asarray(array_from_wire(e["values"]), np.float32),
                e.get("tokens"),
            )
            for e in reply["embeddings"]
        ]

    def make(inputs: object) -> Call[list[SparseVector]]:
        return _call(_model_path("encode", model), {"inputs": inputs, **options}, decode)

    return Job(catalog_id(model), texts, "inputs", make, _concat)


def _query_tokens(query: str) -> int:
    return estimate_tokens(item_bytes(query), 1 << 30)


def score_job(
    model: str, query: str, items: list[str], truncate: bool, adapter: str | None = None
) -> Job[list[float]]:
    def make(run: object) -> Call[list[float]]:
        body = {"query": query, "items": run, "truncate": truncate, "adapter": adapter}
        path = _model_path("score", model)
        return _call(path, body, lambda r: [float(s) for s in r["scores"]])

    return Job(catalog_id(model), items, "items", make, _concat, _query_tokens(query))


def rerank_job(
    model: str, query: str, documents: list[str], top_n: int | None, return_documents: bool
) -> Job[list[RerankResult]]:
    def decode(reply: Any) -> list[RerankResult]:
        return [
            RerankResult(
                int(r["index"]),
                float(r["relevance_score"]),
                (r.get("document") or {}).get("text"),
            )
            for r in reply["results"]
        ]

    def make(run: object) -> Call[list[RerankResult]]:
        body = {
            "model": model,
            "query": query,
            "documents": run,
            "top_n": top_n,
            "return_documents": return_documents,
        }
        return _call("/v1/rerank", body, decode)

    def merge(parts: list[list[RerankResult]], starts: list[int]) -> list[RerankResult]:
        """Each run's best, as indices of the whole list, best first (ties: the earlier
        document, as the server orders them)."""
        every = [
            replace(r, index=r.index + start)
            for part, start in zip(parts, starts, strict=True)
            for r in part
        ]
        every.sort(key=lambda r: (-r.relevance_score, r.index))
        return every if top_n is None else every[:top_n]

    return Job(catalog_id(model), documents, "documents", make, merge, _query_tokens(query))


def extract_job(
    model: str,
    inputs: str | list[str],
    labels: list[str] | None,
    threshold: float | None,
    options: Opts,
) -> Job[list[object]]:
    def make(run: object) -> Call[list[object]]:
        body = {"inputs": run, "labels": labels, "threshold": threshold, **options}
        return _call(_model_path("extract", model), body, lambda r: list(r["results"]))

    return Job(catalog_id(model), inputs, "inputs", make, _concat)
