"""``python -m benchmarks fleet cold-load``: a pinned model's latency while another loads.

For each source tree (before and after), a ``fleetserve serve`` of that tree with a
fresh ``--cache-dir`` (so a GGUF model's first conversion is part of its load), an
open-loop Poisson load of one-sentence embeddings on the pinned model, then ONE request
to the cold model; the load runs on until its answer arrives and ``--tail`` seconds
more. Latency counts from each request's scheduled start (no coordinated omission).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from fleetserve.bench.loadgen import percentile

from .fleet_models import SENTENCE
from .fleet_report import COLD_COLUMNS
from .fleet_server import Server

WINDOWS = ("baseline", "load", "after")
SUMMARY = [key for key, _, _ in COLD_COLUMNS]  # the figures quoted as medians


def tree_src(path: Path) -> Path:
    """A source tree's import root: ``PATH/src`` when it holds the package, else PATH."""
    return path / "src" if (path / "src" / "fleetserve").is_dir() else path


def describe(src: Path) -> str:
    """``<short commit>[+dirty]`` of the git checkout holding ``src``, or its path."""

    def git(*a: str) -> str:
        r = subprocess.run(["git", "-C", str(src), *a], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return str(src)
    return head + ("+dirty" if git("status", "--porcelain", "--", ".") else "")


def cold_request(model: str, family: str) -> tuple[str, dict[str, Any]]:
    if family == "generate":
        msgs = [{"role": "user", "content": "Hi"}]
        return "/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 4}
    return "/v1/embeddings", {"model": model, "input": ["Hi"]}


async def drive(url: str, args: argparse.Namespace, family: str) -> dict[str, Any]:
    """The open-loop load and the one cold request: samples (t, ms, status), t relative
    to the cold request's start; that request's start, end and status."""
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as client:
        warm = {"model": args.minilm, "input": [SENTENCE]}
        for _ in range(args.warmup):
            (await client.post(url + "/v1/embeddings", json=warm)).raise_for_status()
        samples: list[tuple[float, float, int]] = []
        cold: dict[str, Any] = {}
        t0 = time.perf_counter()
        stop = [float("inf")]

        async def one(at: float) -> None:
            try:
                status = (await client.post(url + "/v1/embeddings", json=warm)).status_code
            except httpx.HTTPError:
                status = 0
            samples.append((at, (time.perf_counter() - t0 - at) * 1e3, status))

        async def fire() -> None:
            await asyncio.sleep(args.baseline)
            route, body = cold_request(args.cold_model, family)
            cold["start"] = time.perf_counter() - t0
            try:
                r = await client.post(url + route, json=body)
                cold["status"], cold["reply"] = r.status_code, r.text[:200]
            except httpx.HTTPError as exc:
                cold["status"], cold["reply"] = 0, repr(exc)
            cold["end"] = time.perf_counter() - t0
            stop[0] = cold["end"] + args.tail

        rng = random.Random(args.seed)
        firing = asyncio.create_task(fire())
        tasks: list[asyncio.Task[None]] = []
        at = 0.0
        while True:
            at += rng.expovariate(args.rate)
            if at >= stop[0] or at > args.timeout:
                break
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            if at >= stop[0]:  # the cold answer came while we slept
                break
            tasks.append(asyncio.create_task(one(at)))
        await asyncio.gather(firing, *tasks)
    start = cold.get("start", args.baseline)
    return {
        "cold": {**cold, "start": 0.0, "end": cold.get("end", start) - start},
        "samples": sorted((t - start, ms, st) for t, ms, st in samples),
    }


def windows(samples: list[tuple[float, float, int]], end: float) -> dict[str, dict[str, float]]:
    out = {}
    for name, lo, hi in (("baseline", -1e9, 0.0), ("load", 0.0, end), ("after", end, 1e9)):
        xs = [ms for t, ms, _ in samples if lo <= t < hi]
        errs = sum(1 for t, _, st in samples if lo <= t < hi and st != 200)
        out[name] = {
            "n": len(xs),
            "errors": errs,
            "p50_ms": percentile(xs, 0.5),
            "p99_ms": percentile(xs, 0.99),
            "max_ms": max(xs) if xs else float("nan"),
        }
    return out


def run_once(
    tree: str, src: Path, run: int, family: str, args: argparse.Namespace
) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="fleet-cold-"))
    cache = scratch / "cache" if args.cold else Path(args.log_dir).resolve() / f"cache-{tree}"
    flags = ["--device", "cpu", "--cache-dir", str(cache), "--log-level", "warning"]
    flags += ["--catalog", str(Path(args.catalog).resolve())] if args.catalog else []
    flags += ["--torch-threads", str(args.threads)] if args.threads else []
    srv = Server(f"cold-{tree}-{run}", flags + args.serve_args.split(), Path(args.log_dir), src=src)
    try:
        ready = srv.wait_ready()
        got = asyncio.run(drive(srv.url, args, family))
    finally:
        srv.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    end = got["cold"]["end"]
    w = windows(got["samples"], end)
    row = {"tree": tree, "src": str(src), "version": describe(src), "run": run}
    row |= {"ready_s": ready, "load_s": end, "cold_status": got["cold"].get("status", 0)}
    row |= {f"{k}_{s}": v for k, d in w.items() for s, v in d.items()}
    row["errors"] = sum(d["errors"] for d in w.values())
    return {**row, "cold_reply": got["cold"].get("reply", ""), "samples": got["samples"]}


def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    from fleetserve.catalog import Catalog

    extra = [Path(args.catalog)] if args.catalog else []
    family = Catalog.load(extra).get(args.cold_model).family
    trees = [("after", tree_src(Path(args.src)))]
    if args.before:
        trees.insert(0, ("before", tree_src(Path(args.before))))
    console.print(
        f"{args.minilm} at {args.rate:g} req/s (Poisson) for {args.baseline:g} s, then one "
        f"{family} request to {args.cold_model}; {'fresh' if args.cold else 'kept'} cache"
    )
    runs: list[dict[str, Any]] = []
    for r in range(args.repeats):
        for tree, src in trees if r % 2 == 0 else trees[::-1]:
            with console.status(f"run {r + 1}/{args.repeats}: {tree} ({src})…"):
                res = run_once(tree, src, r, family, args)
            runs.append(res)
            console.print(
                f"  run {r + 1} {tree}: load {res['load_s']:.1f} s (HTTP "
                f"{res['cold_status']}), p99 {res['baseline_p99_ms']:.0f} -> "
                f"{res['load_p99_ms']:.0f} ms"
            )
    med = {
        tree: {k: statistics.median(x[k] for x in runs if x["tree"] == tree) for k in SUMMARY}
        for tree, _ in trees
    }
    return {"family": family, "trees": {t: str(s) for t, s in trees}, "runs": runs, "medians": med}
