"""Chat with adapters: sequences of different adapters share the running batch, and
each answers what its adapter merged into the base answers alone."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerThread, tiny_settings
from tests.lora.test_serving import upload
from tests.tiny_generate import build_llama
from tests.tiny_lora import LLAMA_TARGETS, make_lora, save_merged
from tests.tinymodels import write_spec

CHAT = "tiny/chat"
PROMPTS = ["hello there", "what is a fox", "count to three", "tell me more"]
PROFILE = {"cpu": {"precision": "fp32", "max_batch_tokens": 4096, "max_batch_size": 8}}


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServerThread, dict[str, str]]]:
    root = tmp_path_factory.mktemp("lora-chat")
    llama = build_llama(root / "llama", seed=2)
    cat = root / "catalog"
    spec = {"family": "generate", "max_seq_len": 256, "profiles": PROFILE}
    write_spec(cat, CHAT, llama, **spec)
    adapters: dict[str, Path] = {}
    for i, name in enumerate(["x", "y"]):
        path = make_lora(llama, root / name, targets=LLAMA_TARGETS, seed=20 + i, scale=0.3,
                         head="causal_lm")  # fmt: skip
        adapters[name] = path
        save_merged(llama, path, "causal_lm", root / f"merged-{name}")
        write_spec(cat, f"tiny/merged-{name}", root / f"merged-{name}", **spec)
    settings = tiny_settings(
        cat, models="tiny/*", cache_dir=str(root / "cache"),
        adapter_store=(root / "adapters").as_uri(),
    )  # fmt: skip
    srv = ServerThread(settings).start()
    ids = {}
    for name, path in adapters.items():
        r = upload(srv.url, path, name, base=CHAT)
        assert r.status_code == 201, r.text
        ids[name] = r.json()["id"]
    yield srv, ids
    srv.stop()


def chat(url: str, model: str, prompt: str) -> str:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 12,
        "temperature": 0,
    }
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    text: str = r.json()["choices"][0]["message"]["content"]
    return text


def test_adapters_mix_across_running_sequences_and_equal_their_merged_models(
    setup: tuple[ServerThread, dict[str, str]],
) -> None:
    srv, ids = setup
    calls = [(p, name) for p in PROMPTS for name in (None, "x", "y")]
    with ThreadPoolExecutor(len(calls)) as pool:  # all at once: they share the engine
        mixed = list(
            pool.map(lambda c: chat(srv.url, f"{CHAT}:{ids[c[1]]}" if c[1] else CHAT, c[0]), calls)
        )
    for (prompt, name), got in zip(calls, mixed, strict=True):
        alone = chat(srv.url, f"tiny/merged-{name}" if name else CHAT, prompt)
        assert got == alone, (prompt, name)
    by_name = {name: [g for (_, n), g in zip(calls, mixed, strict=True) if n == name]
               for name in (None, "x", "y")}  # fmt: skip
    assert by_name["x"] != by_name[None] and by_name["y"] != by_name["x"]


def test_the_native_generate_route_takes_the_adapter_field(
    setup: tuple[ServerThread, dict[str, str]],
) -> None:
    srv, ids = setup
    body = {"prompt": "hello there", "max_tokens": 8, "temperature": 0, "adapter": ids["x"]}
    r = httpx.post(f"{srv.url}/v1/generate/{CHAT}", json=body, timeout=60)
    assert r.status_code == 200, r.text
    merged = dict(body, adapter=None)
    want = httpx.post(f"{srv.url}/v1/generate/tiny/merged-x", json=merged, timeout=60)
    assert r.json()["text"] == want.json()["text"]
