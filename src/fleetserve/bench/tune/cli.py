"""``fleetserve tune MODEL...`` and ``fleetserve hardware``."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ...catalog import Catalog
from ...catalog.hardware import detect, judged_features
from ...catalog.profiles import ProfileError, Profiles
from ...catalog.rules import class_precision, fallback_chain
from ...catalog.weights import local_weights, weights_path
from ...settings import Settings
from ...wire import FleetError
from .options import (
    KNEE_PARTS,
    KNEE_S,
    MEASURE_PARTS,
    MEASURE_S,
    QUICK_KNEE_S,
    QUICK_MEASURE_S,
    SHORTEST_S,
    Options,
    TuneError,
    windows,
)
from .runs import RunStore
from .tuner import Outcome, Tuner


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("tune_models", nargs="+", metavar="MODEL", help="Model ids to tune.")
    p.add_argument("--budget", type=float, default=600.0, help="Seconds per model [600].")
    p.add_argument("--quick", action="store_true", help="A short search (what --tune quick runs).")
    p.add_argument(
        "--workload",
        default="mix",
        choices=["mix", "sentences"],
        help="mix: real text, 8-256 tokens; sentences: 64 tokens each [mix].",
    )
    p.add_argument(
        "--measure",
        type=float,
        default=None,
        help=f"Seconds per measurement [{MEASURE_S:g}; a {MEASURE_PARTS}th of a budget under "
        f"{MEASURE_S * MEASURE_PARTS:g} s, at least {SHORTEST_S:g}; --quick: at most "
        f"{QUICK_MEASURE_S:g}].",
    )
    p.add_argument("--slo-ms", type=float, default=None, help="p99 SLO for the knee.")
    p.add_argument("--no-knee", action="store_true", help="Skip the open-loop knee sweep.")
    p.add_argument(
        "--knee-seconds",
        type=float,
        default=None,
        help=f"Seconds per knee rate [{KNEE_S:g}; a {KNEE_PARTS}th of a budget under "
        f"{KNEE_S * KNEE_PARTS:g} s, at least {SHORTEST_S:g}; --quick: at most {QUICK_KNEE_S:g}].",
    )
    p.add_argument(
        "--max-processes",
        type=int,
        default=0,
        help="Processes per device to try at most; 1 for `fleetserve serve`, which runs "
        "one [0: as many as cores].",
    )
    p.add_argument("--output", default="", help="Profile directory [--profile-dir].")
    p.add_argument("--report-dir", default="", help="Reports [<tune-dir>/reports].")
    p.add_argument(
        "--start",
        default="",
        metavar="RUNTIME:PRECISION",
        help="Screen this engine right after the fp32 reference (a server's background "
        "tune passes the one it runs) [the rules' pick].",
    )
    p.add_argument(
        "--run-id",
        default="",
        help="Id of the run document, for one model (a server's background tune names "
        "it, so that GET /v1/models shows the run while it goes) [a new one].",
    )
    p.add_argument(
        "--pause-file",
        default="",
        help="Pause ledger of the server that runs this tune in the background "
        "(--tune auto): its pauses are left out of the budget and spoil no figure.",
    )


ARGS = {"tune_models", "budget", "quick", "workload", "measure", "slo_ms", "no_knee"}
ARGS |= {"output", "report_dir", "knee_seconds", "max_processes", "pause_file", "start"}
ARGS |= {"run_id"}


def run_tune(settings: Settings, args: argparse.Namespace, console: Console) -> int:

    extra = (Path(settings.catalog),) if settings.catalog else ()
    catalog = Catalog.load(extra, weights=local_weights(settings))
    hw = detect(settings.device)
    cls = settings.hardware_class or hw.hardware_class
    if cls != hw.hardware_class:
        console.print(
            f"[red]error:[/] this machine is {hw.hardware_class}: a profile for {cls} must be "
            f"measured on a {cls} machine (drop --hardware-class)",
            soft_wrap=True,
        )
        return 2
    measure_s, knee_s = windows(args.budget, args.quick)
    opts = Options(
        budget_s=args.budget,
        quick=args.quick,
        workload=args.workload,
        measure_s=measure_s if args.measure is None else args.measure,
        knee=not args.no_knee,
        knee_s=knee_s if args.knee_seconds is None else args.knee_seconds,
        max_processes=args.max_processes,
        slo_ms=args.slo_ms,
        device=settings.device if settings.device != "auto" else hw.kind,
        cache_dir=Path(settings.cache_dir).expanduser(),
        pause_file=Path(args.pause_file) if args.pause_file else None,
        start=_engine(args.start),
    )
    if args.pause_file:  # a server's background tune: below its requests, and SIGTERM
        os.nice(10)  # ends it as Ctrl-C would (the run says cancelled, nothing written)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    out = Path(args.output or settings.profile_dir).expanduser()
    tune_dir = Path(settings.tune_dir).expanduser()
    if args.run_id:
        why = _bad_run_id(args.run_id, len(args.tune_models), RunStore(tune_dir))
        if why:
            console.print(f"[red]error:[/] --run-id {args.run_id!r}: {why}", soft_wrap=True)
            return 2
    reports = Path(args.report_dir).expanduser() if args.report_dir else tune_dir / "reports"
    jobs = []
    for model in args.tune_models:  # every model checked before the first is tuned
        try:
            spec = catalog.get(model)
            path = weights_path(spec, settings)
            jobs.append(
                Tuner(
                    spec,
                    path,
                    hw,
                    cls,
                    opts,
                    RunStore(tune_dir),
                    profile_dir=out,
                    report_dir=reports,
                    catalog_dirs=extra,
                    console=console,
                    run_id=args.run_id,
                )
            )
        except (FleetError, TuneError, ValueError) as exc:
            console.print(f"[red]error:[/] {exc}", soft_wrap=True)
            return 2
    console.print(f"[bold]fleetserve tune[/] on {hw.summary()}")
    for job in jobs:
        try:
            outcome = asyncio.run(_with_progress(job, console))
        except KeyboardInterrupt:
            console.print("[yellow]cancelled:[/] no profile was written")
            return 130
        except (TuneError, FleetError, ValueError, RuntimeError, OSError) as exc:
            text = exc.message if isinstance(exc, FleetError) else str(exc)
            console.print(f"[red]error:[/] {text}; no profile was written", soft_wrap=True)
            return 1
        run = outcome.run
        for w in run.get("warnings") or []:
            console.print(f"[yellow]warning:[/] {w}", soft_wrap=True)
        console.print(
            f"[green]{run['model']}:[/] {run['winner']} -> {outcome.profile_file}\n"
            f"  report: {run['report']['markdown']}"
        )
    return 0


def _engine(text: str) -> tuple[str, str] | None:
    """``--start openvino:bf16`` -> ("openvino", "bf16")."""
    if not text:
        return None
    runtime, _, precision = text.partition(":")
    return runtime, precision or "fp32"


async def _with_progress(job: Tuner, console: Console) -> Outcome:
    shown: set[int] = set()
    cols = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*cols, console=console, transient=True) as bar:
        task = bar.add_task(job.spec.id, total=job.opts.budget_s)
        hook = job.search.on_change

        def on_change(phase: str) -> None:
            hook(phase)
            s = job.search
            best = s.measured()[0].tokens_per_s if s.measured() else 0.0
            bar.update(
                task,
                completed=min(s.clock.elapsed, job.opts.budget_s),
                description=f"{job.spec.id} [{phase}] best {best:,.0f} tok/s",
            )
            for p in s.points:
                if p.status in ("measured", "rejected", "skipped") and id(p) not in shown:
                    shown.add(id(p))
                    tps = f"{p.tokens_per_s:>9,.0f} tok/s" if p.samples else " " * 15
                    bar.console.print(f"  {p.cand.id:<40} {tps}  {p.status} {p.reason}"[:160])

        job.search.on_change = on_change
        return await job.run()


def _bad_run_id(run_id: str, models: int, store: RunStore) -> str:
    """Why ``run_id`` cannot name this tune's run document, or ""."""
    if models != 1:
        return "names the run of one model, and this tunes several"
    try:
        file = store.path(run_id)
    except KeyError:
        return "a run id is letters, digits, '.', '_' and '-'"
    return "a run of that id exists already" if file.exists() else ""


def run_hardware(settings: Settings, console: Console) -> int:
    """``fleetserve hardware``: the class, the facts behind it, and what it runs."""
    hw = detect(settings.device)
    cls = settings.hardware_class or hw.hardware_class
    console.print(
        f"[bold]hardware class:[/] {cls}"
        + ("" if cls == hw.hardware_class else f" (asked for; detected {hw.hardware_class})")
    )
    t = Table(show_header=False, box=None, pad_edge=False)
    for k, v in hw.facts().items():
        if k == "features":
            v = " ".join(v) or "-"
        t.add_row(str(k), str(v))
    console.print(t)
    console.print(f"[bold]fallback chain:[/] {' -> '.join(fallback_chain(cls)) or 'none'}")
    try:  # --bundled-profiles false: what a class with nothing bundled gets
        profiles = Profiles(
            hw, cls, Path(settings.profile_dir), unbundled=not settings.bundled_profiles
        )
    except ProfileError as exc:
        console.print(f"[red]error:[/] {exc}", soft_wrap=True)
        return 1
    pick = profiles.table.pick("dense", cls, judged_features(hw, cls))
    rule = f"{pick.runtime} {pick.precision}, {pick.reason}" if pick else class_precision(cls)
    console.print(f"[bold]rule for a dense model:[/] {rule}")
    return _profiles_table(settings, profiles, cls, console)


def _profiles_table(settings: Settings, profiles: Profiles, cls: str, console: Console) -> int:
    extra = (Path(settings.catalog),) if settings.catalog else ()
    # one space apart: the longest bundled id (50 characters) fits 80 columns whole
    t = Table(
        title=f"profiles on {cls}",
        title_justify="left",
        box=None,
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )
    t.add_column("model", overflow="fold", ratio=1)
    for col in ("runs on", "batch", "how"):
        t.add_column(col, no_wrap=True)
    for spec in Catalog.load(extra, weights=local_weights(settings)):
        c = profiles.choose(spec)
        p = c.profile
        runs = f"{p.runtime or spec.runtime} {p.precision}"
        t.add_row(spec.id, runs, f"{p.max_batch_size}/{p.max_batch_tokens}", c.how)
    console.print(t)
    return 0


__all__ = ["ARGS", "add_arguments", "run_hardware", "run_tune"]
