"""The event loop's shared state: batch forming, the event heap and the metrics of a run.

How work reaches the workers (the pull queue, the push routers) is in ``policies``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, count
from typing import Any

from .params import POLICIES, Params
from .workload import Workload, _budgets

_IDX_BITS = 16  # window slot packed into the low bits of each item's sort key
_IDX_MASK = (1 << _IDX_BITS) - 1
_DONE, _PULL, _DELIVER, _SEEN, _PUBLISH = 0, 1, 2, 3, 4


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


class _Engine:
    """One run's state, the batch former and the metrics; ``policies._Sim`` drives it."""

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
