"""The generation adapter on a tiny random Llama: request checks, replies, constraints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest

from fleetserve.families import Prepared
from fleetserve.wire import InvalidInput

from ..tiny_generate import build_llama, chat_body, envelope, load_adapter

SCHEMAS: list[dict[str, Any]] = [
    {  # nested object, enum, bounded integer
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "size": {"enum": ["small", "large"]},
            "box": {
                "type": "object",
                "properties": {"w": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["w"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "size", "box"],
        "additionalProperties": False,
    },
    {  # array of booleans
        "type": "object",
        "properties": {"flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
        "required": ["flags"],
        "additionalProperties": False,
    },
]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = build_llama(Path(tmp_path_factory.mktemp("tiny-llama")), max_positions=128)
    return load_adapter(path, max_seq_len=128)


def _run(adapter: Any, body: bytes, task: str = "chat", accept: str = "application/json") -> Any:
    env = envelope(task, accept)
    prepared: Prepared = adapter.preprocess(env, body)
    out = list(adapter.forward(prepared.items))
    raw = adapter.postprocess(env, prepared, out)
    return (
        raw
        if prepared.options.stream
        else msgspec.json.decode(raw)
        if accept.endswith("json")
        else msgspec.msgpack.decode(raw)
    )


def test_chat_reply_is_an_openai_chat_completion(adapter: Any) -> None:
    r = _run(adapter, chat_body("hello", max_tokens=8, temperature=0))
    assert r["object"] == "chat.completion" and r["id"] == "chatcmpl-req-1"
    assert r["model"] == "tiny/llama" and isinstance(r["created"], int)
    (choice,) = r["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length")
    u = r["usage"]
    assert 1 <= u["completion_tokens"] <= 8
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    prompt = adapter.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    # byte-level without merges: one token per byte, one per special token
    specials = prompt.count("<|im_start|>") * 11 + prompt.count("<|im_end|>") * 9
    assert u["prompt_tokens"] == len(prompt.encode()) - specials
    assert "fleetserve" not in r


def test_native_generate_in_msgpack_is_deterministic_when_greedy(adapter: Any) -> None:
    body = json.dumps({"prompt": "the fox", "max_tokens": 6, "temperature": 0}).encode()
    a = _run(adapter, body, "generate", "application/msgpack")
    b = _run(adapter, body, "generate")
    assert a["text"] == b["text"] and a["id"] == "gen-req-1"
    assert a["usage"]["prompt_tokens"] == len("the fox")
    assert a["finish_reason"] in ("stop", "length")


def test_seeded_sampling_repeats_and_other_seeds_differ(adapter: Any) -> None:
    def text(seed: int) -> str:
        body = chat_body("hi", max_tokens=24, temperature=1.0, seed=seed)
        return str(_run(adapter, body)["choices"][0]["message"]["content"])

    assert text(3) == text(3)
    assert len({text(3), text(4), text(5)}) > 1


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_json_schema_output_parses_and_validates(adapter: Any, schema: Any, seed: int) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    body = chat_body("json", max_tokens=120, temperature=1.0, seed=seed, response_format=fmt)
    choice = _run(adapter, body)["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), schema)


def test_json_object_mode_gives_an_object(adapter: Any) -> None:
    fmt = {"type": "json_object"}
    body = chat_body("json", max_tokens=60, temperature=0, response_format=fmt)
    choice = _run(adapter, body)["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    else:  # cut by max_tokens: still the start of an object
        assert choice["message"]["content"].startswith("{")


def test_the_grammar_tokenizer_is_built_at_the_first_response_format(tmp_path: Path) -> None:
    """A load (and so a miss) of a model that serves plain text does not build
    llguidance's tokenizer; the first request with a response format does, once."""
    fresh = load_adapter(build_llama(tmp_path, max_positions=128), max_seq_len=128)
    assert not fresh.grammars.built
    assert _run(fresh, chat_body("hello", max_tokens=4, temperature=0))["choices"]
    assert not fresh.grammars.built
    fmt = {"type": "json_object"}
    body = chat_body("json", max_tokens=60, temperature=0, response_format=fmt)
    assert _run(fresh, body)["choices"][0]["message"]["content"].startswith("{")
    assert fresh.grammars.built
    built = fresh.grammars.tokenizer
    _run(fresh, body)
    assert fresh.grammars.tokenizer is built


@pytest.mark.parametrize(
    ("fmt", "field", "words"),
    [
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
            "response_format.json_schema.schema",
            "strin",
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(?<=a)b"}},
            },
            "response_format.json_schema.schema",
            "look-around",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x"}},
            "response_format.json_schema.schema",
            "needs json_schema.schema",
        ),
        ({"type": "yaml"}, "response_format.type", "yaml"),
    ],
)
def test_a_schema_that_cannot_be_compiled_is_refused_in_preprocess(
    adapter: Any, fmt: Any, field: str, words: str
) -> None:
    with pytest.raises(InvalidInput) as e:
        adapter.preprocess(envelope(), chat_body("x", response_format=fmt))
    assert e.value.field == field and words in e.value.message


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"n": 2}, "n"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": -1}, "max_completion_tokens"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]",
        ),
        ({"messages": "hi"}, "messages"),
    ],
)
def test_bad_requests_name_the_field(adapter: Any, fields: Any, field: str) -> None:
    with pytest.raises(InvalidInput) as e:
        adapter.preprocess(envelope(), chat_body("x", **fields))
    assert e.value.field == field


def test_max_tokens_beyond_the_context_is_clamped_and_reported(adapter: Any) -> None:
    r = _run(adapter, chat_body("hello", max_tokens=5000, temperature=0))
    (warning,) = r["fleetserve"]["warnings"]
    room = 128 - r["usage"]["prompt_tokens"]
    assert warning["code"] == "max_tokens_clamped" and warning["field"] == "max_tokens"
    assert warning["requested"] == 5000 and warning["effective"] == room
    assert r["usage"]["completion_tokens"] <= room


def test_a_prompt_longer_than_the_context_is_400_naming_it(adapter: Any) -> None:
    with pytest.raises(InvalidInput) as e:
        adapter.preprocess(envelope(), chat_body("x" * 200))
    assert e.value.field == "messages" and "128" in e.value.message
    body = json.dumps({"prompt": "y" * 128}).encode()
    with pytest.raises(InvalidInput) as e:
        adapter.preprocess(envelope("generate"), body)
    assert e.value.field == "prompt"


def test_a_stop_string_ends_the_text_before_it(adapter: Any) -> None:
    free = _run(adapter, chat_body("hello", max_tokens=30, temperature=0))
    text = free["choices"][0]["message"]["content"]
    assert len(text) >= 12
    stop = text[8:11]
    cut = _run(adapter, chat_body("hello", max_tokens=30, temperature=0, stop=stop))
    choice = cut["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == text[: text.index(stop)]


def test_a_stream_sent_in_one_piece_is_well_formed_sse(adapter: Any) -> None:
    body = chat_body(
        "hello", max_tokens=6, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    raw: bytes = _run(adapter, body)
    events = [e for e in raw.decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    full = _run(adapter, chat_body("hello", max_tokens=6, temperature=0))
    assert text == full["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == full["usage"]


def test_the_kv_cache_charge_is_what_the_model_caches(adapter: Any) -> None:
    """What the fleet charges a generation model for its KV cache
    (``kv_cache_bytes``) is what transformers' cache holds for that many tokens (the
    tiny llama: 2 layers, 2 key-value heads), so admission and the budget agree."""
    import torch

    tokens = 37
    with torch.no_grad():
        out = adapter.model(torch.arange(tokens).unsqueeze(0), use_cache=True)
    cache = out.past_key_values
    held = sum(
        t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
    )
    assert held == adapter.kv_cache_bytes(tokens) > 0
    assert adapter.kv_cache_bytes(2 * tokens) == 2 * held
