"""A request far larger than one batch is shared as parts by real worker processes,
and nothing is lost or duplicated when one is killed with SIGKILL mid-request
(issue 12, "the remainder put back")."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from ..conftest import TINY
from ..waiting import wait_for
from .conftest import RunningCluster, start_cluster
from .test_failures import reference

TEXTS = [f"sentence number {i} about {'many ' * (i % 5)}things" for i in range(3000)]


@pytest.fixture
def sliced(cluster_catalog: Path, tmp_path: Path) -> Iterator[RunningCluster]:
    # a 64-token budget makes the request hundreds of parts; unacked work comes back
    # after 1 s when its worker is gone; 3000 inputs in one request are over the default
    # max_items (2048), so the gateway is told to take them
    rc = start_cluster(
        cluster_catalog, tmp_path, workers=2, max_batch_tokens=64, ack_wait=1.0, max_items=4096
    )
    yield rc
    rc.cluster.stop()


def encode(api: str, texts: list[str]) -> httpx.Response:
    return httpx.post(f"{api}/v1/encode/{TINY}", json={"inputs": texts}, timeout=60)


def check(r: httpx.Response, cluster_catalog: Path) -> None:
    assert r.status_code == 200, r.text
    got = np.asarray(r.json()["embeddings"], dtype=np.float32)
    assert got.shape[0] == len(TEXTS)
    want = reference(cluster_catalog.parent / "model", TEXTS)
    cos = (got * want).sum(1)
    assert cos.min() > 0.999, f"item {int(cos.argmin())} got another item's result"


def test_both_workers_serve_parts_of_one_request(
    sliced: RunningCluster, cluster_catalog: Path
) -> None:
    check(encode(sliced.api, TEXTS), cluster_catalog)
    assert sliced.worker_metric("fleetserve_slices_total") >= 10
    # each worker ran batches of it: the second one did not sit idle
    for w in sliced.workers():
        text = httpx.get(w["url"] + "/metrics", timeout=5).text
        batches = [ln for ln in text.splitlines() if ln.startswith("fleetserve_batch_size_count")]
        assert sum(float(ln.rsplit(" ", 1)[1]) for ln in batches) > 0, w["id"]


@pytest.mark.parametrize("victim", [0, 1])
def test_kill_9_mid_request_loses_and_repeats_nothing(
    sliced: RunningCluster, cluster_catalog: Path, victim: int
) -> None:
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.update(r=encode(sliced.api, TEXTS)))
    t.start()
    # parts are out: whoever holds the request and whoever serves them, one dies now
    assert wait_for(lambda: sliced.worker_metric("fleetserve_slices_total") > 0, 30)
    assert t.is_alive()  # mid-request
    sliced.kill_worker(victim)
    t.join(60)
    assert not t.is_alive()
    check(out["r"], cluster_catalog)
