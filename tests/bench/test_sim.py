"""The pull-versus-push simulation: bookkeeping, equivalences, search and the CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fleetserve.bench import main as bench_main
from fleetserve.bench.sim import (
    HOMOGENEOUS,
    MIXED_FLEET,
    POLICIES,
    Params,
    at_load,
    capacity_rps,
    fleet_speeds,
    make_workload,
    max_load_at_slo,
    simulate,
)
from fleetserve.bench.sim.policies import _Sim

SMALL = Params.from_catalog(requests=800)


def test_params_come_from_the_fitted_catalog_profile() -> None:
    p = Params.from_catalog()
    assert "cpu" in p.cost_source
    assert (p.cost.fixed_ms, p.cost.per_padded_token_ms) == (7.0, 0.11)
    assert (p.max_batch_tokens, p.max_batch_size, p.max_seq_len) == (2048, 32, 256)
    assert any("cost model" in line and "0.11" in line for line in p.describe())


def test_fleet_keeps_the_proportions() -> None:
    speeds = fleet_speeds(SMALL, 64)
    assert len(speeds) == 64
    assert [speeds.count(s) for _, s, _ in MIXED_FLEET] == [32, 19, 13]
    assert fleet_speeds(SMALL, 64) == speeds  # seeded order
    assert set(fleet_speeds(replace(SMALL, fleet=HOMOGENEOUS), 5)) == {1.0}


def test_workload_is_seeded_and_within_bounds() -> None:
    a, b = make_workload(SMALL, 3), make_workload(SMALL, 3)
    assert a == b
    assert a != make_workload(SMALL, 4)
    assert all(1 <= len(x) <= 256 for x in a.items)
    assert all(8 <= t <= SMALL.max_seq_len for x in a.items for t in x)
    assert sum(len(x) == 1 for x in a.items) > len(a.items) / 2  # most requests are small


@pytest.mark.parametrize("policy", POLICIES)
def test_deterministic(policy: str) -> None:
    wl = make_workload(SMALL, 1)
    speeds = fleet_speeds(SMALL, 6)
    assert simulate(wl, speeds, 30.0, policy, SMALL) == simulate(wl, speeds, 30.0, policy, SMALL)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("load", [0.3, 1.2])
def test_every_request_completes_exactly_once(policy: str, load: float) -> None:
    wl = make_workload(SMALL, 2)
    speeds = fleet_speeds(SMALL, 5)
    rate = load * capacity_rps(SMALL, speeds, wl.mean_tokens)
    sim = _Sim(wl, speeds, rate, policy, replace(SMALL, routers=2))
    run = sim.run()
    assert sim.remaining == [0] * len(wl.items)  # never below zero: no item served twice
    assert all(d >= a for d, a in zip(sim.done, sim.arrivals, strict=True))
    assert run.completed == len(wl.items)
    assert run.items_completed == sum(len(x) for x in wl.items)
    assert sum(sim.pending) == 0 and not any(sim.local)
    assert 0 < run.utilization <= 1 and 0 < run.batch_fill <= 1.5
    if load < 1:  # the fleet keeps up
        assert run.throughput_rps == pytest.approx(run.offered_rps, rel=0.05)


@pytest.mark.parametrize("load", [0.05, 0.5, 0.9])
def test_one_worker_pull_and_push_are_the_same(load: float) -> None:
    p = replace(SMALL, fleet=HOMOGENEOUS, rtt_ms=0.0)
    wl = make_workload(p, 5)
    runs = [at_load(wl, [1.0], load, pol, p) for pol in POLICIES]
    for r in runs[1:]:
        assert (r.p50_ms, r.p99_ms, r.throughput_rps, r.batches) == (
            runs[0].p50_ms,
            runs[0].p99_ms,
            runs[0].throughput_rps,
            runs[0].batches,
        )


def test_put_backs_are_counted() -> None:
    wl = make_workload(SMALL, 1)
    speeds = fleet_speeds(SMALL, 8)
    pull = at_load(wl, speeds, 0.9, "pull", SMALL)
    assert pull.pulls > 0 and pull.put_backs > 0
    push = at_load(wl, speeds, 0.9, "push-lor", SMALL)
    assert push.pulls == push.put_backs == 0


def test_round_robin_breaks_first_on_a_mixed_fleet() -> None:
    p = replace(SMALL, requests=3000)
    wl = make_workload(p, 0)
    speeds = fleet_speeds(p, 16)
    # half the fleet is 1x and the mean speed is about 2x: at 0.45 of capacity the 1x
    # workers get more than they can do under round robin, while pull keeps up
    pull = at_load(wl, speeds, 0.45, "pull", p)
    rr = at_load(wl, speeds, 0.45, "push-rr", p)
    assert pull.throughput_rps == pytest.approx(pull.offered_rps, rel=0.03)
    assert rr.p99_ms > 3 * pull.p99_ms


def test_slo_search_returns_a_load_within_the_slo() -> None:
    p = replace(SMALL, slo_ms=3000.0, search_steps=4)
    wl = make_workload(p, 0)
    speeds = fleet_speeds(p, 8)
    best, tried = max_load_at_slo(wl, speeds, "pull", p)
    assert best is not None and best in tried
    assert best.p99_ms <= 3000.0
    assert best.throughput_rps >= p.min_goodput * best.offered_rps
    assert len(tried) == 1 + p.search_steps
    above = [r for r in tried if r.load > best.load]
    assert all(r.p99_ms > 3000.0 or r.throughput_rps < 0.98 * r.offered_rps for r in above)
    # an SLO below the lowest load's p99: nothing qualifies
    none, tried = max_load_at_slo(wl, speeds, "pull", replace(p, slo_ms=1.0))
    assert none is None and len(tried) == 1


def test_slo_search_needs_an_slo() -> None:
    wl = make_workload(SMALL, 0)
    with pytest.raises(ValueError, match="slo"):
        max_load_at_slo(wl, [1.0], "pull", SMALL)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="policy"):
        simulate(make_workload(SMALL), [1.0], 1.0, "teleport", SMALL)
    with pytest.raises(ValueError):
        Params(fleet=(("x", 0.0, 1.0),))
    with pytest.raises(ValueError):
        Params(mix=((1.0, 0, 4),))


def test_cli_writes_markdown_json_and_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sim", "--workers", "2,4", "--requests", "300", "--steps", "2", "--jobs", "1"]
    assert bench_main([*argv, "--out", str(tmp_path), "--fleet", "a:1:0.5,b:3:0.5"]) == 0
    out = capsys.readouterr().out
    assert "cost model" in out and "pull" in out and "push-lor" in out
    data = json.loads((tmp_path / "sim.json").read_text())
    assert [r["workers"] for r in data["headline"]] == [2, 4]
    assert {p["policy"] for p in data["points"]} == set(POLICIES)
    assert data["params"]["slo_ms"] > 0 and data["assumptions"]
    md = (tmp_path / "sim.md").read_text()
    assert "Assumptions" in md and "| workers |" in md and "pull / push-lor" in md
    assert (tmp_path / "sim.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
