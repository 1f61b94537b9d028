"""The event loop's shared state: the workers' formers, the event heap, the metrics.

How work reaches the workers (the pull queue, the push routers) is in ``policies``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, count

from .former import Former
from .params import POLICIES, Params
from .synthetic import Workload, _budgets

_DONE, _PULL, _DELIVER, _SEEN, _PUBLISH, _EXPIRE = 0, 1, 2, 3, 4, 5


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
    p99_interactive_ms: float
    p99_batch_ms: float
    utilization: float
    batch_fill: float  # padded slots over the worker's full batch budget
    padding_efficiency: float  # real tokens over padded slots
    batches: int
    pulls: int
    put_backs: int
    parts: int  # slices published for other workers (pull)
    completed: int
    items_completed: int
    lag_ms: float = 0.0


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


class _Engine:
    """One run's state, batches and metrics; ``policies._Sim`` drives it."""

    def __init__(
        self, wl: Workload, speeds: Sequence[float], rate_rps: float, policy: str, p: Params
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, not {policy!r}")
        if rate_rps <= 0 or not speeds:
            raise ValueError("need a positive rate and at least one worker")
        self.wl, self.p, self.policy = wl, p, policy
        self.speeds = list(speeds)
        n = len(wl.items)
        scale = 1000.0 / rate_rps
        self.arrivals = list(accumulate(g * scale for g in wl.gaps))
        self.interactive = [t <= p.interactive_cost for t in wl.tokens]
        bud = [_budgets(p, s) for s in speeds]
        self.budget = [b for b, _ in bud]
        f = [s if p.scale_budget else 1.0 for s in speeds]
        caps = [max(1, round(p.interactive_batch_tokens * x)) for x in f]
        self.formers = [
            Former(b, c, m, p.age_limit_ms, p.hold_ms) for (b, m), c in zip(bud, caps, strict=True)
        ]
        self.inv = [1.0 / s for s in speeds]
        self.busy = [False] * len(speeds)
        self.remaining = [len(x) for x in wl.items]
        self.done = [math.nan] * n
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = count()
        i0 = min(n - 1, int(n * p.warmup))
        self.t0, self.t1 = self.arrivals[i0], self.arrivals[-1]
        self.first = i0
        self.busy_ms = self.fill = self.padeff = 0.0
        self.batches = self.pulls = self.put_backs = self.parts = 0

    def _push(self, t: float, kind: int, x: int) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), kind, x))

    def _start(self, w: int, t: float) -> None:
        """Start worker ``w``'s next batch (its former is not empty)."""
        b = self.formers[w].take(t)
        end = t + self.p.cost.predict_ms(b.tokens, b.width, b.n) * self.inv[w]
        rem, done = self.remaining, self.done
        for m, c in b.done:
            rid = m.rid
            rem[rid] -= c
            if not rem[rid]:
                done[rid] = end
                if self.policy != "pull":
                    self._push(end + self.p.lag_ms, _SEEN, rid)
        self.busy[w] = True
        self._push(end, _DONE, w)
        overlap = min(end, self.t1) - max(t, self.t0)
        if overlap > 0:
            self.busy_ms += overlap
        if self.t0 <= t <= self.t1:
            self.batches += 1
            self.fill += b.width * b.n / self.budget[w]
            self.padeff += b.tokens / (b.width * b.n)

    def _metrics(self) -> Run:
        n = len(self.arrivals)
        arr, done, t0, t1 = self.arrivals, self.done, self.t0, self.t1
        if any(math.isnan(d) for d in done):
            raise RuntimeError("simulation ended with requests still open")
        span_s = max(t1 - t0, 1e-9) / 1000.0
        fin = [r for r in range(n) if t0 <= done[r] <= t1]
        lat = [done[r] - arr[r] for r in range(self.first, n)]
        inter = self.interactive[self.first :]
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
            p99_interactive_ms=_percentile([x for x, i in zip(lat, inter, strict=True) if i], 0.99),
            p99_batch_ms=_percentile([x for x, i in zip(lat, inter, strict=True) if not i], 0.99),
            utilization=self.busy_ms / (len(self.speeds) * max(t1 - t0, 1e-9)),
            batch_fill=self.fill / nb,
            padding_efficiency=self.padeff / nb,
            batches=self.batches,
            pulls=self.pulls,
            put_backs=self.put_backs,
            parts=self.parts,
            completed=sum(1 for d in done if not math.isnan(d)),
            items_completed=sum(len(x) for x in self.wl.items) - sum(self.remaining),
            lag_ms=self.p.lag_ms if self.policy != "pull" else 0.0,
        )
