"""The cluster supervisor's children share the host: its cores and, by default, its
memory. On the default budget each worker registers in the host's share
(``fleet.host_share``) with every other fleetserve process there, so a cluster's
workers and a server beside them split 70 % of the host between them."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from fleetserve.cluster.supervisor import Cluster
from fleetserve.fleet import host_share
from fleetserve.fleet.memory import default_budget
from fleetserve.settings import Settings
from fleetserve.worker.devices import child_settings

from ..conftest import TINY, ServerThread, tiny_settings
from ..waiting import wait_for
from .conftest import RunningCluster, start_cluster

BUDGET = "fleetserve_memory_budget_bytes"


def test_workers_on_the_default_budget_take_the_hosts_share(tmp_path: Path) -> None:
    def env(workers: int, **overrides: object) -> dict[str, str]:
        settings = Settings.load(overrides={"device": "cpu", **overrides})
        cluster = Cluster(settings, workers, {}, store_dir=str(tmp_path))
        return cluster.child_env(worker_id="worker-0")

    budget, share = Settings.env_name("memory_budget"), Settings.env_name("memory_share_dir")
    assert budget not in env(2) and budget not in env(1)  # the share decides, at each load
    assert env(2, memory_budget="2GiB")[budget] == "2GiB"  # a set budget stays as set
    assert env(2, memory_share_dir=str(tmp_path))[share] == str(tmp_path)


def test_device_processes_split_a_set_budget_and_share_the_default() -> None:
    def budget(devices: int, memory_budget: str = "") -> str:
        settings = Settings.load(overrides={"device": "cpu", "memory_budget": memory_budget})
        return child_settings(settings, "cpu:0", devices).memory_budget

    assert budget(2) == budget(1) == ""  # each registers in the host's share
    assert budget(2, "2GiB") == str(1 << 30) and budget(1, "2GiB") == "2GiB"


def _budgets(rc: RunningCluster) -> list[int]:
    out = []
    for w in rc.workers():
        text = httpx.get(w["url"] + "/metrics", timeout=5).text
        (value,) = re.findall(rf"^{BUDGET} (\S+)$", text, re.M)
        out.append(int(float(value)))
    return out


def test_a_clusters_workers_and_a_server_beside_them_split_the_default_budget(
    cluster_catalog: Path, tmp_path: Path
) -> None:
    share = tmp_path / "share"
    full = default_budget("cpu")[0]
    rc = start_cluster(cluster_catalog, tmp_path, workers=2, memory_share_dir=str(share))
    try:
        wait_for(lambda: host_share.live(share) == 2, 30, lambda: host_share.live(share))
        wait_for(lambda: _budgets(rc) == [full // 2] * 2, 30, lambda: _budgets(rc))
        # a `serve` beside them, on the default budget too: three ways, each within a
        # second or two (the workers look at the share every second)
        beside = tiny_settings(cluster_catalog, models=TINY, memory_share_dir=str(share))
        srv = ServerThread(beside).start()
        try:
            assert host_share.live(share) == 3
            assert srv.server.fleet.budget == full // 3
            wait_for(lambda: _budgets(rc) == [full // 3] * 2, 30, lambda: _budgets(rc))
        finally:
            srv.stop()
    finally:
        rc.cluster.stop()
    assert host_share.live(share) == 1  # the server's process: it registered once
