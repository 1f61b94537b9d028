"""Typed request bodies, decoded by the worker (never by the gateway)."""

from __future__ import annotations

import msgspec


class EncodeRequest(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/encode/{model}``."""

    inputs: str | list[str]
    normalize: bool | None = None  # None: the model spec's default
    output_dtype: str = "float32"
    dimensions: int | None = None
    truncate: bool = True


class EmbeddingsRequest(msgspec.Struct):
    """``POST /v1/embeddings`` (OpenAI-compatible; unknown fields such as ``user`` pass)."""

    input: str | list[str]
    model: str
    encoding_format: str = "float"
    dimensions: int | None = None


class ModelOnly(msgspec.Struct):
    """What the gateway extracts from an OpenAI body: the model name and the stream flag."""

    model: str
    stream: bool = False


class StreamOnly(msgspec.Struct):
    """What the gateway extracts from a native generate body: the stream flag."""

    stream: bool = False


class ScoreRequest(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/score/{model}``: score each item against the query.

    The reply is ``{"model", "scores": [float per item, in input order],
    "ranking": [item indices, best first], "usage": {"tokens"}}``.
    """

    query: str
    items: list[str]
    truncate: bool = True


class RerankDocument(msgspec.Struct):
    text: str


class RerankRequest(msgspec.Struct):
    """``POST /v1/rerank`` (Cohere/Jina-compatible; unknown fields pass).

    The reply is ``{"id", "model", "results": [{"index", "relevance_score",
    "document": {"text"}}] best first, "meta": {"billed_units": {...}},
    "usage": {"total_tokens"}}``; ``document`` only with ``return_documents``.
    """

    model: str
    query: str
    documents: list[str | RerankDocument]
    top_n: int | None = None
    return_documents: bool = False


class ExtractRequest(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/extract/{model}``: entities (NER, GLiNER) or labels (zero-shot).

    ``labels`` is required by zero-shot families (GLiNER, zero-shot classification)
    and ignored by token-classification NER, whose labels are fixed by the model.
    """

    inputs: str | list[str]
    labels: list[str] | None = None
    threshold: float | None = None  # None: the model spec's default
    multi_label: bool = False  # zero-shot classification: independent labels
    flat_ner: bool = True  # span NER: no overlapping spans
