"""Affinity: two workers, two models, room for one each; they settle, not thrash."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from ..tinymodels import build_bert, write_spec
from ..waiting import wait_for
from .conftest import start_cluster

MODELS = ("aff/a", "aff/b")


@pytest.fixture(scope="module")
def affinity_catalog(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    root = tmp_path_factory.mktemp("affinity")
    cat = root / "catalog"
    size = 0
    for i, model in enumerate(MODELS):
        path = build_bert(root / f"m{i}", seed=i, hidden=384, layers=4)
        size = max(size, sum(f.stat().st_size for f in path.glob("*.safetensors")))
        write_spec(cat, model, path, dimensions=384)
    return cat, size


def test_workers_keep_the_models_they_hold_and_do_not_thrash(
    affinity_catalog: tuple[Path, int], tmp_path: Path
) -> None:
    cat, size = affinity_catalog
    rc = start_cluster(cat, tmp_path, workers=2, models="aff/*", memory_budget=str(size * 3 // 2))
    try:

        def embed(model: str) -> int:
            body = {"model": model, "input": ["which worker holds me"]}
            r = httpx.post(rc.api + "/v1/embeddings", json=body, timeout=60)
            assert r.status_code == 200, r.text
            return r.status_code

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(embed, [MODELS[i % 2] for i in range(160)]))

        def settled() -> bool:
            data = httpx.get(rc.api + "/v1/models", timeout=5).json()["data"]
            where = {m["id"]: m["resident_on"] for m in data}
            return all(len(where[m]) == 1 for m in MODELS) and set(where["aff/a"]) != set(
                where["aff/b"]
            )

        wait_for(settled, 10, lambda: httpx.get(rc.api + "/v1/models").json())
        loads = sum(  # a wake from sleep counts: a model traded back and forth wakes
            rc.worker_metric(f'fleetserve_model_loads_total{{model="{m}",outcome="{how}"}}')
            for m in MODELS
            for how in ("ok", "woken")
        )
        # each model loaded once, and a few times more while heartbeats spread (9 seen
        # once in a full run on 2 busy cores): not once every other request (~80), as
        # two workers that pull anything would
        assert loads <= 12, loads
    finally:
        rc.cluster.stop()
