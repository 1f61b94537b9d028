"""``python -m benchmarks fleet trace``: cost-aware eviction (gdsf) against LRU.

Random BERTs of mixed sizes (one pinned; with ``--runtimes``, on several runtimes)
behind one ``fleetserve serve`` whose memory budget holds about a third of what they
hold; the same seeded Zipf trace replayed against each policy by a few closed-loop
clients, a fresh server per run, policies alternated when repeated. A server first
loads each model once with room for all: what they hold sets the budget, and what a
first load builds and keeps on disk is there for every run. What each run cost comes
from the server's own metrics (differences over the trace) and its resident set
sampled every 50 ms.

The servers share one ``--cache-dir`` under ``--log-dir``: what a first load builds
is made once, and nothing another process kept (a test's server, an earlier
invocation) is read. What a load measures each model to hold is kept there too
(``held/``), and the next server charges it: with ``--held probe`` (the default) each
run starts from what the probe measured, so no policy inherits what the run before it
learned; with ``--held learned`` each run keeps what the runs before it measured, as
a server restarted on its own cache does.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from fleetserve.bench.loadgen import percentile
from fleetserve.fleet.memory import parse_size, rss_of

from .fleet_cold import describe, tree_src
from .fleet_models import SENTENCE, Model, fleet
from .fleet_server import RssSampler, Server

POLICIES = ("gdsf", "lru")
MIB = 1 << 20
# the figures compared across policies (medians over repeats), and their ratios
STATS = (
    "requests", "errors", "p50_ms", "p99_ms", "misses", "loads", "wakes", "load_s",
    "evictions",
    "peak_rss", "ready_rss", "wall_s",
)  # fmt: skip


def zipf_trace(ids: list[str], n: int, s: float, seed: int) -> tuple[list[str], list[str]]:
    """The ids by popularity (a seeded shuffle) and ``n`` requests drawn from a Zipf(s)
    over those ranks."""
    rng = random.Random(seed)
    ranked = list(ids)
    rng.shuffle(ranked)
    weights = [1 / (k + 1) ** s for k in range(len(ranked))]
    return ranked, rng.choices(ranked, weights, k=n)


async def replay(url: str, trace: list[str], concurrency: int) -> list[tuple[float, int]]:
    """Each request of ``trace`` in order, ``concurrency`` at a time: (seconds, status)."""
    out: list[tuple[float, int]] = [(0.0, 0)] * len(trace)
    todo = iter(range(len(trace)))
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:

        async def client_loop() -> None:
            for i in todo:
                body = {"model": trace[i], "input": [SENTENCE]}
                t0 = time.perf_counter()
                try:
                    status = (await client.post(url + "/v1/embeddings", json=body)).status_code
                except httpx.HTTPError:
                    status = 0
                out[i] = (time.perf_counter() - t0, status)

        await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    return out


def serve_args(
    catalog: Path, budget: int, policy: str, threads: int, cache: Path, host_tier: str = ""
) -> list[str]:
    tier = ["--host-tier", host_tier] if host_tier else []
    return [
        "--catalog", str(catalog.resolve()), "--device", "cpu", "--cache-dir", str(cache),
        "--torch-threads", str(threads), "--memory-budget", str(budget),
        "--eviction", policy, "--hardware-class", "cpu-avx2",
        "--profile-dir", "/dev/null/x", "--log-level", "warning", *tier,
    ]  # fmt: skip


def probe(
    catalog: Path, models: list[Model], threads: int, log_dir: Path, host_tier: str = ""
) -> dict[str, tuple[int, float]]:
    """What each model holds once loaded, as the server measures and charges it (an
    OpenVINO model holds about twice its weights file: the compiled model's copy, and
    the file it keeps mapped). Loading each once, with room for all, also leaves what a
    first load builds and keeps (exports, OpenVINO's IR and compiled model, mapped
    copies) on disk before either policy runs: the trace then measures reloads alone,
    the same for both. Beside each, the seconds of one hit after its load."""
    roomy = 4 * sum(m.bytes for m in models) + (4 << 30)
    args = serve_args(catalog, roomy, "lru", threads, cache_of(log_dir), host_tier)
    srv = Server("fleet-probe", args, log_dir)
    try:
        srv.wait_ready()
        hit_s = {}
        for m in models:
            body = {"model": m.id, "input": [SENTENCE]}
            for _ in range(2):  # the load, then a hit, timed
                t0 = time.perf_counter()
                httpx.post(srv.url + "/v1/embeddings", json=body, timeout=600).raise_for_status()
            hit_s[m.id] = time.perf_counter() - t0
        held = srv.models()
        return {m.id: (int(held[m.id]["bytes"]), hit_s[m.id]) for m in models}
    finally:
        srv.stop()


def cache_of(log_dir: Path) -> Path:
    """The servers' ``--cache-dir``; its ``held/`` is what loads measured."""
    return log_dir.resolve() / "cache"


def keep_probed(log_dir: Path) -> None:
    """What the probe measured each model to hold, kept aside for ``restore_probed``."""
    held = cache_of(log_dir) / "held"
    shutil.rmtree(log_dir / "held-probed", ignore_errors=True)
    if held.is_dir():
        shutil.copytree(held, log_dir / "held-probed")


def restore_probed(log_dir: Path) -> None:
    held = cache_of(log_dir) / "held"
    shutil.rmtree(held, ignore_errors=True)
    if (log_dir / "held-probed").is_dir():
        shutil.copytree(log_dir / "held-probed", held)


def run_once(
    policy: str,
    run: int,
    catalog: Path,
    budget: int,
    trace: list[str],
    args: argparse.Namespace,
    src: Path | None = None,
) -> dict[str, Any]:
    """One fresh server's run of ``trace``; ``src``: the source tree it runs (``None``:
    this one), its runs labelled ``<policy>@before``."""
    log_dir = Path(args.log_dir)
    if args.held == "probe":
        restore_probed(log_dir)
    label = run_label(policy, src)
    srv = Server(
        f"fleet-{label}-{run}",
        serve_args(catalog, budget, policy, args.threads, cache_of(log_dir), args.host_tier),
        log_dir,
        src=src,
    )
    try:
        srv.wait_ready()
        before, ok0, w0 = srv.metrics(), srv.metrics(outcome="ok"), srv.metrics(outcome="woken")
        outcome_failed0 = srv.metrics(outcome="failed")
        ready_rss = rss_of(srv.pid)
        asked = sorted(set(trace))
        per_model0 = {m: srv.metrics(model=m) for m in asked}
        with RssSampler(srv.pid) as rss:
            t0 = time.perf_counter()
            answers = asyncio.run(replay(srv.url, trace, args.concurrency))
            wall = time.perf_counter() - t0
        after, ok1, w1 = srv.metrics(), srv.metrics(outcome="ok"), srv.metrics(outcome="woken")
        outcome_failed1 = srv.metrics(outcome="failed")
        per_model1 = {m: srv.metrics(model=m) for m in asked}
        listed = srv.models()  # what each model is charged now (as it last loaded)
    finally:
        srv.stop()
    drifts = srv.log_path.read_text(errors="replace").count("memory drift")

    def grew(name: str, a: dict[str, float] = after, b: dict[str, float] = before) -> float:
        return a.get(name, 0.0) - b.get(name, 0.0)

    ok = [dt for dt, status in answers if status == 200]
    woken = (w1, w0)
    loads = grew("fleetserve_model_loads_total", ok1, ok0)
    return {
        "policy": label,
        "run": run,
        "requests": len(answers),
        "errors": len(answers) - len(ok),
        "p50_ms": percentile(ok, 0.5) * 1e3,
        "p99_ms": percentile(ok, 0.99) * 1e3,
        "misses": grew("fleetserve_model_misses_total"),
        "loads": loads,
        "wakes": grew("fleetserve_model_loads_total", *woken),
        "sleeps": grew("fleetserve_model_sleeps_total"),
        "failed_loads": grew("fleetserve_model_loads_total", outcome_failed1, outcome_failed0),
        "load_s": grew("fleetserve_model_load_seconds_sum"),
        "evictions": grew("fleetserve_model_evictions_total"),
        "peak_rss": rss.peak,
        "ready_rss": ready_rss,
        "rss_samples": rss.samples,
        "per_model": {  # over the trace: loads and wakes together, and their seconds
            m: {
                "load_s": grew("fleetserve_model_load_seconds_sum", per_model1[m], per_model0[m]),
                "loads": grew("fleetserve_model_load_seconds_count", per_model1[m], per_model0[m]),
            }
            for m in asked
        },
        "wall_s": wall,
        "charged_at_end": {m: listed[m].get("bytes", 0) for m in asked if m in listed},
        "drift_warnings": drifts,
    }  # fmt: skip


def run_label(policy: str, src: Path | None) -> str:
    """A run's label: its policy, ``<policy>@before`` on the ``--before`` tree."""
    return policy if src is None else f"{policy}@before"


def medians(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per policy (and ``<policy>@before``), in the order they first ran."""
    labels = dict.fromkeys(r["policy"] for r in runs)
    return {
        p: {k: statistics.median(r[k] for r in runs if r["policy"] == p) for k in STATS}
        for p in labels
    }


def ratios(med: dict[str, dict[str, float]], a: str = "gdsf", b: str = "lru") -> dict[str, float]:
    if a not in med or b not in med:
        return {}
    return {k: med[a][k] / med[b][k] for k in STATS if med[b][k]}


def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    with console.status(f"building {args.models} models under {args.model_dir}…"):
        catalog, models = fleet(args.models, Path(args.model_dir), runtimes=args.runtimes)
    total = sum(m.bytes for m in models)
    pinned = next(m for m in models if m.pinned)
    with console.status("loading each model once (what a first load builds, kept)…"):
        probed = probe(catalog, models, args.threads, Path(args.log_dir), args.host_tier)
    keep_probed(Path(args.log_dir))
    charged = {k: v[0] for k, v in probed.items()}
    held = charged[pinned.id]
    if args.budget:
        budget = parse_size(args.budget, limit=sum(charged.values()))
        how = f"--budget {args.budget}"
    else:  # from what the models hold, not their files' sizes
        rest = [charged[m.id] for m in models if not m.pinned]
        room = max(sum(rest) // 3, max(rest, default=0) * 5 // 4)  # the largest fits
        budget = held + room
        how = f"{pinned.id} as held ({held / MIB:.1f} MiB) + {room / MIB:.0f} MiB"
        how += " (a third of what the rest hold)" if room == sum(rest) // 3 else ""
    ranked, trace = zipf_trace([m.id for m in models], args.requests, args.zipf, args.seed)
    console.print(
        f"{len(models)} models, {total / MIB:.0f} MiB of weights; budget "
        f"{budget / MIB:.0f} MiB = {how}; {args.requests} requests, Zipf s={args.zipf}, "
        f"{len(set(trace))} models asked for, {args.concurrency} clients"
    )
    before = tree_src(Path(args.before)) if args.before else None
    arms = [(p, None) for p in POLICIES] + ([(p, before) for p in POLICIES] if before else [])
    runs: list[dict[str, Any]] = []
    for r in range(args.repeats):
        for policy, src in arms if r % 2 == 0 else arms[::-1]:
            label = run_label(policy, src)
            with console.status(f"run {r + 1}/{args.repeats}: {label}…"):
                res = run_once(policy, r, catalog, budget, trace, args, src)
            runs.append(res)
            console.print(
                f"  run {r + 1} {label}: p99 {res['p99_ms']:.0f} ms, {res['loads']:.0f} "
                f"loads, {res['load_s']:.1f} s loading, {res['errors']} errors"
            )
    med = medians(runs)
    return {
        "models": [
            {
                **vars(m),
                "path": str(m.path),
                "rank": ranked.index(m.id),
                "held": charged[m.id],
                "hit_s": probed[m.id][1],
            }
            for m in models
        ],
        "weights_bytes": total,
        "budget_bytes": budget,
        "budget_how": how,
        "pinned_held_bytes": held,
        "trace": {"requests": args.requests, "zipf_s": args.zipf, "seed": args.seed},
        "concurrency": args.concurrency,
        "before": describe(before) if before else None,
        "runs": runs,
        "medians": med,
        "ratios_gdsf_over_lru": ratios(med),
    }
