"""The noise: how far repeated measurements of one candidate fall apart, and so how
large a gain must be to be a gain.

Before, the noise was ``(max - min) / median`` of each of the two best points'
samples, the larger of the two, and each later call replaced it. A point's repeat
was one more window, compared with its first, taken minutes before in another phase
(right after its first load, with two lone requests as its only warm-up); with two or
three samples, one slow window (a cold first run, a burst of CPU steal) set the
figure alone, and the max of two ranges only ever picks the wider. Now:

- the shortlist is measured again in **rounds** (A B, A B, ...), never one candidate
  back to back, so drift and whatever else the machine does fall on all alike;
- every window is preceded by unmeasured **warm-up** traffic at full concurrency
  (the shapes and allocations of concurrent batches, not just two lone requests);
- the spread is the **median absolute deviation** from each point's median, pooled
  over every point measured more than once, relative to that median, scaled by
  1.4826 (so that it reads as a standard deviation would on normal data) and by
  sqrt(n / (n - 1)) (deviations from a median of few samples come out small). One
  window out of line among several moves it little; windows truly spread move it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from . import steal

if TYPE_CHECKING:
    from .search import Search

NOISY = 0.10  # repeats further apart than this: the machine was busy
METHOD = "median absolute deviation"
MAD_TO_SD = 1.4826  # MAD x this = the standard deviation, for normal data
ROUNDS = 2  # rounds of the final repeat over the shortlist
SHORTLIST = 2  # the best points repeated

T = TypeVar("T")


def deviations(samples: Sequence[float]) -> list[float]:
    """``|x / median - 1|`` for each sample, with the small-sample correction; empty
    for fewer than two samples or a median of 0."""
    n = len(samples)
    med = statistics.median(samples) if n else 0.0
    if n < 2 or med <= 0:
        return []
    k = math.sqrt(n / (n - 1))
    return [k * abs(x / med - 1.0) for x in samples]


def robust_spread(groups: Sequence[Sequence[float]]) -> float | None:
    """The relative spread of repeated measurements, each group one point's samples:
    the scaled median of every group's :func:`deviations`. ``None`` when no group
    was measured twice."""
    pooled = [d for g in groups for d in deviations(g)]
    return MAD_TO_SD * statistics.median(pooled) if pooled else None


def range_spread(samples: Sequence[float]) -> float:
    """The old figure, ``(max - min) / median``: kept for comparison in the report."""
    med = statistics.median(samples) if samples else 0.0
    return (max(samples) - min(samples)) / med if med > 0 else 0.0


def interleave(points: Sequence[T], rounds: int) -> list[T]:
    """The order of the repeats: the whole shortlist once per round, in the same
    order each round, so that no point is measured twice in a row (when there are
    two or more)."""
    return [p for _ in range(rounds) for p in points]


async def measure(s: Search, rounds: int = 1) -> None:
    """Measure the best points again in interleaved rounds; set ``s.noise`` from every
    point measured more than once (it keeps its value when none was)."""
    s.phase = "noise"
    for p in interleave(s.measured()[:SHORTLIST], rounds):
        if p.status == "rejected":  # failed in an earlier round: never brought back
            continue
        if s.clock.fits(s._measure_cost_s()):
            await s._run_point(p)
    update(s)


def update(s: Search) -> None:
    groups = [p.samples for p in s.points if len(p.samples) > 1]
    got = robust_spread(groups)
    if got is not None:
        s.noise = got
        s.noise_repeats = sum(len(g) for g in groups)
        s.noise_points = len(groups)
        s.noise_range = max(range_spread(g) for g in groups)


def warnings(s: Search) -> list[str]:
    """What the run's warnings say of the noise and the CPU steal, if anything."""
    out = []
    st = s.steal
    shared = st is not None and st > steal.SHARED
    if shared:
        out.append(
            f"the machine is being shared: the hypervisor gave {st:.0%} of the CPU "
            "time to other guests while measuring; tune again on a dedicated machine"
        )
    if s.noise > NOISY:
        why = "the CPU steal says why" if shared else "another program was probably busy"
        out.append(
            f"noisy measurements ({s.noise:.0%} spread between repeats): {why}; "
            "tune again on a quiet machine"
        )
    return out


def describe(noise: float, method: str | None, repeats: int, points: int, old: float = 0.0) -> str:
    """``noise 3.1% (median absolute deviation of 6 warmed-up measurements of 2
    candidates, repeated in interleaved rounds; their max - min: 9.0%)``."""
    if not method:  # a run document from before the method was recorded
        return f"noise (spread of repeated measurements) {noise:.1%}"
    if not repeats:
        return f"noise {noise:.1%} (no candidate was measured twice within the budget)"
    line = (
        f"noise {noise:.1%} ({method} of {repeats} warmed-up measurements of {points} "
        f"candidate{'s' if points != 1 else ''}, repeated in interleaved rounds"
    )
    return line + (f"; their max - min: {old:.1%})" if old else ")")


__all__ = ["METHOD", "NOISY", "describe", "interleave", "measure", "range_spread", "robust_spread"]
