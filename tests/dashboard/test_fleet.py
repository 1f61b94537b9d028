"""The fleet view's data in embedded mode: a real server on loopback, its figures after
a known number of requests, an adapter hot on its model, the queue's lanes, the
workers' counters, and the key."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from fleetserve.dashboard.fleet import FleetView
from fleetserve.dashboard.fleet_local import memory_lanes, normalize, worker_figures
from fleetserve.dashboard.fleet_sources import Gathered
from fleetserve.dashboard.window import Recent, percentile
from fleetserve.metrics import Metrics
from fleetserve.queue import MemoryQueue
from fleetserve.queue.base import QueueStats
from fleetserve.wire import NotFound, Priority

from ..conftest import TINY, ServerThread, tiny_settings
from ..queue.envelopes import env
from .conftest import KEY


@pytest.fixture(scope="module")
def fleet_server(
    tiny_catalog: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerThread]:
    """The tiny model, with an adapter store of its own (empty)."""
    root = tmp_path_factory.mktemp("fleet-embedded")
    settings = tiny_settings(
        tiny_catalog, tune_dir=str(root / "tune"), adapter_store=(root / "adapters").as_uri()
    )
    srv = ServerThread(settings).start()
    yield srv
    srv.stop()


def fleet(srv: ServerThread, **headers: str) -> dict[str, Any]:
    r = httpx.get(srv.url + "/v1/fleet", headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["cache-control"] == "no-store"
    body: dict[str, Any] = r.json()
    return body


def row(doc: dict[str, Any], model: str) -> dict[str, Any]:
    (out,) = [m for m in doc["models"] if m["id"] == model]
    assert isinstance(out, dict)
    return out


def test_the_window_gives_exact_percentiles_and_a_rate() -> None:
    now = [1000.0]
    recent = Recent(window_s=30, rate_s=10, clock=lambda: now[0])
    now[0] += 40  # up for 40 s: rates over the whole 10 s
    for i in range(100):  # 1 .. 100 ms, spread over the last 20 s
        now[0] += 0.2
        recent.observe("m", (i + 1) / 1e3)
    s = recent.summary()["m"]
    assert s["requests"] == s["total"] == 100
    assert s["p50_ms"] == pytest.approx(50) and s["p99_ms"] == pytest.approx(99)
    assert s["rps"] == pytest.approx(50 / 10)  # the last 10 s held 50 of them
    now[0] += 25  # the first 75 left the 30 s window
    s = recent.summary()["m"]
    assert s["requests"] == 25 and s["total"] == 100 and s["rps"] == 0
    assert s["p50_ms"] == pytest.approx(88)  # the 13th of 76..100 ms
    now[0] += 60
    s = recent.summary()["m"]
    assert s["requests"] == 0 and s["p50_ms"] is None and s["p99_ms"] is None
    assert percentile([1.0], 0.99) == 1.0 and percentile([], 0.5) is None


async def test_memory_lanes_show_waiting_and_in_flight_work() -> None:
    q = MemoryQueue()
    await q.start()
    for waited in (4.0, 1.0):
        await q.publish(env("m/a", priority=Priority.BATCH, waited=waited), b"{}")
    await q.publish(env("m/a", priority=Priority.INTERACTIVE, waited=0.5), b"{}")
    await q.publish(env("m/b", priority=Priority.INTERACTIVE), b"{}")
    lanes = {(lane["model"], lane["class"]): lane for lane in memory_lanes(q)}
    batch = lanes[("m/a", "batch")]
    assert batch["waiting"] == 2 and batch["inflight"] == 0
    assert 4.0 <= batch["age_s"] < 10  # the oldest one's age
    assert lanes[("m/a", "interactive")]["waiting"] == 1
    got = await q.pull(["m/b"], budget=10, timeout=1)
    assert len(got) == 1
    b = {(x["model"], x["class"]): x for x in memory_lanes(q)}[("m/b", "interactive")]
    assert b["waiting"] == 0 and b["inflight"] == 1 and b["age_s"] == 0
    await q.close()


def test_heartbeat_figures_carry_the_counters_and_survive_odd_beats() -> None:
    stats, metrics = QueueStats(), Metrics()
    stats.bump(stats.put_backs, "m/a", 3)
    stats.bump(stats.redeliveries, "m/a")
    stats.bump(stats.dead_letters, "m/b", 2)
    metrics.evictions.labels("m/a", "pressure").inc()
    metrics.evictions.labels("m/a", "oom").inc()
    figures = worker_figures({}, stats, metrics)
    assert figures["counters"] == {
        "put_backs": {"m/a": 3},
        "redeliveries": {"m/a": 1},
        "dead_letters": {"m/b": 2},
        "evictions": {"m/a": 2},
    }
    beat = {"id": "w1", "ready": True, "memory": {"budget": 100, "used": 40}, **figures,
            "models": {"m/a": {"state": "resident", "bytes": 40}, "m/b": "junk"},
            "adapters": {"m/a": ["t/x@1"]}}  # fmt: skip
    w = normalize(beat)
    older = {"budget": 100, "used": 40, "host": 0, "host_tier_budget": 0, "host_tier_used": 0}
    assert w["memory"] == older  # an older worker's
    assert [(m["id"], m["state"], m["adapters"]) for m in w["models"]] == [
        ("m/a", "resident", ["t/x@1"]),
        ("m/b", "cold", []),
    ]
    assert w["counters"]["put_backs"] == {"m/a": 3}
    odd = normalize({"id": 7, "memory": "lots", "models": [1, 2], "counters": None})
    assert odd["id"] == "7" and odd["models"] == []
    assert odd["memory"] == dict.fromkeys(("budget", "used", "host"), 0) | {
        "host_tier_budget": 0,
        "host_tier_used": 0,
    }


def test_after_n_requests_the_embedded_figures_are_right(fleet_server: ServerThread) -> None:
    before = fleet(fleet_server)
    assert before["object"] == "fleet" and before["mode"] == "embedded"
    (worker,) = before["workers"]
    assert worker["ready"] is True and worker["memory"]["budget"] > 0
    (tiny,) = [m for m in worker["models"] if m["id"] == TINY]
    assert tiny["state"] == "resident" and tiny["bytes"] > 0
    assert worker["memory"]["used"] >= tiny["bytes"]
    assert row(before, TINY)["resident_on"] == [worker["id"]]
    assert row(before, TINY)["total"] == 0 and row(before, TINY)["p50_ms"] is None
    errors = row(before, TINY)["errors"]

    n, took = 12, []
    with httpx.Client(base_url=fleet_server.url, timeout=30) as client:
        for i in range(n):
            r = client.post("/v1/embeddings", json={"model": TINY, "input": ["hi"] * (1 + i % 3)})
            assert r.status_code == 200, r.text
            took.append(float(r.headers["x-total-time-ms"]))
        bad = client.post("/v1/embeddings", json={"model": TINY, "input": 7})
        assert bad.status_code == 400
    after = fleet(fleet_server)
    m = row(after, TINY)
    assert m["total"] == m["requests"] == n and after["totals"]["total"] == n
    assert m["errors"] == errors + 1
    assert m["rps"] > 0 and after["totals"]["rps"] >= m["rps"]
    took.sort()  # the window holds exactly these: the percentiles are theirs, exactly
    assert m["p50_ms"] == pytest.approx(took[math.ceil(0.5 * n) - 1], abs=0.002)
    assert m["p99_ms"] == pytest.approx(took[-1], abs=0.002)
    assert m["waiting"] == 0 and m["age_s"] == 0
    assert {"interactive"} <= set(m["lanes"])
    for name in ("put_backs", "redeliveries", "dead_letters", "evictions"):
        assert m[name] == 0 and after["totals"][name] == 0
    assert after["totals"]["workers"] == after["totals"]["ready"] == 1
    assert after["adapters"] == [] and m["adapters"] == {"registered": 0, "hot": {}}


def test_an_adapter_shows_registered_then_hot_where_it_runs(
    fleet_server: ServerThread, tiny_catalog: Path, tmp_path: Path
) -> None:
    from ..tiny_lora import make_lora

    view = fleet_server.server.gateway.dashboard.fleet  # type: ignore[union-attr]
    assert view is not None
    view.adapters_every = 0.0  # list them on every snapshot
    lora = make_lora(tiny_catalog.parent / "model", tmp_path / "lora", rank=4)
    files = {
        name: (name, (lora / name).read_bytes())
        for name in ("adapter_config.json", "adapter_model.safetensors")
    }
    r = httpx.post(
        fleet_server.url + "/v1/adapters",
        data={"name": "fleet-demo", "base": TINY},
        files={
            "config": files["adapter_config.json"],
            "weights": files["adapter_model.safetensors"],
        },
        timeout=30,
    )
    assert r.status_code == 201, r.text
    aid = r.json()["id"]
    doc = fleet(fleet_server)
    (base,) = doc["adapters"]
    assert base["base"] == TINY and [a["id"] for a in base["registered"]] == [aid]
    assert base["hot"] == {} and row(doc, TINY)["adapters"]["registered"] == 1
    body = {"inputs": ["hello"], "adapter": aid}
    r = httpx.post(f"{fleet_server.url}/v1/encode/{TINY}", json=body, timeout=30)
    assert r.status_code == 200, r.text
    doc = fleet(fleet_server)
    (worker,) = doc["workers"]
    assert doc["adapters"][0]["hot"] == {aid: [worker["id"]]}
    (tiny,) = [m for m in worker["models"] if m["id"] == TINY]
    assert tiny["adapters"] == [aid]


class StubSource:
    """A fixed fleet: one worker holding ``m/a``; the view adds what the gateway saw."""

    mode = "embedded"

    def __init__(self) -> None:
        self.catalog = [SimpleNamespace(id="m/a", family="dense")]
        self.metrics = Metrics()
        self.adapters = None
        beat = {"id": "w", "ready": True, "models": {"m/a": {"state": "resident"}}}
        self.gathered = Gathered([normalize(beat)], [])

    async def gather(self) -> Gathered:
        return self.gathered


async def test_the_version_moves_with_the_figures_only() -> None:
    now = [100.0]
    view = FleetView(Recent(clock=lambda: now[0]), refresh_s=0.0)
    source = StubSource()
    view.attach(source)  # type: ignore[arg-type]
    first = await view.version()
    now[0] += 5
    assert await view.version() == first  # time passed, nothing moved
    view.recent.observe("m/a", 0.01)
    second = await view.version()
    assert second != first
    source.metrics.requests.labels("encode", "m/a", "overloaded").inc()
    assert await view.version() != second
    doc = await view.data("")
    assert row(doc, "m/a")["errors"] == 1 and row(doc, "m/a")["total"] == 1
    assert doc["totals"]["resident"] == 1 and doc["generated_at"]
    with pytest.raises(NotFound):
        await view.data("/workers")


def test_the_fleet_needs_the_key_like_the_other_views(keyed_dash_server: ServerThread) -> None:
    srv = keyed_dash_server
    for headers in ({}, {"authorization": "Bearer wrong"}):
        r = httpx.get(srv.url + "/v1/fleet", headers=headers, timeout=10)
        assert r.status_code == 401 and r.json()["error"]["field"] == "authorization"
    assert fleet(srv, authorization=f"Bearer {KEY}")["mode"] == "embedded"
    r = httpx.get(srv.url + "/v1/fleet/nope", headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_workers_of_one_host_count_its_memory_once() -> None:
    from fleetserve.dashboard.fleet import _totals

    def worker(wid: str, host: str) -> dict[str, Any]:
        beat = {"id": wid, "host": host, "memory": {"budget": 35, "used": 10, "host": 100}}
        return normalize(beat)

    two = Gathered([worker("w0", "a"), worker("w1", "a")], [])
    totals = _totals(two, [])
    assert (totals["memory_budget"], totals["memory_host"]) == (70, 100)
    assert _totals(Gathered([worker("w0", "a"), worker("w1", "b")], []), [])["memory_host"] == 200
