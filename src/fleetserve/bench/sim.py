"""A discrete-event simulation of pull (one central queue) against push (a router).

Pure Python and ``heapq``, deterministic for a seed. Times are in milliseconds.

- Workload: Poisson arrivals; each request carries 1 to 256 items from a heavy-tailed
  mixture, each item 8 to 512 tokens (log-uniform), cut to the model's ``max_seq_len``.
  Every policy and every load replays the same requests (common random numbers): a
  higher load only compresses the arrival times.
- Workers run one batch at a time. A batch costs ``CostModel.predict_ms(tokens,
  max_len, batch_size) / speed``, with coefficients from a catalog profile. The batch
  budget (padded tokens) and the batch size cap scale with the speed by default, and
  batches are formed as the worker's batch former does: a window of the oldest items,
  sorted by length, packed while ``max_len * n`` fits the budget. Large requests span
  batches; a request completes when its last item does.
- ``pull``: one FIFO queue. A worker that needs work pays a broker round trip, pulls
  whole requests oldest first until its window is full, forms a batch and puts the
  requests it did not touch back at the head (counted as put-backs).
- ``push-*``: a router sends each request to one worker's FIFO, one hop later.
  ``push-rr`` is round robin; ``push-lor`` picks the least outstanding requests as the
  router sees them; ``push-loc`` (a stronger baseline that knows each worker's speed
  and each request's cost) picks the earliest expected finish. There are ``routers``
  routers (gateways, taking arrivals in turn). Each sees its own assignments at once
  and everything else (other routers' assignments, all completions) ``lag_ms`` late.
- A load meets the SLO when p99 is within it and the fleet keeps up (completions in
  the measured window reach ``min_goodput`` of arrivals): a short run can hide an
  overload whose queue has not yet grown past the SLO.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from itertools import accumulate, count
from typing import Any

import numpy as np
import numpy.typing as npt

from ..catalog import Catalog, CostModel

POLICIES = ("pull", "push-rr", "push-lor", "push-loc")
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# (weight, fewest items, most items): most requests are single queries, a few are bulk
DEFAULT_MIX: tuple[tuple[float, int, int], ...] = ((0.70, 1, 1), (0.25, 2, 32), (0.05, 33, 256))
# (label, speed, share of the fleet)
MIXED_FLEET: tuple[tuple[str, float, float], ...] = (
    ("L4", 1.0, 0.5),
    ("A100", 2.5, 0.3),
    ("H100", 4.0, 0.2),
)
HOMOGENEOUS: tuple[tuple[str, float, float], ...] = (("1x", 1.0, 1.0),)

_IDX_BITS = 16  # window slot packed into the low bits of each item's sort key
_IDX_MASK = (1 << _IDX_BITS) - 1
_DONE, _PULL, _DELIVER, _SEEN, _PUBLISH = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class Params:
    """Everything the simulation assumes, printed with every report."""

    cost: CostModel = field(default_factory=CostModel)
    cost_source: str = "defaults"
    max_batch_tokens: int = 2048
    max_batch_size: int = 32
    max_seq_len: int = 512
    fleet: tuple[tuple[str, float, float], ...] = MIXED_FLEET
    scale_budget: bool = True  # faster workers get proportionally larger batches
    mix: tuple[tuple[float, int, int], ...] = DEFAULT_MIX
    item_tokens: tuple[int, int] = (8, 512)
    requests: int = 20_000
    warmup: float = 0.1  # fraction of requests (by arrival) left out of the metrics
    rtt_ms: float = 0.3  # pull: broker round trip per pull; push: router-to-worker hop
    lag_ms: float = 20.0  # push: how late a router learns what it did not do itself
    routers: int = 1  # push: routers (gateways); 1 is the strongest push baseline
    slo_ms: float | None = None  # p99 target for "throughput at SLO"; None: default_slo_ms
    search_steps: int = 7
    min_load: float = 0.02  # lowest offered load tried, as a fraction of nominal capacity
    overload: float = 1.25  # offered load for the saturation run
    min_goodput: float = 0.98  # completions over arrivals for a load to count as sustained

    def __post_init__(self) -> None:
        if not self.fleet or any(s <= 0 or w < 0 for _, s, w in self.fleet):
            raise ValueError("fleet speeds must be positive and shares non-negative")
        if sum(w for _, _, w in self.fleet) <= 0 or sum(w for w, _, _ in self.mix) <= 0:
            raise ValueError("fleet shares and mix weights must not all be zero")
        if any(lo < 1 or hi < lo for _, lo, hi in self.mix):
            raise ValueError("request sizes need 1 <= fewest <= most")
        if self.item_tokens[0] < 1 or self.item_tokens[1] < self.item_tokens[0]:
            raise ValueError("item tokens need 1 <= shortest <= longest")
        if self.routers < 1:
            raise ValueError("need at least one router")
        if self.requests < 10 or not 0 <= self.warmup < 0.9:
            raise ValueError("need at least 10 requests and a warmup fraction below 0.9")

    @classmethod
    def from_catalog(cls, model: str = DEFAULT_MODEL, hardware: str = "cpu", **kw: Any) -> Params:
        """Cost coefficients, budgets and ``max_seq_len`` from a catalog profile."""
        spec = Catalog.load().get(model)
        prof = spec.profile(hardware)
        return cls(
            cost=prof.cost,
            cost_source=f"{model} profile {prof.hardware!r}",
            max_batch_tokens=prof.max_batch_tokens,
            max_batch_size=prof.max_batch_size,
            max_seq_len=spec.max_seq_len,
            **kw,
        )

    def describe(self) -> list[str]:
        c = self.cost
        fleet = ", ".join(f"{n} {s:g}x ({w:.0%})" for n, s, w in self.fleet)
        mix = ", ".join(f"{w:.0%} {lo}" + (f"-{hi}" if hi > lo else "") for w, lo, hi in self.mix)
        lo, hi = self.item_tokens
        return [
            f"cost model ({self.cost_source}): batch ms = ({c.fixed_ms:g} + "
            f"{c.per_token_ms:g} x tokens + {c.per_padded_token_ms:g} x max_len x batch) / speed",
            f"batch budget {self.max_batch_tokens} padded tokens and {self.max_batch_size} items "
            f"at 1x, {'scaled by' if self.scale_budget else 'not scaled by'} worker speed",
            f"fleet: {fleet}; a 1x worker runs batches exactly as fast as the cost model "
            f"predicts (the hardware it was fitted on), an Nx worker N times faster",
            f"requests: Poisson arrivals; items per request {mix} (log-uniform in each range); "
            f"{lo}-{hi} tokens per item (log-uniform), cut to max_seq_len {self.max_seq_len}",
            f"{self.requests} requests per run, first {self.warmup:.0%} left out of the metrics",
            f"pull: {self.rtt_ms:g} ms broker round trip per pull, not overlapped with the "
            f"forward; the worker fills its batch window (2 budgets or 2x the batch size cap) "
            f"oldest first from its unfinished requests and whole requests from the queue; "
            f"requests the batch did not touch go back to the head of the queue",
            f"push: {self.rtt_ms:g} ms router-to-worker hop; {self.routers} router(s), each "
            f"seeing its own assignments at once and the rest {self.lag_ms:g} ms late; "
            f"least-outstanding takes the minimum over all workers (ties at random), stronger "
            f"than power-of-two choices",
            f"p99 SLO {self.slo_ms or math.nan:g} ms, and completions >= {self.min_goodput:.0%} "
            f"of arrivals; load in fractions of nominal capacity (full batches, no padding); "
            f"highest load within the SLO by bisection ({self.search_steps} steps); "
            f"saturation = offered {self.overload:g}x nominal capacity",
        ]


@dataclass(frozen=True)
class Workload:
    gaps: list[float]  # unit-mean exponential inter-arrival gaps
    items: list[list[int]]  # each request's item lengths in tokens, shortest first
    tokens: list[int]

    @property
    def mean_tokens(self) -> float:
        return sum(self.tokens) / len(self.tokens)


def make_workload(params: Params, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    weights = [w for w, _, _ in params.mix]
    lo_t, hi_t = params.item_tokens
    cap = params.max_seq_len

    def loguni(lo: int, hi: int) -> int:
        return min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))

    gaps: list[float] = []
    items: list[list[int]] = []
    for _ in range(params.requests):
        gaps.append(rng.expovariate(1.0))
        _, lo, hi = rng.choices(params.mix, weights)[0]
        items.append(sorted(min(cap, loguni(lo_t, hi_t)) for _ in range(loguni(lo, hi))))
    return Workload(gaps, items, [sum(x) for x in items])


def fleet_speeds(params: Params, workers: int, seed: int = 0) -> list[float]:
    """``workers`` speeds in the fleet's proportions (largest remainder), seeded order."""
    total = sum(w for _, _, w in params.fleet)
    exact = [workers * w / total for _, _, w in params.fleet]
    n = [int(x) for x in exact]
    by_rest = sorted(range(len(exact)), key=lambda i: n[i] - exact[i])
    for i in by_rest[: workers - sum(n)]:
        n[i] += 1
    speeds = [s for (_, s, _), k in zip(params.fleet, n, strict=True) for _ in range(k)]
    random.Random(seed).shuffle(speeds)
    return speeds


def _budgets(params: Params, speed: float) -> tuple[int, int]:
    f = speed if params.scale_budget else 1.0
    return max(1, round(params.max_batch_tokens * f)), max(1, round(params.max_batch_size * f))


def capacity_rps(params: Params, speeds: Sequence[float], mean_tokens: float) -> float:
    """Nominal fleet capacity in requests/s: every batch full and free of padding."""
    tok_per_ms = 0.0
    for s in speeds:
        b, _ = _budgets(params, s)
        tok_per_ms += b * s / params.cost.predict_ms(b, b, 1)  # b tokens, b padded slots
    return tok_per_ms * 1000.0 / mean_tokens


@dataclass
class Run:
    """The metrics of one simulated run."""

    policy: str
    workers: int
    load: float  # offered, as a fraction of nominal capacity
    offered_rps: float
    throughput_rps: float
    items_per_s: float
    p50_ms: float
    p99_ms: float
    utilization: float
    batch_fill: float  # padded slots over the worker's batch budget
    padding_efficiency: float  # real tokens over padded slots
    batches: int
    pulls: int
    put_backs: int
    completed: int
    items_completed: int


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


class _Sim:
    def __init__(
        self, wl: Workload, speeds: Sequence[float], rate_rps: float, policy: str, p: Params
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, not {policy!r}")
        if rate_rps <= 0 or not speeds:
            raise ValueError("need a positive rate and at least one worker")
        self.wl, self.p, self.policy = wl, p, policy
        self.speeds = list(speeds)
        n, nw = len(wl.items), len(speeds)
        scale = 1000.0 / rate_rps
        self.arrivals = list(accumulate(g * scale for g in wl.gaps))
        bud = [_budgets(p, s) for s in speeds]
        self.budget = [b for b, _ in bud]
        self.maxbs = [m for _, m in bud]
        if 2 * max(self.maxbs) > _IDX_MASK:
            raise ValueError("batch size cap too large for the simulator's window")
        self.inv = [1.0 / s for s in speeds]
        self.local: list[deque[list[Any]]] = [deque() for _ in range(nw)]
        self.pending = [0] * nw
        self.busy = [False] * nw
        self.remaining = [len(x) for x in wl.items]
        self.done = [math.nan] * n
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = count()
        i0 = min(n - 1, int(n * p.warmup))
        self.t0, self.t1 = self.arrivals[i0], self.arrivals[-1]
        self.first = i0
        self.busy_ms = self.fill = self.padeff = 0.0
        self.batches = self.pulls = self.put_backs = 0

    def _push(self, t: float, kind: int, x: int) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), kind, x))

    def _batch(self, w: int, t: float) -> None:
        """Form and start the next batch of worker ``w`` from its local items."""
        loc = self.local[w]
        b, m = self.budget[w], self.maxbs[w]
        lim_n, lim_t = 2 * m, 2 * b
        keys: list[int] = []
        win: list[list[Any]] = []
        wtok = 0
        for ch in loc:
            k = len(win)
            seg = ch[1][ch[2] : ch[2] + lim_n - len(keys)]
            keys += [(x << _IDX_BITS) | k for x in seg]
            win.append(ch)
            wtok += sum(seg)
            if wtok >= lim_t or len(keys) >= lim_n:
                break
        keys.sort()
        counts = [0] * len(win)
        n = tok = last = 0
        for key in keys:
            x = key >> _IDX_BITS
            if n and (x * (n + 1) > b or n >= m):
                break
            n += 1
            tok += x
            last = x
            counts[key & _IDX_MASK] += 1
        end = t + self.p.cost.predict_ms(tok, last, n) * self.inv[w]
        rem, done = self.remaining, self.done
        for k, ch in enumerate(win):
            if counts[k]:
                ch[2] += counts[k]
                rid = ch[0]
                rem[rid] -= counts[k]
                if not rem[rid]:
                    done[rid] = end
                    if self.policy != "pull":
                        self._push(end + self.p.lag_ms, _SEEN, rid)
        for _ in win:
            loc.popleft()
        for ch in reversed(win):
            if ch[2] < len(ch[1]):
                loc.appendleft(ch)
        self.pending[w] -= tok
        self.busy[w] = True
        self._push(end, _DONE, w)
        overlap = min(end, self.t1) - max(t, self.t0)
        if overlap > 0:
            self.busy_ms += overlap
        if self.t0 <= t <= self.t1:
            self.batches += 1
            self.fill += last * n / b
            self.padeff += tok / (last * n)

    def run(self) -> Run:
        if self.policy == "pull":
            self._run_pull()
        else:
            self._run_push()
        return self._metrics()

    def _run_pull(self) -> None:
        central: deque[int] = deque()  # request ids; stays in arrival order (put-backs are older)
        idle: deque[int] = deque(range(len(self.speeds)))  # waiting pulls, served in turn
        items, tokens, rtt = self.wl.items, self.wl.tokens, self.p.rtt_ms
        arr, heap, n = self.arrivals, self.heap, len(self.arrivals)
        i = 0
        while i < n or heap:
            if i < n and (not heap or arr[i] <= heap[0][0]):
                t = arr[i]
                central.append(i)
                i += 1
                if idle:
                    w = idle.popleft()
                    self.busy[w] = True
                    self._push(t + rtt, _PULL, w)
                continue
            t, _, kind, w = heapq.heappop(heap)
            loc = self.local[w]
            if kind == _DONE:
                if central:
                    self._push(t + rtt, _PULL, w)
                elif loc:
                    self._batch(w, t)
                else:
                    self.busy[w] = False
                    idle.append(w)
                continue
            self.pulls += 1  # _PULL: oldest first, the worker's own unfinished requests
            # included, until the batch former's window is full; then put back the rest
            lim_n, lim_t = 2 * self.maxbs[w], 2 * self.budget[w]
            mine = sorted(loc, key=lambda ch: int(ch[0]))
            pulled: list[list[Any]] = []
            j = wn = wt = 0
            while wn < lim_n and wt < lim_t:
                if j < len(mine) and (not central or mine[j][0] < central[0]):
                    ch = mine[j]
                    j += 1
                elif central:
                    rid = central.popleft()
                    ch = [rid, items[rid], 0]
                    pulled.append(ch)
                    self.pending[w] += tokens[rid]
                else:
                    break
                seg = ch[1][ch[2] : ch[2] + lim_n - wn]
                wn += len(seg)
                wt += sum(seg)
            if not mine and not pulled:
                self.busy[w] = False
                idle.append(w)
                continue
            loc.clear()
            loc.extend(sorted(mine + pulled, key=lambda ch: int(ch[0])))
            self._batch(w, t)
            back = [ch for ch in pulled if ch[2] == 0]
            for ch in reversed(back):
                loc.remove(ch)
                self.pending[w] -= tokens[ch[0]]
                central.appendleft(ch[0])
                if idle:
                    w2 = idle.popleft()
                    self.busy[w2] = True
                    self._push(t + rtt, _PULL, w2)
            self.put_backs += len(back)

    def _run_push(self) -> None:
        nw, nr, lag = len(self.speeds), self.p.routers, self.p.lag_ms
        items, tokens, hop = self.wl.items, self.wl.tokens, self.p.rtt_ms
        target = [0] * len(items)
        # what every router sees lag_ms late, and what each has done itself since then
        seen_n = np.zeros(nw, dtype=np.int64)
        seen_c = np.zeros(nw, dtype=np.float64)
        own_n = np.zeros((nr, nw), dtype=np.int64)
        own_c = np.zeros((nr, nw), dtype=np.float64)
        route = self._router(seen_n, seen_c, own_n, own_c)
        arr, heap, n = self.arrivals, self.heap, len(self.arrivals)
        i = 0
        while i < n or heap:
            if i < n and (not heap or arr[i] <= heap[0][0]):
                r = i % nr
                w = route(i, r)
                target[i] = w
                own_n[r, w] += 1
                own_c[r, w] += tokens[i]
                self._push(arr[i] + hop, _DELIVER, i)
                self._push(arr[i] + lag, _PUBLISH, i)
                i += 1
                continue
            t, _, kind, x = heapq.heappop(heap)
            if kind == _DONE:
                if self.local[x]:
                    self._batch(x, t)
                else:
                    self.busy[x] = False
            elif kind == _DELIVER:
                w = target[x]
                self.local[w].append([x, items[x], 0])
                self.pending[w] += tokens[x]
                if not self.busy[w]:
                    self._batch(w, t)
            elif kind == _PUBLISH:  # the assignment reaches everyone's view
                w, r = target[x], x % nr
                own_n[r, w] -= 1
                own_c[r, w] -= tokens[x]
                seen_n[w] += 1
                seen_c[w] += tokens[x]
            else:  # _SEEN: the completion reaches everyone's view
                w = target[x]
                seen_n[w] -= 1
                seen_c[w] -= tokens[x]

    def _router(
        self,
        seen_n: npt.NDArray[np.int64],
        seen_c: npt.NDArray[np.float64],
        own_n: npt.NDArray[np.int64],
        own_c: npt.NDArray[np.float64],
    ) -> Callable[[int, int], int]:
        nw, tokens = len(self.speeds), self.wl.tokens
        inv = np.asarray(self.inv, dtype=np.float64)
        rng = random.Random(len(tokens) * 7919 + nw)
        if self.policy == "push-rr":
            return lambda i, r: i % nw
        if self.policy == "push-lor":

            def lor(i: int, r: int) -> int:
                view = seen_n + own_n[r]
                ties = np.flatnonzero(view == view.min())
                return int(ties[rng.randrange(len(ties))] if len(ties) > 1 else ties[0])

            return lor
        return lambda i, r: int(np.argmin((seen_c + own_c[r] + tokens[i]) * inv))

    def _metrics(self) -> Run:
        n = len(self.arrivals)
        arr, done, t0, t1 = self.arrivals, self.done, self.t0, self.t1
        if any(math.isnan(d) for d in done):
            raise RuntimeError("simulation ended with requests still open")
        span_s = max(t1 - t0, 1e-9) / 1000.0
        fin = [r for r in range(n) if t0 <= done[r] <= t1]
        lat = [done[r] - arr[r] for r in range(self.first, n)]
        nb = max(self.batches, 1)
        return Run(
            policy=self.policy,
            workers=len(self.speeds),
            load=0.0,
            offered_rps=(n - 1 - self.first) / span_s,
            throughput_rps=len(fin) / span_s,
            items_per_s=sum(len(self.wl.items[r]) for r in fin) / span_s,
            p50_ms=_percentile(lat, 0.50),
            p99_ms=_percentile(lat, 0.99),
            utilization=self.busy_ms / (len(self.speeds) * max(t1 - t0, 1e-9)),
            batch_fill=self.fill / nb,
            padding_efficiency=self.padeff / nb,
            batches=self.batches,
            pulls=self.pulls,
            put_backs=self.put_backs,
            completed=sum(1 for d in done if not math.isnan(d)),
            items_completed=sum(len(x) for x in self.wl.items) - sum(self.remaining),
        )


def simulate(
    wl: Workload, speeds: Sequence[float], rate_rps: float, policy: str, params: Params
) -> Run:
    """One run: ``policy`` serves ``wl`` at ``rate_rps`` on workers of the given speeds."""
    return _Sim(wl, speeds, rate_rps, policy, params).run()


@dataclass
class Point:
    """One policy at one fleet size: throughput at the p99 SLO and at saturation."""

    policy: str
    workers: int
    capacity_rps: float
    at_slo: Run | None  # the highest load found whose p99 meets the SLO; None if none does
    saturation: Run
    tried: list[Run] = field(default_factory=list)

    @property
    def slo_rps(self) -> float:
        return self.at_slo.throughput_rps if self.at_slo else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["slo_rps"] = self.slo_rps
        return d


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


def point(workers: int, policy: str, params: Params, seed: int = 0) -> Point:
    wl = make_workload(params, seed)
    speeds = fleet_speeds(params, workers, seed)
    best, tried = max_load_at_slo(wl, speeds, policy, params)
    sat = at_load(wl, speeds, params.overload, policy, params)
    cap = capacity_rps(params, speeds, wl.mean_tokens)
    return Point(policy, workers, cap, best, sat, sorted(tried, key=lambda r: r.load))


def _point_task(args: tuple[int, str, Params, int]) -> Point:
    return point(*args)


def sweep(
    workers: Sequence[int],
    policies: Sequence[str],
    params: Params,
    seed: int = 0,
    jobs: int = 1,
    progress: Callable[[Point], None] | None = None,
) -> list[Point]:
    """Every (fleet size, policy) point; in ``jobs`` processes when more than one."""
    tasks = [(w, pol, params, seed) for w in workers for pol in policies]
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
