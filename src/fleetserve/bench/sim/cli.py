"""``fleetserve bench sim``: pull against push at each router lag and cost model, as tables,
markdown, JSON and a PNG.

``fleetserve bench sim fleet``: the fleet-memory scenario (many models, a memory budget
per worker, cold loads, GDSF or LRU eviction, affinity on or off), as a table, JSON, PNG.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from .cli_common import ints, json_default
from .costs import COST_MODELS, from_catalog
from .params import DEFAULT_MIX, DEFAULT_MODEL, HOMOGENEOUS, LAGS, MIXED_FLEET, POLICIES, Params
from .plot import plot
from .report import (
    detail_table,
    headline_rows,
    headline_tables,
    markdown,
    slos_of,
    target_verdict,
)
from .search import Point, default_slo_ms, isolated_latency, plan, sweep


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


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fleetserve bench sim", description=__doc__)
    p.add_argument("--workers", default="64", help="fleet sizes to sweep, e.g. 16,64,256")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--lags", default=",".join(f"{x:g}" for x in LAGS), help="router lag, ms")
    p.add_argument(
        "--cost-models",
        default=",".join(COST_MODELS),
        help="cpu (a tuned cpu-* profile: fitted), gpu (a tuned cuda-* profile if there is "
        "one, else the spec's cuda budgets: assumed)",
    )
    p.add_argument("--model", default=DEFAULT_MODEL, help="catalog model for the cost models")
    p.add_argument("--profile-dir", default="", help="tuned profiles to look in first")
    p.add_argument("--cpu-class", default="", help="hardware class of the cpu profile")
    p.add_argument("--gpu-class", default="", help="hardware class of the gpu profile")
    p.add_argument(
        "--slo-ms",
        type=float,
        default=None,
        help="p99 SLO (default, per cost model: 2x the p99 of requests served alone on the "
        "slowest worker)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=".bench/results/sim")
    p.add_argument("--name", default="sim", help="file name stem")
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
    p.add_argument("--requests", type=int, default=20_000, help="fewest requests per run")
    p.add_argument(
        "--duration-s", type=float, default=4.0, help="seconds of arrivals per run, at least"
    )
    p.add_argument("--warmup", type=float, default=0.25, help="fraction left out of metrics")
    p.add_argument("--rtt-ms", type=float, default=0.3, help="pull round trip / push hop")
    p.add_argument("--routers", type=int, default=1, help="push routers (gateways)")
    p.add_argument("--high-water", type=float, default=2.0, help="budgets a worker holds")
    p.add_argument(
        "--no-full-pull", action="store_true", help="a full worker does not pull queries"
    )
    p.add_argument(
        "--variants",
        default="",
        help="extra pull runs of another worker: hwX (high water X budgets; 0: only when "
        "empty), hwX/nofull (and a full worker does not pull queries), e.g. hw0,hw2/nofull",
    )
    p.add_argument(
        "--age-limit-ms", type=float, default=2000.0, help="batch work not starved (queue, former)"
    )
    p.add_argument("--hold-ms", type=float, default=1000.0, help="cap after a query")
    p.add_argument("--interactive-tokens", type=int, default=-1, help="cap; -1: the profile's")
    p.add_argument("--interactive-cost", type=int, default=-1, help="-1: the profile's")
    p.add_argument("--steps", type=int, default=6, help="bisection steps for the SLO search")
    p.add_argument("--focus", type=int, default=64, help="fleet size for the plots")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    return p.parse_args(list(argv))


def variant(spec: str) -> dict[str, Any]:
    """``hw0`` or ``hw2/nofull``: the Params fields of a pull variant."""
    hw, _, rest = spec.partition("/")
    if not hw.startswith("hw") or rest not in ("", "nofull"):
        raise SystemExit(f"--variants takes hwX or hwX/nofull, not {spec!r}")
    try:
        return {"high_water": float(hw[2:]), "full_pull": rest != "nofull"}
    except ValueError:
        raise SystemExit(f"--variants takes hwX or hwX/nofull, not {spec!r}") from None


def params_from_args(args: argparse.Namespace) -> list[Params]:
    """One Params per cost model, each with its SLO."""
    bounds = ints(args.item_tokens)
    if len(bounds) != 2:
        raise ValueError(f"--item-tokens takes shortest,longest, not {args.item_tokens!r}")
    lo, hi = bounds
    out = []
    for name in (x.strip() for x in args.cost_models.split(",") if x.strip()):
        if name not in COST_MODELS:
            raise SystemExit(f"--cost-models takes {', '.join(COST_MODELS)}, not {name!r}")
        cls = args.cpu_class if name == "cpu" else args.gpu_class
        prof_dir = Path(args.profile_dir) if args.profile_dir else None
        p = from_catalog(
            name,
            args.model,
            prof_dir,
            cls,
            fleet=_fleet(args.fleet),
            scale_budget=not args.no_scale_budget,
            mix=_mix(args.mix),
            item_tokens=(lo, hi),
            requests=args.requests,
            duration_s=args.duration_s,
            warmup=args.warmup,
            rtt_ms=args.rtt_ms,
            routers=args.routers,
            high_water=args.high_water,
            full_pull=not args.no_full_pull,
            age_limit_ms=args.age_limit_ms,
            hold_ms=args.hold_ms,
            search_steps=args.steps,
        )
        if args.interactive_tokens >= 0:
            p = replace(p, interactive_tokens=args.interactive_tokens)
        if args.interactive_cost >= 0:
            p = replace(p, interactive_cost=args.interactive_cost)
        out.append(replace(p, slo_ms=args.slo_ms or default_slo_ms(p, args.seed)))
    return out


def main(argv: Sequence[str] = ()) -> int:
    argv = list(argv)
    if argv[:1] == ["fleet"]:
        from .fleet_cli import main as fleet_main

        return fleet_main(argv[1:])
    from ..report import cpu_model, machine

    args = _args(argv)
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 160)
    try:
        params = params_from_args(args)
        workers = ints(args.workers)
    except ValueError as exc:  # one line, as for --policies, not a traceback
        raise SystemExit(f"fleetserve bench sim: {exc}") from None
    policies = [x for x in args.policies.split(",") if x]
    if any(x not in POLICIES for x in policies):
        raise SystemExit(f"--policies takes {', '.join(POLICIES)}, not {args.policies!r}")
    tasks = plan(workers, policies, _floats(args.lags), params, args.seed)
    if "pull" in policies:  # extra pull runs: the worker with another high water
        for v in (x.strip() for x in args.variants.split(",") if x.strip()):
            kw = variant(v)
            tasks += [(w, "pull", replace(p, **kw), args.seed, v) for p in params for w in workers]
    console.rule("fleetserve bench sim: pull (central queue) vs push (router)")
    for p in params:
        for line in p.describe():
            console.print(f"  - {line}", highlight=False)
    iso = {p.cost_label: isolated_latency(p, args.seed) for p in params}
    t0 = time.perf_counter()
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("simulating", total=len(tasks))

        def step(pt: Point) -> None:
            lag = "" if pt.lag_ms is None else f", lag {pt.lag_ms:g} ms"
            bar.update(task, advance=1, description=f"{pt.cost} {pt.policy} x {pt.workers}{lag}")

        points = sweep(tasks, args.jobs, step)
    runtime = time.perf_counter() - t0
    rows = headline_rows(points)
    slos = slos_of(params)
    for t in headline_tables(rows, slos):
        console.print(t)
    console.print(detail_table(points))
    verdict = target_verdict(rows)
    for v in verdict:
        console.print(v, highlight=False)
    console.print(f"{len(points)} points in {runtime:.1f} s ({args.jobs} processes)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "fleetserve bench sim " + " ".join(argv)
    data = {
        "command": command,
        "cpu": cpu_model(),
        "machine": machine(),
        "seed": args.seed,
        "runtime_s": runtime,
        "cost_models": [_cost_entry(p) for p in params],
        "params": {p.cost_label: asdict(p) for p in params},
        "assumptions": {p.cost_label: p.describe() for p in params},
        "isolated_latency": iso,
        "headline": rows,
        "target": verdict,
        "points": [pt.to_dict() for pt in points],
    }
    stem = args.name
    (out / f"{stem}.json").write_text(json.dumps(data, indent=2, default=json_default))
    when = time.strftime("%Y-%m-%d")
    md = markdown(rows, points, params, iso, verdict, command, when, runtime)
    (out / f"{stem}.md").write_text(md)
    plot(points, rows, slos, args.focus, out / f"{stem}.png")
    console.print(f"wrote {out / stem}.md, .json and .png", highlight=False)
    return 0


def _cost_entry(p: Params) -> dict[str, object]:
    return {
        "name": p.cost_name,
        "label": p.cost_label,
        "fitted": p.cost_fitted,
        "status": "fitted" if p.cost_fitted else "assumed",
        "source": p.cost_source,
        "coefficients": asdict(p.cost),
        "max_batch_tokens": p.max_batch_tokens,
        "max_batch_size": p.max_batch_size,
        "interactive_cost": p.interactive_cost,
        "priority_cap": p.priority_cap,
        "interactive_batch_tokens": p.interactive_batch_tokens,
        "slo_ms": p.slo_ms,
    }
