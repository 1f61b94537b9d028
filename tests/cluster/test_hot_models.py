"""Hot add and remove in distributed mode: the gateway puts the change in the fleet's
models bucket, the workers pick it up (build the runner; drain and unload), and the
gateway's listing follows."""

from __future__ import annotations

from pathlib import Path

import httpx

from ..conftest import TINY
from ..tinymodels import build_bert, write_spec
from ..waiting import wait_for
from .conftest import start_cluster

HOT = "hot/cluster-bert"


def _holders(api: str, model: str, field: str = "id") -> list[str]:
    """``field`` of each worker the gateway's listing says serves ``model``."""
    data = httpx.get(api + "/v1/models", timeout=5).json()["data"]
    return next((sorted(w[field] for w in m["workers"]) for m in data if m["id"] == model), [])


def test_a_model_added_at_the_gateway_is_served_by_the_workers(tmp_path: Path) -> None:
    cat = tmp_path / "catalog"
    write_spec(cat, TINY, build_bert(tmp_path / "models" / "a"))
    source = build_bert(tmp_path / "models" / "b", seed=1)
    rc = start_cluster(cat, tmp_path, workers=2, models=TINY, model_roots=str(tmp_path / "models"))
    try:
        spec = {"id": HOT, "family": "dense", "sources": [str(source)], "max_seq_len": 16}
        r = httpx.post(rc.api + "/v1/models", json=spec, timeout=30)
        assert r.status_code == 201, r.text
        assert r.json()["id"] == HOT
        again = httpx.post(rc.api + "/v1/models", json=spec, timeout=30)
        assert again.status_code == 409
        body = {"inputs": ["hello there", "a second text"]}
        r = httpx.post(f"{rc.api}/v1/encode/{HOT}", json=body, timeout=30)
        assert r.status_code == 200, r.text
        assert len(r.json()["embeddings"][0]) == 32
        wait_for(lambda: len(_holders(rc.api, HOT)) == 2, 30, "both workers serving it")
        # the worker that answered has it loaded (its next beat says so)
        wait_for(lambda: "resident" in _holders(rc.api, HOT, "state"), 10, "it to be resident")
        resident = sum(state == "resident" for state in _holders(rc.api, HOT, "state"))
        before = rc.worker_metric("fleetserve_resident_models")
        gone = httpx.delete(f"{rc.api}/v1/models/{HOT}", timeout=30)
        assert gone.status_code == 200 and gone.json()["deleted"] is True
        r = httpx.post(f"{rc.api}/v1/encode/{HOT}", json=body, timeout=30)
        assert r.status_code == 404 and repr(HOT) in r.json()["error"]["message"]
        assert HOT not in [m["id"] for m in httpx.get(rc.api + "/v1/models").json()["data"]]
        # the DELETE answered once no worker's heartbeat listed it: drained and unloaded
        assert rc.worker_metric("fleetserve_resident_models") == before - resident
        assert httpx.post(f"{rc.api}/v1/encode/{TINY}", json=body, timeout=30).status_code == 200
    finally:
        rc.cluster.stop()
