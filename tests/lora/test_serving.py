"""Adapters served end to end: upload, call as ``base:adapter`` or the ``adapter``
field, mixed in one batch with the base and each other, equal to PEFT alone."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.conftest import TINY, ServerThread, tiny_settings
from tests.tiny_lora import make_lora, peft_model
from tests.tinymodels import build_bert, write_spec
from tests.waiting import wait_for

TEXTS = ["the quick brown fox", "jumps over the lazy dog", "a b c"]


def upload(
    url: str,
    adapter: Path,
    name: str,
    base: str = TINY,
    version: int | None = None,
    **headers: str,
) -> httpx.Response:
    files = {
        "config": ("adapter_config.json", (adapter / "adapter_config.json").read_bytes()),
        "weights": (
            "adapter_model.safetensors",
            (adapter / "adapter_model.safetensors").read_bytes(),
        ),
    }
    data = {"name": name, "base": base}
    if version is not None:
        data["version"] = str(version)
    return httpx.post(f"{url}/v1/adapters", data=data, files=files, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bert(tmp_path_factory.mktemp("lora-serving") / "bert")


@pytest.fixture(scope="module")
def server(base_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("lora-serving-server")
    cat = root / "catalog"
    write_spec(cat, TINY, base_dir)
    write_spec(cat, "tiny/image", base_dir, family="image")  # a family that takes none
    settings = tiny_settings(
        cat,
        models="tiny/*",
        cache_dir=str(root / "cache"),
        adapter_store=(root / "adapters").as_uri(),
    )
    srv = ServerThread(settings).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def adapters(
    base_dir: Path, server: ServerThread, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora-serving-adapters")
    out = {}
    for i, (name, targets) in enumerate(
        [("a", ("query", "value")), ("b", ("query", "key", "dense")), ("c", ("value",))]
    ):
        path = make_lora(base_dir, root / name, seed=10 + i, rank=4 + 2 * i, targets=targets)
        r = upload(server.url, path, name)
        assert r.status_code == 201, r.text
        out[r.json()["id"]] = path
    return out


def reference(base_dir: Path, adapter: Path | None, texts: Sequence[str]) -> np.ndarray[Any, Any]:
    """Mean-pooled embeddings of PEFT running ``adapter`` alone (or the base) at fp32."""
    from transformers import AutoTokenizer

    from tests.tiny_lora import load_base

    tok = AutoTokenizer.from_pretrained(str(base_dir))
    model = peft_model(base_dir, adapter) if adapter is not None else load_base(base_dir)
    batch = tok(list(texts), padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled: np.ndarray[Any, Any] = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    return pooled


def encode(url: str, adapter: str | None, texts: Sequence[str] = TEXTS) -> np.ndarray[Any, Any]:
    body: dict[str, Any] = {"inputs": list(texts), "normalize": False}
    if adapter is not None:
        body["adapter"] = adapter
    r = httpx.post(f"{url}/v1/encode/{TINY}", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["embeddings"], dtype=np.float32)


def record_batches(srv: ServerThread) -> list[list[str | None]]:
    """The adapter of each row of every batch the tiny model runs from now on."""
    assert srv.server is not None
    runner: Any = srv.server.runners[TINY]
    real = runner._planned
    seen: list[list[str | None]] = []

    def planned(items: Any, keys: list[str | None]) -> Any:
        seen.append(list(keys))
        return real(items, keys)

    runner._planned = planned
    return seen


def queued(srv: ServerThread, items: int, heating: str | None = None) -> None:
    """Wait until ``items`` items wait in the tiny model's batch former (or, with
    ``heating``, until that adapter waits to be made hot)."""
    assert srv.server is not None
    runner: Any = srv.server.runners[TINY]
    former = runner.waiting
    wait_for(
        lambda: len(former) >= items or (heating and runner.adapters.heating(heating)),
        60,  # generous: a loaded 2-core machine is slow to queue
        lambda: f"{items} items queued (only {len(former)})",
        interval=0.01,
    )


def behind_gate(srv: ServerThread) -> None:
    """Wait until a forward pass waits on the held compute thread."""
    assert srv.server is not None
    work = srv.server.runners[TINY]._forward._work_queue  # type: ignore[attr-defined]
    wait_for(lambda: work.qsize() >= 1, 20, "a forward pass on the compute thread", interval=0.01)


def hold_compute(srv: ServerThread) -> threading.Event:
    """Block the compute thread until the returned event is set (requests queue up).
    Returns once the thread is inside the hold: till then the hold itself sits in the
    thread's queue, where ``behind_gate`` would take it for a forward pass behind it."""
    assert srv.server is not None
    gate, holding = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        gate.wait(30)

    srv.server.runners[TINY]._forward.submit(hold)  # type: ignore[attr-defined]
    assert holding.wait(20), "the compute thread never took the hold"
    return gate


def test_requests_for_adapters_and_the_base_share_one_batch_and_equal_peft_alone(
    server: ServerThread, adapters: dict[str, Path], base_dir: Path
) -> None:
    mixed_batches_equal_peft(server, adapters, base_dir)


def mixed_batches_equal_peft(
    server: ServerThread, adapters: dict[str, Path], base_dir: Path
) -> None:
    """Requests for each adapter and for the base, queued behind a held compute thread,
    run in batches that mix them, each row equal to PEFT running its adapter alone.
    PEFT runs first: loading it silences a warning with ``warnings.catch_warnings``,
    which a server's background conversion (a fit of LoRA slots, its own
    ``catch_warnings``) could undo on another thread meanwhile."""
    ids = list(adapters)
    calls: list[str | None] = [ids[0], None, ids[1], ids[2], ids[0], None]
    refs = {key: reference(base_dir, adapters[key] if key else None, TEXTS) for key in {*calls}}
    for key in ids:  # hot before the batch is held
        encode(server.url, key, ["warm"])
    seen = record_batches(server)
    gate = hold_compute(server)
    with ThreadPoolExecutor(len(calls) + 1) as pool:
        first = pool.submit(encode, server.url, None, ["hold the line"])  # runs after the gate
        behind_gate(server)
        futures = [pool.submit(encode, server.url, key) for key in calls]
        queued(server, 3 * len(calls))  # every request's items wait behind the first
        gate.set()
        first.result()
        results = [f.result() for f in futures]
    mixed = [b for b in seen if len({k for k in b}) > 2]
    assert mixed, f"no batch mixed the adapters and the base: {seen}"
    assert set().union(*map(set, seen[-3:])) == {None, *ids}  # the held requests' batches
    for key, got in zip(calls, results, strict=True):
        np.testing.assert_allclose(got, refs[key], atol=1e-5, rtol=0)
    assert not np.allclose(refs[ids[0]], refs[None], atol=1e-3)


def test_base_colon_adapter_works_for_openai_clients(
    server: ServerThread, adapters: dict[str, Path], base_dir: Path
) -> None:
    from openai import OpenAI

    key = next(iter(adapters))
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    out = client.embeddings.create(model=f"{TINY}:{key}", input=TEXTS)
    got = np.asarray([d.embedding for d in out.data])
    want = reference(base_dir, adapters[key], TEXTS)
    want /= np.linalg.norm(want, axis=1, keepdims=True)  # /v1/embeddings normalizes
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_an_unknown_adapter_is_a_404_naming_it(server: ServerThread) -> None:
    r = httpx.post(
        f"{server.url}/v1/encode/{TINY}", json={"inputs": ["x"], "adapter": "default/nope"}
    )
    assert r.status_code == 404, r.text
    assert r.json()["error"]["code"] == "adapter_not_found"
    assert "default/nope" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/embeddings", json={"model": f"{TINY}:x/y", "input": "x"})
    assert r.status_code == 404 and "x/y" in r.json()["error"]["message"]


def test_another_tenants_adapter_answers_404_not_403(base_dir: Path, tmp_path: Path) -> None:
    import yaml

    from fleetserve.gateway.auth import hash_key

    keys = {"acme": "fs-acme-key", "globex": "fs-globex-key", "reader": "fs-read-only"}
    entries = [
        {"sha256": hash_key(keys[t]), "tenant": t, "scopes": ["infer", "adapters:write"]}
        for t in ("acme", "globex")
    ]
    entries.append({"sha256": hash_key(keys["reader"]), "tenant": "acme", "scopes": ["infer"]})
    (tmp_path / "keys.yaml").write_text(yaml.safe_dump(entries))
    cat = tmp_path / "catalog"
    write_spec(cat, TINY, base_dir)
    settings = tiny_settings(
        cat,
        cache_dir=str(tmp_path / "cache"),
        adapter_store=(tmp_path / "adapters").as_uri(),
        keys_file=str(tmp_path / "keys.yaml"),
    )
    srv = ServerThread(settings).start()
    try:
        path = make_lora(base_dir, tmp_path / "secret", seed=3)
        assert upload(srv.url, path, "secret").status_code == 401
        bearer = {t: {"Authorization": f"Bearer {k}"} for t, k in keys.items()}
        assert upload(srv.url, path, "secret", **bearer["reader"]).status_code == 403
        r = upload(srv.url, path, "secret", **bearer["acme"])
        assert r.status_code == 201, r.text
        aid = r.json()["id"]
        assert aid.startswith("acme/secret@")

        def call(who: str) -> httpx.Response:
            body = {"inputs": ["x"], "adapter": aid}
            return httpx.post(f"{srv.url}/v1/encode/{TINY}", json=body, headers=bearer[who])

        assert call("acme").status_code == 200
        assert call("reader").status_code == 200  # same tenant, infer only
        other = call("globex")
        assert other.status_code == 404, other.text
        assert other.json()["error"]["code"] == "adapter_not_found"
        assert (
            httpx.get(f"{srv.url}/v1/adapters/{aid}", headers=bearer["globex"]).status_code == 404
        )
        gone = httpx.delete(f"{srv.url}/v1/adapters/{aid}", headers=bearer["globex"])
        assert gone.status_code == 404
        listed = httpx.get(f"{srv.url}/v1/adapters", headers=bearer["globex"]).json()
        assert aid not in str(listed)
    finally:
        srv.stop()


def test_a_family_that_takes_no_adapters_says_so(
    server: ServerThread, adapters: dict[str, Path]
) -> None:
    key = next(iter(adapters))
    r = httpx.post(
        f"{server.url}/v1/encode/tiny/image", json={"inputs": ["x"], "adapter": key}, timeout=30
    )
    assert r.status_code == 400, r.text
    assert "cannot take adapters" in r.json()["error"]["message"]


def test_an_adapter_deleted_while_its_requests_queue_answers_them_404(
    server: ServerThread, base_dir: Path, tmp_path: Path
) -> None:
    path = make_lora(base_dir, tmp_path / "doomed", seed=4)
    aid = upload(server.url, path, "doomed").json()["id"]
    encode(server.url, aid, ["warm"])  # hot: only the delete can stop it now
    gate = hold_compute(server)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(encode, server.url, None, ["hold the line"])  # runs after the gate
        behind_gate(server)
        waiting = pool.submit(
            httpx.post,
            f"{server.url}/v1/encode/{TINY}",
            json={"inputs": TEXTS, "adapter": aid},
            timeout=30,
        )
        # in the worker behind the held compute thread: in the former, or (if the
        # adapter left the hot tier meanwhile) waiting to be made hot on that thread
        queued(server, len(TEXTS), heating=aid)
        r = httpx.delete(f"{server.url}/v1/adapters/{aid}", timeout=30)
        assert r.status_code == 200, r.text
        gate.set()
        first.result()
        answer = waiting.result()
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["code"] == "adapter_not_found"
    assert aid in answer.json()["error"]["message"]


def test_two_uploads_of_one_id_at_once_one_wins_the_other_409(
    server: ServerThread, base_dir: Path, tmp_path: Path
) -> None:
    path = make_lora(base_dir, tmp_path / "race", seed=5)
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda _: upload(server.url, path, "race", version=1), range(2)))
    assert sorted(r.status_code for r in got) == [201, 409], [r.text for r in got]


def test_loading_an_adapter_holds_up_no_other_traffic(
    server: ServerThread, base_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While an adapter's files are read (held here), the base and hot adapters serve."""
    import fleetserve.lora.load as load

    path = make_lora(base_dir, tmp_path / "slow", seed=6)
    aid = upload(server.url, path, "slow").json()["id"]
    reading, release = threading.Event(), threading.Event()
    real = load.read_adapter

    def slow_read(p: Path) -> Any:
        reading.set()
        release.wait(30)
        return real(p)

    monkeypatch.setattr(load, "read_adapter", slow_read)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(encode, server.url, aid)
        assert reading.wait(20)
        for _ in range(3):  # the base answers while the adapter loads
            np.testing.assert_allclose(
                encode(server.url, None), reference(base_dir, None, TEXTS), atol=1e-5
            )
        assert not waiting.done()
        release.set()
        np.testing.assert_allclose(waiting.result(), reference(base_dir, path, TEXTS), atol=1e-5)
