"""Candidates too slow to measure at saturation (the search's screening step).

A precision the CPU emulates (torch bf16 at 0.15x fp32 on cpu-avx2) cannot win, and
its saturation windows took a 110M model's tune 7 of its 10 minutes. So, on a CPU:

- its quality set is cut once it has run SLOW_X times the reference's, and at least
  MIN_GATE_S (``gate_limit``; looked at between requests, since the compute thread
  cannot be interrupted within one);
- a set that ran to its end is judged per request (``too_slow``): over SLOW_X times
  the reference's (the median of the ratios, so the reference's cold first call weighs
  little), or a saturation window that, as much slower than the reference's, would not
  fit in the budget;
- its saturation window may run SLOW_X times the reference's, and never past the
  budget (``within``), and its two warm requests SLOW_X times the reference's: a small
  quality set can hide a slowness that larger batches show (torch bf16 of the 110M
  model passed its set, then ran 255 s of one window, 4x the reference's, when cut).

torch.compile is exempt: its first calls compile.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from ...aio import cancel_and_wait
from . import pauses as pauses_mod

T = TypeVar("T")

SLOW_X = 4.0
MIN_GATE_S = 10.0  # and never before this: a small model's first calls cost more than its gate
# and a candidate's two warm requests may always take this long: a small model's first
# calls set up their shapes (OpenVINO bf16 of a tiny BERT on cpu-amx ran past 4x its fp32
# reference's, a fraction of a second, and was skipped as too slow)
MIN_WARM_S = 2.0
SLOWER = f"over {SLOW_X:g}x slower than the fp32 reference"
WINDOW = "its window"  # what ``within`` cuts, unless told


def gate_limit(kind: str, runtime: str, reference_s: float) -> float | None:
    """How long a candidate's quality set may run (``None``: no limit; the reference's
    own set, a GPU, or torch.compile)."""
    if reference_s <= 0 or kind != "cpu" or runtime == "torch_compile":
        return None
    return max(SLOW_X * reference_s, MIN_GATE_S)  # (a first call's fixed cost)


def warm_limit(reference_warm_s: float) -> float:
    """How long a candidate's two warm requests may run, the reference's having taken
    ``reference_warm_s``."""
    return max(SLOW_X * reference_warm_s, MIN_WARM_S)


def too_slow(
    took: float,
    times: Sequence[float],
    reference_times: Sequence[float],
    reference_window_s: float,
    fits: Callable[[float], bool],
) -> str:
    """Why a candidate whose quality set passed in ``took`` s (``times`` per request)
    is not measured at saturation; "" when it is. ``fits(s)``: whether ``s`` more
    seconds fit in the budget."""
    if took < MIN_GATE_S or not reference_times or not times:
        return ""  # (a small set: its first calls dominate, and nothing is saved)
    x = statistics.median(t / max(r, 1e-6) for t, r in zip(times, reference_times, strict=False))
    if x > SLOW_X:
        return f"{SLOWER} per quality-set request ({x:.1f}x, {took:.1f}s in all): not measured"
    need = x * reference_window_s
    if reference_window_s and not fits(need):
        return (
            f"the time budget ran out: {x:.1f}x the reference's time per quality-set "
            f"request, so its window would take about {need:.0f}s"
        )
    return ""


class TooLong(Exception):
    """``what`` ran past its ``cap`` seconds (``within``)."""

    def __init__(self, what: str, cap: float) -> None:
        super().__init__(f"{what} ran past {cap:.{0 if cap >= 10 else 1}f}s")
        self.what, self.cap = what, cap


async def within(
    aw: Awaitable[T],
    cap: float,
    pauses: pauses_mod.Read = pauses_mod.never,
    what: str = WINDOW,
) -> T:
    """``aw``, given ``cap`` seconds of its own time (a background tune's pauses left
    out); cancelled, and TooLong raised, once it has run longer."""
    task = asyncio.ensure_future(aw)
    paused0, t0 = pauses().seconds, time.monotonic()
    while True:
        left = t0 + cap + (pauses().seconds - paused0) - time.monotonic()
        if left <= 0:
            await cancel_and_wait(task, errors=True)
            raise TooLong(what, cap)
        try:
            done, _ = await asyncio.wait({task}, timeout=min(left, 1.0))
        except asyncio.CancelledError:
            task.cancel()  # (its caller is gone: so is it)
            raise
        if done:
            return task.result()
