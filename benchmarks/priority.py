"""``python -m benchmarks priority``: queries stay fast while bulk work runs.

Side by side in one run on this machine, with the real model, every server a process
of its own and all of them up for the whole run:

- targets: ``embedded`` (``fleetserve serve``); ``nats``: nats-server + gateway + 2
  workers pulling from one stream (``nats-pull``); ``push``: 2 more such workers, each
  on a stream of its own, behind the least-outstanding push router of ``benchmarks
  dist`` (``nats-push-lor``); ``infinity``: infinity-emb at its best setting here (a
  search over its dtypes and batch sizes first, by bulk throughput);
- per target and repeat: bulk alone (``--bulk-clients`` closed-loop clients sending
  ``--bulk-items`` texts of realistic lengths), then the same bulk with one-sentence
  queries arriving at ``--rate``/s (Poisson): without a header (the server classes
  them by predicted cost) and, fleetserve only, with ``X-Priority: interactive``;
- the broker hop: one client, one short sentence at a time, embedded against NATS.

Targets and phases rotate per repeat; medians over repeats. The goals: query p99
<= 100 ms while bulk keeps >= 0.9x its bulk-alone throughput; NATS p50 within 3 ms
of embedded. Writes ``priority-<hardware class>.{json,png}`` under ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.markup import escape

from . import hop, priority_infinity
from .dist_cpu import CpuMeter
from .dist_fleet import Fleet
from .dist_measure import Noise
from .priority_load import JSON_HEADERS, Bodies, Load, Sample, Workload, build_workload, phase
from .priority_report import ALONE, print_tables, summarize, write
from .targets import HttpTarget

REAL = "sentence-transformers/all-MiniLM-L6-v2"
TARGETS = ("embedded", "nats", "push", "infinity")
SECTIONS = ("mixed", "hop")
Runs = dict[tuple[str, str], list[tuple[Sample, float]]]  # (target, variant) -> repeats


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks priority",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add("--model", default=REAL)
    add("--catalog", default="", help="extra catalog directory (also for the servers)")
    add("--targets", default=",".join(TARGETS), help="any of " + ",".join(TARGETS))
    add("--sections", default=",".join(SECTIONS), help="any of " + ",".join(SECTIONS))
    add("--repeats", type=int, default=3)
    add("--seconds", type=float, default=20.0, help="measured window of each phase")
    add("--warm", type=float, default=3.0, help="seconds of load before each window")
    add("--rate", type=float, default=4.0, help="interactive queries per second")
    add("--bulk-clients", type=int, default=4)
    add("--bulk-items", type=int, default=256, help="texts per bulk request")
    add("--bulk-pool", type=int, default=16, help="distinct bulk requests")
    add("--hop-requests", type=int, default=400, help="per target, after the warm-up")
    add("--hop-warmup", type=int, default=50)
    add("--hop-blocks", type=int, default=4, help="alternations between targets")
    add("--infinity-venv", default=".bench/infinity-venv")
    add("--infinity-dtypes", default="auto,float32,bfloat16,float16,int8")
    add("--infinity-batch-sizes", default="32,64,128", help="the first with every dtype")
    add("--search-seconds", type=float, default=8.0, help="per infinity candidate")
    add("--quiet-wait", type=float, default=20.0, help="wait for others to leave the cores")
    add("--seed", type=int, default=0)
    add("--out", default=None, help="default docs/bench (--quick: .bench/results)")
    add("--logs", default=".bench/results/priority-logs", help="the processes' logs")
    add(
        "--quick",
        action="store_true",
        help="a smoke run of about 2 minutes: 1 repeat of 2 s windows, 64-text bulk "
        "requests, one infinity setting (bfloat16), no waiting for quiet",
    )
    return p


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = _parser()
    a = p.parse_args(list(argv))
    if a.quick:
        a.repeats, a.seconds, a.warm, a.bulk_pool, a.search_seconds = 1, 2.0, 1.0, 4, 2.0
        a.hop_requests, a.hop_warmup, a.hop_blocks = 100, 20, 2
        a.infinity_dtypes, a.infinity_batch_sizes, a.bulk_items = "bfloat16", "32", 64
        a.quiet_wait = 0.0
    a.out = a.out or (".bench/results" if a.quick else "docs/bench")
    for name, allowed in (("targets", TARGETS), ("sections", SECTIONS)):
        bad = set(_csv(getattr(a, name))) - set(allowed)
        if bad:
            p.error(f"--{name}: unknown {', '.join(sorted(bad))} (any of {', '.join(allowed)})")
    return a


def start_fleet(fleet: Fleet, targets: set[str], cores: int) -> dict[str, HttpTarget]:
    """The fleetserve fronts asked for, ready."""
    half = max(1, cores // 2)
    fronts: dict[str, HttpTarget] = {}
    if targets & {"nats", "push"}:
        fleet.start_nats()
    if "embedded" in targets:
        fronts["embedded"] = fleet.embedded("embedded")
    if "nats" in targets:
        fronts["nats-pull"] = fleet.gateway("nats-pull", "pull")
        for i in range(2):
            fleet.worker(f"pull-w{i}", "pull", half)
    if "push" in targets:
        prefixes = [fleet.worker(f"push-w{i}", f"push-w{i}", half).prefix for i in range(2)]
        fronts["nats-push-lor"] = fleet.router("nats-push-lor", prefixes, "lor")
    fleet.wait_ready()
    return fronts


def warm_up(fronts: Sequence[HttpTarget], w: Workload) -> None:
    """First requests are slow (shapes compiled, connections opened)."""
    with httpx.Client(timeout=300) as client:
        for f in fronts:
            client.post(f.url, content=f.body(w.bulk[0]), headers=JSON_HEADERS).raise_for_status()
            for q in w.queries[:8]:
                client.post(f.url, content=f.body([q]), headers=JSON_HEADERS).raise_for_status()


class Runner:
    """Phases through :class:`Noise` (others' CPU recorded, quiet waited for)."""

    def __init__(self, a: argparse.Namespace, w: Workload, noise: Noise, console: Console) -> None:
        self.a, self.w, self.noise, self.console = a, w, noise, console
        self.bodies: dict[str, Bodies] = {}

    def phase(self, f: HttpTarget, load: Load) -> tuple[Sample, float]:
        if f.name not in self.bodies:
            self.bodies[f.name] = Bodies.of(self.w, f.body)
        coro = phase(f.url, self.bodies[f.name], load)
        s, cpu = self.noise.measure(lambda: asyncio.run(coro))
        return s, cpu["foreign_cores"] + cpu["steal_cores"]

    def hop(self, pair: Sequence[HttpTarget]) -> list[dict[str, Any]]:
        a = self.a
        rows, _ = self.noise.measure(
            lambda: hop.measure(
                pair,
                self.w.queries,
                requests=a.hop_requests,
                warmup=a.hop_warmup,
                blocks=a.hop_blocks,
            )
        )
        return rows

    def infinity(self, model_path: Path, live: list[HttpTarget]) -> dict[str, Any]:
        """The search for infinity's best setting; ``live`` ends up holding the winner."""
        a, venv = self.a, Path(self.a.infinity_venv)
        if not priority_infinity.venv_ready(venv):
            hint = priority_infinity.VENV_HINT
            self.console.print(f"[yellow]no infinity venv at {venv}; {hint}[/]")
            return {"infinity_skipped": f"no infinity venv at {venv}"}
        self.console.rule("infinity-emb: its best setting here")

        def bulk_alone(t: HttpTarget) -> float:
            return self.phase(t, self.load(0.0, False, 0, a.search_seconds))[0].bulk_tokens_per_s

        best, rows = priority_infinity.search(
            venv,
            model_path,
            _csv(a.infinity_dtypes),
            [int(b) for b in _csv(a.infinity_batch_sizes)],
            self.w.queries[:16],
            bulk_alone,
            Path(a.logs),
            self.console,
            live,
        )
        if best is not None:
            warm_up([best], self.w)
        return {"infinity_search": rows}

    def load(self, rate: float, header: bool, r: int, seconds: float | None = None) -> Load:
        a = self.a
        first = r * len(self.w.bulk) // max(1, a.repeats)
        return Load(a.bulk_clients, rate, seconds or a.seconds, a.warm, header, a.seed + r, first)

    def repeats(self, fronts: Sequence[HttpTarget], fleetserve: set[str]) -> Runs:
        """Every front's phases per repeat: bulk alone, mixed, and (fleetserve) mixed
        with the header; fronts and phases rotated per repeat."""
        runs: Runs = {}
        for r in range(self.a.repeats):
            k = r % len(fronts)
            for f in [*fronts[k:], *fronts[:k]]:
                plan = [(ALONE, 0.0, False), ("mixed", self.a.rate, False)]
                if f.name in fleetserve:
                    plan.append(("mixed+header", self.a.rate, True))
                j = r % len(plan)
                for variant, rate, header in [*plan[j:], *plan[:j]]:
                    s, others = self.phase(f, self.load(rate, header, r))
                    runs.setdefault((f.name, variant), []).append((s, others))
                    self.console.print(_line(r, self.a.repeats, f.name, variant, s))
        return runs


def run(
    a: argparse.Namespace, env: Mapping[str, str], facts: Mapping[str, Any], console: Console
) -> dict[str, Any]:
    from fleetserve.assembly import HF_CACHE
    from fleetserve.catalog import Catalog
    from fleetserve.catalog.sources import resolve
    from fleetserve.settings import Settings

    t0 = time.perf_counter()
    settings = Settings.load(env=env, cli={"catalog": a.catalog or None})
    spec = Catalog.load([Path(settings.catalog)] if settings.catalog else []).get(a.model)
    path = resolve(a.model, spec.sources, HF_CACHE)
    w = build_workload(path, spec.max_seq_len, a.bulk_items, a.bulk_pool, a.seed)
    wanted, sections = set(_csv(a.targets)), set(_csv(a.sections))
    started = wanted | ({"embedded", "nats"} if "hop" in sections else set())
    Path(a.logs).mkdir(parents=True, exist_ok=True)
    fleet = Fleet(a.model, Path(a.logs), env, {"catalog": a.catalog} if a.catalog else None)
    infinity: list[HttpTarget] = []  # running: candidates, then the one chosen

    def pids() -> list[int]:
        return [*fleet.pids(), *(t.proc.pid for t in infinity if t.proc is not None)]

    noise = Noise(CpuMeter(pids), a.quiet_wait)
    runner = Runner(a, w, noise, console)
    out: dict[str, Any] = {"workload": _describe(w, spec.max_seq_len)}
    try:
        with console.status("starting nats-server, servers, gateways, workers…"):
            fronts = start_fleet(fleet, started, os.cpu_count() or 1)
        with console.status("warming up…"):
            warm_up(list(fronts.values()), w)
        if "hop" in sections:
            console.rule("the broker hop")
            out["hop"] = runner.hop([fronts["embedded"], fronts["nats-pull"]])
        mixed = [f for f in fronts.values() if f.name in _mixed_names(wanted)]
        if "mixed" in sections and "infinity" in wanted:
            out.update(runner.infinity(path, infinity))
            mixed += infinity
        if "mixed" in sections and mixed:
            console.rule("queries under bulk load")
            out["rows"] = summarize(runner.repeats(mixed, set(fronts)), facts["hardware_class"])
    finally:
        fleet.stop()
        for t in infinity:
            t.stop()
    out["noise"] = noise.summary()
    out["seconds"] = time.perf_counter() - t0
    return out


def _line(r: int, n: int, name: str, variant: str, s: Sample) -> str:
    line = f"{r + 1}/{n} {name[:21]:<21} {variant:<12} bulk {s.bulk_tokens_per_s:>7,.0f} tok/s"
    if variant != ALONE:
        line += f"  p99 {s.query(0.99):>6,.1f} ms"
    codes = ",".join(f"{n}x{c or 'no reply'}" for c, n in sorted(s.error_codes.items()))
    return line + (f" [red]{codes}[/]" if codes else "")


def _mixed_names(targets: set[str]) -> set[str]:
    names = {"embedded": "embedded", "nats": "nats-pull", "push": "nats-push-lor"}
    return {v for k, v in names.items() if k in targets}


def _describe(w: Workload, max_seq_len: int) -> dict[str, Any]:
    return {
        "source": w.source,
        "bulk_requests_in_pool": len(w.bulk),
        "bulk_items_per_request": len(w.bulk[0]) if w.bulk else 0,
        "mean_tokens_per_bulk_item": w.mean_tokens_per_item,
        "queries_in_pool": len(w.queries),
        "max_seq_len": max_seq_len,
    }


def main(argv: Sequence[str] = (), env: Mapping[str, str] | None = None) -> int:
    """``env``: the servers' environment (default: this process's)."""
    from .fleet import machine_facts

    a = _args(argv)
    console = Console(width=80)
    facts = machine_facts()
    console.rule(f"python -m benchmarks priority: {a.model}")
    console.print(f"{facts['hardware_class']}: {facts['machine']}")
    try:
        result = run(a, dict(os.environ if env is None else env), facts, console)
    except (RuntimeError, httpx.HTTPError) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return 1
    result = {**facts, "args": vars(a), **result}
    print_tables(result, console)
    write(Path(a.out), f"priority-{facts['hardware_class']}", result, console)
    return 0
