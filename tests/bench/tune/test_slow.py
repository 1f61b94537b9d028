"""tune/slow.py: which candidates are too slow to measure at saturation."""

from __future__ import annotations

import asyncio
import time

import pytest

from fleetserve.bench.tune.pauses import Pauses
from fleetserve.bench.tune.slow import (
    MIN_GATE_S,
    SLOW_X,
    SLOWER,
    TooLong,
    gate_limit,
    too_slow,
    within,
)


def always(seconds: float) -> bool:
    return True


def test_the_limit_is_slow_x_the_reference_and_never_under_the_minimum() -> None:
    assert gate_limit("cpu", "onnx", 10.0) == SLOW_X * 10.0
    assert gate_limit("cpu", "onnx", 0.5) == MIN_GATE_S
    assert gate_limit("cpu", "torch", 0.0) is None  # the reference's own set
    assert gate_limit("cuda", "torch", 10.0) is None
    assert gate_limit("cpu", "torch_compile", 10.0) is None  # its first calls compile


def test_a_set_that_ran_past_slow_x_per_request_is_too_slow() -> None:
    """torch bf16 of a 110M model on cpu-avx2 against torch fp32 (seconds measured
    per calibration request): its set ended under the limit, since the deadline is
    looked at only between requests, but each request ran ~5x the reference's."""
    ref = [0.75, 1.15, 1.25, 1.0]
    bf16 = [3.71, 5.76, 6.09, 6.19]
    why = too_slow(sum(bf16), bf16, ref, 45.0, always)
    assert why.startswith(SLOWER) and "5.0x" in why, why


def test_the_reference_s_cold_first_call_weighs_little() -> None:
    """The ratio of the totals would be 2x here; per request it is 1.5x."""
    ref = [20.0, 2.0, 2.0, 2.0]
    cand = [6.0, 3.0, 3.0, 3.0]
    assert too_slow(sum(cand), cand, ref, 45.0, always) == ""


def test_a_small_set_is_never_judged() -> None:
    """A small model's first calls cost more than its whole gate: nothing to save."""
    ref, cand = [0.01, 0.01], [1.0, 1.0]
    assert too_slow(MIN_GATE_S - 1, cand, ref, 5.0, always) == ""


def test_a_window_that_would_not_fit_the_budget_is_not_measured() -> None:
    ref, cand = [4.0, 4.0, 4.0], [12.0, 12.0, 12.0]  # 3x: not over SLOW_X
    asked: list[float] = []

    def fits(seconds: float) -> bool:
        asked.append(seconds)
        return seconds < 100

    why = too_slow(36.0, cand, ref, 45.0, fits)
    assert asked == [135.0] and why.startswith("the time budget ran out"), why
    assert too_slow(36.0, cand, ref, 30.0, fits) == ""  # 90 s fits


async def test_within_gives_back_what_ends_in_time() -> None:
    async def quick() -> str:
        await asyncio.sleep(0.01)
        return "done"

    assert await within(quick(), 5.0) == "done"


async def test_within_cancels_what_runs_past_its_cap() -> None:
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cancelled.set()

    t0 = time.monotonic()
    with pytest.raises(TooLong):
        await within(forever(), 0.1)
    assert cancelled.is_set() and time.monotonic() - t0 < 5


async def test_within_leaves_a_background_tune_s_pauses_out() -> None:
    """The server held the tune stopped for 0.4 s of a 0.3 s cap: not the window's time."""
    t0 = time.monotonic()

    def pauses() -> Pauses:  # paused for the first 0.4 s
        return Pauses(1, min(time.monotonic() - t0, 0.4))

    async def half_second() -> str:
        await asyncio.sleep(0.5)
        return "done"

    assert await within(half_second(), 0.3, pauses) == "done"


class SlowStack:
    """Each request takes ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def send(self, request: object) -> int:
        await asyncio.sleep(self.seconds)
        return 100


class Req:
    items = 4


async def test_a_window_whose_warm_requests_run_past_their_limit_stops_there() -> None:
    """The reference's two warm requests are timed (``Measure.warm_s``); a candidate's
    may take SLOW_X times as long, so a far slower one is cut within seconds rather
    than after its whole window."""
    from typing import cast

    from fleetserve.bench.tune.harness import Request, Stack, saturate

    reqs = cast(list[Request], [Req()] * 4)
    ref = await saturate(cast(Stack, SlowStack(0.02)), reqs, 2, 0.1)
    assert ref.warm_s == pytest.approx(0.04, abs=0.03)
    t0 = time.monotonic()
    with pytest.raises(TooLong, match="warm requests ran past"):
        await saturate(cast(Stack, SlowStack(5.0)), reqs, 2, 0.1, warm_limit=SLOW_X * ref.warm_s)
    assert time.monotonic() - t0 < 2.0  # not the two 5 s requests


def test_warm_requests_may_always_take_a_small_models_first_calls() -> None:
    """Four times a tiny model's warm requests is a fraction of a second, which its first
    calls may take alone (shapes set up): never less than MIN_WARM_S."""
    from fleetserve.bench.tune.slow import MIN_WARM_S, warm_limit

    assert warm_limit(0.02) == MIN_WARM_S
    assert warm_limit(5.0) == SLOW_X * 5.0
    assert str(TooLong("its two warm requests", 0.08)) == "its two warm requests ran past 0.1s"
    assert str(TooLong("its window", 45.0)) == "its window ran past 45s"
