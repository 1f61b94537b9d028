"""Build the envelope from the route, headers and body size, without decoding items."""

from __future__ import annotations

import time
import uuid

from ..wire import Encoding, Envelope, InvalidInput, Priority, Task, parse_duration, parse_priority
from ..wire.codec import TypedDecoder
from ..wire.requests import AdapterOnly, ModelOnly, StreamOnly

_MODEL_ONLY = TypedDecoder(ModelOnly)
_STREAM_ONLY = TypedDecoder(StreamOnly)
_ADAPTER_ONLY = TypedDecoder(AdapterOnly)
# the field's name as it appears in a JSON or a msgpack body (fixstr of 7 bytes)
_ADAPTER_KEYS = (b'"adapter"', b"\xa7adapter")


def model_from_body(body: bytes, encoding: Encoding) -> tuple[str, bool]:
    """The ``model`` and ``stream`` fields of an OpenAI-style body; the items are
    skipped, not built."""
    head = _MODEL_ONLY.decode(body, encoding)
    if not head.model:
        raise InvalidInput("model must not be empty", field="model")
    return head.model, head.stream


def adapter_field(body: bytes, encoding: Encoding) -> str | None:
    """The ``adapter`` field of a native body; bodies that cannot hold one (the name
    appears nowhere in their bytes) are not decoded at all."""
    if not any(k in body for k in _ADAPTER_KEYS):
        return None
    adapter = _ADAPTER_ONLY.decode(body, encoding).adapter
    return adapter or None


def stream_flag(body: bytes, encoding: Encoding) -> bool:
    """The ``stream`` field of a native generate body."""
    return bool(_STREAM_ONLY.decode(body, encoding).stream)


def parse_timeout(raw: str | None, default: float, maximum: float = 0.0) -> float:
    """The ``X-Request-Timeout`` header in seconds (absent: ``default``). Not a number,
    not finite or not positive: 400; above ``maximum`` (the ``max_request_timeout``
    setting; 0: none) it is cut to ``maximum``, as the default is."""
    cap = maximum if maximum > 0 else float("inf")
    if raw is None:
        return min(default, cap)
    try:
        value = float(raw)
    except ValueError:
        raise InvalidInput(
            f"X-Request-Timeout must be seconds as a number, not {raw!r}",
            field="x-request-timeout",
        ) from None
    if value != value or value in (float("inf"), float("-inf")):
        raise InvalidInput(
            f"X-Request-Timeout must be a finite number of seconds, not {raw!r}",
            field="x-request-timeout",
        )
    if not value > 0:
        raise InvalidInput("X-Request-Timeout must be positive", field="x-request-timeout")
    return min(value, cap)


# a request that claims interactive is served so only up to this many times the
# model's interactive_cost: a tenant cannot starve others by labelling bulk interactive
CLAIM_FACTOR = 4


def parse_priority_header(raw: str | None) -> Priority | None:
    """The ``X-Priority`` header: ``interactive`` or ``batch``; ``None`` when absent."""
    if raw is None:
        return None
    try:
        return parse_priority(raw)
    except ValueError as exc:
        raise InvalidInput(f"X-Priority {exc}", field="x-priority") from None


def classify(cost: int, claimed: Priority | None, interactive_cost: int) -> Priority:
    """The class a request is served in: from its predicted ``cost`` unless the client
    claimed one; a claim of interactive above ``CLAIM_FACTOR`` times the threshold is
    served as batch (the response's ``X-Priority`` says so)."""
    if claimed is Priority.BATCH:
        return Priority.BATCH
    limit = interactive_cost * (CLAIM_FACTOR if claimed is Priority.INTERACTIVE else 1)
    return Priority.INTERACTIVE if cost <= limit else Priority.BATCH


def cost_of(body_size: int) -> int:
    """The predicted cost in tokens, before anything is decoded: about four bytes of
    body per token (the worker refines it after tokenizing)."""
    return max(1, body_size // 4)


def parse_keep_alive(raw: str | None) -> float | None:
    """The ``X-Keep-Alive`` header: how long the model stays resident after this
    request (``30s``, ``5m``, seconds), at most a day; ``None`` when absent."""
    if raw is None:
        return None
    return parse_duration(raw, "keep_alive")


def build(
    *,
    model: str,
    task: Task,
    content_type: Encoding,
    accept: Encoding,
    body_size: int,
    timeout: float,
    request_id: str | None,
    tenant: str | None,
    keep_alive: float | None = None,
    adapter: str | None = None,
    priority: Priority = Priority.BATCH,
) -> Envelope:
    now = time.time()
    return Envelope(
        request_id=request_id or uuid.uuid4().hex,
        model=model,
        task=task,
        content_type=content_type,
        accept=accept,
        cost_hint=cost_of(body_size),
        deadline=now + timeout,
        tenant=tenant or "default",
        enqueued_at=now,
        keep_alive=keep_alive,
        adapter=adapter,
        priority=priority,
    )
