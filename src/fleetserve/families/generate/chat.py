"""Request parsing and reply formatting for chat completions and native generation.

Replies follow OpenAI's ``chat.completion`` and ``chat.completion.chunk`` objects; a
stream is server-sent events (``data: {json}\\n\\n``) ending with ``data: [DONE]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from ...runtimes import Generation, SamplingParams
from ...wire import Encoding, InvalidInput, Task
from ...wire.codec import dumps
from ...wire.requests import ChatMessage

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_STOPS = 16
DONE = b"data: [DONE]\n\n"
_json = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class GenItem:
    """What one sequence needs: prompt ids, sampling, and the llguidance grammar."""

    prompt: list[int]
    params: SamplingParams
    grammar: str | None = None

    def __len__(self) -> int:  # its cost: the tokens its cache may hold
        return len(self.prompt) + self.params.max_tokens


@dataclass(frozen=True, slots=True)
class GenOptions:
    task: Task
    id: str
    model: str
    created: int
    stream: bool = False
    include_usage: bool = False
    warnings: tuple[dict[str, object], ...] = field(default=())


@dataclass(frozen=True, slots=True)
class GenOutput:
    """A finished sequence; ``streamed`` when its text already went out as chunks."""

    generation: Generation
    streamed: bool = False


def messages(msgs: list[ChatMessage]) -> list[dict[str, str]]:
    """OpenAI messages as plain ``{"role", "content"}`` dicts for a chat template."""
    if not msgs:
        raise InvalidInput("messages must not be empty", field="messages")
    out = []
    for i, m in enumerate(msgs):
        role = ROLES.get(m.role)
        if role is None:
            raise InvalidInput(
                f"messages[{i}].role must be one of {sorted(ROLES)}, not {m.role!r}",
                field=f"messages[{i}].role",
            )
        if m.content is None or isinstance(m.content, str):
            text = m.content or ""
        else:
            parts = []
            for j, p in enumerate(m.content):
                if p.type != "text" or p.text is None:
                    raise InvalidInput(
                        f"only text content is served, not {p.type!r}",
                        field=f"messages[{i}].content[{j}]",
                    )
                parts.append(p.text)
            text = "".join(parts)
        out.append({"role": role, "content": text})
    return out


def stops(stop: str | list[str] | None) -> tuple[str, ...]:
    items = [stop] if isinstance(stop, str) else list(stop or [])
    if len(items) > MAX_STOPS:
        raise InvalidInput(f"stop takes at most {MAX_STOPS} strings", field="stop")
    if any(not s for s in items):
        raise InvalidInput("stop strings must not be empty", field="stop")
    return tuple(items)


def check_sampling(temperature: float, top_p: float) -> None:
    if not 0.0 <= temperature <= 2.0:
        raise InvalidInput("temperature must be between 0 and 2", field="temperature")
    if not 0.0 < top_p <= 1.0:
        raise InvalidInput("top_p must be greater than 0 and at most 1", field="top_p")


def clamp_warning(
    field_name: str, requested: int, effective: int, context: int
) -> dict[str, object]:
    return {
        "code": "max_tokens_clamped",
        "field": field_name,
        "requested": requested,
        "effective": effective,
        "message": (
            f"{field_name}={requested} does not fit the model's context of {context} tokens "
            f"after the prompt; generating at most {effective} tokens"
        ),
    }


# -- replies -----------------------------------------------------------------------------
def usage(g: Generation) -> dict[str, int]:
    total = g.prompt_tokens + g.completion_tokens
    return {
        "prompt_tokens": g.prompt_tokens,
        "completion_tokens": g.completion_tokens,
        "total_tokens": total,
    }


def body(o: GenOptions, g: Generation, accept: Encoding) -> bytes:
    """The whole (non-streamed) reply."""
    out: dict[str, object]
    if o.task is Task.CHAT:
        message = {"role": "assistant", "content": g.text}
        choice = {"index": 0, "message": message, "finish_reason": g.finish_reason}
        out = {
            "id": o.id,
            "object": "chat.completion",
            "created": o.created,
            "model": o.model,
            "choices": [choice],
            "usage": usage(g),
        }
    else:
        out = {
            "id": o.id,
            "model": o.model,
            "text": g.text,
            "finish_reason": g.finish_reason,
            "usage": usage(g),
        }
    if o.warnings:
        out["fleetserve"] = {"warnings": list(o.warnings)}
    return dumps(out, accept)


def sse(obj: dict[str, object]) -> bytes:
    return b"data: " + _json.encode(obj) + b"\n\n"


def chunk(o: GenOptions, delta: dict[str, object], finish_reason: str | None = None) -> bytes:
    """One ``chat.completion.chunk`` event (chat) or ``{"id", "model", "text"}`` event."""
    if o.task is not Task.CHAT:
        return sse({"id": o.id, "model": o.model, "text": delta.get("content", "")})
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    return sse(_chunk_obj(o, [choice]))


def opening(o: GenOptions) -> bytes:
    """The first event of a chat stream: the assistant role, no text yet."""
    return chunk(o, {"role": "assistant", "content": ""}) if o.task is Task.CHAT else b""


def closing(o: GenOptions, g: Generation, rest: str = "") -> bytes:
    """The end of a stream: any text not yet sent, the finish reason, usage, [DONE]."""
    extra: dict[str, object] = {"fleetserve": {"warnings": list(o.warnings)}} if o.warnings else {}
    if o.task is not Task.CHAT:
        last = {"id": o.id, "model": o.model, "text": rest, "finish_reason": g.finish_reason}
        return sse({**last, "usage": usage(g), **extra}) + DONE
    out = chunk(o, {"content": rest}) if rest else b""
    choice = {"index": 0, "delta": {}, "finish_reason": g.finish_reason}
    out += sse({**_chunk_obj(o, [choice]), **extra})
    if o.include_usage:
        out += sse({**_chunk_obj(o, []), "usage": usage(g)})
    return out + DONE


def whole_stream(o: GenOptions, g: Generation) -> bytes:
    """A stream sent in one piece (when the runner did not stream it as it went)."""
    return opening(o) + closing(o, g, g.text)


def _chunk_obj(o: GenOptions, choices: list[dict[str, object]]) -> dict[str, object]:
    return {
        "id": o.id,
        "object": "chat.completion.chunk",
        "created": o.created,
        "model": o.model,
        "choices": choices,
    }
