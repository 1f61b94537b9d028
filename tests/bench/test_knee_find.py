"""The knee finder on synthetic sweeps, and Kneedle against the kneed package."""

from __future__ import annotations

import math
import random

import pytest

from fleetserve.bench.knee_find import KneePoint, find_knee, kneedle

RATES = [10.0, 15.0, 22.0, 33.0, 50.0, 75.0, 110.0, 165.0]


def server(rate: float, cap: float = 60.0, base_ms: float = 20.0) -> KneePoint:
    """A server of capacity ``cap`` req/s: keeps up below it; p99 grows as M/M/1's."""
    achieved = min(rate, cap)
    rho = min(rate / cap, 0.999)
    p99 = base_ms * (1 + 4 * rho / (1 - rho)) if rate < cap else base_ms * 200 * rate / cap
    return KneePoint(rate, achieved, rate * 64, achieved * 64, base_ms / (1 - rho / 2), p99, 0)


def sweep(rates: list[float] = RATES, **kw: float) -> list[KneePoint]:
    return [server(r, **kw) for r in rates]


def test_point_fields_and_as_dict() -> None:
    p = server(10)
    assert list(p.as_dict()) == [
        "offered_rps",
        "achieved_rps",
        "offered_tokens_s",
        "achieved_tokens_s",
        "p50_ms",
        "p99_ms",
        "errors",
    ]
    with pytest.raises(AttributeError):
        p.errors = 1  # type: ignore[misc]


def test_with_an_slo_the_knee_is_the_highest_rate_within_it() -> None:
    pts = sweep()
    within = [p for p in pts if p.p99_ms <= 200 and p.achieved_rps >= 0.98 * p.offered_rps]
    knee = find_knee(list(reversed(pts)), slo_ms=200)  # any order
    assert knee.method == "slo"
    assert knee.knee_rps == within[-1].offered_rps == 33.0
    assert knee.point == within[-1] and not knee.beyond_sweep
    assert "200 ms" in knee.reason
    # a looser SLO: throughput is what stops it (75 req/s falls behind a 60 req/s server)
    assert find_knee(pts, slo_ms=1e6).knee_rps == 50.0


def test_without_an_slo_kneedle_on_p99_against_offered() -> None:
    pts = sweep()
    knee = find_knee(pts, slo_ms=None)
    assert knee.method == "kneedle"
    assert knee.kneedle_rps is not None
    expected = RATES[kneedle(RATES, [p.p99_ms for p in pts]) or 0]
    assert knee.kneedle_rps == expected
    # held to the throughput criterion: at or below the Kneedle point, keeping up
    assert knee.knee_rps is not None and knee.knee_rps <= knee.kneedle_rps <= 60
    assert "Kneedle" in knee.reason
    assert find_knee(pts, slo_ms=1e6).kneedle_rps == knee.kneedle_rps  # reported either way


def test_kneedle_ignores_the_plateau_past_saturation() -> None:
    # measured: p99 is capped by the run's length once the server falls behind, and dips
    rates = [0.4, 1.43, 3.61, 6.54, 14.9, 30.0, 60.7]
    p99 = [33, 44, 64, 99, 240, 2790, 2660]
    got = [6.4 if r > 14.9 else r for r in rates]
    pts = [KneePoint(r, a, 0, 0, y / 2, y, 0) for r, a, y in zip(rates, got, p99, strict=True)]
    knee = find_knee(pts, slo_ms=None)
    assert knee.kneedle_rps == 14.9 == knee.knee_rps  # not the last rate
    assert find_knee([*pts, pts[-1]], slo_ms=None).kneedle_rps == 14.9  # a flat tail too


def test_never_saturates() -> None:
    pts = sweep(cap=1e6)  # p99 about flat, everything keeps up
    for slo in (None, 1000.0):
        knee = find_knee(pts, slo_ms=slo)
        assert knee.knee_rps == RATES[-1]
        assert knee.beyond_sweep
        assert "above" in knee.reason
    assert find_knee(pts, slo_ms=None).kneedle_rps is None  # no knee on a flat curve


def test_saturated_at_the_first_rate() -> None:
    pts = sweep(cap=5.0)
    for slo in (None, 1e9):
        knee = find_knee(pts, slo_ms=slo)
        assert knee.knee_rps is None and knee.point is None
        assert "sweep lower" in knee.reason
    over = find_knee(sweep(), slo_ms=1.0)  # keeps up, but never within a 1 ms SLO
    assert over.knee_rps is None and "SLO" in over.reason


def test_empty() -> None:
    knee = find_knee([], slo_ms=100)
    assert knee.knee_rps is None and knee.kneedle_rps is None and knee.point is None
    assert knee.as_dict()["point"] is None
    assert find_knee([], None).method == "kneedle"


def test_as_dict_nests_the_point() -> None:
    d = find_knee(sweep(), slo_ms=200).as_dict()
    assert set(d) >= {"slo_ms", "knee_rps", "kneedle_rps", "point", "method", "reason"}
    assert d["point"]["offered_rps"] == d["knee_rps"]


def test_kneedle_edge_cases() -> None:
    assert kneedle([], []) is None
    assert kneedle([1, 2], [1, 5]) is None
    assert kneedle([1, 2, 3, 4], [5, 5, 5, 5]) is None
    with pytest.raises(ValueError):
        kneedle([1, 2, 3], [1, 2])
    with pytest.raises(ValueError):
        kneedle([1, 2, 3], [1, 2, 3], curve="wiggly")


def _curves() -> list[tuple[list[float], list[float], str, str]]:
    rng = random.Random(7)
    uniform = [float(x) for x in range(1, 21)]
    geometric = [2.0 * 1.3**k for k in range(12)]
    out = []
    for xs in (uniform, geometric, RATES):
        for curve, direction, f in (
            ("convex", "increasing", lambda x, top=xs[-1]: math.exp(x / top * 5)),
            ("concave", "increasing", lambda x: math.log(x)),
            ("convex", "decreasing", lambda x: 1 / x),
            ("concave", "decreasing", lambda x, top=xs[-1]: -math.exp(x / top * 4)),
        ):
            out.append((xs, [f(x) for x in xs], curve, direction))
            noisy = [f(x) * (1 + rng.uniform(-0.05, 0.05)) for x in xs]
            out.append((xs, noisy, curve, direction))
    out.append((RATES, [p.p99_ms for p in sweep()], "convex", "increasing"))
    return out


@pytest.mark.parametrize("case", range(len(_curves())))
def test_kneedle_agrees_with_kneed(case: int) -> None:
    kneed = pytest.importorskip("kneed", reason="kneed (the dev extra) is not installed")
    xs, ys, curve, direction = _curves()[case]
    for s in (1.0, 0.5, 2.0):
        ours = kneedle(xs, ys, curve=curve, direction=direction, sensitivity=s)
        theirs = kneed.KneeLocator(xs, ys, S=s, curve=curve, direction=direction).knee
        assert (xs[ours] if ours is not None else None) == theirs, (curve, direction, s)
