"""``python -m benchmarks http``: choose the HTTP server and framework by measuring.

Each stack serves the same fixed reply. httpx measures single-request latency (one
connection, as the SDK sees it); wrk (``apt-get install wrk``), when present, measures
throughput with 16 connections, since a Python client saturates before any server.
Rounds are interleaved across stacks; medians are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fleetserve.bench.loadgen import run_load

from .targets import HttpTarget

APP = "benchmarks.echo"
ROOT = Path(__file__).resolve().parent.parent  # the servers import APP from here


def _uvicorn(app: str, http: str, loop: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "uvicorn",
        f"{APP}:{app}",
        "--http",
        http,
        "--loop",
        loop,
        "--no-access-log",
        "--log-level",
        "warning",
        "--port",
        "{port}",
    ]


STACKS = {
    "uvicorn+httptools+uvloop, raw ASGI": _uvicorn("raw_app", "httptools", "uvloop"),
    "uvicorn+httptools+uvloop, starlette": _uvicorn("starlette_app", "httptools", "uvloop"),
    # fleetserve's own protocol: httptools with its HTTP limits (http_limits.py), as served
    "uvicorn+bounded httptools+uvloop, raw ASGI": _uvicorn(
        "raw_app", f"{APP}:limited_httptools", "uvloop"
    ),
    "uvicorn+h11+asyncio, raw ASGI": _uvicorn("raw_app", "h11", "asyncio"),
    "granian (1 worker, uvloop), raw ASGI": [
        sys.executable,
        "-m",
        "granian",
        "--interface",
        "asgi",
        f"{APP}:raw_app",
        "--loop",
        "uvloop",
        "--workers",
        "1",
        "--log-level",
        "warning",
        "--port",
        "{port}",
    ],
}


def main(argv: Sequence[str] = ()) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks http", description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--out", default=".bench/results")
    p.add_argument("--only", default="", help="only the stacks whose name contains this")
    args = p.parse_args(list(argv))
    console = Console()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    targets = []
    for name, argv_ in STACKS.items():
        if args.only not in name:
            continue
        t = HttpTarget(
            name=name,
            argv=argv_,
            route="/x",
            model="",
            ready_path="/x",
            ready_method="POST",
            cwd=ROOT,
        )
        try:
            t.start(out, timeout=30)
            targets.append(t)
        except RuntimeError as exc:
            console.print(f"[yellow]skipping {name}: {exc}[/]")
    lat: dict[str, list[float]] = {}
    rps: dict[str, list[float]] = {}
    body = b'{"input": "' + b"x" * 300 + b'"}'
    hdrs = {"content-type": "application/json"}
    try:
        for r in range(args.rounds):
            for t in targets if r % 2 == 0 else targets[::-1]:  # ABBA: no order bias
                one = asyncio.run(
                    run_load(
                        t.url,
                        lambda i: body,
                        hdrs,
                        concurrency=1,
                        batch=1,
                        tokens_per_item=1,
                        duration=args.duration,
                    )
                )
                lat.setdefault(t.name, []).append(one.p50_ms)
                rps.setdefault(t.name, []).append(_throughput(t.url, body, args.duration, out))
    finally:
        for t in targets:
            t.stop()
    tool = "wrk" if shutil.which("wrk") else "httpx"
    table = Table(title="HTTP stack: same reply, same clients (medians)")
    for c in ("stack", "p50 ms (httpx, 1 connection)", f"req/s ({tool}, 16 connections)"):
        table.add_column(c)
    lines = [
        f"| stack | p50 ms (httpx, 1 connection) | req/s ({tool}, 16 connections) |",
        "| --- | ---: | ---: |",
    ]
    for name in lat:
        p50, per_s = statistics.median(lat[name]), statistics.median(rps[name])
        table.add_row(name, f"{p50:.3f}", f"{per_s:,.0f}")
        lines.append(f"| {name} | {p50:.3f} | {per_s:,.0f} |")
    console.print(table)
    (out / "http_stack.md").write_text("\n".join(lines) + "\n")
    return 0


def _throughput(url: str, body: bytes, duration: float, out: Path) -> float:
    """Requests/s with 16 connections: wrk when installed, else the Python load generator."""
    if shutil.which("wrk"):
        script = out / "post.lua"
        lua_body = body.decode().replace("\\", "\\\\").replace('"', '\\"')
        script.write_text(
            'wrk.method = "POST"\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
            f'wrk.body = "{lua_body}"\n'
        )
        res = subprocess.run(
            ["wrk", "-t1", "-c16", f"-d{max(1, round(duration))}s", "-s", str(script), url],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        m = re.search(r"Requests/sec:\s+([\d.]+)", res)
        return float(m.group(1)) if m else float("nan")
    hdrs = {"content-type": "application/json"}
    r = asyncio.run(
        run_load(
            url, lambda i: body, hdrs, concurrency=16, batch=1, tokens_per_item=1, duration=duration
        )
    )
    return r.tokens_per_s
