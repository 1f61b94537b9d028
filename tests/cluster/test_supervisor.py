"""The cluster supervisor's children share the host: its cores and, by default, its
memory (each worker's budget a share of the host's 70 %, not 70 % each)."""

from __future__ import annotations

from pathlib import Path

from fleetserve.cluster.supervisor import Cluster
from fleetserve.settings import Settings


def test_workers_share_the_default_memory_budget(tmp_path: Path) -> None:
    def env(workers: int, **overrides: object) -> dict[str, str]:
        settings = Settings.load(overrides={"device": "cpu", **overrides})
        cluster = Cluster(settings, workers, {}, store_dir=str(tmp_path))
        return cluster.child_env(worker_id="worker-0")

    name = Settings.env_name("memory_budget")
    assert env(2)[name] == "35%" and env(4)[name] == "17.5%" and env(1)[name] == "70%"
    assert env(2, memory_budget="2GiB")[name] == "2GiB"  # a set budget stays as set
    assert env(3)[name] == "23.3333%"
