"""Offload end to end: a body over the threshold travels through the NATS object store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import nats

from fleetserve.storage.nats import NatsObjectStore

from ..conftest import TINY
from .conftest import start_cluster
from .test_failures import reference


def test_large_requests_go_through_the_object_store_and_are_cleaned_up(
    cluster_catalog: Path, tmp_path: Path
) -> None:
    rc = start_cluster(cluster_catalog, tmp_path, workers=1, offload_threshold=2048)
    try:
        texts = [f"item {i} of a request too large to travel inline" for i in range(200)]
        r = httpx.post(rc.api + f"/v1/encode/{TINY}", json={"inputs": texts}, timeout=60)
        assert r.status_code == 200, r.text
        import numpy as np

        got = np.array(r.json()["embeddings"], dtype=np.float32)
        want = reference(cluster_catalog.parent / "model", texts)
        assert float((got * want).sum(1).min()) > 0.999

        async def leftovers() -> int:
            nc = await nats.connect(rc.cluster.nats.url)
            try:
                store = await NatsObjectStore.open(nc, "fleetserve-payloads")
                return await store.sweep(0.0)  # counts (and removes) whatever is left
            finally:
                await nc.close()

        assert asyncio.run(leftovers()) == 0
    finally:
        rc.cluster.stop()
