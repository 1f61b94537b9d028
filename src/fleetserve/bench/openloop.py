"""Open-loop load for any async ``send``: Poisson arrivals at a fixed offered rate.

The core of ``fleetserve bench knee`` and of the tuner's knee step. It knows nothing
of HTTP: ``send(i)`` sends request number ``i`` and returns the tokens it carried;
raising counts the request as an error.

- Arrivals follow a seeded Poisson process (exponential gaps), whatever the server
  does: a slow reply never delays the next arrival.
- A request's latency runs from its **scheduled** arrival, not from when it was sent,
  so time spent waiting for a free slot or for a late client counts (no coordinated
  omission).
- At most ``max_in_flight`` requests are outstanding; later arrivals wait for a slot,
  their clock already running.
- Requests still in flight when the arrivals end are waited for up to ``drain_s``
  and counted; those still unfinished then are cancelled and counted as errors.
- Rates are fitted: offered from the arrival times, achieved from the completion
  times of the successes, each as 1 / the least-squares slope of time against rank.
  Latency jitter moves completions but not that slope, so a server that keeps up
  shows achieved = offered even in short runs, and one that falls behind shows its
  completion rate, drained backlog included (achieved is capped at the offered rate
  of the requests that succeeded). Token rates are these rates times the mean tokens
  of the successful requests. A point needs some 100 requests for its rates to be
  good to a few per cent.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable, Sequence

from .knee_find import KEEP_UP, KneePoint
from .loadgen import percentile

Send = Callable[[int], Awaitable[int]]
Window = Callable[[Callable[[], Awaitable[KneePoint]]], Awaitable[KneePoint]]
MAX_IN_FLIGHT = 256


def arrivals(rate_rps: float, duration_s: float, seed: int = 0) -> list[float]:
    """Seconds from the start of each arrival of a Poisson process on [0, duration_s)."""
    if rate_rps <= 0 or duration_s <= 0:
        raise ValueError("rate_rps and duration_s must be positive")
    rng = random.Random(seed)
    out: list[float] = []
    t = rng.expovariate(rate_rps)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate_rps)
    return out


async def open_loop(
    send: Send,
    rate_rps: float,
    duration_s: float,
    *,
    seed: int = 0,
    max_in_flight: int = MAX_IN_FLIGHT,
    drain_s: float | None = None,
    first: int = 0,
) -> KneePoint:
    """Offer ``rate_rps`` requests/s for ``duration_s`` s; requests are numbered from
    ``first``. ``drain_s``: how long to wait for the stragglers (default: half the
    duration, at least 1 s)."""
    due_at = arrivals(rate_rps, duration_s, seed)
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(max_in_flight)
    done: list[tuple[float, float, int]] = []  # (scheduled, finished, tokens) per success
    errors = 0

    async def one(i: int, due: float) -> None:
        nonlocal errors
        async with slots:
            try:
                tokens = await send(first + i)
            except Exception:
                errors += 1
                return
        done.append((due, loop.time(), tokens))

    t0 = loop.time()
    tasks: list[asyncio.Task[None]] = []
    try:
        for i, offset in enumerate(due_at):
            due = t0 + offset
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, due)))
        drain = max(1.0, duration_s / 2) if drain_s is None else drain_s
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=drain)
            errors += len(pending)
    finally:  # the stragglers, or everything when this run is cancelled
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return _point(due_at, done, errors, duration_s)


def _point(
    due_at: Sequence[float], done: Sequence[tuple[float, float, int]], errors: int, dur: float
) -> KneePoint:
    n, k = len(due_at), len(done)
    offered = _rate(due_at) or n / dur
    achieved = _rate(sorted(d for _, d, _ in done)) or k / dur
    achieved = min(achieved, offered * k / n) if n else 0.0  # no more than was offered
    mean_tokens = sum(t for _, _, t in done) / k if k else 0.0
    lat = [d - s for s, d, _ in done]
    return KneePoint(
        offered_rps=offered,
        achieved_rps=achieved,
        offered_tokens_s=offered * mean_tokens,
        achieved_tokens_s=achieved * mean_tokens,
        p50_ms=percentile(lat, 0.50) * 1e3,
        p99_ms=percentile(lat, 0.99) * 1e3,
        errors=errors,
    )


def _rate(times: Sequence[float]) -> float | None:
    """Events per second: 1 / the least-squares slope of time against rank (None with
    fewer than 3 events). Jitter in the times does not bias a slope fitted this way."""
    m = len(times)
    if m < 3:
        return None
    mid_i, mid_t = (m - 1) / 2, sum(times) / m
    cov = sum((i - mid_i) * (t - mid_t) for i, t in enumerate(times))
    var = m * (m * m - 1) / 12  # sum of (i - mid_i)^2
    return var / cov if cov > 0 else None


async def sweep(
    send: Send,
    rates: Sequence[float],
    duration_s: float,
    *,
    seed: int = 0,
    max_in_flight: int = MAX_IN_FLIGHT,
    drain_s: float | None = None,
    stop_after: int | None = None,
    on_point: Callable[[float, KneePoint], None] | None = None,
    window: Window | None = None,
    min_arrivals: int = 0,
) -> list[KneePoint]:
    """:func:`open_loop` at each rate in turn (rate k with seed ``seed + k``), each for
    :func:`window_s` (``duration_s``, longer where a rate would send fewer than
    ``min_arrivals`` requests in it: a window of two Poisson arrivals measures noise).

    ``stop_after``: stop once this many rates in a row fell behind (achieved below
    98 % of offered), since higher ones will too. ``on_point(rate, point)`` is called
    after each rate. ``window(measure)`` runs each rate's measurement (a background
    tune's runs it again when a pause cut into it)."""
    points: list[KneePoint] = []
    behind, sent = 0, 0
    for k, rate in enumerate(rates):

        async def measure(k: int = k, rate: float = rate) -> KneePoint:
            nonlocal sent
            first = sent
            seconds = window_s(rate, duration_s, min_arrivals)
            sent += math.ceil(rate * seconds * 2) + 16  # request numbers never repeat
            return await open_loop(
                send,
                rate,
                seconds,
                seed=seed + k,
                max_in_flight=max_in_flight,
                drain_s=drain_s,
                first=first,
            )

        p = await (window(measure) if window is not None else measure())
        points.append(p)
        if on_point is not None:
            on_point(rate, p)
        behind = 0 if p.achieved_rps >= KEEP_UP * p.offered_rps else behind + 1
        if stop_after is not None and behind >= stop_after:
            break
    return points


def window_s(rate: float, duration_s: float, min_arrivals: int = 0) -> float:
    """How long :func:`sweep` measures ``rate``: ``duration_s``, or long enough for
    ``min_arrivals`` requests at it."""
    return max(duration_s, min_arrivals / rate) if rate > 0 else duration_s


async def capacity(send: Send, duration_s: float, *, concurrency: int = 8) -> float:
    """Closed loop: the successful requests/s of ``concurrency`` clients sending back to
    back for ``duration_s`` s: a probe of where to sweep."""
    loop = asyncio.get_running_loop()
    end = loop.time() + duration_s
    ok = 0
    counter = 0

    async def client() -> None:
        nonlocal ok, counter
        while loop.time() < end:
            counter += 1
            try:
                await send(counter)
            except Exception:
                continue
            ok += 1

    t0 = loop.time()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return ok / (loop.time() - t0)


def auto_rates(
    capacity_rps: float, points: int = 8, *, low: float = 0.2, high: float = 1.5
) -> list[float]:
    """``points`` geometric steps from ``low`` to ``high`` times ``capacity_rps``."""
    if capacity_rps <= 0 or points < 1:
        raise ValueError("capacity_rps must be positive and points at least 1")
    if points == 1:
        return [capacity_rps]
    ratio = (high / low) ** (1 / (points - 1))
    return [capacity_rps * low * ratio**k for k in range(points)]
