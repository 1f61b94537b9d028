"""Real processes: a nats-server, `fleetserve gateway` and `fleetserve worker`s."""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetserve.cluster.supervisor import Cluster
from fleetserve.settings import Settings

from ..conftest import NO_USER_PROFILES, TINY, TINY_CLASS
from ..tinymodels import build_bert, write_spec

POISON = "tiny/poison-bert"  # its spec allows 64 tokens, its weights only 16 positions
_prefixes = itertools.count()


@pytest.fixture(scope="session")
def cluster_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cluster")
    cat = root / "catalog"
    write_spec(cat, TINY, build_bert(root / "model"))
    write_spec(cat, POISON, build_bert(root / "short", max_positions=16), max_seq_len=64)
    return cat


class RunningCluster:
    def __init__(self, cluster: Cluster, api: str) -> None:
        self.cluster = cluster
        self.api = api

    def workers(self) -> list[dict[str, Any]]:
        data = httpx.get(self.api + "/v1/models", timeout=5).json()["data"]
        seen: dict[str, dict[str, Any]] = {}
        for m in data:
            for w in m["workers"]:
                seen[w["id"]] = w
        return list(seen.values())

    def worker_metric(self, name: str) -> float:
        """Sum of a metric over the live workers' /metrics."""
        total = 0.0
        for w in self.workers():
            text = httpx.get(w["url"] + "/metrics", timeout=5).text
            for line in text.splitlines():
                if line.startswith(name) and not line.startswith("#"):
                    total += float(line.rsplit(" ", 1)[1])
        return total

    def kill_worker(self, i: int) -> None:
        os.kill(self.cluster.workers[i].pid, signal.SIGKILL)
        self.cluster.workers[i].wait()


def start_cluster(catalog: Path, tmp: Path, workers: int = 2, **settings: Any) -> RunningCluster:
    base: dict[str, Any] = {
        "port": 0,
        "catalog": str(catalog),
        "models": f"{TINY},{POISON}",
        "device": "cpu",
        "torch_threads": 1,
        "queue_prefix": f"fail{next(_prefixes)}",
        "request_timeout": 30.0,
        "hardware_class": TINY_CLASS,
        "profile_dir": NO_USER_PROFILES,
    }
    base.update(settings)
    # a fixed port, so the test knows where the gateway listens
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        base["port"] = s.getsockname()[1]
    cluster = Cluster(
        Settings.load(overrides=base), workers, {**os.environ}, store_dir=str(tmp / "js")
    )
    api = cluster.start()
    if not cluster.wait_ready(api, timeout=120):
        cluster.stop()
        raise RuntimeError("cluster did not become ready")
    return RunningCluster(cluster, api)


@pytest.fixture
def running(cluster_catalog: Path, tmp_path: Path) -> Iterator[RunningCluster]:
    rc = start_cluster(cluster_catalog, tmp_path, workers=2, max_deliver=3)
    yield rc
    rc.cluster.stop()


def wait_for(pred: Any, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False
