"""Processes per device: N worker processes, each on its slice of the cores.

This is how ``fleetserve worker --devices cpu:0,cpu:1`` runs a CPU. Each child
(``python -m fleetserve.bench.tune.child``) builds the same in-process path on its cores,
loads the model, says ``ready``, and waits; when every child is ready they all start
at once, measure for the same time, and report. Throughputs add up; latencies are
the worst child's.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from ...catalog import ModelSpec
from ...worker.cores import core_share, usable_cores
from .candidates import Candidate
from .harness import Measure
from .options import Options

CHILD = "fleetserve.bench.tune.child"


class Searched(Protocol):
    """What the children's job reads of the search (a ``Search``, which calls here)."""

    @property
    def spec(self) -> ModelSpec: ...

    @property
    def catalog_dirs(self) -> tuple[Path, ...]: ...

    @property
    def path(self) -> Path: ...

    @property
    def cls(self) -> str: ...

    @property
    def opts(self) -> Options: ...

    @property
    def warmup_s(self) -> float: ...


def job(s: Searched, cand: Candidate, cores: list[int]) -> dict[str, object]:
    """What a child needs, as JSON: the model, where its weights are, the candidate."""
    return {
        "model": s.spec.id,
        "catalog": [str(d) for d in s.catalog_dirs],
        "path": str(s.path),
        "hardware_class": s.cls,
        "candidate": asdict(cand) | {"processes": 1},
        "workload": s.opts.workload,
        "batch": s.opts.batch,
        "clients": max(2, s.opts.clients // max(1, cand.processes)),
        "duration": s.opts.measure_s,
        "warmup_s": s.warmup_s,
        "cache_dir": str(s.opts.cache_dir),
        "cores": cores,
    }


async def measure_processes(s: Searched, cand: Candidate) -> Measure:
    cores = usable_cores()
    procs = []
    try:
        for i in range(cand.processes):
            spec = json.dumps(job(s, cand, core_share(i, cand.processes, cores)))
            p = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                CHILD,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
            assert p.stdin is not None
            p.stdin.write(spec.encode() + b"\n")
            await p.stdin.drain()
            procs.append(p)
        for p in procs:  # every child loaded and warmed up
            line = await _line(p, timeout=300)
            if line != "ready":
                raise RuntimeError(f"a tuning child failed to start: {line[:200]}")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(b"go\n")
            await p.stdin.drain()
        results = [_result(await _line(p, timeout=s.opts.measure_s + 120)) for p in procs]
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
            await p.wait()
    ms = [Measure(**r) for r in results]
    return Measure(
        tokens_per_s=sum(m.tokens_per_s for m in ms),
        items_per_s=sum(m.items_per_s for m in ms),
        p50_ms=max(m.p50_ms for m in ms),
        p99_ms=max(m.p99_ms for m in ms),
        requests=sum(m.requests for m in ms),
        errors=sum(m.errors for m in ms),
        seconds=max(m.seconds for m in ms),
    )


def _result(line: str) -> dict[str, Any]:
    """A child's measurement, or its one-line error as a RuntimeError."""
    try:
        out = json.loads(line)
    except ValueError:
        raise RuntimeError(f"a tuning child failed: {line[:200]}") from None
    if not isinstance(out, dict):
        raise RuntimeError(f"a tuning child answered {line[:200]!r}")
    return out


async def _line(p: asyncio.subprocess.Process, timeout: float) -> str:
    assert p.stdout is not None
    try:
        async with asyncio.timeout(timeout):
            raw = await p.stdout.readline()
    except TimeoutError:
        raise RuntimeError(f"a tuning child gave no answer within {timeout:.0f}s") from None
    if not raw:
        raise RuntimeError(f"a tuning child exited (status {await p.wait()})")
    return raw.decode().strip()


__all__ = ["measure_processes"]
