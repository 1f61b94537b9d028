"""The HTTP APIs the external runtime speaks: its options and the requests it sends.

- ``sglang``: SGLang's native ``POST /generate`` (token ids in, text out; streaming as
  server-sent events whose ``text`` is cumulative unless the server runs with
  ``--incremental-streaming-output``).
- ``openai``: the OpenAI-compatible ``POST /v1/completions`` that vLLM and SGLang serve,
  with token-id prompts.

Both use ``POST /v1/embeddings`` with token-id inputs for embeddings. Nothing here does
I/O; :mod:`.external_replies` reads the answers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .base import SamplingParams

APIS = ("sglang", "openai")
# how the openai API carries a JSON schema: the OpenAI field (vLLM and SGLang), vLLM's own
# field (vLLM >= 0.10.2), or vLLM's field before 0.12
STRUCTURED = ("response_format", "structured_outputs", "guided_json")


@dataclass(frozen=True, slots=True)
class ExternalOptions:
    """The model spec's ``runtime_options`` for ``runtime: external``."""

    url: str
    api: str = "sglang"
    model: str | None = None  # the served model name; asked from the server when absent
    timeout: float = 300.0  # seconds to wait for a reply (between stream events)
    connect_timeout: float = 5.0
    max_concurrency: int = 64  # requests in flight to the server
    api_key: str | None = None  # sent as "Authorization: Bearer ..."
    structured_output: str = "response_format"  # openai API only; one of STRUCTURED
    incremental_stream: bool = False  # sglang: the server has --incremental-streaming-output
    retry_after: float = 2.0  # seconds, in the error when the server is unreachable

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> ExternalOptions:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(options) - known)
        if "api_key_env" in unknown:
            raise ValueError(
                "runtime_options.api_key_env is not read by the external runtime: "
                "pass the key itself as runtime_options.api_key"
            )
        if unknown:
            raise ValueError(
                f"unknown runtime_options {unknown} for runtime external; known: {sorted(known)}"
            )
        url = str(options.get("url") or "").rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(
                "runtime external needs runtime_options.url, e.g. http://gpu-host:30000"
            )
        url = url.removesuffix("/v1")
        opts = cls(
            url=url,
            api=str(options.get("api", "sglang")),
            model=str(options["model"]) if options.get("model") else None,
            timeout=float(options.get("timeout", 300.0)),
            connect_timeout=float(options.get("connect_timeout", 5.0)),
            max_concurrency=int(options.get("max_concurrency", 64)),
            api_key=str(options["api_key"]) if options.get("api_key") else None,
            structured_output=str(options.get("structured_output", "response_format")),
            incremental_stream=bool(options.get("incremental_stream", False)),
            retry_after=float(options.get("retry_after", 2.0)),
        )
        if opts.api not in APIS:
            raise ValueError(f"runtime_options.api must be one of {APIS}, not {opts.api!r}")
        if opts.structured_output not in STRUCTURED:
            raise ValueError(f"runtime_options.structured_output must be one of {STRUCTURED}")
        if opts.timeout <= 0 or opts.connect_timeout <= 0 or opts.max_concurrency < 1:
            raise ValueError("runtime_options timeouts must be > 0 and max_concurrency >= 1")
        return opts


# -- generation ------------------------------------------------------------------------
def generate_request(
    opts: ExternalOptions, model: str | None, ids: list[int], p: SamplingParams, stream: bool
) -> tuple[str, dict[str, object]]:
    """The path and JSON body for one sequence."""
    if opts.api == "sglang":
        sp: dict[str, object] = {
            "max_new_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
        }
        if p.stop:
            sp["stop"] = list(p.stop)
        if p.seed is not None:
            sp["sampling_seed"] = p.seed
        if p.json_schema is not None:
            sp["json_schema"] = json.dumps(p.json_schema)  # SGLang takes the schema as a string
        return "/generate", {
            "input_ids": [int(t) for t in ids],
            "sampling_params": sp,
            "stream": stream,
        }
    body: dict[str, object] = {
        "model": model,
        "prompt": [int(t) for t in ids],
        "max_tokens": p.max_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if p.stop:
        body["stop"] = list(p.stop)
    if p.seed is not None:
        body["seed"] = p.seed
    if p.json_schema is not None:
        if opts.structured_output == "response_format":
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": p.json_schema},
            }
        elif opts.structured_output == "structured_outputs":
            body["structured_outputs"] = {"json": p.json_schema}
        else:
            body["guided_json"] = p.json_schema
    return "/v1/completions", body


# -- embeddings ------------------------------------------------------------------------
def embeddings_body(model: str | None, inputs: list[list[int]]) -> dict[str, object]:
    body: dict[str, object] = {"input": inputs, "encoding_format": "float"}
    if model is not None:
        body["model"] = model
    return body
