"""fleetserve in front of an SGLang-compatible server: chat (also streamed, also with a
JSON schema) and embeddings go through the real gateway, queue and worker, then over
HTTP to the stand-in, which records exactly what it received."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleetserve.catalog import Catalog

from ..conftest import ServerThread, tiny_settings
from ..tiny_generate import build_llama
from ..tinymodels import build_tokenizer as build_wordpiece
from ..tinymodels import write_spec
from .standin import StandIn


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, StandIn]]:
    root = tmp_path_factory.mktemp("external-e2e")
    llama = build_llama(root / "llama")  # only its tokenizer and chat template are used
    build_wordpiece(root / "bert")
    cat = root / "catalog"
    with StandIn() as standin:
        opts = {"url": standin.url, "api": "sglang"}
        profile = {"cpu": {"max_batch_tokens": 4096, "max_batch_size": 4}}
        write_spec(cat, "ext/chat", llama, family="generate", runtime="external",
                   runtime_options=opts, max_seq_len=256, profiles=profile)  # fmt: skip
        write_spec(cat, "ext/embed", root / "bert", runtime="external", runtime_options=opts)
        settings = tiny_settings(cat, models="ext/chat,ext/embed")
        srv = ServerThread(settings, Catalog.load([cat], bundled=False)).start()
        yield srv, standin
        srv.stop()


def chat(srv: ServerThread, **extra: object) -> httpx.Response:
    body = {"model": "ext/chat", "messages": [{"role": "user", "content": "hello"}]}
    body.update(extra)
    return httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)


def test_chat_completions_go_to_sglang_generate(stack: tuple[ServerThread, StandIn]) -> None:
    srv, standin = stack
    before = len(standin.bodies("/generate"))
    r = chat(srv, max_tokens=8, temperature=0)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "chat.completion" and out["choices"][0]["message"]["content"]
    sent = standin.bodies("/generate")[before:]
    assert len(sent) == 1
    assert isinstance(sent[0]["input_ids"], list) and sent[0]["input_ids"]  # tokenized here
    assert sent[0]["sampling_params"]["max_new_tokens"] == 8


def test_a_json_schema_is_forwarded_as_sglang_expects(
    stack: tuple[ServerThread, StandIn],
) -> None:
    srv, standin = stack
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    before = len(standin.bodies("/generate"))
    r = chat(srv, max_tokens=16, response_format=fmt)
    assert r.status_code == 200, r.text
    params = standin.bodies("/generate")[before]["sampling_params"]
    assert json.loads(params["json_schema"]) == schema  # a JSON string, as SGLang takes


def test_streamed_chat_through_the_bridge(stack: tuple[ServerThread, StandIn]) -> None:
    srv, _ = stack
    body = {"model": "ext/chat", "messages": [{"role": "user", "content": "hi"}],
            "stream": True, "max_tokens": 8}  # fmt: skip
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text and chunks[0]["object"] == "chat.completion.chunk"


def test_embeddings_go_as_token_ids(stack: tuple[ServerThread, StandIn]) -> None:
    srv, standin = stack
    before = len(standin.bodies("/v1/embeddings"))
    r = httpx.post(srv.url + "/v1/encode/ext/embed", json={"inputs": ["fox", "the dog"]})
    assert r.status_code == 200, r.text
    assert len(r.json()["embeddings"]) == 2
    sent = standin.bodies("/v1/embeddings")[before:]
    assert sum(len(b["input"]) for b in sent) == 2
    assert all(isinstance(x, list) for b in sent for x in b["input"])


def test_an_unreachable_server_is_a_clear_503(tmp_path: Path) -> None:
    llama = build_llama(tmp_path / "llama")
    cat = tmp_path / "catalog"
    write_spec(cat, "ext/gone", llama, family="generate", runtime="external",
               runtime_options={"url": "http://127.0.0.1:9", "api": "sglang"})  # fmt: skip
    settings = tiny_settings(cat, models="")
    srv = ServerThread(settings, Catalog.load([cat], bundled=False)).start()
    try:
        body = {"model": "ext/gone", "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 503
        assert "127.0.0.1:9" in r.json()["error"]["message"]
    finally:
        srv.stop()
