"""Adapters in distributed mode: uploaded through the gateway into the NATS object
store, served by workers that never saw the upload, with no extra service."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np

from ..conftest import TINY
from ..lora.test_serving import reference, upload
from ..tiny_lora import make_lora
from ..tinymodels import build_bert, write_spec
from .conftest import start_cluster


def test_an_adapter_uploaded_to_the_gateway_is_served_by_the_workers(tmp_path: Path) -> None:
    cat = tmp_path / "catalog"
    bert = build_bert(tmp_path / "bert")
    write_spec(cat, TINY, bert, pinned=True)
    rc = start_cluster(cat, tmp_path, workers=2, models=TINY, cache_dir=str(tmp_path / "cache"))
    try:
        path = make_lora(bert, tmp_path / "legal", seed=8)
        r = upload(rc.api, path, "legal")
        assert r.status_code == 201, r.text
        aid = r.json()["id"]
        texts = ["the quick brown fox", "a b c"]
        for _ in range(4):  # both workers, whichever pulls
            got = httpx.post(
                f"{rc.api}/v1/encode/{TINY}",
                json={"inputs": texts, "adapter": aid, "normalize": False},
                timeout=30,
            )
            assert got.status_code == 200, got.text
            np.testing.assert_allclose(
                np.asarray(got.json()["embeddings"]), reference(bert, path, texts), atol=1e-5
            )
        listed = httpx.get(f"{rc.api}/v1/adapters", timeout=10).json()
        assert aid in str(listed)
        assert httpx.delete(f"{rc.api}/v1/adapters/{aid}", timeout=10).status_code == 200
        gone = httpx.post(
            f"{rc.api}/v1/encode/{TINY}", json={"inputs": texts, "adapter": aid}, timeout=30
        )
        assert gone.status_code == 404, gone.text
    finally:
        rc.cluster.stop()
