"""``fleetserve models``: list the catalog, or prepare models ahead of serving.

``prepare`` does once, now, what the first request would otherwise do: resolve the
weights (fetching object-store sources, converting GGUF), export and quantize for ONNX
Runtime (``--runtime onnx --precision int8``, behind the quality guard), load and warm
up. Run it at install or image-build time for fast cold starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .settings import Settings


def list_models(settings: Settings) -> int:
    from .catalog.sources import locate
    from .server import build_catalog, build_profiles

    catalog = build_catalog(settings)
    profiles = build_profiles(settings)
    hf_cache = Path(settings.hf_cache).expanduser()
    table = Table(title="fleetserve catalog")
    table.add_column("model", no_wrap=True)
    for col in ("family", "runs on", "size", "present", "where"):
        table.add_column(col)
    for s in catalog:
        found = locate(s.sources, hf_cache, Path(settings.cache_dir).expanduser())
        size = disk_size(found) if found is not None else (s.size or "?")
        where = str(found) if found is not None else ", ".join(s.sources)
        present = "[green]yes[/]" if found is not None else "[red]no[/]"
        c = profiles.choose(s)
        runs = f"{c.profile.runtime or s.runtime} {c.profile.precision} ({c.how})"
        table.add_row(s.id, s.family, runs, size, present, where)
    Console().print(table)
    return 0


def prepare_models(
    settings: Settings, ids: list[str], runtime: str, precision: str, console: Console
) -> int:
    from .catalog.profiles import Choice
    from .metrics import Metrics
    from .server import build_catalog, build_profiles, build_runner
    from .wire import FleetError

    if not ids:
        console.print("[red]error:[/] name the models to prepare")
        return 2
    catalog = build_catalog(settings)
    failed = 0
    for model_id in ids:
        try:
            spec = catalog.get(model_id)
            choice = build_profiles(settings).choose(spec)
            if runtime or precision:
                prof = dataclasses.replace(
                    choice.profile,
                    runtime=runtime or choice.profile.runtime,
                    precision=precision or choice.profile.precision,
                )
                choice = Choice(prof, "catalog", "asked for on the command line")
            runner = build_runner(spec, settings, Metrics(), choice)
            t0 = time.perf_counter()
            with console.status(f"preparing {model_id}…"):
                asyncio.run(runner.load())
            adapter = runner.adapter
            done = adapter.runtime.name, adapter.runtime.precision
            console.print(
                f"[green]ready[/] {model_id} ({done[0]}, {done[1]}) "
                f"in {time.perf_counter() - t0:.1f}s"
            )
            runner.close()
        except (FleetError, ValueError, OSError) as exc:
            failed += 1
            message = exc.message if isinstance(exc, FleetError) else str(exc)
            console.print(f"[red]error:[/] {model_id}: {message}", soft_wrap=True)
    return 1 if failed else 0


def disk_size(path: Path) -> str:
    n = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"
