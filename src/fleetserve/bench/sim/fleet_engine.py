"""The fleet scenario's event-driven engine: ``FleetSim`` runs one configuration (the
rules are described in ``fleet.py``), ``simulate_fleet`` is the short way to call it."""

from __future__ import annotations

import heapq
import math
from collections import deque
from itertools import accumulate, count

from ...fleet.policy import Policy, Resident, make_policy, victims, worth_waiting
from .fleet_model import EVICTIONS, FleetParams, FleetRun, FleetWorkload
from .hindsight import Hindsight, until_next


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


_BATCH, _LOAD, _KICK = 0, 1, 2


class FleetSim:
    """One configuration: ``workers`` workers serve ``wl`` with the given rules.

    ``trace``, when given, gets ``(t, worker, model, used_bytes, budget)`` after every
    load has reserved its memory, and ``check`` (tests) recounts every worker's bytes
    from its residents at each load.
    """

    def __init__(
        self,
        wl: FleetWorkload,
        workers: int,
        p: FleetParams,
        *,
        affinity: bool,
        eviction: str,
        trace: list[tuple[float, int, int, int, int]] | None = None,
        check: bool = False,
    ) -> None:
        if workers < 1:
            raise ValueError("need at least one worker")
        if eviction not in EVICTIONS:
            raise ValueError(f"eviction must be one of {EVICTIONS}, not {eviction!r}")
        self.wl, self.p, self.nw = wl, p, workers
        self.affinity, self.eviction = affinity, eviction
        self.trace, self.check = trace, check
        nm = len(wl.models)
        self.size = [m.bytes for m in wl.models]
        self.reload = [m.reload_s for m in wl.models]
        self.service = [m.service_s for m in wl.models]
        self.rate = p.utilization * workers / wl.mean_service_s
        self.closed = p.clients  # a closed loop: arrivals are set as the clients send
        if self.closed:
            self.arr = [math.inf] * len(wl.which)
        else:
            self.arr = list(accumulate(g * (1.0 / self.rate) for g in wl.gaps))
        self.which = wl.which
        self.index = {m.name: k for k, m in enumerate(wl.models)}
        n = len(self.arr)
        self.q: list[deque[int]] = [deque() for _ in range(nm)]
        self.taken = bytearray(n)
        self.gptr = 0  # every request before it has been taken
        self.arrived = 0
        self.done = [math.nan] * n
        self.missed = bytearray(n)
        self.uses: list[list[int]] = [[] for _ in range(nm)]  # each model's requests
        for rid, k in enumerate(wl.which):
            self.uses[k].append(rid)
        self.policy = [self._policy(eviction) for _ in range(workers)]
        self.res: list[dict[int, Resident]] = [{} for _ in range(workers)]
        self.used = [0] * workers
        self.peak = [0] * workers
        self.loading = [-1] * workers
        self.local: list[dict[int, list[int]]] = [{} for _ in range(workers)]
        self.computing = [-1] * workers  # the model of the batch in flight
        self.batched = [0] * workers  # its requests
        self.holders: list[set[int]] = [set() for _ in range(nm)]  # resident or loading
        self.idle: dict[int, None] = dict.fromkeys(range(workers))  # compute free, in order
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = count()
        i0 = min(n - 1, int(n * p.warmup))
        self.first, self.t0, self.t1 = i0, self.arr[i0], self.arr[-1]  # (closed: as sent)
        self.loads = self.evictions = 0
        self.load_s = self.busy_s = 0.0
        self.deferred: list[dict[int, float]] = [{} for _ in range(workers)]  # since when

    def _policy(self, eviction: str) -> Policy:
        if eviction != "hindsight":
            return make_policy(eviction)

        def next_use(model: str) -> float:  # (the simulator knows the requests to come)
            k = self.index[model]
            return until_next(self.uses[k], self.arrived, bool(self.q[k]))

        return Hindsight(next_use)

    # ---- the loop -------------------------------------------------------------------

    def run(self) -> FleetRun:
        arr, heap, n = self.arr, self.heap, len(self.arr)
        i = 0
        if self.closed:  # each client sends its first request; the rest follow answers
            for _ in range(min(self.closed, n)):
                self._send(0.0)
            i = n
        while i < n or heap:
            if i < n and (not heap or arr[i] <= heap[0][0]):
                t = arr[i]
                self.q[self.which[i]].append(i)
                self.arrived = i = i + 1
                if self.idle:
                    self._wake(i - 1, t)
                continue
            t, _, kind, x = heapq.heappop(heap)
            if kind == _BATCH:
                self._batch_done(x, t)
            elif kind == _LOAD:
                self._load_done(x, t)
            elif self.q[x] and self.idle:  # _KICK: a model lost a holder
                self._wake(self.q[x][0], t)
        if self.closed:  # the measured span ends with the last answer
            self.t1 = max(self.done)
        return self._metrics()

    def _send(self, t: float) -> None:
        """A client sends the trace's next request (the closed loop)."""
        i = self.arrived
        if i >= len(self.arr):
            return
        self.arr[i] = t
        if i == self.first:
            self.t0 = t
        self.q[self.which[i]].append(i)
        self.arrived = i + 1
        if self.idle:
            self._wake(i, t)

    def _push(self, t: float, kind: int, x: int) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), kind, x))

    def _wake(self, rid: int, t: float) -> None:
        """Idle workers, the model's holders first, decide until one takes ``rid``."""
        m = self.which[rid]
        if self.affinity:
            for h in self.holders[m]:
                if h in self.idle and m in self.res[h]:
                    self._decide(h, t)
                    return
            if not self._eligible(m):
                return
        for w in list(self.idle):
            lw = self.loading[w]
            if lw >= 0 and m not in self.res[w] and (self.affinity or m != lw):
                continue  # nothing has changed for it: it cannot load now
            self._decide(w, t)
            if self.taken[rid]:
                return

    def _batch_done(self, w: int, t: float) -> None:
        m = self.computing[w]
        self.computing[w] = -1
        self.res[w][m].busy = False
        if self.closed:  # each answered client sends its next
            for _ in range(self.batched[w]):
                self._send(t)
        self._decide(w, t)

    def _load_done(self, w: int, t: float) -> None:
        m = self.loading[w]
        self.loading[w] = -1
        r = Resident(self.wl.models[m].name, self.size[m], self.reload[m], last_used=t)
        self.res[w][m] = r
        self.policy[w].loaded(r, t)
        if self.computing[w] < 0:
            self._decide(w, t)

    # ---- decisions ------------------------------------------------------------------

    def _oldest_rid(self) -> int:
        """The oldest request still queued, -1 if none."""
        taken, g = self.taken, self.gptr
        while g < self.arrived and taken[g]:
            g += 1
        self.gptr = g
        return g if g < self.arrived else -1

    def _oldest(self) -> float:
        g = self._oldest_rid()
        return self.arr[g] if g >= 0 else math.inf

    def _eligible(self, m: int) -> bool:
        """Affinity: no other worker holds ``m`` with room to spare."""
        hs = self.holders[m]
        if not hs:
            return True
        if len(self.q[m]) < self.p.batch:
            return False
        return not any(h in self.idle and m in self.res[h] for h in hs)

    def _decide(self, w: int, t: float) -> None:
        """Worker ``w``'s compute is free: what it pulls, loads and runs next."""
        if self.affinity:
            self._decide_affinity(w, t)
        else:
            self._decide_oldest(w, t)
        if self.computing[w] < 0:
            self.idle[w] = None
        else:
            self.idle.pop(w, None)

    def _ready(self, w: int) -> int:
        """A resident model with requests waiting on this worker (after a load)."""
        for m in self.local[w]:
            if m in self.res[w]:
                return m
        return -1

    def _decide_affinity(self, w: int, t: float) -> None:
        q, arr, res = self.q, self.arr, self.res[w]
        ready = self._ready(w)
        if self.loading[w] < 0:
            idle = ready < 0 and not any(q[m] for m in res)
            if idle or t - self._oldest() > self.p.affinity_wait_s:
                limit = math.inf if idle else t - self.p.affinity_wait_s
                cold = sorted(
                    (arr[qm[0]], m)
                    for m, qm in enumerate(q)
                    if qm and arr[qm[0]] <= limit and m not in res and self._eligible(m)
                )
                for _, m in cold:
                    if self._start_load(w, m, t):
                        break
        if ready >= 0:
            self._run_batch(w, ready, t)
            return
        best, head = -1, math.inf  # after the load: it may have evicted some
        for m in res:
            if q[m] and arr[q[m][0]] < head:
                best, head = m, arr[q[m][0]]
        if best >= 0:
            self._run_batch(w, best, t)

    def _decide_oldest(self, w: int, t: float) -> None:
        q, arr, res, b = self.q, self.arr, self.res[w], self.p.batch
        ready = self._ready(w)
        if ready >= 0:
            self._run_batch(w, ready, t)
            return
        skip: set[int] = set()
        while True:
            m = -1
            g = self._oldest_rid()
            if g >= 0 and not skip:  # usually the oldest message will do
                k = self.which[g]
                if self._actionable(w, k):
                    m = k
                else:
                    skip.add(k)
            if m < 0:
                head = math.inf
                for k, qk in enumerate(q):
                    if qk and arr[qk[0]] < head and k not in skip and self._actionable(w, k):
                        m, head = k, arr[qk[0]]
            if m < 0:
                return
            if m in res:
                self._run_batch(w, m, t)
                return
            if m == self.loading[w]:
                self._pull(w, m, b - len(self.local[w].get(m, ())))
            elif not self._start_load(w, m, t):
                skip.add(m)

    def _actionable(self, w: int, m: int) -> bool:
        if m in self.res[w]:
            return True
        if self.loading[w] >= 0:
            return m == self.loading[w] and len(self.local[w].get(m, ())) < self.p.batch
        return True

    def _pull(self, w: int, m: int, k: int) -> list[int]:
        """Up to ``k`` of model ``m``'s oldest requests, into ``w``'s local queue when
        ``m`` is not resident there (they missed and wait for the load)."""
        qm, taken = self.q[m], self.taken
        got = [qm.popleft() for _ in range(min(k, len(qm)))]
        for rid in got:
            taken[rid] = 1
        if got and m not in self.res[w]:
            for rid in got:
                self.missed[rid] = 1
            self.local[w].setdefault(m, []).extend(got)
        return got

    def _start_load(self, w: int, m: int, t: float) -> bool:
        """Make room for ``m`` by the policy, reserve it, pull a batch for it."""
        res = self.res[w]
        admitted = self.p.admitted_busy
        for k, r in res.items():
            r.busy = k == self.computing[w] or k in self.local[w] or (admitted and bool(self.q[k]))
        free = self.p.memory_budget - self.used[w]
        out = victims(self.policy[w], list(res.values()), self.size[m], free, t)
        if out is None or (out and admitted and self._defer(w, m, out, free, t)):
            return False
        self.deferred[w].pop(m, None)
        counted = self.t0 <= t <= self.t1
        for r in out:
            k = self.index[r.model]
            del res[k]
            self.policy[w].evicted(r)
            self.used[w] -= self.size[k]
            self.holders[k].discard(w)
            if counted:
                self.evictions += 1
            if self.q[k]:
                self._push(t, _KICK, k)
        self.used[w] += self.size[m]
        if self.used[w] > self.p.memory_budget:
            raise AssertionError(f"worker {w} over its memory budget")
        self.peak[w] = max(self.peak[w], self.used[w])
        if self.check:
            held = sum(self.size[k] for k in res) + self.size[m]
            if held != self.used[w]:
                raise AssertionError(f"worker {w} bookkeeping: {held} != {self.used[w]}")
        if self.trace is not None:
            self.trace.append((t, w, m, self.used[w], self.p.memory_budget))
        self.loading[w] = m
        self.holders[m].add(w)
        if counted:
            self.loads += 1
            self.load_s += self.reload[m]
        self._push(t + self.reload[m], _LOAD, w)
        self._pull(w, m, self.p.batch)
        return True

    def _defer(self, w: int, m: int, out: list[Resident], free: int, t: float) -> bool:
        """The embedded server's wait (``Room.make``): when the policy would rather
        evict models that are busy now, the load waits for them (the worker runs their
        batches meanwhile) at most the reload seconds that choice saves."""
        res = list(self.res[w].values())
        saved = worth_waiting(out, victims(self.policy[w], res, self.size[m], free, t, True))
        return saved > 0 and t < self.deferred[w].setdefault(m, t) + saved

    def _run_batch(self, w: int, m: int, t: float) -> None:
        rids = self.local[w].pop(m, [])
        rids += self._pull(w, m, self.p.batch - len(rids))
        r = self.res[w][m]
        pol = self.policy[w]
        for _ in range(len(rids)):
            pol.used(r, t)
        r.last_used = t
        r.busy = True
        end = t + self.service[m] * len(rids)
        for rid in rids:
            self.done[rid] = end
        self.computing[w] = m
        self.batched[w] = len(rids)
        overlap = min(end, self.t1) - max(t, self.t0)
        if overlap > 0:
            self.busy_s += overlap
        self._push(end, _BATCH, w)

    # ---- metrics --------------------------------------------------------------------

    def _metrics(self) -> FleetRun:
        n, first, arr, done = len(self.arr), self.first, self.arr, self.done
        if any(math.isnan(d) for d in done):
            raise RuntimeError("simulation ended with requests still open")
        span = max(self.t1 - self.t0, 1e-9)
        lat = [done[r] - arr[r] for r in range(first, n)]
        measured = n - first
        return FleetRun(
            workers=self.nw,
            affinity=self.affinity,
            eviction=self.eviction,
            rate_rps=measured / span if self.closed else self.rate,
            requests=measured,
            miss_rate=sum(self.missed[first:]) / measured,
            loads=self.loads,
            load_s=self.load_s,
            evictions=self.evictions,
            p50_s=_percentile(lat, 0.50),
            p99_s=_percentile(lat, 0.99),
            mean_s=sum(lat) / len(lat),
            throughput_rps=sum(1 for d in done if self.t0 <= d <= self.t1) / span,
            utilization=self.busy_s / (self.nw * span),
            loads_per_worker=self.loads / self.nw,
            peak_bytes=max(self.peak),
            completed=sum(1 for d in done if not math.isnan(d)),
        )


def simulate_fleet(
    wl: FleetWorkload, workers: int, p: FleetParams, *, affinity: bool, eviction: str
) -> FleetRun:
    return FleetSim(wl, workers, p, affinity=affinity, eviction=eviction).run()
