"""A closed-loop HTTP load generator: C concurrent clients, each sending back to back."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class LoadResult:
    concurrency: int
    batch: int
    requests: int
    seconds: float
    tokens_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def run_load(
    url: str,
    make_body: Callable[[int], bytes],
    headers: dict[str, str],
    *,
    concurrency: int,
    batch: int,
    tokens_per_item: float,
    duration: float,
    warmup: int = 2,
    tokens_of: Callable[[int], float] | None = None,
) -> LoadResult:
    """Send requests of ``batch`` items from ``concurrency`` clients for ``duration`` s.

    ``tokens_of(i)``: the tokens in request ``i``'s body, where requests differ (real
    text); the throughput then counts what was answered, not ``batch`` times the mean."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        for i in range(warmup):
            (await client.post(url, content=make_body(i), headers=headers)).raise_for_status()
        lat: list[float] = []
        errors = 0
        counter = 0
        answered = 0.0  # tokens in the answered requests
        t_end = time.perf_counter() + duration

        async def one_client() -> None:
            nonlocal errors, counter, answered
            while time.perf_counter() < t_end:
                counter += 1
                i, body = counter, make_body(counter)
                t0 = time.perf_counter()
                r = await client.post(url, content=body, headers=headers)
                dt = time.perf_counter() - t0
                if r.status_code == 200:
                    lat.append(dt)
                    answered += tokens_of(i) if tokens_of else batch * tokens_per_item
                else:
                    errors += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return LoadResult(
        concurrency=concurrency,
        batch=batch,
        requests=len(lat),
        seconds=elapsed,
        tokens_per_s=answered / elapsed,
        p50_ms=statistics.median(lat) * 1e3 if lat else float("nan"),
        p99_ms=percentile(lat, 0.99) * 1e3,
        errors=errors,
    )


def run_latency(
    url: str,
    make_body: Callable[[int], bytes],
    headers: dict[str, str],
    *,
    duration: float,
    tokens_per_item: float,
    warmup: int = 5,
) -> LoadResult:
    """One client, one request at a time, on a plain blocking httpx client: the least
    client overhead Python offers, so the figure is mostly the server's."""
    lat: list[float] = []
    errors = 0
    with httpx.Client(timeout=120) as client:
        for i in range(warmup):
            client.post(url, content=make_body(i), headers=headers).raise_for_status()
        t_end = time.perf_counter() + duration
        i = warmup
        t_start = time.perf_counter()
        while time.perf_counter() < t_end:
            body = make_body(i)
            i += 1
            t0 = time.perf_counter()
            r = client.post(url, content=body, headers=headers)
            if r.status_code == 200:
                lat.append(time.perf_counter() - t0)
            else:
                errors += 1
        elapsed = time.perf_counter() - t_start
    return LoadResult(
        concurrency=1,
        batch=1,
        requests=len(lat),
        seconds=elapsed,
        tokens_per_s=len(lat) * tokens_per_item / elapsed,
        p50_ms=statistics.median(lat) * 1e3 if lat else float("nan"),
        p99_ms=percentile(lat, 0.99) * 1e3,
        errors=errors,
    )
