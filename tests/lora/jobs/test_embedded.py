"""Fine-tuning jobs in the embedded server, end to end through the SDK: a job trains a
LoRA on a tiny base in a child process, measures it, registers it, and the adapter it
registered serves what the trainer trained; a job below the margin registers nothing;
a running job cancels; the server keeps serving while a job trains."""

from __future__ import annotations

import json
import multiprocessing
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleetserve import Client

from ...conftest import TINY, ServerThread, tiny_settings
from ...extras import needs
from ...lora.test_serving import reference

pytestmark = needs("sentence_transformers", "peft", extra="train")

WORDS = ["quick", "brown", "fox", "lazy", "dog", "cat", "river", "bank", "money", "water",
         "model", "fleet", "vector", "search", "world", "hello"]  # fmt: skip


def pairs_file(path: Path, n: int = 40, seed: int = 0) -> Path:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        words = rng.sample(WORDS, 4)
        rows.append(
            {
                "query": f"{words[0]} {words[1]} {i % 20}",
                "positive": f"the {words[0]} and the {words[1]} {' '.join(words[2:])}",
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def server(tiny_catalog: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    tmp = tmp_path_factory.mktemp("ft")
    settings = tiny_settings(
        tiny_catalog, cache_dir=str(tmp / "cache"), train_min_pairs=8, train_threads=1
    )
    srv = ServerThread(settings).start()
    yield srv
    srv.stop()


def base_dir(srv: ServerThread) -> Path:
    assert srv.server is not None
    return Path(srv.server.catalog.get(TINY).sources[0])


def test_a_job_trains_measures_registers_and_serves(server: ServerThread, tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    with Client(server.url, timeout=120) as c:
        job = c.fine_tune(
            TINY, pairs_file(tmp_path / "p.jsonl"), suffix="tiny-legal", margin=-1.0,
            hyperparameters={"rank": 4, "epochs": 2, "batch_size": 8, "learning_rate": 1e-3,
                             "hard_negatives": 1},
            on_event=seen.append,
        )  # fmt: skip
        assert job["status"] == "succeeded", job
        result = job["result"]
        for key in ("base", "adapter"):
            assert 0.0 <= result[key]["ndcg_at_10"] <= 1.0
            assert 0.0 <= result[key]["recall_at_10"] <= 1.0
        assert result["registered"] and job["fine_tuned_model"] == f"{TINY}:default/tiny-legal@1"
        assert result["epochs"] == 2 and result["steps"] > 0 and result["mined_negatives"] > 0
        # its share of the server's budget (train_memory_share, 25 %) was held and kept
        assert server.server is not None
        memory, budget = result["memory"], server.server.fleet.budget
        assert abs(memory["share"] - budget // 4) <= 1 and memory["micro_batch"] >= 1
        assert 0 < memory["peak_growth"] <= 1.1 * memory["share"], memory
        assert any("MiB of the memory budget held for training" in e["message"] for e in seen)
        kinds = {e["type"] for e in seen}
        assert {"status", "metrics"} <= kinds, seen
        assert any("checkpoint after epoch 1" in e["message"] for e in seen)
        # what is served under the new name is what the trainer trained
        texts = ["quick brown fox", "the lazy dog and the river bank"]
        got = np.asarray(c.encode(job["fine_tuned_model"], texts, normalize=False))
        adapter_dir = tmp_path / "adapter"
        adapter_dir.mkdir()
        files = c.get_adapter("default/tiny-legal@1")
        assert files["id"] == "default/tiny-legal@1"
    assert server.server is not None
    registry = server.server.adapters.registry  # type: ignore[union-attr]
    config, weights = server.call(lambda: registry.files("default/tiny-legal@1"))
    (adapter_dir / "adapter_config.json").write_bytes(config)
    (adapter_dir / "adapter_model.safetensors").write_bytes(weights)
    np.testing.assert_allclose(got, reference(base_dir(server), adapter_dir, texts), atol=1e-4)


def test_below_the_margin_the_job_succeeds_unregistered(
    server: ServerThread, tmp_path: Path
) -> None:
    with Client(server.url, timeout=120) as c:
        job = c.fine_tune(TINY, pairs_file(tmp_path / "p.jsonl", seed=1), suffix="too-small",
                          margin=1.0, hyperparameters={"rank": 2, "epochs": 1})  # fmt: skip
        assert job["status"] == "succeeded" and job["registered"] is False
        assert job["fine_tuned_model"] is None and job["result"]["gain"] < 1.0
        assert not any("too-small" in a["id"] for a in c.list_adapters())


def test_a_running_job_is_cancelled_and_serving_goes_on(
    server: ServerThread, tmp_path: Path
) -> None:
    with Client(server.url, timeout=120) as c:
        f = c.upload_file(pairs_file(tmp_path / "p.jsonl", seed=2))
        job = c.create_fine_tuning_job(
            TINY, f["id"], suffix="long", hyperparameters={"epochs": 50, "batch_size": 2}
        )
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until it trains (steps are reported)
            seen = c.fine_tuning_events(job["id"], limit=5)
            if any(e["type"] == "metrics" for e in seen):
                break
            c.encode(TINY, ["serving goes on while a job trains"])
        assert any(e["type"] == "metrics" for e in seen), seen
        assert c.encode(TINY, ["still serving"]).shape == (1, 32)
        cancelled = c.cancel_fine_tuning_job(job["id"])
        assert cancelled["status"] == "cancelled", cancelled
        assert c.get_fine_tuning_job(job["id"])["status"] == "cancelled"
        messages = [e["message"] for e in c.fine_tuning_events(job["id"], limit=100)]
        assert "cancelled while training" in messages
    assert multiprocessing.active_children() == []  # the training process is gone
