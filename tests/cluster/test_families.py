"""Families in distributed mode: a model not named at start loads on its first request,
and a streamed chat crosses NATS chunk by chunk as server-sent events."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from ..conftest import TINY
from ..tiny_generate import build_llama
from ..tinymodels import build_bert, write_spec
from .conftest import start_cluster

CHAT = "tiny/chat"


def test_a_lazy_chat_model_streams_over_nats(tmp_path: Path) -> None:
    cat = tmp_path / "catalog"
    write_spec(cat, TINY, build_bert(tmp_path / "bert"), pinned=True)
    write_spec(cat, CHAT, build_llama(tmp_path / "llama"), family="generate", max_seq_len=256,
               profiles={"cpu": {"max_batch_tokens": 4096, "max_batch_size": 4}})  # fmt: skip
    # models="": the worker serves the whole catalog; only pinned models load at start
    rc = start_cluster(cat, tmp_path, workers=1, models="")
    try:
        before = httpx.get(rc.api + "/v1/models", timeout=5).json()["data"]
        loaded = {m["id"]: any(w["loaded"] for w in m["workers"]) for m in before}
        assert loaded[TINY] is True and loaded[CHAT] is False
        body = {"model": CHAT, "messages": [{"role": "user", "content": "hello"}],
                "stream": True, "max_tokens": 12, "temperature": 0}  # fmt: skip
        with httpx.stream("POST", rc.api + "/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) >= 3
        chunks = [json.loads(e[6:]) for e in events[:-1]]
        streamed = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        )
        whole = httpx.post(rc.api + "/v1/chat/completions", timeout=60,
                           json={**body, "stream": False}).json()  # fmt: skip
        assert streamed == whole["choices"][0]["message"]["content"]  # greedy: the same text
    finally:
        rc.cluster.stop()
