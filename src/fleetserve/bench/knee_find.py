"""The knee of a load sweep: pure functions over measured points, no I/O.

A sweep measures a server at increasing offered rates (:class:`KneePoint` each). The
**knee** is the highest offered rate the server keeps up with: achieved/offered >=
:data:`KEEP_UP` (0.98) and, when an SLO is given, p99 <= the SLO. It is the highest
such rate even when a lower one missed (noise, on a shared machine); its reason says so.

Without an SLO the knee is found by Kneedle (Satopaa et al., 2011) on **p99 latency
against offered rate**, a convex increasing curve: flat while the server keeps up,
then climbing as queues form. That curve, not achieved against offered, because the
elbow of achieved against offered is the saturation point, which the 0.98 criterion
already finds directly; the elbow of the latency curve is where queueing starts to
cost, the operating point an SLO would otherwise pick. The Kneedle point is then held
to the throughput criterion too (the highest rate at or below it that keeps up).
Kneedle sees the curve up to p99's peak, made non-decreasing (past saturation p99 is
bounded by the run's length and plateaus). A p99 curve that rises by less than
:data:`FLAT_RISE` has no knee: the server was not pushed hard enough to show one.

:func:`kneedle` follows ``kneed`` 0.9.0's offline algorithm (no smoothing), which a
test cross-checks it against.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

KEEP_UP = 0.98  # achieved/offered at or above this: the server kept up
FLAT_RISE = 0.5  # p99 must peak this fraction above its first value for a knee


@dataclass(frozen=True)
class KneePoint:
    """One offered rate, measured. Rates per second; latencies from scheduled arrival."""

    offered_rps: float
    achieved_rps: float
    offered_tokens_s: float
    achieved_tokens_s: float
    p50_ms: float
    p99_ms: float
    errors: int

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    @property
    def keeps_up(self) -> bool:
        return self.offered_rps > 0 and self.achieved_rps >= KEEP_UP * self.offered_rps


@dataclass(frozen=True)
class Knee:
    """``knee_rps``: the knee (None: no rate met the criteria); ``kneedle_rps``: the
    Kneedle point of p99 against offered rate, with or without an SLO (None: none)."""

    slo_ms: float | None
    knee_rps: float | None
    kneedle_rps: float | None
    point: KneePoint | None
    method: str  # "slo" (criteria with the SLO) or "kneedle" (no SLO given)
    reason: str  # one line: why this point, or why none
    beyond_sweep: bool = False  # every rate kept up: the knee is above the sweep

    def as_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["point"] = self.point.as_dict() if self.point else None
        return out


def find_knee(points: Sequence[KneePoint], slo_ms: float | None) -> Knee:
    """The knee of ``points`` (any order) under ``slo_ms`` (None: Kneedle on p99)."""
    pts = sorted(points, key=lambda p: p.offered_rps)
    method = "slo" if slo_ms is not None else "kneedle"
    if not pts:
        return Knee(slo_ms, None, None, None, method, "no points measured")
    kneedle_rps = _kneedle_rps(pts)

    def ok(p: KneePoint) -> bool:
        return p.keeps_up and (slo_ms is None or p.p99_ms <= slo_ms)

    if slo_ms is None and kneedle_rps is not None:
        cands = [p for p in pts if p.offered_rps <= kneedle_rps and ok(p)]
        why = f"Kneedle point of p99 against offered rate at {kneedle_rps:.4g} req/s"
    else:
        cands = [p for p in pts if ok(p)]
        why = (
            f"highest rate with achieved >= {KEEP_UP:.0%} of offered and p99 <= {slo_ms:g} ms"
            if slo_ms is not None
            else f"p99 shows no knee: highest rate with achieved >= {KEEP_UP:.0%} of offered"
        )
    if not cands:
        return Knee(slo_ms, None, kneedle_rps, None, method, _why_none(pts[0], slo_ms))
    best = cands[-1]
    beyond = best is pts[-1] and (slo_ms is not None or kneedle_rps is None)
    missed = [p for p in pts if p.offered_rps < best.offered_rps and not ok(p)]
    if missed:
        why += f"; a lower rate ({missed[-1].offered_rps:.4g} req/s) missed: noise?"
    elif beyond:
        why += "; every rate up to the highest swept passed: the knee may lie above"
    return Knee(slo_ms, best.offered_rps, kneedle_rps, best, method, why, beyond)


def _kneedle_rps(pts: Sequence[KneePoint]) -> float | None:
    """Kneedle on p99 against offered rate, up to p99's peak and made non-decreasing:
    past saturation p99 is bounded by the run's length, and its plateau or dip would
    read as a knee at the end."""
    ys = [p.p99_ms for p in pts]
    if not ys or not all(math.isfinite(y) for y in ys):
        return None
    top = ys.index(max(ys))
    ys = list(itertools.accumulate(ys[: top + 1], max))
    if ys[-1] <= (1 + FLAT_RISE) * ys[0]:
        return None  # flat: no knee to see
    xs = [p.offered_rps for p in pts[: top + 1]]
    k = kneedle(xs, ys, curve="convex", direction="increasing")
    return xs[k] if k is not None else None


def _why_none(first: KneePoint, slo_ms: float | None) -> str:
    at = f"at the lowest rate, {first.offered_rps:.4g} req/s,"
    if not first.keeps_up:
        return f"{at} achieved was {first.achieved_rps:.4g} req/s already: sweep lower"
    if slo_ms is not None and first.p99_ms > slo_ms:
        return f"{at} p99 was {first.p99_ms:.4g} ms, over the {slo_ms:g} ms SLO: sweep lower"
    return "no rate at or below the Kneedle point kept up"


def kneedle(
    xs: Sequence[float],
    ys: Sequence[float],
    *,
    curve: str = "convex",
    direction: str = "increasing",
    sensitivity: float = 1.0,
) -> int | None:
    """The index of the knee of ``ys`` over ascending ``xs``, or None if there is none.

    Offline Kneedle as ``kneed.KneeLocator(xs, ys, S=sensitivity, curve=curve,
    direction=direction).knee`` computes it: normalize both axes to [0, 1], turn the
    curve into a concave increasing one (mirroring x and y as needed), take the
    difference curve y - x and return the first local maximum after which the
    difference drops below that maximum less ``sensitivity`` times the mean x step.
    """
    if curve not in ("convex", "concave") or direction not in ("increasing", "decreasing"):
        raise ValueError("curve is convex or concave; direction increasing or decreasing")
    n = len(xs)
    if n != len(ys):
        raise ValueError("xs and ys must have the same length")
    if n < 3 or max(xs) == min(xs) or max(ys) == min(ys):
        return None
    xn, yn = _normalize(xs), _normalize(ys)
    # to a concave increasing curve (kneed's transform_y, and x mirrored by value)
    if direction == "decreasing":
        yn = yn[::-1] if curve == "concave" else [max(yn) - y for y in yn]
    elif curve == "convex":
        yn = [max(yn) - y for y in yn][::-1]
    mirrored = (direction, curve) in (("decreasing", "concave"), ("increasing", "convex"))
    if mirrored:
        xn = [1 - x for x in xn][::-1]
    diff = [y - x for x, y in zip(xn, yn, strict=True)]
    maxima = [i for i in range(n) if _extremum(diff, i, greater=True)]
    minima = {i for i in range(n) if _extremum(diff, i, greater=False)}
    if not maxima:
        return None
    step = (xn[-1] - xn[0]) / (n - 1)  # the mean x step (xn ascends)
    thresholds = {i: diff[i] - sensitivity * step for i in maxima}
    threshold, at, active = 0.0, maxima[0], True
    for i in range(maxima[0], n - 1):
        if i in thresholds:
            threshold, at, active = thresholds[i], i, True
        if i in minima:
            threshold, active = 0.0, False
        if active and diff[i + 1] < threshold:
            return n - 1 - at if mirrored else at
    return None


def _normalize(v: Sequence[float]) -> list[float]:
    lo, hi = min(v), max(v)
    return [(x - lo) / (hi - lo) for x in v]


def _extremum(v: Sequence[float], i: int, *, greater: bool) -> bool:
    """scipy's ``argrelextrema`` with ``greater_equal``/``less_equal`` and mode clip."""
    left, right = v[max(i - 1, 0)], v[min(i + 1, len(v) - 1)]
    if greater:
        return v[i] >= left and v[i] >= right
    return v[i] <= left and v[i] <= right
