"""``fleetserve models``: list the fleet (live from a running server, else the catalog),
or prepare models ahead of serving.

``prepare`` does once, now, what the first request would otherwise do: resolve the
weights (fetching object-store sources, converting GGUF), export and quantize for ONNX
Runtime (``--runtime onnx --precision int8``, behind the quality guard), load and warm
up. Run it at install or image-build time for fast cold starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from rich import box
from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.table import Table

from .fleet.memory import mib, parse_size
from .settings import Settings


def list_models(
    settings: Settings,
    console: Console | None = None,
    *,
    as_json: bool = False,
    notes: Console | None = None,
) -> int:
    """The live fleet from the server at ``settings.host:port`` if one answers, else the
    catalog. On a terminal a table that fits its width (each model's lines stacked
    where one line does not fit); piped, tab-separated columns; ``as_json``, a JSON
    list. Notes (failures, "showing the catalog") go to ``notes`` when piped."""
    console = console or Console()
    address = _address(settings)
    live, note = fetch_live(settings)
    if live is not None:
        rows, failures = live_rows(live)
        title, said = f"fleetserve models (live, {address})", ""
    else:
        rows, failures = catalog_rows(settings), []
        title, said = "fleetserve catalog", f"{note}: showing the catalog"
    if as_json:
        console.file.write(json.dumps([dataclasses.asdict(r) for r in rows], indent=1) + "\n")
    elif console.is_terminal:
        print_table(console, title, rows)
    else:
        print_tsv(console, rows)
    aside = console if console.is_terminal and not as_json else notes or Console(stderr=True)
    for model, error in failures:
        aside.print(f"[red]failed[/] {escape(model)}: {escape(error)}", highlight=False)
    if said:
        aside.print(f"[dim]{escape(said)}[/]", highlight=False)
    return 0


@dataclasses.dataclass
class Row:
    model: str
    family: str
    state: str  # resident | loading | cold | failed | absent (its weights are not here)
    size: str  # in MiB, the one unit; "?" unknown
    pinned: bool
    runs_on: str
    where: str = ""


STATE_STYLE = {
    "resident": "green", "loading": "yellow", "cold": "dim", "failed": "red", "absent": "magenta"
}  # fmt: skip
_HEADERS = ("model", "family", "state", "size", "pinned", "runs on", "where")


def _address(settings: Settings) -> str:
    host = settings.host
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"[{host}]:{settings.port}" if ":" in host else f"{host}:{settings.port}"


def fetch_live(
    settings: Settings, timeout: float = 1.0
) -> tuple[list[dict[str, object]] | None, str]:
    """``GET /v1/models`` of the running server: its entries, or None and why not."""
    import httpx

    address = _address(settings)
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    try:
        r = httpx.get(
            f"http://{address}/v1/models", headers=headers, timeout=timeout, trust_env=False
        )
    except httpx.HTTPError:
        return None, f"no server on {address}"
    if r.status_code in (401, 403):
        return None, f"the server on {address} refused the API key ({r.status_code})"
    try:
        data = r.json()["data"] if r.status_code == 200 else None
    except (ValueError, KeyError, TypeError):
        data = None
    if not isinstance(data, list):
        return None, f"{address} did not answer GET /v1/models ({r.status_code})"
    return [d for d in data if isinstance(d, dict)], ""


def release_models(settings: Settings, ids: list[str], errors: Console | None = None) -> int:
    """``fleetserve models release MODEL …``: end each model's keep-alive on the server at
    ``settings.host:port`` (``DELETE /v1/models/{id}/keep-alive``, an admin key), so that
    it may leave when memory is wanted. 1 if any failed, 2 if none was named."""
    import httpx

    errors = errors or Console(stderr=True)
    if not ids:
        errors.print("[red]error:[/] name the models to release: fleetserve models release MODEL")
        return 2
    out, address, code = Console(), _address(settings), 0
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    for model in ids:
        url = f"http://{address}/v1/models/{quote(model, safe='')}/keep-alive"
        try:
            r = httpx.delete(url, headers=headers, timeout=10.0, trust_env=False)
        except httpx.HTTPError as exc:
            errors.print(f"[red]error:[/] no server on {address}: {escape(str(exc))}")
            return 1
        try:
            body = r.json()
        except ValueError:
            body = {}
        if r.status_code != 200:
            why = (body.get("error") or {}).get("message") if isinstance(body, dict) else None
            errors.print(f"[red]error:[/] {escape(str(why or r.text[:200]))} ({r.status_code})")
            code = 1
        elif body.get("released"):
            left = float(body.get("left_s") or 0.0)
            out.print(f"released {escape(model)}: {left:.0f}s of keep-alive were left")
        else:
            out.print(f"{escape(model)} was not kept alive: nothing to release")
    return code


def state_of(entry: dict[str, Any]) -> str:
    """The entry's fleet state; from ``loaded`` where a server does not report one."""
    state = entry.get("state")
    if isinstance(state, str) and state:
        return state
    if entry.get("loaded"):
        return "resident"
    held = {state_of(w) for w in entry.get("workers") or () if isinstance(w, dict)}
    return next((s for s in ("resident", "loading") if s in held), "cold")


def live_rows(entries: list[dict[str, Any]]) -> tuple[list[Row], list[tuple[str, str]]]:
    """Table rows from ``/v1/models``, and the failed models with their errors."""
    rows, failures = [], []
    for e in entries:
        model = str(e.get("id", "?"))
        state = state_of(e)
        if state == "cold" and e.get("present") is False:
            state = "absent"  # its weights are not on the server: it cannot load
        runs = " ".join(str(e[k]) for k in ("runtime", "precision") if e.get(k))
        how = (e.get("profile") or {}).get("how") if isinstance(e.get("profile"), dict) else None
        if how:
            runs += f" ({how})"
        where = ""
        workers = [w for w in e.get("workers") or () if isinstance(w, dict)]
        if "workers" in e:
            held = []
            for w in workers:
                ws = state_of(w)
                if ws in ("resident", "loading"):
                    held.append(str(w.get("id", "?")) + ("" if ws == "resident" else " (loading)"))
            where = ", ".join(held) or f"none of {len(workers)}"
        n = e.get("bytes")
        if not isinstance(n, int) or n <= 0:  # older servers: the sum over workers, if any
            n = sum(w["bytes"] for w in workers if isinstance(w.get("bytes"), int))
        size = mib(n) if n > 0 else "?"
        rows.append(
            Row(model, str(e.get("family", "")), state, size, bool(e.get("pinned")), runs, where)
        )
        if state == "failed":
            failures.append((model, str(e.get("error") or "failed to load")))
    return rows, failures


def catalog_rows(settings: Settings) -> list[Row]:
    """The catalog as it would run here: every model cold, or absent (its weights are
    not here: where says what installs them)."""
    from .assembly import build_catalog, build_profiles
    from .catalog.sources import absent_hint, locate

    catalog = build_catalog(settings)
    profiles = build_profiles(settings)
    hf_cache = Path(settings.hf_cache).expanduser()
    cache_dir = Path(settings.cache_dir).expanduser()
    named = set(settings.model_list())
    rows = []
    for s in catalog:
        found = locate(s.sources, hf_cache, cache_dir)
        c = profiles.choose(s)
        precision = c.profile.precision
        if c.profile.memory_bytes:
            size = mib(c.profile.memory_bytes)
        elif found is not None:
            size = mib(disk_bytes(found))
        else:
            declared = declared_bytes(s.size, precision)
            size = f"~{mib(declared)}" if declared else "?"
        state = "cold" if found is not None else "absent"
        where = str(found) if found is not None else absent_hint(s.sources)
        runs = f"{c.profile.runtime or s.runtime} {precision} ({c.how})"
        rows.append(Row(s.id, s.family, state, size, s.pinned or s.id in named, runs, where))
    return rows


def _cells(r: Row) -> list[str]:
    return [r.model, r.family, r.state, r.size, "yes" if r.pinned else "", r.runs_on, r.where]


def print_tsv(console: Console, rows: list[Row]) -> None:
    """Piped: one line per model, its columns tab-separated, nothing cut or wrapped."""
    out = ["\t".join(h.replace(" ", "_") for h in _HEADERS)]
    out += ["\t".join(c.replace("\t", " ") for c in _cells(r)) for r in rows]
    console.file.write("\n".join(out) + "\n")


def print_table(console: Console, title: str, rows: list[Row]) -> None:
    """One line per model where that fits ``console.width``; else each model's lines
    stacked (its id, then its figures, then where): nothing is cut or left out."""
    cells = [_cells(r) for r in rows]
    keep = [i for i in range(len(_HEADERS)) if i != 6 or any(r.where for r in rows)]
    widths = [max([len(_HEADERS[i])] + [len(c[i]) for c in cells]) for i in keep]
    if sum(widths) + 2 * (len(widths) - 1) <= console.width:
        table = Table(
            title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
            padding=(0, 1, 0, 0), title_justify="left", collapse_padding=True,
        )  # fmt: skip
        for i in keep:
            justify: JustifyMethod = "right" if _HEADERS[i] == "size" else "left"
            table.add_column(_HEADERS[i], no_wrap=True, justify=justify)
        for r, c in zip(rows, cells, strict=True):
            style = STATE_STYLE.get(r.state, "")
            shown = [escape(x) for x in c]
            shown[2] = f"[{style}]{shown[2]}[/]" if style else shown[2]
            table.add_row(*(shown[i] for i in keep))
        console.print(table)
        return
    console.print(f"[italic]{escape(title)}[/]", highlight=False)
    for r in rows:
        style = STATE_STYLE.get(r.state, "")
        state = f"[{style}]{r.state}[/]" if style else r.state
        figures = [escape(r.family), state, escape(r.size), *(["pinned"] if r.pinned else [])]
        console.print(f"[bold]{escape(r.model)}[/]", highlight=False, overflow="fold")
        console.print("  " + " · ".join(figures), highlight=False, overflow="fold")
        for label, text in (("runs on", r.runs_on), ("where", r.where)):
            if text:
                console.print(f"  {label}: {escape(text)}", highlight=False, overflow="fold")


def prepare_models(
    settings: Settings, ids: list[str], runtime: str, precision: str, console: Console
) -> int:
    from .assembly import build_catalog, build_profiles, build_runner
    from .catalog.profiles import Choice
    from .metrics import Metrics
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
            adapter = runner.family
            done = adapter.runtime.name, adapter.runtime.precision
            console.print(
                f"[green]ready[/] {model_id} ({done[0]}, {done[1]}) "
                f"in {time.perf_counter() - t0:.1f}s"
            )
            runner.close()
        except (FleetError, ValueError, OSError) as exc:
            failed += 1
            message = exc.message if isinstance(exc, FleetError) else str(exc)
            console.print(f"[red]error:[/] {model_id}: {escape(message)}", soft_wrap=True)
    return 1 if failed else 0


def disk_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


_PARAMS = re.compile(r"([\d.]+)\s*([KMB])\s*params", re.IGNORECASE)
_PARAM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1, "int4": 1}


def declared_bytes(size: str, precision: str) -> int:
    """A spec's declared ``size`` ("605 MB", "33M params") in bytes, roughly; 0 if none."""
    m = _PARAMS.fullmatch(size.strip())
    if m:
        scale = {"k": 1e3, "m": 1e6, "b": 1e9}[m[2].lower()]
        return int(float(m[1]) * scale * _PARAM_BYTES.get(precision, 4))
    try:
        return parse_size(size, limit=0)
    except ValueError:
        return 0
