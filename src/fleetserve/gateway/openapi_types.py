"""Typed shapes of what the server answers, for the OpenAPI document.

Request bodies are described by the very Structs the workers decode with
(``wire.requests`` and the families' own); this module adds the reply bodies, which
the families build as plain dicts, and the few request bodies that are decoded by
hand (adapter uploads, fine-tuning jobs). ``tests/gateway/test_openapi.py`` checks
real replies against them and these request Structs against the hand decoders'
field lists, so they cannot drift. Replies allow unknown fields: adding one is not
a breaking change.
"""

from __future__ import annotations

from typing import Any

import msgspec

# -- shared ----------------------------------------------------------------------------


class ErrorDetail(msgspec.Struct):
    code: str  # stable: invalid_input, model_not_found, overloaded... (gateway.errors)
    message: str
    field: str | None  # the request field, header or path part at fault, when there is one


class ErrorBody(msgspec.Struct):
    """Every error, on every route: ``{"error": {"code", "message", "field"}}``."""

    error: ErrorDetail


class WireArray(msgspec.Struct):
    """An array in msgpack: dtype, shape and the raw little-endian bytes (bin)."""

    dtype: str
    shape: list[int]
    data: bytes


class TokenUsage(msgspec.Struct):
    tokens: int
    images: int = 0  # image models: how many inputs were images


class OpenAIUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


# -- operations ------------------------------------------------------------------------


class Health(msgspec.Struct):
    status: str  # "ok" or "failed"


class Ready(msgspec.Struct):
    ready: bool


class ModelCard(msgspec.Struct):
    id: str
    object: str
    owned_by: str
    family: str
    tasks: list[str] = []
    dimensions: int | None = None
    max_seq_len: int | None = None
    loaded: bool | None = None


class ModelList(msgspec.Struct):
    object: str
    data: list[ModelCard]


class ModelDeleted(msgspec.Struct):
    id: str
    object: str  # "model"
    deleted: bool


class KeepAliveReleased(msgspec.Struct):
    id: str
    object: str
    released: bool  # it was kept alive
    left_s: float  # the seconds of keep-alive it had left


# -- inference replies -----------------------------------------------------------------

Matrix = list[list[float]]


class EncodeReply(msgspec.Struct):
    """Dense and image ``/v1/encode``: one vector per input (int8 codes with ``scales``,
    packed sign bits with ``dimensions``)."""

    model: str
    embeddings: Matrix | WireArray
    usage: TokenUsage
    scales: list[float] | WireArray | None = None
    output_dtype: str | None = None
    dimensions: int | None = None


class SparseVector(msgspec.Struct):
    indices: list[int] | WireArray
    values: list[float] | WireArray
    tokens: list[str] = []


class SparseEncodeReply(msgspec.Struct):
    model: str
    embeddings: list[SparseVector]
    usage: TokenUsage


class MultiVectorEncodeReply(msgspec.Struct):
    """One ``[tokens, dim]`` matrix per input."""

    model: str
    embeddings: list[Matrix | WireArray]
    usage: TokenUsage
    scales: list[list[float] | WireArray] | None = None
    output_dtype: str | None = None
    dimensions: int | None = None


class Embedding(msgspec.Struct):
    object: str
    index: int
    embedding: list[float] | str  # base64 of little-endian float32 with encoding_format


class EmbeddingsReply(msgspec.Struct):
    object: str
    data: list[Embedding]
    model: str
    usage: OpenAIUsage


class ScoreReply(msgspec.Struct):
    model: str
    scores: list[float]  # per item, in input order
    ranking: list[int]  # item indices, best first
    usage: TokenUsage


class RerankText(msgspec.Struct):
    text: str


class RerankResult(msgspec.Struct):
    index: int
    relevance_score: float
    document: RerankText | None = None


class RerankReply(msgspec.Struct):
    id: str
    model: str
    results: list[RerankResult]
    meta: dict[str, Any] = {}
    usage: dict[str, int] = {}


class Entity(msgspec.Struct):
    start: int
    end: int
    text: str
    label: str
    score: float


class Classification(msgspec.Struct):
    labels: list[str]  # best first
    scores: list[float]


class ExtractReply(msgspec.Struct):
    """Entities per input (NER, span NER) or labels per input (zero-shot)."""

    model: str
    results: list[list[Entity] | Classification]
    usage: TokenUsage


class ChatMessageOut(msgspec.Struct):
    role: str
    content: str | None


class ChatChoice(msgspec.Struct):
    index: int
    message: ChatMessageOut
    finish_reason: str | None


class ChatCompletionReply(msgspec.Struct):
    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: OpenAIUsage


class SseEvent(msgspec.Struct):
    """One server-sent event of a stream: ``data`` is a JSON chunk (``[DONE]`` last); an
    error after the stream started is an ``error`` event holding the error body."""

    data: str
    event: str | None = None
    id: str | None = None


class GenerateReply(msgspec.Struct):
    id: str
    model: str
    text: str
    finish_reason: str | None
    usage: OpenAIUsage


# -- adapters --------------------------------------------------------------------------


class AdapterUpload(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/adapters`` as msgpack or JSON (``gateway.adapter_routes.parse_body``)."""

    name: str
    config: str | dict[str, Any]  # adapter_config.json: its text (msgpack: or bin), or the object
    weights: bytes  # adapter_model.safetensors: msgpack bin, base64 in JSON
    base: str | None = None
    version: int | str | None = None
    pinned: bool | str | None = None


class AdapterForm(msgspec.Struct):
    """``POST /v1/adapters`` as multipart: the two files by name, or fields."""

    name: str
    files: list[bytes] = []  # adapter_config.json and adapter_model.safetensors
    config: bytes | None = None
    weights: bytes | None = None
    base: str | None = None
    version: str | None = None
    pinned: str | None = None


class AdapterInfo(msgspec.Struct):
    object: str
    id: str  # tenant/name@version
    tenant: str
    name: str
    version: int | None
    base: str
    model: str  # what to call it as: base:tenant/name@version
    rank: int
    alpha: float
    sha256: str
    bytes: int
    pinned: bool
    target_modules: list[str] = []


class AdapterList(msgspec.Struct):
    object: str
    data: list[AdapterInfo]


class AdapterDeleted(msgspec.Struct):
    object: str
    deleted: list[str]


# -- fine-tuning -----------------------------------------------------------------------


class FileForm(msgspec.Struct):
    """``POST /v1/files`` as OpenAI's clients send it."""

    file: bytes  # JSONL: one {"query", "positive", "negative"?} per line
    purpose: str  # "fine-tune"
    truncate: bool = False  # cut texts over train_max_chars instead of a 400


class FileObject(msgspec.Struct):
    id: str
    object: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    rows: int = 0
    duplicates: int = 0
    warnings: list[str] = []


class FileList(msgspec.Struct):
    object: str
    data: list[FileObject]
    has_more: bool


class HyperparametersIn(msgspec.Struct, forbid_unknown_fields=True):
    """``"auto"`` means the default (OpenAI's clients send it)."""

    rank: int | str | None = None
    alpha: float | str | None = None
    epochs: int | str | None = None
    n_epochs: int | str | None = None  # OpenAI's name for epochs
    learning_rate: float | str | None = None
    learning_rate_multiplier: float | str | None = None
    batch_size: int | str | None = None
    hard_negatives: int | str | None = None


class JobCreate(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/fine_tuning/jobs`` (``lora.jobs.manager.FineTuning.create_job``)."""

    model: str
    training_file: str
    validation_file: str | None = None
    hyperparameters: HyperparametersIn | None = None
    suffix: str | None = None
    validation_fraction: float | None = None
    margin: float | None = None
    seed: int | None = None
    task: str | None = None  # "embed" (a dense base) or "rerank" (a cross-encoder)


class JobObject(msgspec.Struct):
    id: str
    object: str
    model: str
    created_at: int
    status: str
    training_file: str
    hyperparameters: dict[str, Any]
    suffix: str
    fine_tuned_model: str | None
    error: ErrorDetail | None
    finished_at: int | None = None
    validation_file: str | None = None


class JobList(msgspec.Struct):
    object: str
    data: list[JobObject]
    has_more: bool


class JobEventObject(msgspec.Struct):
    id: str
    object: str
    created_at: int
    level: str
    message: str
    type: str
    data: dict[str, Any] | None = None


class JobEventList(msgspec.Struct):
    object: str
    data: list[JobEventObject]
    has_more: bool


# -- dashboard views -------------------------------------------------------------------


class ViewList(msgspec.Struct):
    """A dashboard view's list (e.g. tuning runs): documents as their writers made them."""

    object: str
    data: list[dict[str, Any]]
