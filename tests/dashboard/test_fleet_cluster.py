"""The fleet view in distributed mode: a real nats-server, a gateway and a worker
(each a real process's services, in one thread with its own loop).

The worker announces itself and its resident model in its heartbeats; the gateway
counts the replies it sees; and work for a model that no worker serves waits in
JetStream, where the gateway reads its lag per class, as KEDA's scaler would.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetserve.cluster import NatsServer
from fleetserve.gateway.process import GatewayProcess
from fleetserve.settings import Settings
from fleetserve.wire import Priority
from fleetserve.worker.process import WorkerProcess

from ..conftest import NO_USER_PROFILES, TINY, TINY_CLASS
from ..services import Services
from ..tinymodels import build_bert, write_spec

ORPHAN = "tiny/orphan"  # in the gateway's catalog, served by no worker: its work waits
Doc = dict[str, Any]


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fleet-cluster")
    model = build_bert(root / "model")
    for name in (TINY, ORPHAN):
        write_spec(root / "catalog", name, model)
    return root / "catalog"


def fleet_until(api: str, ok: Callable[[Doc], bool], timeout: float = 20.0) -> Doc:
    """``GET /v1/fleet`` until ``ok(doc)``; the last document in the failure."""
    end = time.monotonic() + timeout
    while True:
        doc: Doc = httpx.get(api + "/v1/fleet", timeout=10).json()
        if ok(doc):
            return doc
        if time.monotonic() > end:
            raise AssertionError(f"the fleet never showed it: {doc}")
        time.sleep(0.1)


def row(doc: Doc, model: str) -> Doc:
    (out,) = [m for m in doc["models"] if m["id"] == model]
    assert isinstance(out, dict)
    return out


def lane(doc: Doc, model: str, cls: str) -> Doc:
    out: Doc = row(doc, model)["lanes"].get(cls, {"waiting": 0, "inflight": 0, "age_s": 0.0})
    return out


def holds(doc: Doc, worker: str, model: str) -> bool:
    return any(
        w["id"] == worker
        and any(m["id"] == model and m["state"] == "resident" for m in w["models"])
        for w in doc["workers"]
    )


@pytest.fixture
def cluster(two_models: Path, nats_server: NatsServer) -> Iterator[tuple[str, WorkerProcess, Any]]:
    base = {
        "port": 0,
        "worker_port": 0,
        "catalog": str(two_models),
        "models": f"{TINY},{ORPHAN}",
        "device": "cpu",
        "torch_threads": 1,
        "nats": nats_server.url,
        "queue_prefix": f"fleet{time.monotonic_ns()}",
        "stream_storage": "memory",
        "profile_dir": NO_USER_PROFILES,
        "hardware_class": TINY_CLASS,
    }
    gateway = GatewayProcess(Settings.load(overrides=base))
    worker = WorkerProcess(Settings.load(overrides={**base, "models": TINY}))
    with Services(worker, gateway) as services:
        api = f"http://127.0.0.1:{gateway.port}"
        end = time.monotonic() + 60
        while httpx.get(api + "/readyz").status_code != 200:
            assert time.monotonic() < end, "the gateway never became ready"
            time.sleep(0.05)
        yield api, worker, (services, gateway)


def test_workers_models_throughput_and_lag_reach_the_gateway(
    cluster: tuple[str, WorkerProcess, Any],
) -> None:
    api, worker, (services, gateway) = cluster
    # the worker's heartbeat: its resident model, memory against its budget
    doc = fleet_until(api, lambda d: holds(d, worker.node, TINY))
    assert doc["mode"] == "distributed"
    (w,) = [w for w in doc["workers"] if w["id"] == worker.node]
    assert w["ready"] is True and w["memory"]["budget"] > 0 and w["memory"]["used"] > 0
    assert set(w["counters"]) == {"put_backs", "redeliveries", "dead_letters", "evictions"}
    assert row(doc, TINY)["resident_on"] == [worker.node]
    assert row(doc, ORPHAN)["state"] == "cold" and row(doc, ORPHAN)["resident_on"] == []

    # throughput and latency, from the replies the gateway saw
    n, took = 8, []
    with httpx.Client(base_url=api, timeout=30) as client:
        for _ in range(n):
            r = client.post("/v1/embeddings", json={"model": TINY, "input": ["hello there"]})
            assert r.status_code == 200, r.text
            took.append(float(r.headers["x-total-time-ms"]))
    m = row(fleet_until(api, lambda d: row(d, TINY)["total"] == n), TINY)
    took.sort()
    assert m["p50_ms"] == pytest.approx(took[math.ceil(n / 2) - 1], abs=0.002)
    assert m["p99_ms"] == pytest.approx(took[-1], abs=0.002) and m["rps"] > 0
    assert m["waiting"] == 0
    # the gateway runs no worker: its /metrics must not say a worker is down
    exported = httpx.get(api + "/metrics").text
    assert "fleetserve_requests_total" in exported
    assert "fleetserve_worker_up" not in exported
    assert "fleetserve_memory_budget_bytes" not in exported

    # work that waits: the interactive lane through its durable consumer (made as a
    # worker's puller makes it), the batch lane with none yet
    assert gateway.js.puller is not None
    services.run(gateway.js.puller.consumers.ensure_one((ORPHAN, Priority.INTERACTIVE)))

    def ask(priority: str) -> None:
        headers = {"x-priority": priority, "x-request-timeout": "2.5"}
        body = {"model": ORPHAN, "input": ["nobody serves me"]}
        httpx.post(api + "/v1/embeddings", json=body, headers=headers, timeout=30)

    clients = [threading.Thread(target=ask, args=(p,)) for p in ("interactive", "batch", "batch")]
    for t in clients:
        t.start()
    doc = fleet_until(
        api,
        lambda d: (
            lane(d, ORPHAN, "interactive")["waiting"] == 1
            and lane(d, ORPHAN, "batch")["waiting"] == 2
            and lane(d, ORPHAN, "batch")["age_s"] >= 0.2
        ),
    )
    assert row(doc, ORPHAN)["waiting"] == 3 and doc["totals"]["waiting"] == 3
    assert lane(doc, TINY, "interactive")["waiting"] == 0
    for t in clients:
        t.join(30)
    # their deadline passed: each counts as an error at the gateway
    doc = fleet_until(api, lambda d: row(d, ORPHAN)["errors"] == 3)
    assert row(doc, TINY)["errors"] == 0
