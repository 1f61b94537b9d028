"""The pull-versus-push simulation: cost models, bookkeeping, equivalences, search, CLI."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from fleetserve.bench import main as bench_main
from fleetserve.bench.sim import (
    HOMOGENEOUS,
    MIXED_FLEET,
    POLICIES,
    Params,
    Workload,
    at_load,
    capacity_rps,
    find_cost,
    fleet_speeds,
    from_catalog,
    make_workload,
    max_load_at_slo,
    simulate,
    workload_for,
)
from fleetserve.bench.sim.fleet import (
    GIB,
    FleetParams,
    FleetSim,
    FleetWorkload,
    make_fleet_workload,
    make_models,
    parse_bytes,
    simulate_fleet,
)
from fleetserve.bench.sim.fleet import Model as FleetModel
from fleetserve.bench.sim.former import Former
from fleetserve.bench.sim.policies import _Sim
from fleetserve.bench.sim.puller import Msg
from fleetserve.catalog import CostModel
from fleetserve.catalog.profiles import (
    bundled_dir,
    profile_path,
    read_profile_file,
    write_profile_file,
)
from fleetserve.catalog.spec import Profile
from fleetserve.fleet.policy import Resident

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
SMALL = from_catalog("cpu", requests=800)


def test_the_cpu_cost_model_is_the_tuned_profile_and_fitted() -> None:
    pf = read_profile_file(profile_path(bundled_dir(), MODEL, "cpu-amx"), "cpu-amx", True)
    p = from_catalog("cpu")
    assert p.cost == pf.profile.cost and p.cost_fitted and p.cost_label == "cpu (fitted)"
    assert (p.max_batch_tokens, p.max_batch_size, p.max_seq_len) == (2048, 32, 256)
    assert "cpu-amx" in p.cost_source and "fitted by fleetserve tune" in p.cost_source
    # no priority_cap in the profile: the worker's rule, a batch of about 25 ms
    assert p.interactive_batch_tokens == p.cost.tokens_within(25.0) < p.max_batch_tokens
    assert p.interactive_batch_tokens == p.cost.interactive_cap(p.max_batch_tokens)
    assert "FITTED" in p.describe()[0]


def test_the_gpu_cost_model_is_assumed_without_a_tuned_gpu_profile(tmp_path: Path) -> None:
    p = from_catalog("gpu")
    assert not p.cost_fitted and p.cost_label == "gpu (assumed)"
    assert p.cost == CostModel(2.0, 0.0005, 0.0002)  # the spec's cuda starting points
    assert (p.max_batch_tokens, p.interactive_batch_tokens) == (32768, 32768)  # no cap
    assert "ASSUMED" in p.describe()[0] and "budgets 'cuda'" in p.cost_source
    # a profile that `fleetserve tune` wrote on a GPU (benchmarks/gpu.sh) makes it fitted
    tuned = Profile("cuda-sm90", max_batch_tokens=16384, cost=CostModel(1.0, 0.0002, 0.0001))
    prov = {"written_by": "fleetserve tune", "date": "2026-12-02", "machine": "H100"}
    write_profile_file(tmp_path, MODEL, tuned, prov)
    cs = find_cost("gpu", MODEL, tmp_path)
    assert cs.fitted and cs.profile.cost == tuned.cost and "cuda-sm90" in cs.source
    with pytest.raises(ValueError, match="cost model"):
        find_cost("tpu")


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
    # a duration asks for more requests, and the longer workload extends the shorter
    speeds = fleet_speeds(SMALL, 4)
    long = workload_for(replace(SMALL, duration_s=10.0), speeds, 3)
    assert len(long.items) > len(a.items) and long.items[:800] == a.items


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
    assert all(f.pending == 0 and not f for f in sim.formers)
    assert 0 < run.utilization <= 1 and 0 < run.batch_fill <= 1.0
    if load < 1:  # the fleet keeps up
        assert run.throughput_rps == pytest.approx(run.offered_rps, rel=0.05)


@pytest.mark.parametrize("load", [0.05, 0.5, 0.9])
def test_one_worker_that_pulls_everything_is_push(load: float) -> None:
    # no request is sliced (at most 8 x 256 tokens, under two budgets) and the worker
    # pulls whatever waits: the queue adds nothing, and both serve the same batches
    p = replace(SMALL, fleet=HOMOGENEOUS, rtt_ms=0.0, mix=((1.0, 1, 8),), high_water=1e6)
    wl = make_workload(p, 5)
    pull, push = (at_load(wl, [1.0], load, pol, p) for pol in ("pull", "push-lor"))
    assert (pull.p50_ms, pull.p99_ms, pull.batches) == (push.p50_ms, push.p99_ms, push.batches)
    assert pull.parts == 0 and pull.pulls > 0


def test_put_backs_and_parts_are_counted() -> None:
    wl = make_workload(SMALL, 1)
    speeds = fleet_speeds(SMALL, 8)
    pull = at_load(wl, speeds, 0.9, "pull", SMALL)
    assert pull.pulls > 0 and pull.put_backs > 0 and pull.parts > 0
    push = at_load(wl, speeds, 0.9, "push-lor", SMALL)
    assert push.pulls == push.put_backs == push.parts == 0


def test_pull_shares_a_big_request_and_push_cannot() -> None:
    # ten requests of 256 items, far apart: pull slices each over the 8 workers
    wl = Workload([1.0] * 10, [[200] * 256] * 10, [200 * 256] * 10)
    p = replace(SMALL, fleet=HOMOGENEOUS, warmup=0.0, requests=10)
    pull, push = (simulate(wl, [1.0] * 8, 0.1, pol, p) for pol in ("pull", "push-loc"))
    assert pull.parts >= 10 * 20  # 51,200 tokens in slices of about one budget (2048)
    assert pull.p99_ms < push.p99_ms / 4


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


def test_a_stale_router_view_hurts_least_outstanding() -> None:
    # seen 1 s late, the fleet's completions: the router cannot tell fast workers from
    # slow ones (1x to 4x) and routes nearly round robin (lag 0: p99 ~0.4 s, 1 s: ~3 s)
    p = replace(SMALL, requests=3000)
    wl = make_workload(p, 0)
    speeds = fleet_speeds(p, 16)
    fresh, stale = (at_load(wl, speeds, 0.5, "push-lor", replace(p, lag_ms=x)) for x in (0, 1e3))
    assert stale.p99_ms > 3 * fresh.p99_ms
    assert fresh.lag_ms == 0 and stale.lag_ms == 1000


def test_the_former_serves_interactive_work_first_within_the_cap() -> None:
    f = Former(budget=2048, cap=512, max_size=32, age_limit_ms=2000.0, hold_ms=1000.0)
    f.add(Msg(0, [100] * 20, 0.0, False), 0.0)
    f.add(Msg(1, [100] * 8, 0.0, True), 10.0)
    first = f.take(20.0)  # only interactive items, within the cap
    assert [(m.rid, c) for m, c in first.done] == [(1, 5)] and first.budget == 512
    second = f.take(30.0)
    assert [(m.rid, c) for m, c in second.done] == [(1, 3)]
    capped = f.take(40.0)  # no query waits, but one came 30 ms ago: still capped
    assert [(m.rid, c) for m, c in capped.done] == [(0, 5)]
    full = f.take(1100.0)  # the hold is over: the full budget
    assert [(m.rid, c) for m, c in full.done] == [(0, 15)] and full.budget == 2048
    assert not f and f.pending == 0
    # batch work that has waited 2 s goes before waiting queries
    f.add(Msg(2, [100] * 4, 0.0, False), 2000.0)
    f.add(Msg(3, [100], 0.0, True), 4100.0)
    assert [m.rid for m, _ in f.take(4200.0).done] == [2]


def test_slo_search_returns_a_load_within_the_slo() -> None:
    p = replace(SMALL, slo_ms=1000.0, search_steps=4)
    wl = make_workload(p, 0)
    speeds = fleet_speeds(p, 8)
    best, tried = max_load_at_slo(wl, speeds, "pull", p)
    assert best is not None and best in tried
    assert best.p99_ms <= 1000.0
    assert best.throughput_rps >= p.min_goodput * best.offered_rps
    assert len(tried) == 1 + p.search_steps
    above = [r for r in tried if r.load > best.load]
    assert all(r.p99_ms > 1000.0 or r.throughput_rps < 0.98 * r.offered_rps for r in above)
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
    with pytest.raises(ValueError, match="lag"):
        Params(lag_ms=-1.0)
    with pytest.raises(ValueError, match="high water"):
        Params(high_water=-1.0)


def test_cli_writes_markdown_json_and_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sim", "--workers", "3", "--requests", "200", "--duration-s", "0", "--steps", "1"]
    argv += [
        "--lags",
        "0,20",
        "--jobs",
        "1",
        "--variants",
        "hw1/nofull",
        "--fleet",
        "a:1:0.5,b:3:0.5",
    ]
    assert bench_main([*argv, "--out", str(tmp_path), "--name", "s"]) == 0
    out = capsys.readouterr().out
    assert "FITTED" in out and "ASSUMED" in out and "push-lor" in out
    assert "gpu (assumed) cost model" in out and "cpu (fitted) cost model" in out
    data = json.loads((tmp_path / "s.json").read_text())
    assert [(c["name"], c["status"]) for c in data["cost_models"]] == [
        ("cpu", "fitted"),
        ("gpu", "assumed"),
    ]
    keys = {(r["cost"], r["workers"], r["lag_ms"]) for r in data["headline"]}
    assert keys == {(c, 3, lag) for c in ("cpu (fitted)", "gpu (assumed)") for lag in (0, 20)}
    # pull once per cost model and fleet size (and once more with high water 1), push per lag
    assert len(data["points"]) == 2 * (1 + 1 + 3 * 2)
    assert all("pull[hw1/nofull]_vs_push-lor" in r for r in data["headline"])
    assert all(v["slo_ms"] > 0 for v in data["params"].values()) and data["assumptions"]
    assert data["command"].startswith("fleetserve bench sim --workers 3")
    md = (tmp_path / "s.md").read_text()
    assert "Assumptions: gpu (assumed)" in md and "| workers | lag ms |" in md
    assert "pull/push-lor" in md and "ASSUMED" in md
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not math.isnan(data["headline"][0]["pull_slo_rps"])


# ---- the fleet-memory scenario (bench/sim/fleet.py) -----------------------------------

# 24 models on 8 workers: the catalog (~8 GiB) fits the fleet (24 GiB) but not a worker
FLEET_SMALL = FleetParams(models=24, requests_per_worker=5000)
# sizes and reload costs that differ a lot, one worker, most of the catalog fits
FLEET_COSTLY = FleetParams(
    models=24,
    size_classes=((100, 0.5), (1000, 0.5)),
    slow_share=0.5,
    slow_factor=(8.0, 16.0),
    memory_budget=10 * GIB,
    requests_per_worker=20_000,
    load_mib_s=1000.0,
    service_fixed_s=0.05,
    service_s_per_gib=0.05,
)


def test_fleet_models_are_seeded_and_in_proportion() -> None:
    a, b = make_models(FleetParams(), 0), make_models(FleetParams(), 0)
    assert a == b and a != make_models(FleetParams(), 1)
    assert len(a) == 48 and sum(m.popularity for m in a) == pytest.approx(1.0)
    assert [m.popularity for m in a] == sorted((m.popularity for m in a), reverse=True)
    sizes = sorted(m.bytes >> 20 for m in a)
    assert sizes.count(50) == 17 and sizes.count(1536) == 4  # 35 % and 8 % of 48
    assert all(m.reload_s > 0 and m.service_s > 0 for m in a)
    assert (
        make_fleet_workload(FLEET_SMALL, 2, 5).which
        == make_fleet_workload(FLEET_SMALL, 4, 5).which[: 2 * FLEET_SMALL.requests_per_worker]
    )  # a smaller fleet replays a prefix


@pytest.mark.parametrize("affinity", [True, False])
def test_fleet_deterministic(affinity: bool) -> None:
    p = replace(FLEET_SMALL, requests_per_worker=800)
    runs = [
        simulate_fleet(make_fleet_workload(p, 6, seed), 6, p, affinity=affinity, eviction="gdsf")
        for seed in (3, 3, 4)
    ]
    assert runs[0] == runs[1] and runs[0] != runs[2]


@pytest.mark.parametrize("affinity", [True, False])
@pytest.mark.parametrize("eviction", ["gdsf", "lru"])
def test_fleet_memory_never_exceeds_the_budget(affinity: bool, eviction: str) -> None:
    p = replace(FLEET_SMALL, memory_budget=2 * GIB, requests_per_worker=1500)
    trace: list[tuple[float, int, int, int, int]] = []
    wl = make_fleet_workload(p, 4, 1)
    sim = FleetSim(wl, 4, p, affinity=affinity, eviction=eviction, trace=trace, check=True)
    run = sim.run()  # check=True: the engine recounts each worker's bytes at every load
    assert len(trace) > 20 and run.evictions > 0  # under pressure
    for _, _w, m, used, budget in trace:
        assert 0 < used <= budget == p.memory_budget
        assert used >= wl.models[m].bytes
    assert run.peak_bytes <= p.memory_budget
    for w in range(4):  # what is left adds up too
        held = sum(wl.models[k].bytes for k in sim.res[w])
        assert held == sim.used[w] <= p.memory_budget
    assert run.completed == len(wl.which)
    assert all(d >= a for d, a in zip(sim.done, sim.arr, strict=True))
    assert 0 < run.utilization <= 1


def test_fleet_affinity_lowers_the_miss_rate() -> None:
    # robust across seeds (seeds 0-5: on <= 0.6 %, off >= 8.6 %); assert with a wide margin
    wl = make_fleet_workload(FLEET_SMALL, 8, 0)
    for eviction in ("gdsf", "lru"):
        on = simulate_fleet(wl, 8, FLEET_SMALL, affinity=True, eviction=eviction)
        off = simulate_fleet(wl, 8, FLEET_SMALL, affinity=False, eviction=eviction)
        assert on.miss_rate < off.miss_rate / 3
        assert on.loads < off.loads and on.p99_s < off.p99_s


def test_fleet_gdsf_reloads_less_than_lru_when_costs_differ() -> None:
    # GDSF keeps the small, slow-to-reload models; LRU ignores size and cost (seeds
    # 1-6: gdsf/lru load seconds 0.32-0.53)
    for seed in (2, 4):
        wl = make_fleet_workload(FLEET_COSTLY, 1, seed)
        g = simulate_fleet(wl, 1, FLEET_COSTLY, affinity=True, eviction="gdsf")
        lr = simulate_fleet(wl, 1, FLEET_COSTLY, affinity=True, eviction="lru")
        assert g.load_s < 0.8 * lr.load_s


@pytest.mark.parametrize("eviction", ["gdsf", "lru"])
def test_a_closed_loop_never_has_more_in_flight_than_its_clients(eviction: str) -> None:
    """``clients=4``: each request is sent when an earlier one is answered, in the
    trace's order, so at most 4 are open at any moment and each load serves the few
    that wait for it. Poisson arrivals at 90 % of compute let the queue grow during a
    load (calibrated against a real torch+OpenVINO trace, benchmarks/fleet_calibrate.py,
    the open queue counted a third of the server's misses)."""
    p = replace(FLEET_SMALL, memory_budget=2 * GIB, requests_per_worker=1500, warmup=0.0,
                batch=4, utilization=0.9)  # fmt: skip
    wl = make_fleet_workload(p, 1, 1)
    sim = FleetSim(wl, 1, replace(p, clients=4), affinity=False, eviction=eviction, check=True)
    closed = sim.run()
    sent, done = sim.arr, sim.done
    assert sent[:4] == [0.0] * 4 and sent == sorted(sent)
    for i in range(4, len(sent)):  # sent as an earlier one was answered, none before
        assert sent[i] in done[:i] and sum(d > sent[i] for d in done[:i]) < 4
    assert closed.completed == len(wl.which) and closed.rate_rps == closed.throughput_rps
    opened = simulate_fleet(wl, 1, p, affinity=False, eviction=eviction)
    assert closed.loads > 1.5 * opened.loads  # one load served many requests there
    with pytest.raises(ValueError, match="clients"):
        replace(p, clients=-1)


@pytest.mark.parametrize(("admitted", "leaves"), [(False, "a"), (True, "b")])
def test_a_model_with_requests_waiting_stays_where_the_server_admits_them(
    admitted: bool, leaves: str
) -> None:
    """``admitted_busy``: an embedded server holds a model busy from a request's arrival,
    so LRU passes over the least recent model while a request for it waits in the
    queue; a worker pulling from a shared queue holds only what it pulled for."""
    models = tuple(FleetModel(n, GIB, 1.0, 0.01, 1 / 3) for n in "abc")
    wl = FleetWorkload(models, [1.0] * 3, [0, 1, 2])
    p = replace(FleetParams(), models=3, memory_budget=2 * GIB, size_classes=((1024, 1.0),),
                requests_per_worker=10, admitted_busy=admitted)  # fmt: skip
    sim = FleetSim(wl, 1, p, affinity=False, eviction="lru", check=True)
    for k, at in ((0, 1.0), (1, 2.0)):  # a used first, then b: a is the least recent
        sim.res[0][k] = Resident(models[k].name, GIB, 1.0, last_used=at)
    sim.used[0] = 2 * GIB
    sim.q[0].append(0)  # a request for a waits in the queue
    assert sim._start_load(0, 2, 3.0)
    assert {models[k].name for k in sim.res[0]} == {"a", "b"} - {leaves}


def test_a_load_waits_for_a_busy_cheaper_first_choice_at_most_what_it_saves() -> None:
    """As the embedded server does (``Room.make``): GDSF would rather evict ``a`` (it
    reloads in 0.01 s) than ``b`` (1 s), but a request for ``a`` waits; the load waits
    for it while the worker serves it, at most the 0.99 s that saves."""
    models = (FleetModel("a", GIB, 0.01, 0.01, 0.4), FleetModel("b", GIB, 1.0, 0.01, 0.4),
              FleetModel("c", GIB, 1.0, 0.01, 0.2))  # fmt: skip
    wl = FleetWorkload(models, [1.0] * 3, [0, 1, 2])
    p = replace(FleetParams(), models=3, memory_budget=2 * GIB, size_classes=((1024, 1.0),),
                requests_per_worker=10, admitted_busy=True)  # fmt: skip

    def a_and_b_resident_a_asked_for() -> FleetSim:
        sim = FleetSim(wl, 1, p, affinity=False, eviction="gdsf", check=True)
        for k, at in ((0, 1.0), (1, 2.0)):
            r = sim.res[0][k] = Resident(models[k].name, GIB, models[k].reload_s, last_used=at)
            sim.policy[0].loaded(r, at)
            sim.policy[0].used(r, at)
        sim.used[0] = 2 * GIB
        sim.q[0].append(0)  # a request for a waits: a is busy
        return sim

    sim = a_and_b_resident_a_asked_for()
    assert not sim._start_load(0, 2, 3.0)  # waits for a
    assert not sim._start_load(0, 2, 3.9)  # still within the 0.99 s
    assert sim._start_load(0, 2, 4.0)  # waited what it saves: the idle b leaves
    assert {models[k].name for k in sim.res[0]} == {"a"}
    sim = a_and_b_resident_a_asked_for()
    assert not sim._start_load(0, 2, 3.0)
    sim.q[0].clear()  # a is served meanwhile: it leaves, b stays
    assert sim._start_load(0, 2, 3.1)
    assert {models[k].name for k in sim.res[0]} == {"b"}


def test_fleet_bad_inputs() -> None:
    assert parse_bytes("3GiB") == parse_bytes("3G") == 3 * GIB
    assert parse_bytes("512MiB") == 512 << 20 and parse_bytes("1000") == 1000
    with pytest.raises(ValueError):
        parse_bytes("three gigs")
    with pytest.raises(ValueError, match="largest model"):
        FleetParams(memory_budget=GIB)
    wl = make_fleet_workload(replace(FLEET_SMALL, requests_per_worker=10), 1)
    with pytest.raises(ValueError, match="eviction"):
        FleetSim(wl, 1, FLEET_SMALL, affinity=True, eviction="random")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--workers", "2,x"], "fleetserve bench sim: not whole numbers apart by commas: '2,x'"),
        (["--item-tokens", "5"], "--item-tokens takes shortest,longest, not '5'"),
        (["fleet", "--memory-budget", "1GiB"], "1 GiB cannot hold the largest model (1.5 GiB)"),
        (["fleet", "--memory-budget", "lots"], "not a size: 'lots'"),
        (["fleet", "--workers", "8,x"], "fleetserve bench sim fleet: not whole numbers"),
    ],
)
def test_a_bad_argument_is_one_line_that_names_it(argv: list[str], says: str) -> None:
    """Before, each of these ended in a traceback."""
    with pytest.raises(SystemExit, match=re.escape(says)):
        bench_main(["sim", *argv])


def test_fleet_cli_writes_json_and_png_in_80_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sim", "fleet", "--workers", "2,4", "--models", "12", "--jobs", "1"]
    argv += ["--requests-per-worker", "300", "--out", str(tmp_path), "--name", "f"]
    assert bench_main(argv) == 0
    out = capsys.readouterr().out
    assert "miss" in out and "gdsf" in out and "lru" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    data = json.loads((tmp_path / "f.json").read_text())
    assert len(data["runs"]) == len(data["rows"]) == 8  # {2, 4} x {on, off} x {gdsf, lru}
    assert {(r["workers"], r["affinity"], r["eviction"]) for r in data["rows"]} == {
        (w, a, e) for w in (2, 4) for a in ("on", "off") for e in ("gdsf", "lru")
    }
    assert data["cpu"] and data["assumptions"] and len(data["models"]) == 12
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
