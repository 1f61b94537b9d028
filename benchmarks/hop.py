"""The broker hop: what NATS mode adds to one request when nothing else is running.

One client sends one short sentence at a time, sequentially, to each front in turn
(blocks of requests, the order rotated per block so that neither front always goes
first); after a warm-up, the p50 of each, and each one's p50 over the first front's
(embedded). The target: NATS within ``BUDGET_MS`` of embedded.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import httpx

from fleetserve.bench.loadgen import percentile

from .priority_load import JSON_HEADERS
from .targets import HttpTarget

BUDGET_MS = 3.0


def sequential(
    client: httpx.Client, f: HttpTarget, bodies: Sequence[bytes], n: int, first: int = 0
) -> tuple[list[float], int]:
    """``n`` requests one after another: their latencies (ms) and the failures."""
    lat: list[float] = []
    errors = 0
    for k in range(first, first + n):
        t0 = time.perf_counter()
        try:
            r = client.post(f.url, content=bodies[k % len(bodies)], headers=JSON_HEADERS)
            good = r.status_code == 200
        except httpx.HTTPError:
            good = False
        if good:
            lat.append((time.perf_counter() - t0) * 1e3)
        else:
            errors += 1
    return lat, errors


def measure(
    fronts: Sequence[HttpTarget],
    queries: Sequence[str],
    *,
    requests: int,
    warmup: int,
    blocks: int,
) -> list[dict[str, Any]]:
    """One row per front: p50, p99 and mean ms of ``requests`` sequential requests."""
    bodies = {f.name: [f.body([q]) for q in queries] for f in fronts}
    lat: dict[str, list[float]] = {f.name: [] for f in fronts}
    errors = dict.fromkeys(lat, 0)
    per = max(1, requests // max(1, blocks))
    with httpx.Client(timeout=60) as client:
        for f in fronts:
            sequential(client, f, bodies[f.name], warmup)
        for b in range(max(1, blocks)):
            k = b % len(fronts)
            for f in [*fronts[k:], *fronts[:k]]:
                xs, bad = sequential(client, f, bodies[f.name], per, first=b * per)
                lat[f.name] += xs
                errors[f.name] += bad
    return rows(lat, errors)


def rows(lat: dict[str, list[float]], errors: dict[str, int]) -> list[dict[str, Any]]:
    def p50(xs: list[float]) -> float:
        return statistics.median(xs) if xs else float("nan")

    base = p50(next(iter(lat.values())))
    out = []
    for name, xs in lat.items():
        over = p50(xs) - base
        out.append(
            {
                "target": name,
                "requests": len(xs),
                "errors": errors[name],
                "p50_ms": p50(xs),
                "p99_ms": percentile(xs, 0.99),
                "mean_ms": statistics.fmean(xs) if xs else float("nan"),
                "p50_over_first_ms": over,
                "met": bool(over <= BUDGET_MS),
            }
        )
    return out
