"""A reranker's fine-tuning job in the embedded server, end to end through the SDK: a
cross-encoder base trains a LoRA from pairs, the tiny dense model of the catalog (the
miner, ``train_miner``) mines its negatives and retrieves its held-out candidates, the
adapter registers, and ``/v1/rerank`` serves what the trainer trained."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from fleetserve import Client

from ...conftest import TINY, ServerThread, tiny_settings
from ...extras import needs
from ...tiny_lora import peft_model
from ...tiny_rerank import build_cross_encoder
from ...tinymodels import build_bert, write_spec
from .test_embedded import pairs_file

pytestmark = needs("sentence_transformers", "peft", extra="train")

RERANKER = "tiny/rerank"
QUERY, DOCS = "quick brown fox", ["the quick brown fox and the dog", "money in the river bank"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("ft-rerank")
    cat = root / "catalog"
    write_spec(cat, TINY, build_bert(root / "bi-encoder"))
    write_spec(cat, RERANKER, build_cross_encoder(root / "cross-encoder"),
               family="cross_encoder", max_seq_len=64)  # fmt: skip
    settings = tiny_settings(
        cat, models="tiny/*", cache_dir=str(root / "cache"), train_min_pairs=8,
        train_threads=1, train_miner=TINY,
    )  # fmt: skip
    srv = ServerThread(settings).start()
    yield srv
    srv.stop()


def test_a_reranker_job_trains_registers_and_serves(server: ServerThread, tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    with Client(server.url, timeout=120) as c:
        job = c.fine_tune(
            RERANKER, pairs_file(tmp_path / "p.jsonl"), suffix="tiny-rerank", margin=-1.0,
            task="rerank", on_event=seen.append,
            hyperparameters={"rank": 4, "epochs": 1, "batch_size": 8, "learning_rate": 1e-3},
        )  # fmt: skip
    assert job["status"] == "succeeded", job
    result = job["result"]
    assert job["hyperparameters"]["hard_negatives"] == 3  # a reranker's default
    pairs = result["pairs"]["train"]
    assert result["mined_negatives"] == 3 * pairs  # the pairs bring none of their own
    assert result["steps"] == math.ceil(4 * pairs / 8)  # a positive and 3 negatives each
    for key in ("base", "adapter"):
        assert 0.0 <= result[key]["ndcg_at_10"] <= 1.0
    assert result["memory"]["micro_batch"] >= 1  # within its share of the budget
    assert any(f"a reranker: {TINY} mines its negatives" in e["message"] for e in seen)
    adapter = f"{RERANKER}:default/tiny-rerank@1"
    assert result["registered"] and job["fine_tuned_model"] == adapter
    # what /v1/rerank serves under the new name is what the trainer trained
    r = httpx.post(f"{server.url}/v1/rerank", json={"model": adapter, "query": QUERY,
                                                   "documents": DOCS}, timeout=30)  # fmt: skip
    assert r.status_code == 200, r.text
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    assert server.server is not None
    registry = server.server.adapters.registry  # type: ignore[union-attr]
    config, weights = server.call(lambda: registry.files("default/tiny-rerank@1"))
    files = tmp_path / "adapter"
    files.mkdir()
    (files / "adapter_config.json").write_bytes(config)
    (files / "adapter_model.safetensors").write_bytes(weights)
    base = Path(server.server.catalog.get(RERANKER).sources[0])
    np.testing.assert_allclose([got[i] for i in range(len(DOCS))], reference(base, files),
                               atol=1e-4)  # fmt: skip


def reference(base: Path, adapter: Path) -> list[float]:
    """PEFT's scores of (QUERY, each of DOCS) at fp32: the one label's sigmoid."""
    import torch
    from transformers import AutoTokenizer

    model = peft_model(base, adapter, "sequence_classification")
    tok = AutoTokenizer.from_pretrained(str(base))
    batch = tok([QUERY] * len(DOCS), DOCS, padding=True, return_tensors="pt")
    with torch.inference_mode():
        logits = model(**batch).logits[:, 0]
    return [float(x) for x in torch.sigmoid(logits)]
