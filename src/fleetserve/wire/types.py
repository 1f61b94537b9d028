"""Request-path vocabulary: tasks, envelopes, replies and encode options."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Task(enum.StrEnum):
    """What a request asks of a model; each task has its own request body shape."""

    ENCODE = "encode"  # POST /v1/encode/{model}
    EMBEDDINGS = "embeddings"  # POST /v1/embeddings (OpenAI)
    SCORE = "score"  # POST /v1/score/{model}: a query against items
    RERANK = "rerank"  # POST /v1/rerank (Cohere/Jina)
    EXTRACT = "extract"  # POST /v1/extract/{model}: entities, labels
    GENERATE = "generate"  # POST /v1/generate/{model}
    CHAT = "chat"  # POST /v1/chat/completions (OpenAI)


class Encoding(enum.StrEnum):
    """Body encodings on the wire, chosen by Content-Type and Accept."""

    MSGPACK = "application/msgpack"
    JSON = "application/json"


class OutputDtype(enum.StrEnum):
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    INT8 = "int8"  # scaled per vector: round(x / max|x| * 127)
    BINARY = "binary"  # sign bits packed 8 per byte (numpy packbits, big-endian bit order)


class Priority(enum.StrEnum):
    """A request's class: interactive work is served before batch work.

    The gateway picks it from the predicted cost (the profile's ``interactive_cost``)
    unless ``X-Priority`` says otherwise; a request too large to be interactive is
    served as batch whatever it claims."""

    INTERACTIVE = "interactive"
    BATCH = "batch"


def parse_priority(raw: str) -> Priority:
    """``interactive`` or ``batch`` (any case); a ``ValueError`` naming both otherwise."""
    try:
        return Priority(raw.strip().lower())
    except ValueError:
        raise ValueError(f"must be 'interactive' or 'batch', not {raw[:40]!r}") from None


@dataclass(frozen=True, slots=True)
class Part:
    """A slice of a larger request that a worker put back for others to share.

    Items ``start`` to ``stop`` (of the parent's prepared items) travel as the body,
    already prepared (``wire.items``); the reply carries their raw outputs back to the
    worker that holds the parent, which answers the client once, in order."""

    parent: str  # the request id of the request this slice belongs to
    start: int
    stop: int

    def header(self) -> str:
        return f"{self.parent}:{self.start}:{self.stop}"

    @classmethod
    def parse(cls, raw: str) -> Part:
        parent, start, stop = raw.rsplit(":", 2)
        a, b = int(start), int(stop)
        if not parent or a < 0 or b <= a:
            raise ValueError(f"bad part {raw[:60]!r}")
        return cls(parent, a, b)


@dataclass(frozen=True, slots=True)
class Envelope:
    """What the gateway attaches to a raw body. Workers plan from it without decoding."""

    request_id: str
    model: str
    task: Task
    content_type: Encoding
    accept: Encoding
    cost_hint: int
    deadline: float  # absolute, time.time() seconds
    tenant: str = "default"
    adapter: str | None = None
    enqueued_at: float = 0.0
    keep_alive: float | None = None  # seconds to keep the model resident after this use
    priority: Priority = Priority.BATCH
    part: Part | None = None  # a slice of another request, put back by a worker
    # W3C trace context of the gateway's span (fleetserve.tracing); None: not traced
    traceparent: str | None = None
    tracestate: str | None = None

    @property
    def interactive(self) -> bool:
        return self.priority is Priority.INTERACTIVE


@dataclass(slots=True)
class Reply:
    """The worker's answer. ``body`` is already encoded for the client's Accept.

    On failure ``error`` holds the error body (``{"error": {...}}``) instead.
    """

    body: bytes = b""
    content_type: Encoding = Encoding.JSON
    error: dict[str, Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)  # queue_ms, inference_ms
    payload: str | None = None  # a payload-store key standing in for an offloaded body
    final: bool = True  # False: one chunk of a streamed reply; more follow, then a final one
