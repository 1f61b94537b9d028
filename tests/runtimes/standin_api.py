"""What the stand-in server accepts and answers: the request fields SGLang and vLLM
document, and deterministic fake outputs computed from the token ids.

Request checks are strict on purpose (unknown fields, wrong types are a 400), so a
test fails when the runtime sends something a real server would not take.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
NATURAL_LENGTH = 6  # tokens before the fake model's end-of-sequence

# SGLang's GenerateReqInput (the subset a text model takes) and SamplingParams API fields
SGLANG_GENERATE = {"text", "input_ids", "sampling_params", "stream", "rid", "return_logprob"}
SGLANG_SAMPLING = {
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens",
    "n", "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "custom_params", "stream_interval",
    "logit_bias", "sampling_seed",
}  # fmt: skip
# vLLM's CompletionRequest fields that a token-id prompt uses
OPENAI_COMPLETION = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "stream",
    "stream_options", "stop", "seed", "n", "echo", "logprobs", "user", "response_format",
    "structured_outputs", "guided_json", "min_tokens", "ignore_eos", "stop_token_ids",
}  # fmt: skip
OPENAI_EMBEDDINGS = {"model", "input", "encoding_format", "dimensions", "user"}


class Rejected(Exception):
    """A request a real server would answer with an error status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Completion:
    pieces: list[str]  # one text piece per generated token
    finish: str  # "stop" or "length"
    matched: str | None = None
    prompt_tokens: int = 0
    tokens: int = 0  # generated tokens, counting those a stop string cut away

    @property
    def text(self) -> str:
        return "".join(self.pieces)


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any = field(default=None)


def fake_embedding(ids: list[int]) -> list[float]:
    """The stand-in's embedding of a token-id sequence (its dimension is 4)."""
    return [float(len(ids)), float(ids[0]), float(ids[-1]), float(sum(ids))]


def fake_completion(
    ids: list[int], max_tokens: int, stop: list[str], schema: dict[str, Any] | None
) -> Completion:
    """What the fake model writes for ``ids``: words picked by ``sum(ids)``, or a JSON
    object when a schema constrains it; cut at a stop string or at ``max_tokens``."""
    if schema is not None:
        natural = ['{"n": ', str(sum(ids)), "}"]
    else:
        natural = [" " + WORDS[(sum(ids) + k) % len(WORDS)] for k in range(NATURAL_LENGTH)]
    out = Completion([], "stop", prompt_tokens=len(ids))
    text = ""
    for piece in natural:
        if len(out.pieces) == max_tokens:
            out.finish = "length"
            break
        out.pieces.append(piece)
        text += piece
        hits = [(text.find(s), s) for s in stop if s in text]
        if hits:
            at, out.matched = min(hits)
            out.tokens = len(out.pieces)
            out.pieces = _cut(out.pieces, at)
            break
    out.tokens = out.tokens or len(out.pieces)
    return out


def _cut(pieces: list[str], at: int) -> list[str]:
    """The pieces whose concatenation is the first ``at`` characters of theirs."""
    kept: list[str] = []
    total = 0
    for p in pieces:
        if total + len(p) >= at:
            kept.append(p[: at - total])
            break
        kept.append(p)
        total += len(p)
    return kept


def _check_keys(body: Any, allowed: set[str], what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise Rejected(f"{what} must be a JSON object")
    extra = sorted(set(body) - allowed)
    if extra:
        raise Rejected(f"{what}: unexpected fields {extra}", 422)
    return body


def _token_ids(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(type(t) is int for t in value):
        raise Rejected(f"{what} must be a non-empty list of token ids")
    return value


def _stops(value: Any) -> list[str]:
    stops = [value] if isinstance(value, str) else value or []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise Rejected("stop must be a string or a list of strings")
    return stops


def parse_sglang(body: Any) -> tuple[list[int], dict[str, Any], bool]:
    """Token ids, sampling params and the stream flag of a ``/generate`` body."""
    body = _check_keys(body, SGLANG_GENERATE, "GenerateReqInput")
    if ("text" in body) == ("input_ids" in body):
        raise Rejected("Either text or input_ids should be provided.")
    ids = _token_ids(body["input_ids"], "input_ids") if "input_ids" in body else None
    if ids is None:
        ids = list(str(body["text"]).encode())
    sp = _check_keys(body.get("sampling_params") or {}, SGLANG_SAMPLING, "sampling_params")
    if "json_schema" in sp:
        if not isinstance(sp["json_schema"], str):
            raise Rejected("sampling_params.json_schema must be a string")
        try:
            json.loads(sp["json_schema"])
        except ValueError as exc:
            raise Rejected(f"invalid json_schema: {exc}") from None
    return ids, sp, bool(body.get("stream", False))


def completion_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema of a ``/v1/completions`` body, from whichever field carries it."""
    found: list[dict[str, Any]] = []
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
            raise Rejected("response_format.type must be text, json_object or json_schema")
        if rf["type"] == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict) or not isinstance(js.get("name"), str):
                raise Rejected("response_format.json_schema needs a name")
            if not isinstance(js.get("schema"), dict):
                raise Rejected("response_format.json_schema.schema must be an object")
            found.append(js["schema"])
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict) or not isinstance(so.get("json"), dict | str):
            raise Rejected("structured_outputs must be an object such as {'json': schema}")
        found.append(so["json"] if isinstance(so["json"], dict) else json.loads(so["json"]))
    if "guided_json" in body:
        found.append(body["guided_json"])
    if len(found) > 1:
        raise Rejected("You can only use one kind of structured outputs constraint")
    return found[0] if found else None


def parse_completion(body: Any, model: str) -> tuple[list[int], dict[str, Any]]:
    """Token ids and the checked body of a ``/v1/completions`` request."""
    body = _check_keys(body, OPENAI_COMPLETION, "CompletionRequest")
    if body.get("model") != model:
        raise Rejected(f"The model `{body.get('model')}` does not exist.", 404)
    if "stream_options" in body and not body.get("stream"):
        raise Rejected("Stream options can only be defined when `stream=True`.")
    return _token_ids(body.get("prompt"), "prompt"), body


def parse_embeddings(body: Any, model: str) -> list[list[int]]:
    body = _check_keys(body, OPENAI_EMBEDDINGS, "EmbeddingRequest")
    if body.get("model") != model:
        raise Rejected(f"The model `{body.get('model')}` does not exist.", 404)
    if body.get("encoding_format", "float") not in ("float", "base64"):
        raise Rejected("encoding_format must be float or base64")
    inputs = body.get("input")
    if isinstance(inputs, list) and inputs and all(type(t) is int for t in inputs):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs:
        raise Rejected("input must be token ids or a list of token-id lists")
    return [_token_ids(x, f"input[{i}]") for i, x in enumerate(inputs)]


def stops_and_schema(api: str, sp: dict[str, Any]) -> tuple[list[str], dict[str, Any] | None]:
    if api == "sglang":
        schema = json.loads(sp["json_schema"]) if "json_schema" in sp else None
        return _stops(sp.get("stop")), schema
    return _stops(sp.get("stop")), completion_schema(sp)


def sglang_meta(out: Completion, *, done: bool, upto: int | None = None) -> dict[str, Any]:
    """SGLang's ``meta_info`` after ``upto`` tokens, or at the end."""
    reason: dict[str, Any] | None = None
    if done and out.finish == "length":
        reason = {"type": "length", "length": out.tokens}
    elif done:
        reason = {"type": "stop", "matched": out.matched if out.matched else 2}  # 2: EOS id
    return {
        "id": "rid-1",
        "finish_reason": reason,
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": out.tokens if done else upto,
        "cached_tokens": 0,
    }
