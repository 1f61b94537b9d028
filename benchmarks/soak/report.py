"""What a soak found: RSS growth after warm-up, the requests' fates, the targets.

- **Warm-up** ends at ``warmup`` seconds (by default a fifth of the run: 2 minutes of
  10) or when every kind of request has had its first answer, whichever is later.
- **Growth** of a series is the median RSS of the last ``window`` seconds of traffic
  over the median of the first ``window`` seconds after warm-up, minus one, in percent.
  Series: each process (its whole process tree), each role (gateway, workers, nats,
  server) and the total. A process that did not live through both windows (a killed
  worker, its replacement) has no growth of its own; the role and total still count it.
- **5xx**: every HTTP attempt, retried or final. A 503 for an attempt that was in
  flight at any time from the start of a disruption to ``settle`` seconds after it
  ended (sent before it and answered during it included: a request waiting on NATS
  when NATS went down) is expected, since the SDK retries through them; every other
  5xx, and every final 5xx answer, is not.

Targets: total and per-process growth under 5 %, no lost request, no unexpected 5xx.
With disruptions, each series also gets ``after_events_pct``: the growth from the
first window after the last disruption settled, which tells a step the disruption
caused (a surviving worker taking all the traffic) from a steady climb.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any

from .traffic import Outcome

GROWTH_TARGET = 5.0


def median_in(points: Sequence[tuple[float, float]], lo: float, hi: float) -> float | None:
    vals = [v for t, v in points if lo <= t <= hi]
    return statistics.median(vals) if vals else None


def growth(
    points: Sequence[tuple[float, float]], warm: float, window: float, end: float
) -> dict[str, Any]:
    """Median of ``[warm, warm + window]`` against ``[end - window, end]``; growth None
    when the series does not cover both windows."""
    first = median_in(points, warm, warm + window)
    last = median_in(points, end - window, end)
    covered = bool(points) and points[0][0] <= warm + window / 2 and points[-1][0] >= end - 1
    pct = None
    if first and last is not None and covered:
        pct = round((last / first - 1) * 100, 2)
    peak = max((v for _, v in points), default=None)
    return {"first": first, "last": last, "growth_pct": pct, "peak": peak}


def series(samples: Iterable[dict[str, Any]], roles: dict[str, str]) -> dict[str, list[Any]]:
    """(t, RSS bytes) per process, per role (``role:<name>``) and ``total``."""
    out: dict[str, list[Any]] = {}
    for s in samples:
        t, rss = s["t"], s["rss"]
        if not rss:
            continue
        sums: Counter[str] = Counter()
        for name, v in rss.items():
            if v:
                out.setdefault(name, []).append((t, v))
                sums[f"role:{roles.get(name, name)}"] += v
        for role, v in sums.items():
            out.setdefault(role, []).append((t, v))
        out.setdefault("total", []).append((t, sum(v for v in rss.values())))
    return out


def _order(name: str) -> tuple[int, str]:
    return (2 if name == "total" else 1 if name.startswith("role:") else 0, name)


def warmup_end(outcomes: Sequence[Outcome], warmup: float) -> float:
    """``warmup``, or later if some kind of request had no answer by then."""
    first: dict[str, float] = {}
    for o in outcomes:
        if o.result == "ok" and o.done is not None:
            first[o.op] = min(first.get(o.op, o.done), o.done)
    return max([warmup, *first.values()])


def _windows(
    events: Sequence[dict[str, Any]], t0: float, settle: float
) -> list[tuple[float, float]]:
    return [(e["start"] - t0, e["end"] - t0 + settle) for e in events]


def outcomes_summary(
    outcomes: Sequence[Outcome], events: Sequence[dict[str, Any]], t0: float, settle: float
) -> dict[str, Any]:
    wins = _windows(events, t0, settle)
    final = Counter(o.result for o in outcomes)
    by_status = Counter(str(o.status) for o in outcomes if o.result == "http")
    attempts = Counter(str(a[0]) for o in outcomes for a in o.attempts)
    expected_503 = other_5xx = 0
    for o in outcomes:
        for status, sent, *answered in o.attempts:
            if isinstance(status, int) and status >= 500:
                end = answered[0] if answered else sent  # in flight over [sent, end]
                if status == 503 and any(sent <= hi and end >= lo for lo, hi in wins):
                    expected_503 += 1
                else:
                    other_5xx += 1
    final_5xx = sum(1 for o in outcomes if o.result == "http" and (o.status or 0) >= 500)
    ops: dict[str, dict[str, Any]] = {}
    for name in sorted({o.op for o in outcomes}):
        mine = [o for o in outcomes if o.op == name]
        lat = sorted(o.done - o.sent for o in mine if o.result == "ok" and o.done is not None)
        ops[name] = {
            "sent": len(mine),
            "ok": sum(o.result == "ok" for o in mine),
            "p50_ms": round(1000 * lat[len(lat) // 2], 1) if lat else None,
            "p99_ms": round(1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))], 1)
            if lat
            else None,
        }
    retried = sum(1 for o in outcomes if len(o.attempts) > 1)
    return {
        "sent": len(outcomes),
        "served": final["ok"],
        "errors_by_status": dict(sorted(by_status.items())),
        "bad_answers": final["bad"],
        "lost": final["lost"],
        "retried": retried,
        "attempts_by_status": dict(sorted(attempts.items())),
        "expected_503": expected_503,
        "unexpected_5xx": other_5xx + final_5xx,
        "final_5xx": final_5xx,
        "mean_slot_delay_s": round(statistics.fmean([o.delay for o in outcomes]), 3)
        if outcomes
        else 0.0,
        "ops": ops,
        "failures": [asdict(o) for o in outcomes if o.result != "ok"][:50],
    }


def analyse(
    samples: Sequence[dict[str, Any]],
    roles: dict[str, str],
    outcomes: Sequence[Outcome],
    events: Sequence[dict[str, Any]],
    *,
    t0: float,
    seconds: float,
    warmup: float,
    window: float,
    settle: float = 15.0,
) -> dict[str, Any]:
    """The whole verdict of one run (JSON-ready)."""
    warm = warmup_end(outcomes, warmup)
    window = min(window, max(1.0, (seconds - warm) / 2))
    calm = max([warm, *(e["end"] - t0 + settle for e in events)])
    rss = {}
    for name, points in sorted(series(samples, roles).items(), key=lambda kv: _order(kv[0])):
        rss[name] = growth(points, warm, window, seconds)
        if events:  # the same, from after the last disruption settled
            after = growth(points, calm, window, seconds)["growth_pct"]
            rss[name]["after_events_pct"] = after if calm + window < seconds - window else None
    out = outcomes_summary(outcomes, events, t0, settle)
    per_process = {k: v for k, v in rss.items() if k != "total" and not k.startswith("role:")}
    checked = {k: v["growth_pct"] for k, v in per_process.items() if v["growth_pct"] is not None}
    total = rss.get("total", {}).get("growth_pct")
    targets = {
        "rss_total_under_5pct": total is not None and total < GROWTH_TARGET,
        "rss_each_process_under_5pct": all(v < GROWTH_TARGET for v in checked.values()),
        "zero_lost": out["lost"] == 0,
        "zero_unexpected_5xx": out["unexpected_5xx"] == 0,
    }
    return {
        "warmup_end_s": round(warm, 1),
        "calm_from_s": round(calm, 1) if events else None,
        "window_s": round(window, 1),
        "rss": rss,
        "requests": out,
        "events": [{**e, "at_s": round(e["start"] - t0, 1)} for e in events],
        "targets": targets,
        "met": all(targets.values()),
    }
