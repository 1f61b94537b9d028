"""The envelope and the reply as NATS headers, so workers plan without decoding bodies.

Every header is a short ASCII string. A message whose headers do not parse raises
:class:`InvalidInput` naming the header; the worker sends such messages to the
dead-letter stream instead of retrying them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import InvalidInput
from .types import Encoding, Envelope, Part, Priority, Reply, Task

REQUEST_ID = "Fleetserve-Request-Id"
MODEL = "Fleetserve-Model"
TASK = "Fleetserve-Task"
CONTENT_TYPE = "Fleetserve-Content-Type"
ACCEPT = "Fleetserve-Accept"
COST = "Fleetserve-Cost"
DEADLINE = "Fleetserve-Deadline"
TENANT = "Fleetserve-Tenant"
ADAPTER = "Fleetserve-Adapter"
ENQUEUED_AT = "Fleetserve-Enqueued-At"
KEEP_ALIVE = "Fleetserve-Keep-Alive"  # seconds, when the request set one
REPLY_TO = "Fleetserve-Reply-To"
PRIORITY = "Fleetserve-Priority"  # interactive | batch (absent: batch)
PART = "Fleetserve-Part"  # parent:start:stop on a slice a worker put back
PAYLOAD = "Fleetserve-Payload"  # a payload-store key; the body is then empty
ERROR = "Fleetserve-Error"  # on replies: "1" when the body is an error body (JSON)
TIMINGS = "Fleetserve-Timings"  # on replies: JSON object of floats
MORE = "Fleetserve-More"  # on replies: "1" on a chunk of a streamed reply; more follow
DLQ_REASON = "Fleetserve-Dlq-Reason"
DLQ_SUBJECT = "Fleetserve-Dlq-Subject"
DLQ_ATTEMPTS = "Fleetserve-Dlq-Attempts"
MSG_ID = "Nats-Msg-Id"  # JetStream de-duplicates republished requests by it
TRACEPARENT = "traceparent"  # W3C trace context, as OpenTelemetry's NATS users carry it
TRACESTATE = "tracestate"

_SAFE = re.compile(r"[A-Za-z0-9-]")


@dataclass(frozen=True, slots=True)
class Routed:
    """An envelope as a worker receives it: where to reply, and the payload key if any."""

    envelope: Envelope
    reply_to: str
    payload: str | None = None


def subject_token(model: str) -> str:
    """A model id as one NATS subject token and consumer name: ``_XX`` escapes the rest.

    ``sentence-transformers/all-MiniLM-L6-v2`` becomes
    ``sentence-transformers_2Fall-MiniLM-L6-v2``; the mapping is reversible.
    """
    if not model:
        raise InvalidInput("model id is empty", field="model")
    return "".join(c if _SAFE.match(c) else "".join(f"_{b:02X}" for b in c.encode()) for c in model)


def model_from_token(token: str) -> str:
    out = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "_":
            out.append(int(token[i + 1 : i + 3], 16))
            i += 3
        else:
            out.extend(token[i].encode())
            i += 1
    return out.decode()


def envelope_headers(env: Envelope, reply_to: str, payload: str | None = None) -> dict[str, str]:
    h = {
        REQUEST_ID: env.request_id,
        MSG_ID: env.request_id,
        MODEL: env.model,
        TASK: env.task.value,
        CONTENT_TYPE: env.content_type.value,
        ACCEPT: env.accept.value,
        COST: str(env.cost_hint),
        DEADLINE: repr(env.deadline),
        TENANT: env.tenant,
        ENQUEUED_AT: repr(env.enqueued_at),
        REPLY_TO: reply_to,
    }
    if env.adapter is not None:
        h[ADAPTER] = env.adapter
    if env.keep_alive is not None:
        h[KEEP_ALIVE] = repr(env.keep_alive)
    if payload is not None:
        h[PAYLOAD] = payload
    if env.priority is not Priority.BATCH:
        h[PRIORITY] = env.priority.value
    if env.part is not None:
        h[PART] = env.part.header()
    if env.traceparent is not None:
        h[TRACEPARENT] = env.traceparent
        if env.tracestate:
            h[TRACESTATE] = env.tracestate
    return h


def _need(h: Mapping[str, str], name: str) -> str:
    value = h.get(name)
    if not value:
        raise InvalidInput(f"message header {name} is missing", field=name)
    return value


def _number(h: Mapping[str, str], name: str, kind: type[int] | type[float]) -> float:
    raw = _need(h, name)
    try:
        return kind(raw)
    except ValueError:
        raise InvalidInput(
            f"message header {name} is not a number: {raw[:40]!r}", field=name
        ) from None


def _enum(
    h: Mapping[str, str], name: str, kind: type[Task] | type[Encoding] | type[Priority]
) -> str:
    raw = _need(h, name)
    try:
        return kind(raw).value
    except ValueError:
        raise InvalidInput(
            f"message header {name} has unknown value {raw[:40]!r}", field=name
        ) from None


def routed_from_headers(h: Mapping[str, str] | None) -> Routed:
    """Parse a work message's headers; raises ``InvalidInput`` naming the bad header."""
    if not h:
        raise InvalidInput("message has no headers", field="headers")
    env = Envelope(
        request_id=_need(h, REQUEST_ID),
        model=_need(h, MODEL),
        task=Task(_enum(h, TASK, Task)),
        content_type=Encoding(_enum(h, CONTENT_TYPE, Encoding)),
        accept=Encoding(_enum(h, ACCEPT, Encoding)),
        cost_hint=int(_number(h, COST, int)),
        deadline=_number(h, DEADLINE, float),
        tenant=h.get(TENANT) or "default",
        adapter=h.get(ADAPTER) or None,
        enqueued_at=_number(h, ENQUEUED_AT, float),
        keep_alive=_number(h, KEEP_ALIVE, float) if h.get(KEEP_ALIVE) else None,
        priority=Priority(_enum(h, PRIORITY, Priority)) if h.get(PRIORITY) else Priority.BATCH,
        part=_part(h),
        # opaque here: a malformed one is ignored where it is read (fleetserve.tracing)
        traceparent=h.get(TRACEPARENT) or None,
        tracestate=h.get(TRACESTATE) or None,
    )
    return Routed(env, _need(h, REPLY_TO), h.get(PAYLOAD) or None)


def _part(h: Mapping[str, str]) -> Part | None:
    raw = h.get(PART)
    if not raw:
        return None
    try:
        return Part.parse(raw)
    except ValueError:
        raise InvalidInput(
            f"message header {PART} is malformed: {raw[:60]!r}", field=PART
        ) from None


def reply_headers(reply: Reply) -> tuple[dict[str, str], bytes]:
    """A reply as (headers, body); an error reply carries its error body as JSON."""
    h = {CONTENT_TYPE: reply.content_type.value}
    if reply.timings:
        h[TIMINGS] = json.dumps(reply.timings, separators=(",", ":"))
    if reply.error is not None:
        h[ERROR] = "1"
        return h, json.dumps(reply.error).encode()
    if reply.payload is not None:
        h[PAYLOAD] = reply.payload
    if not reply.final:
        h[MORE] = "1"
    return h, reply.body


def reply_from_headers(h: Mapping[str, str] | None, body: bytes) -> Reply:
    h = h or {}
    try:
        timings = {str(k): float(v) for k, v in json.loads(h.get(TIMINGS) or "{}").items()}
        ctype = Encoding(h.get(CONTENT_TYPE) or Encoding.JSON.value)
        if h.get(ERROR) == "1":
            return Reply(content_type=ctype, error=json.loads(body), timings=timings)
    except (ValueError, AttributeError) as exc:
        raise InvalidInput(f"malformed reply from the worker: {exc}", field="reply") from None
    return Reply(
        body, ctype, timings=timings, payload=h.get(PAYLOAD) or None, final=h.get(MORE) != "1"
    )
