"""``fleetserve bench sim fleet``: the fleet-memory scenario (many models, a memory budget
per worker, cold loads, GDSF or LRU eviction, affinity on or off), as a table, JSON, PNG.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from .cli_common import ints, json_default
from .fleet_report import fleet_findings, fleet_plot, fleet_rows, fleet_table


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
    p.add_argument(
        "--eviction",
        default="gdsf,lru",
        help="gdsf, lru, hindsight (knows the requests to come: a mark to compare with) "
        "or a list: gdsf,lru,hindsight",
    )
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
        "--clients", type=int, default=d.clients,
        help="a closed loop of this many clients, each sending its next request when its "
        "last is answered (as a benchmark's are); 0: Poisson arrivals at --utilization",
    )  # fmt: skip
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


def main(argv: Sequence[str] = ()) -> int:
    from ..report import cpu_model, machine
    from .fleet import EVICTIONS, FleetParams, FleetRun, compare, configs, make_models, parse_bytes

    args = _fleet_args(argv)
    evictions = [x.strip() for x in args.eviction.split(",") if x.strip()]
    if any(e not in EVICTIONS for e in evictions):
        raise SystemExit(f"--eviction takes {', '.join(EVICTIONS)}, not {args.eviction!r}")
    try:
        params = FleetParams(
            models=args.models,
            zipf_s=args.zipf_s,
            memory_budget=parse_bytes(args.memory_budget),
            batch=args.batch,
            utilization=args.utilization,
            clients=args.clients,
            affinity_wait_s=args.affinity_wait,
            slow_share=args.slow_share,
            requests_per_worker=args.requests_per_worker,
        )
        cfgs = configs(ints(args.workers), _onoff(args.affinity), evictions)
    except ValueError as exc:  # one line, as for --eviction, not a traceback
        raise SystemExit(f"fleetserve bench sim fleet: {exc}") from None
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
    load = f"{params.clients} clients" if params.clients else f"{params.utilization:.0%} busy"
    title = f"fleet memory, {fmt_budget(params.memory_budget)}/worker, {load} (simulated)"
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
    (out / f"{args.name}.json").write_text(json.dumps(data, indent=2, default=json_default))
    fleet_plot(rows, "fleetserve bench sim fleet: " + title, out / f"{args.name}.png")
    console.print(f"wrote {out / args.name}.json and .png", highlight=False)
    return 0


def fmt_budget(n: int) -> str:
    from .fleet import fmt_bytes

    return fmt_bytes(n).replace(" ", "")
