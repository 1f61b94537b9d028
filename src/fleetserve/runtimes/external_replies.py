"""Reading the model server's replies: generations (whole or streamed), embeddings, errors.

See :mod:`.external_api` for the requests these answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import msgspec
import numpy as np

from ..wire import FleetError, InternalError, InvalidInput, Overloaded, Unavailable
from ..wire.values import Array
from .base import Generation


def _finish(reason: object) -> str:
    """SGLang's ``{"type": ...}`` or OpenAI's string, as "stop" or "length"."""
    if isinstance(reason, dict):
        kind = reason.get("type")
        if kind == "abort":
            status = reason.get("status_code")
            msg = f"the model server aborted the request: {reason.get('message', '')}"
            if isinstance(status, int) and 400 <= status < 500:
                raise InvalidInput(msg)
            raise InternalError(msg)
        reason = kind
    if reason == "abort":
        raise InternalError("the model server aborted the request")
    return "length" if reason == "length" else "stop"


def parse_generation(api: str, body: object, prompt_len: int) -> Generation:
    """A non-streamed reply as a :class:`Generation`."""
    if not isinstance(body, dict):
        raise InternalError(f"unexpected reply from the model server: {str(body)[:200]}")
    if api == "sglang":
        meta = body.get("meta_info") or {}
        return Generation(
            text=str(body.get("text", "")),
            finish_reason=_finish(meta.get("finish_reason")),
            prompt_tokens=int(meta.get("prompt_tokens", prompt_len)),
            completion_tokens=int(meta.get("completion_tokens", 0)),
        )
    choices = body.get("choices") or [{}]
    usage = body.get("usage") or {}
    return Generation(
        text=str(choices[0].get("text", "")),
        finish_reason=_finish(choices[0].get("finish_reason")),
        prompt_tokens=int(usage.get("prompt_tokens", prompt_len)),
        completion_tokens=int(usage.get("completion_tokens", 0)),
    )


class StreamState:
    """Folds streamed events into text deltas and, at the end, a :class:`Generation`."""

    def __init__(self, api: str, prompt_len: int, *, incremental: bool = False) -> None:
        self.api = api
        self.incremental = incremental
        self.text = ""
        self.finish: object = None
        self.prompt_tokens = prompt_len
        self.completion_tokens: int | None = None
        self.chunks = 0

    def feed(self, event: object) -> str:
        """One decoded ``data:`` event; returns the new text."""
        if not isinstance(event, dict):
            raise InternalError(f"unexpected stream event: {str(event)[:200]}")
        if "error" in event or event.get("object") == "error":
            raise error_from_payload(event)
        if self.api == "sglang":
            meta = event.get("meta_info") or {}
            text = str(event.get("text", ""))
            delta = text if self.incremental else text[len(self.text) :]
            usage: Mapping[str, Any] = meta
            if meta.get("finish_reason") is not None:
                self.finish = meta["finish_reason"]
        else:
            choices = event.get("choices") or []
            delta = str(choices[0].get("text") or "") if choices else ""
            if choices and choices[0].get("finish_reason") is not None:
                self.finish = choices[0]["finish_reason"]
            usage = event.get("usage") or {}
        if "prompt_tokens" in usage:
            self.prompt_tokens = int(usage["prompt_tokens"])
        if "completion_tokens" in usage:
            self.completion_tokens = int(usage["completion_tokens"])
        self.text += delta
        self.chunks += bool(delta)
        return delta

    def result(self) -> Generation:
        if self.finish is None:
            raise InternalError("the model server ended the stream without a finish reason")
        return Generation(
            text=self.text,
            finish_reason=_finish(self.finish),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.chunks
            if self.completion_tokens is None
            else self.completion_tokens,
        )


def sse_events(lines: Iterable[str]) -> Iterator[object]:
    """The decoded ``data:`` payloads of a server-sent event stream, up to ``[DONE]``."""
    for line in lines:
        if not line.startswith("data:"):
            continue  # blank separators, comments, "event:" lines
        data = line[5:].strip()
        if data == "[DONE]":
            return
        if data:
            yield msgspec.json.decode(data)


# -- embeddings ------------------------------------------------------------------------
def parse_embeddings(body: object, n: int) -> Array:
    """``{"data": [{"index", "embedding"}]}`` as float32 ``[n, dim]`` in input order."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or len(data) != n:
        got = len(data) if isinstance(data, list) else "no"
        raise InternalError(f"the model server returned {got} embeddings for {n} inputs")
    rows = sorted(data, key=lambda d: int(d.get("index", 0)))
    try:
        return np.asarray([r["embedding"] for r in rows], dtype=np.float32).reshape(n, -1)
    except (KeyError, TypeError, ValueError) as exc:
        raise InternalError(f"malformed embeddings from the model server: {exc}") from None


# -- errors ----------------------------------------------------------------------------
def error_message(payload: object) -> str:
    """The message in SGLang's, vLLM's or FastAPI's error bodies."""
    if isinstance(payload, dict):
        err = payload.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if payload.get("message"):
            return str(payload["message"])
        if "detail" in payload:
            return json.dumps(payload["detail"])[:500]
    return str(payload)[:500]


def error_from_payload(payload: object) -> FleetError:
    """An error event inside a stream. SGLang sends ``{"error": {"message"}}`` for
    requests it rejects; vLLM adds a ``code``, or sends ``{"object": "error", "code"}``."""
    err = payload.get("error") if isinstance(payload, dict) else None
    holder = err if isinstance(err, dict) else payload if isinstance(payload, dict) else {}
    code = holder.get("code")
    msg = error_message(payload)
    if isinstance(code, int) and code >= 500:
        return InternalError(f"the model server failed: {msg}")
    return InvalidInput(msg)


def http_error(status: int, content: bytes, url: str, retry_after: str | None) -> FleetError:
    """Map an error status from the model server to a fleetserve error."""
    try:
        msg = error_message(msgspec.json.decode(content))
    except msgspec.DecodeError:
        msg = content.decode("utf-8", "replace")[:500] or f"HTTP {status}"
    try:
        wait = float(retry_after) if retry_after else None
    except ValueError:
        wait = None
    if status == 429:
        return Overloaded(f"the model server at {url} is overloaded: {msg}", retry_after=wait)
    if status == 503:
        return Unavailable(f"the model server at {url} is unavailable: {msg}", retry_after=wait)
    if status in (401, 403, 404):  # a wrong key, model name or URL: the bridge's setup
        return InternalError(f"the model server at {url} answered {status}: {msg}")
    if 400 <= status < 500:
        return InvalidInput(msg)
    return InternalError(f"the model server at {url} failed ({status}): {msg}")
