"""Typed request bodies, decoded by the worker (never by the gateway)."""

from __future__ import annotations

from typing import Annotated

import msgspec


class EncodeRequest(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/encode/{model}``."""

    inputs: str | list[str]
    normalize: bool | None = None  # None: the model spec's default
    output_dtype: str = "float32"
    dimensions: int | None = None
    truncate: bool = True
    adapter: str | None = None  # tenant/name[@version]: a LoRA of this model


class SparseEncodeRequest(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/encode/{model}`` for a sparse model.

    The reply is ``{"model", "embeddings": [{"indices", "values"[, "tokens"]}],
    "usage": {"tokens"}}``; in msgpack ``indices`` is a uint32 array and ``values`` a
    float32 array (``{"dtype", "shape", "data"}``), in JSON both are lists.
    """

    inputs: str | list[str]
    truncate: bool = True
    top_k: int | None = None  # keep only the k heaviest terms per input
    return_tokens: bool = False  # add each kept term's vocabulary string
    adapter: str | None = None  # tenant/name[@version]: a LoRA of this model (the gateway's)


class MultiVectorEncodeRequest(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/encode/{model}`` for a multi-vector model.

    ``is_query`` picks the query treatment (marker, ``query_length``, expansion);
    ``max_tokens`` truncates each input to at most that many tokens (special and
    marker tokens included) below the model's own limit.
    """

    inputs: str | list[str]
    is_query: bool = False
    max_tokens: int | None = None
    output_dtype: str = "float32"
    normalize: bool | None = None  # None: the model spec's default
    truncate: bool = True
    adapter: str | None = None  # tenant/name[@version]: a LoRA of this model (the gateway's)


TokenId = Annotated[int, msgspec.Meta(ge=0)]


class EmbeddingsRequest(msgspec.Struct):
    """``POST /v1/embeddings`` (OpenAI-compatible; unknown fields such as ``user`` pass).

    ``input`` is a text, a list of texts, a list of token ids (the model's own
    tokenizer's), or a list of such lists, as OpenAI's API takes it; one list does not
    mix texts and ids (``families.token_ids`` checks)."""

    input: str | list[str | TokenId | list[TokenId]]
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


class AdapterOnly(msgspec.Struct):
    """What the gateway extracts from a native body: the adapter to call, if any."""

    adapter: str | None = None


class ScoreRequest(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/score/{model}``: score each item against the query.

    The reply is ``{"model", "scores": [float per item, in input order],
    "ranking": [item indices, best first], "usage": {"tokens"}}``.
    """

    query: str
    items: list[str]
    truncate: bool = True
    adapter: str | None = None  # tenant/name[@version]: a LoRA of this model


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
    adapter: str | None = None  # tenant/name[@version]: a LoRA of this model


# -- generation (families/generate) -------------------------------------------------------

Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]  # 0: greedy
TopP = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]


class ChatContentPart(msgspec.Struct):
    """One part of a message's content; only ``{"type": "text", "text": ...}`` is served."""

    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[ChatContentPart] | None = None
    name: str | None = None


class JsonSchemaFormat(msgspec.Struct):
    name: str = "response"
    schema: dict[str, object] | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(msgspec.Struct):
    """``{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}``."""

    type: str = "text"
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class ChatCompletionRequest(msgspec.Struct):
    """``POST /v1/chat/completions`` (OpenAI-compatible; unknown fields pass).

    The reply is a ``chat.completion`` object, or with ``stream`` server-sent events
    of ``chat.completion.chunk`` objects ending with ``data: [DONE]``.
    """

    messages: list[ChatMessage]
    model: str
    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # the newer name; wins over max_tokens
    temperature: Temperature | None = None  # None: the model spec's default (else 1.0)
    top_p: TopP | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    n: int = 1


class GenerateRequest(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/generate/{model}``: a raw prompt (no chat template) to text.

    The reply is ``{"id", "model", "text", "finish_reason", "usage"}``, or with
    ``stream`` server-sent events ``{"id", "model", "text"}`` then ``data: [DONE]``.
    """

    prompt: str
    max_tokens: int | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    response_format: ResponseFormat | None = None
    adapter: str | None = None  # tenant/name[@version]: a LoRA of this model
