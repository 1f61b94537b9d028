"""``fleetserve bench sim``: the pull-versus-push simulation, as tables, markdown, JSON, PNG.

``fleetserve bench sim fleet``: the fleet-memory scenario (many models, a memory budget
per worker, cold loads, GDSF or LRU eviction, affinity on or off), as a table, JSON, PNG.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from ...catalog import CostModel
from .params import DEFAULT_MIX, DEFAULT_MODEL, HOMOGENEOUS, MIXED_FLEET, POLICIES, Params
from .report import (
    detail_table,
    fleet_findings,
    fleet_plot,
    fleet_rows,
    fleet_table,
    headline_rows,
    headline_table,
    markdown,
    plot,
    target_verdict,
)
from .search import Point, default_slo_ms, isolated_latency, sweep


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _fleet(s: str) -> tuple[tuple[str, float, float], ...]:
    if s == "mixed":
        return MIXED_FLEET
    if s == "homogeneous":
        return HOMOGENEOUS
    out = []
    for part in s.split(","):
        name, speed, share = part.split(":")
        out.append((name, float(speed), float(share)))
    return tuple(out)


def _mix(s: str) -> tuple[tuple[float, int, int], ...]:
    out = []
    for part in s.split(","):
        w, lo, hi = part.split(":")
        out.append((float(w), int(lo), int(hi)))
    return tuple(out)


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fleetserve bench sim", description=__doc__)
    p.add_argument("--workers", default="8,16,32,64,128,256", help="fleet sizes to sweep")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument(
        "--slo-ms",
        type=float,
        default=None,
        help="p99 SLO (default: 2x the p99 of requests served alone on the slowest worker)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--model", default=DEFAULT_MODEL, help="catalog model for the cost model")
    p.add_argument("--hardware", default="cpu", help="its profile (cpu is the fitted one)")
    p.add_argument("--cost", default="", help="override: fixed_ms,per_token_ms,per_padded_ms")
    p.add_argument(
        "--fleet",
        default="mixed",
        help="mixed, homogeneous, or name:speed:share,... (default L4:1:0.5,"
        "A100:2.5:0.3,H100:4:0.2)",
    )
    p.add_argument(
        "--no-scale-budget",
        action="store_true",
        help="same batch budget on every worker, whatever its speed",
    )
    p.add_argument(
        "--mix",
        default=",".join(f"{w}:{lo}:{hi}" for w, lo, hi in DEFAULT_MIX),
        help="items per request: weight:fewest:most,...",
    )
    p.add_argument("--item-tokens", default="8,512", help="shortest,longest item in tokens")
    p.add_argument("--requests", type=int, default=20_000, help="requests per run")
    p.add_argument("--rtt-ms", type=float, default=0.3, help="pull round trip / push hop")
    p.add_argument("--lag-ms", type=float, default=20.0, help="router state lag (push)")
    p.add_argument("--routers", type=int, default=1, help="push routers (gateways)")
    p.add_argument("--steps", type=int, default=7, help="bisection steps for the SLO search")
    p.add_argument("--focus", type=int, default=64, help="fleet size for the p99-vs-load plot")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    return p.parse_args(list(argv))


def params_from_args(args: argparse.Namespace) -> Params:
    lo, hi = _ints(args.item_tokens)
    p = Params.from_catalog(
        args.model,
        args.hardware,
        fleet=_fleet(args.fleet),
        scale_budget=not args.no_scale_budget,
        mix=_mix(args.mix),
        item_tokens=(lo, hi),
        requests=args.requests,
        rtt_ms=args.rtt_ms,
        lag_ms=args.lag_ms,
        routers=args.routers,
        search_steps=args.steps,
    )
    if args.cost:
        f, t, pad = (float(x) for x in args.cost.split(","))
        p = replace(p, cost=CostModel(f, t, pad), cost_source="--cost")
    return replace(p, slo_ms=args.slo_ms or default_slo_ms(p, args.seed))


def main(argv: Sequence[str] = ()) -> int:
    argv = list(argv)
    if argv[:1] == ["fleet"]:
        return fleet_main(argv[1:])
    args = _args(argv)
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 150)
    params = params_from_args(args)
    workers = _ints(args.workers)
    policies = [x for x in args.policies.split(",") if x]
    console.rule("fleetserve bench sim: pull (central queue) vs push (router)")
    for line in params.describe():
        console.print(f"  - {line}")
    iso = isolated_latency(params, args.seed)
    t0 = time.perf_counter()
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("simulating", total=len(workers) * len(policies))

        def step(pt: Point) -> None:
            bar.update(task, advance=1, description=f"{pt.policy} x {pt.workers} workers")

        points = sweep(workers, policies, params, args.seed, args.jobs, step)
    runtime = time.perf_counter() - t0
    rows = headline_rows(points, workers, policies)
    console.print(headline_table(rows, policies, params))
    console.print(detail_table(points))
    verdict = target_verdict(rows, policies)
    console.print(verdict)
    console.print(f"{len(points)} points in {runtime:.1f} s ({args.jobs} processes)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "params": asdict(params),
        "assumptions": params.describe(),
        "isolated_latency": iso,
        "seed": args.seed,
        "runtime_s": runtime,
        "headline": rows,
        "target": verdict,
        "points": [pt.to_dict() for pt in points],
    }
    (out / "sim.json").write_text(json.dumps(data, indent=2, default=_json_default))
    (out / "sim.md").write_text(markdown(rows, points, policies, params, iso, verdict, runtime))
    plot(points, rows, policies, params, args.focus, out / "sim.png")
    console.print(f"wrote {out / 'sim.md'}, {out / 'sim.json'} and {out / 'sim.png'}")
    return 0


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and math.isnan(o):
        return None
    raise TypeError(f"not serializable: {type(o).__name__}")


def _fleet_args(argv: Sequence[str]) -> argparse.Namespace:
    from .fleet import FleetParams

    d = FleetParams()
    p = argparse.ArgumentParser(
        prog="fleetserve bench sim fleet",
        description="Fleet memory: many models, a memory budget per worker, cold loads "
        "and eviction, with and without model affinity in the pull. Compares every "
        "{affinity} x {eviction} at every fleet size.",
    )
    p.add_argument("--workers", default="8,64", help="fleet sizes")
    p.add_argument("--affinity", default="on,off", help="on, off or on,off")
    p.add_argument("--eviction", default="gdsf,lru", help="gdsf, lru or gdsf,lru")
    p.add_argument("--models", type=int, default=d.models)
    p.add_argument("--zipf-s", type=float, default=d.zipf_s, help="popularity exponent")
    p.add_argument(
        "--memory-budget", default="3GiB", help="per worker: 3GiB, 2.5G, 800MiB or bytes"
    )
    p.add_argument("--batch", type=int, default=d.batch, help="requests per pull/batch")
    p.add_argument(
        "--utilization", type=float, default=d.utilization, help="of compute: sets the rate"
    )
    p.add_argument(
        "--affinity-wait",
        type=float,
        default=d.affinity_wait_s,
        help="seconds before a busy worker takes a cold model's work",
    )
    p.add_argument("--slow-share", type=float, default=d.slow_share, help="slow conversions")
    p.add_argument("--requests-per-worker", type=int, default=d.requests_per_worker)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="docs/bench", help="folder for sim-fleet.json/.png")
    p.add_argument("--name", default="sim-fleet", help="file name stem")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    return p.parse_args(list(argv))


def _onoff(s: str) -> list[bool]:
    out = []
    for x in s.split(","):
        if x.strip() not in ("on", "off"):
            raise SystemExit(f"--affinity takes on, off or on,off, not {s!r}")
        out.append(x.strip() == "on")
    return out


def fleet_main(argv: Sequence[str] = ()) -> int:
    from ..report import cpu_model, machine
    from .fleet import EVICTIONS, FleetParams, FleetRun, compare, configs, make_models, parse_bytes

    args = _fleet_args(argv)
    evictions = [x.strip() for x in args.eviction.split(",") if x.strip()]
    if any(e not in EVICTIONS for e in evictions):
        raise SystemExit(f"--eviction takes {', '.join(EVICTIONS)}, not {args.eviction!r}")
    params = FleetParams(
        models=args.models,
        zipf_s=args.zipf_s,
        memory_budget=parse_bytes(args.memory_budget),
        batch=args.batch,
        utilization=args.utilization,
        affinity_wait_s=args.affinity_wait,
        slow_share=args.slow_share,
        requests_per_worker=args.requests_per_worker,
    )
    cfgs = configs(_ints(args.workers), _onoff(args.affinity), evictions)
    console = Console(width=80)
    console.rule("fleetserve bench sim fleet: memory, loads and eviction")
    for line in params.describe():
        console.print(f"  - {line}", highlight=False)
    t0 = time.perf_counter()
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("simulating", total=len(cfgs))

        def step(r: FleetRun) -> None:
            bar.update(task, advance=1)

        cmp = compare(cfgs, params, args.seed, args.jobs, step)
    runtime = time.perf_counter() - t0
    rows = fleet_rows(cmp.runs)
    util = f"{params.utilization:.0%}"
    title = f"fleet memory, {fmt_budget(params.memory_budget)}/worker, {util} busy (simulated)"
    console.print(fleet_table(rows, title))
    findings = fleet_findings(rows)
    for line in findings:
        console.print(f"  - {line}", highlight=False)
    console.print(f"{len(cfgs)} configurations in {runtime:.1f} s ({args.jobs} processes)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    models = make_models(params, args.seed)
    data = {
        "scenario": "fleet",
        "command": "fleetserve bench sim fleet " + " ".join(argv),
        "cpu": cpu_model(),
        "machine": machine(),
        "runtime_s": runtime,
        "assumptions": params.describe(),
        **cmp.to_dict(),
        "rows": rows,
        "findings": findings,
        "models": [asdict(m) for m in models],
    }
    (out / f"{args.name}.json").write_text(json.dumps(data, indent=2, default=_json_default))
    fleet_plot(rows, "fleetserve bench sim fleet: " + title, out / f"{args.name}.png")
    console.print(f"wrote {out / args.name}.json and .png", highlight=False)
    return 0


def fmt_budget(n: int) -> str:
    from .fleet import fmt_bytes

    return fmt_bytes(n).replace(" ", "")
