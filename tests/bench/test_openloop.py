"""The open-loop generator against a fake server of known service time and concurrency.

The fake's ``asyncio.sleep`` is its service time, not a wait for something to happen.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable

import pytest

from fleetserve.bench.knee_find import KneePoint
from fleetserve.bench.openloop import (
    arrivals,
    auto_rates,
    capacity,
    open_loop,
    sweep,
    window_s,
)

SERVICE_S = 0.02
SLOTS = 2  # the fake serves 2 at a time: capacity 100 req/s
TOKENS = 64


def fake_server(
    service_s: float = SERVICE_S, slots: int = SLOTS, took: list[float] | None = None
) -> tuple[Callable[[int], Awaitable[int]], list[int]]:
    """``took``, if given, gets each request's service time as it ran (a sleep on a busy
    machine overshoots)."""
    sem = asyncio.Semaphore(slots)
    seen: list[int] = []

    async def send(i: int) -> int:
        seen.append(i)
        async with sem:
            t0 = time.perf_counter()
            await asyncio.sleep(service_s)
            if took is not None:
                took.append(time.perf_counter() - t0)
        return TOKENS

    return send, seen


def test_arrivals_are_poisson_at_the_rate() -> None:
    ts = arrivals(200, 10, seed=3)
    assert ts == arrivals(200, 10, seed=3) != arrivals(200, 10, seed=4)
    assert len(ts) == pytest.approx(2000, rel=0.05)
    gaps = [b - a for a, b in itertools.pairwise(ts)]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / 200, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(mean, rel=0.1)  # exponential: cv 1
    assert all(0 <= t < 10 for t in ts) and ts == sorted(ts)
    with pytest.raises(ValueError):
        arrivals(0, 1)


async def test_below_capacity_achieved_is_offered() -> None:
    send, seen = fake_server()
    p = await open_loop(send, 40, 1.5, seed=1)
    assert isinstance(p, KneePoint)
    assert p.offered_rps == pytest.approx(40, rel=0.15)  # the mean rate, fixed seed
    assert p.achieved_rps == pytest.approx(p.offered_rps, rel=0.05)
    assert p.errors == 0 and seen == list(range(len(seen)))
    assert p.achieved_tokens_s == pytest.approx(p.achieved_rps * TOKENS)
    assert p.offered_tokens_s == pytest.approx(p.offered_rps * TOKENS)
    assert SERVICE_S * 1e3 <= p.p50_ms < 4 * SERVICE_S * 1e3


async def test_above_capacity_achieved_falls_short() -> None:
    send, _ = fake_server()
    p = await open_loop(send, 200, 0.6, seed=1, drain_s=5)
    assert p.offered_rps == pytest.approx(200, rel=0.15)
    assert 0.5 * SLOTS / SERVICE_S < p.achieved_rps <= 1.1 * SLOTS / SERVICE_S  # the capacity
    assert p.achieved_rps < 0.7 * p.offered_rps
    assert p.errors == 0  # the backlog was drained and counted
    assert p.p99_ms > 200  # it queued


async def test_latency_runs_from_the_scheduled_arrival() -> None:
    # one slot, 50 ms each, 16 arrivals in 0.2 s: the later ones wait for the others
    service, took = 0.05, []
    send, seen = fake_server(service_s=service, slots=1, took=took)
    p = await open_loop(send, 80, 0.2, seed=0, max_in_flight=1, drain_s=10)
    due = arrivals(80, 0.2, seed=0)
    assert len(seen) == len(due) == len(took) >= 8 and p.errors == 0
    free, expected = 0.0, []
    for t, ran in zip(due, took, strict=True):  # one FIFO server: each starts when it is
        free = max(free, t) + ran  # due and the server is free, and runs as it ran
        expected.append(free - t)
    # nearest-rank p99 of 16 latencies is the largest; from the send it would be 50 ms
    assert p.p99_ms == pytest.approx(max(expected) * 1e3, abs=40)
    assert p.p99_ms > 3 * service * 1e3


async def test_in_flight_is_bounded() -> None:
    busy = 0
    most = 0
    release = asyncio.Event()

    async def send(i: int) -> int:
        nonlocal busy, most
        busy += 1
        most = max(most, busy)
        if busy == 3:
            release.set()
        await release.wait()
        busy -= 1
        return 1

    p = await open_loop(send, 500, 0.1, seed=0, max_in_flight=3, drain_s=10)
    assert most == 3 and p.errors == 0


async def test_stragglers_past_the_drain_cap_and_failures_are_errors() -> None:
    never = asyncio.Event()

    async def hangs(i: int) -> int:
        await never.wait()
        return 1

    p = await open_loop(hangs, 100, 0.2, seed=0, drain_s=0.05)
    assert p.errors == len(arrivals(100, 0.2, seed=0)) > 0
    assert p.achieved_rps == 0 and p.p99_ms != p.p99_ms  # no successes: NaN latency

    async def fails(i: int) -> int:
        if i % 2:
            raise RuntimeError("HTTP 503")
        return 1

    q = await open_loop(fails, 100, 0.3, seed=0)
    n = len(arrivals(100, 0.3, seed=0))
    assert q.errors == n // 2


async def test_sweep_and_its_stop() -> None:
    send, seen = fake_server()
    got: list[tuple[float, KneePoint]] = []
    pts = await sweep(
        send,
        [300, 400, 500],
        0.3,
        drain_s=0.2,
        stop_after=2,
        on_point=lambda r, p: got.append((r, p)),
    )
    assert len(pts) == 2  # 300 and 400 both fell behind a 100 req/s server: 500 was not run
    assert [r for r, _ in got] == [300, 400] and [p for _, p in got] == pts
    assert all(p.achieved_rps < 0.5 * p.offered_rps for p in pts)
    assert len(set(seen)) == len(seen)  # request numbers never repeat across rates
    assert len(await sweep(send, [20, 30], 0.2)) == 2


def test_a_low_rate_gets_a_window_long_enough_for_its_arrivals() -> None:
    assert window_s(100, 2.5, 20) == 2.5  # 250 arrivals: the duration stands
    assert window_s(1.0, 2.5, 20) == 20.0  # 2.5 arrivals would be noise
    assert window_s(1.0, 2.5) == 2.5 and window_s(0.0, 2.5, 20) == 2.5


async def test_a_sweep_at_low_rates_measures_their_arrivals_not_noise() -> None:
    """At 8 requests/s, a 0.25 s window holds about two arrivals (offered reads 0, 4, 8
    or 12); with ``min_arrivals`` each rate runs long enough to read close to itself
    (the arrivals are seeded: the same every run)."""
    send, seen = fake_server()
    pts = await sweep(send, [8.0, 16.0], 0.25, drain_s=0.5, min_arrivals=16)
    assert len(seen) >= 24
    for rate, p in zip([8.0, 16.0], pts, strict=True):
        assert p.offered_rps == pytest.approx(rate, rel=0.3), (rate, p.offered_rps)


async def test_capacity_probe() -> None:
    send, _ = fake_server()
    cap = SLOTS / SERVICE_S
    assert 0.5 * cap < await capacity(send, 0.5, concurrency=4) <= 1.1 * cap  # shared cores


def test_auto_rates_are_geometric() -> None:
    rates = auto_rates(100, 5)
    assert rates[0] == pytest.approx(20) and rates[-1] == pytest.approx(150)
    ratios = [b / a for a, b in itertools.pairwise(rates)]
    assert max(ratios) == pytest.approx(min(ratios))
    assert auto_rates(100, 1) == [100]


async def test_a_cancelled_run_leaves_no_request_behind() -> None:
    started = asyncio.Event()
    never = asyncio.Event()
    live: set[int] = set()

    async def hangs(i: int) -> int:
        live.add(i)
        started.set()
        try:
            await never.wait()
        finally:
            live.discard(i)
        return 1

    run = asyncio.create_task(open_loop(hangs, 200, 10.0, seed=0))
    await started.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert not live


async def test_a_window_runs_each_rate_and_may_run_it_again() -> None:
    send, seen = fake_server()
    tries: list[int] = []

    async def twice_first(measure: Callable[[], Awaitable[KneePoint]]) -> KneePoint:
        tries.append(1)
        got = await measure()
        if len(tries) == 1:  # the first rate's window was spoiled: measured again
            tries.append(1)
            got = await measure()
        return got

    points = await sweep(send, [20.0, 40.0], 0.3, window=twice_first)
    assert len(points) == 2 and len(tries) == 3
    assert len(seen) == len(set(seen))  # a rerun sends new request numbers
