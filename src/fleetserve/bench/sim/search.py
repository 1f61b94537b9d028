"""Throughput at the p99 SLO: load search, sweeps over fleet sizes, policies, lags and
cost models, and the SLO itself."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

from .engine import Run
from .params import Params
from .policies import simulate
from .synthetic import Workload, capacity_rps, fleet_speeds, make_workload

DURATION_LOAD = 0.5  # duration_s is of arrivals at this fraction of nominal capacity


@dataclass
class Point:
    """One policy at one fleet size and lag: throughput at the p99 SLO and at saturation."""

    policy: str
    workers: int
    lag_ms: float | None  # None for pull: no router
    cost: str  # the cost model's label, e.g. "gpu (assumed)"
    variant: str  # "" for the defaults, else what differs (e.g. "high water 0")
    capacity_rps: float
    requests: int
    at_slo: Run | None  # the highest load found whose p99 meets the SLO; None if none does
    saturation: Run
    tried: list[Run] = field(default_factory=list)

    @property
    def slo_rps(self) -> float:
        return self.at_slo.throughput_rps if self.at_slo else 0.0

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["slo_rps"] = self.slo_rps
        return d


def workload_for(params: Params, speeds: Sequence[float], seed: int = 0) -> Workload:
    """``params.requests`` requests, or enough for ``duration_s`` of arrivals at half the
    nominal capacity if that is more (a longer workload extends the shorter one)."""
    wl = make_workload(params, seed)
    if params.duration_s > 0:
        cap = capacity_rps(params, speeds, wl.mean_tokens)
        n = math.ceil(params.duration_s * DURATION_LOAD * cap)
        if n > params.requests:
            wl = make_workload(replace(params, requests=n), seed)
    return wl


def at_load(wl: Workload, speeds: Sequence[float], load: float, policy: str, params: Params) -> Run:
    cap = capacity_rps(params, speeds, wl.mean_tokens)
    return replace(simulate(wl, speeds, load * cap, policy, params), load=load)


def max_load_at_slo(
    wl: Workload, speeds: Sequence[float], policy: str, params: Params
) -> tuple[Run | None, list[Run]]:
    """Bisect the offered load for the highest one whose p99 stays within the SLO."""
    if params.slo_ms is None:
        raise ValueError("set params.slo_ms (see default_slo_ms)")
    slo = params.slo_ms
    tried: list[Run] = []

    def ok(load: float) -> Run | None:
        r = at_load(wl, speeds, load, policy, params)
        tried.append(r)
        keeps_up = r.throughput_rps >= params.min_goodput * r.offered_rps
        return r if r.p99_ms <= slo and keeps_up else None

    best = ok(params.min_load)
    if best is None:
        return None, tried
    lo, hi = params.min_load, 1.0
    for _ in range(params.search_steps):
        mid = (lo + hi) / 2
        r = ok(mid)
        if r is not None:
            best, lo = r, mid
        else:
            hi = mid
    return best, tried


def point(workers: int, policy: str, params: Params, seed: int = 0, variant: str = "") -> Point:
    speeds = fleet_speeds(params, workers, seed)
    wl = workload_for(params, speeds, seed)
    best, tried = max_load_at_slo(wl, speeds, policy, params)
    sat = at_load(wl, speeds, params.overload, policy, params)
    cap = capacity_rps(params, speeds, wl.mean_tokens)
    lag = None if policy == "pull" else params.lag_ms
    tried.sort(key=lambda r: r.load)
    return Point(
        policy, workers, lag, params.cost_label, variant, cap, len(wl.items), best, sat, tried
    )


Task = tuple[int, str, Params, int, str]  # workers, policy, params, seed, variant


def _point_task(t: Task) -> Point:
    return point(*t)


def plan(
    workers: Sequence[int],
    policies: Sequence[str],
    lags: Sequence[float],
    params: Sequence[Params],
    seed: int = 0,
) -> list[Task]:
    """Every (cost model, fleet size, policy, lag); pull once per fleet size (no router)."""
    out: list[Task] = []
    for p in params:
        for w in workers:
            for pol in policies:
                for lag in [p.lag_ms] if pol == "pull" else lags:
                    out.append((w, pol, replace(p, lag_ms=lag), seed, ""))
    return out


def sweep(
    tasks: Sequence[Task], jobs: int = 1, progress: Callable[[Point], None] | None = None
) -> list[Point]:
    """Every task's point; in ``jobs`` processes when more than one."""
    out: list[Point] = []
    if jobs <= 1:
        for t in tasks:
            out.append(point(*t))
            if progress:
                progress(out[-1])
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        for pt in pool.map(_point_task, tasks):
            out.append(pt)
            if progress:
                progress(pt)
    return out


def isolated_latency(params: Params, seed: int = 0) -> dict[str, float]:
    """p50/p99 of each request served alone on the slowest worker and on a mean-speed one."""
    wl = make_workload(params, seed)
    speeds = [s for _, s, w in params.fleet if w > 0]
    total = sum(w for _, _, w in params.fleet)
    mean = sum(s * w for _, s, w in params.fleet) / total
    out: dict[str, float] = {}
    for name, speed in (("slowest", min(speeds)), ("mean", mean)):
        p = replace(params, fleet=((name, speed, 1.0),), rtt_ms=0.0, warmup=0.0)
        run = simulate(wl, [speed], 1e-6, "push-rr", p)
        out[f"p50_ms_{name}"], out[f"p99_ms_{name}"] = run.p50_ms, run.p99_ms
    return out


def default_slo_ms(params: Params, seed: int = 0) -> float:
    """Twice the p99 of requests served alone on the slowest worker, to two figures.

    Chosen from the workload and the cost model only, the same for every policy: the
    slowest worker must be able to serve the tail at all, with room for queueing.
    """
    x = 2 * isolated_latency(params, seed)["p99_ms_slowest"]
    return float(f"{x:.2g}")
