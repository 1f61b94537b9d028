"""The fleet-memory scenario: many models, a memory budget per worker, cold loads and
eviction (``fleet/policy.py``), with and without model affinity in the pull.

Pure Python and ``heapq``, deterministic for a seed. Times are in seconds, sizes in bytes
(binary units: 1 MiB = 2**20).

- Models: ``models`` of them, Zipf popularity (rank ``k`` drawn with weight
  ``1 / k**zipf_s``). Sizes come from a few classes, 50 MiB to 1.5 GiB, in the classes'
  proportions and shuffled by the seed: independent of popularity. A reload takes
  ``load_fixed_s + size / load_mib_s`` times a log-normal factor; a share of the
  models are slow conversions (GGUF-like, an export on load) that take several times
  longer. A request of a model costs the model's service time (a fixed part plus a
  part per GiB, log-normal), batches cost the sum of theirs.
- Requests: one Poisson stream, a model per request by popularity; the rate is scaled
  with the workers so that compute is busy ``utilization`` of the time. Every
  configuration with the same number of workers replays the same requests.
- Workers: one batch at a time (up to ``batch`` requests of one model, pulled from that
  model's subject oldest first), and a loader thread beside it: a load takes the
  model's reload time, the worker keeps serving its resident models meanwhile, and the
  requests pulled for the loading model wait for it. One load at a time per worker.
  Memory = resident models + the one loading, never above the budget: before a load
  the worker evicts ``victims(...)`` by its own policy (GDSF or LRU); a model with a
  batch in flight or requests waiting on this worker is busy and never evicted. A
  worker pulls cold work only when its loader is free and the model can be made to fit.
- Affinity on: a worker pulls first for the models it holds (the one whose oldest
  message is oldest); it takes a cold model only when it has nothing resident to do or
  that model's oldest message has waited ``affinity_wait_s``, and never a model another
  worker holds (or is loading) with room to spare: one that is idle, or while that
  model's backlog is below one batch.
- Affinity off: a worker takes the oldest message it can act on now, whatever its model,
  and loads its model if it is not resident.
- A request misses when its model was not resident on the worker that pulled it.
  Latency = queue wait + load wait + the batch it is served in. The first ``warmup`` of
  the requests (by arrival) are left out of every metric; loads and evictions count
  when they start inside the measured window.
"""

from __future__ import annotations

import heapq
import math
import random
import re
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import accumulate, count
from typing import Any

from ...fleet.policy import Resident, make_policy, victims

MIB = 1 << 20
GIB = 1 << 30
# (size in MiB, share of the models)
SIZE_CLASSES: tuple[tuple[int, float], ...] = (
    (50, 0.35),
    (150, 0.25),
    (400, 0.20),
    (800, 0.12),
    (1536, 0.08),
)
EVICTIONS = ("gdsf", "lru")
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?b)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(s: str) -> int:
    """``3GiB``, ``3G``, ``3GB`` (all binary), ``512MiB`` or plain bytes."""
    m = _SIZE.fullmatch(s)
    if not m:
        raise ValueError(f"not a size: {s!r} (try 3GiB, 512MiB or bytes)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def fmt_bytes(n: float) -> str:
    return f"{n / GIB:g} GiB" if n >= GIB else f"{n / MIB:g} MiB"


@dataclass(frozen=True)
class FleetParams:
    """Everything the fleet scenario assumes, printed with every report."""

    models: int = 48
    zipf_s: float = 1.1
    size_classes: tuple[tuple[int, float], ...] = SIZE_CLASSES  # (MiB, share)
    load_fixed_s: float = 0.3  # open files, build the session
    load_mib_s: float = 400.0  # read and place the weights
    load_sigma: float = 0.25  # log-normal spread of every reload time
    slow_share: float = 0.2  # models that convert on load (GGUF-like, an export)
    slow_factor: tuple[float, float] = (4.0, 10.0)  # their reload, times the plain one
    service_fixed_s: float = 0.004  # per request
    service_s_per_gib: float = 0.030  # per request, per GiB of weights
    service_sigma: float = 0.4
    memory_budget: int = 3 * GIB  # per worker
    batch: int = 32  # requests of one model per pull / batch
    utilization: float = 0.6  # of compute, sets the arrival rate
    affinity_wait_s: float = 2.0
    requests_per_worker: int = 5000
    warmup: float = 0.2

    def __post_init__(self) -> None:
        if self.models < 1 or self.batch < 1:
            raise ValueError("need at least one model and a batch of at least one")
        if not 0 < self.utilization < 1:
            raise ValueError("utilization must be within (0, 1)")
        if not self.size_classes or any(s <= 0 or w < 0 for s, w in self.size_classes):
            raise ValueError("size classes need positive sizes and non-negative shares")
        if sum(w for _, w in self.size_classes) <= 0:
            raise ValueError("size class shares must not all be zero")
        biggest = max(s for s, w in self.size_classes if w > 0) * MIB
        if biggest > self.memory_budget:
            raise ValueError(
                f"the memory budget {fmt_bytes(self.memory_budget)} cannot hold the "
                f"largest model ({fmt_bytes(biggest)})"
            )
        if self.requests_per_worker < 10 or not 0 <= self.warmup < 0.9:
            raise ValueError("need 10+ requests per worker and a warmup fraction below 0.9")
        if self.load_mib_s <= 0 or self.affinity_wait_s < 0:
            raise ValueError("need a positive load speed and a non-negative affinity wait")

    def describe(self) -> list[str]:
        classes = ", ".join(
            f"{fmt_bytes(s * MIB)} {w / sum(x for _, x in self.size_classes):.0%}"
            for s, w in self.size_classes
        )
        lo, hi = self.slow_factor
        return [
            f"{self.models} models, Zipf popularity s={self.zipf_s:g}; sizes {classes} "
            "(in these proportions, shuffled: independent of popularity)",
            f"reload = ({self.load_fixed_s:g} s + size / {self.load_mib_s:g} MiB/s) x "
            f"lognormal(sigma {self.load_sigma:g}); {self.slow_share:.0%} of the models "
            f"convert on load, {lo:g}-{hi:g}x slower",
            f"service per request = ({self.service_fixed_s * 1000:g} ms + "
            f"{self.service_s_per_gib * 1000:g} ms per GiB) x lognormal(sigma "
            f"{self.service_sigma:g}); a batch (up to {self.batch} requests of one model) "
            "costs the sum",
            f"Poisson arrivals at {self.utilization:.0%} of the fleet's compute; "
            f"{self.requests_per_worker} requests per worker, the first "
            f"{self.warmup:.0%} left out of the metrics",
            f"memory budget {fmt_bytes(self.memory_budget)} per worker (resident + "
            "loading); loads on a loader thread, one at a time, while the worker keeps "
            "serving its resident models",
            f"affinity: resident models first, a cold one only when idle or its oldest "
            f"message waited {self.affinity_wait_s:g} s, never one held by a worker with "
            "room (idle, or its backlog under one batch); off: oldest message first",
        ]


@dataclass(frozen=True)
class Model:
    name: str
    bytes: int
    reload_s: float
    service_s: float
    popularity: float  # share of the requests


@dataclass(frozen=True)
class FleetWorkload:
    models: tuple[Model, ...]
    gaps: list[float]  # unit-mean exponential inter-arrival gaps
    which: list[int]  # each request's model

    @property
    def mean_service_s(self) -> float:
        return sum(m.popularity * m.service_s for m in self.models)


def _stratified(classes: Sequence[tuple[int, float]], n: int) -> list[int]:
    """``n`` sizes in the classes' proportions (largest remainder), smallest first."""
    total = sum(w for _, w in classes)
    exact = [n * w / total for _, w in classes]
    k = [int(x) for x in exact]
    for i in sorted(range(len(exact)), key=lambda i: k[i] - exact[i])[: n - sum(k)]:
        k[i] += 1
    return [s for (s, _), c in zip(classes, k, strict=True) for _ in range(c)]


def make_models(p: FleetParams, seed: int = 0) -> tuple[Model, ...]:
    rng = random.Random(seed * 1_000_003 + 17)
    raw = [1.0 / (k + 1) ** p.zipf_s for k in range(p.models)]
    total = sum(raw)
    lo, hi = p.slow_factor
    sizes = _stratified(p.size_classes, p.models)
    rng.shuffle(sizes)
    out = []
    for k, mib in enumerate(sizes):
        reload_s = (p.load_fixed_s + mib / p.load_mib_s) * rng.lognormvariate(0, p.load_sigma)
        if rng.random() < p.slow_share:
            reload_s *= rng.uniform(lo, hi)
        gib = mib * MIB / GIB
        service = (p.service_fixed_s + p.service_s_per_gib * gib) * rng.lognormvariate(
            0, p.service_sigma
        )
        out.append(Model(f"m{k:02d}", mib * MIB, reload_s, service, raw[k] / total))
    return tuple(out)


def make_fleet_workload(p: FleetParams, workers: int, seed: int = 0) -> FleetWorkload:
    """The models and ``requests_per_worker * workers`` requests; a prefix of one seeded
    stream, so a smaller fleet replays the start of a larger one's requests."""
    models = make_models(p, seed)
    rng = random.Random(seed * 1_000_003 + 29)
    n = p.requests_per_worker * workers
    cum = list(accumulate(m.popularity for m in models))
    gaps, which = [], []
    for _ in range(n):
        gaps.append(rng.expovariate(1.0))
        which.append(min(len(models) - 1, bisect_left(cum, rng.random() * cum[-1])))
    return FleetWorkload(models, gaps, which)


@dataclass
class FleetRun:
    """The metrics of one configuration."""

    workers: int
    affinity: bool
    eviction: str
    rate_rps: float
    requests: int  # measured
    miss_rate: float
    loads: int
    load_s: float  # total reload seconds of those loads
    evictions: int
    p50_s: float
    p99_s: float
    mean_s: float
    throughput_rps: float
    utilization: float  # compute busy fraction
    loads_per_worker: float
    peak_bytes: int  # the most any worker held (resident + loading)
    completed: int


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
        scale = 1.0 / self.rate
        self.arr = list(accumulate(g * scale for g in wl.gaps))
        self.which = wl.which
        self.index = {m.name: k for k, m in enumerate(wl.models)}
        n = len(self.arr)
        self.q: list[deque[int]] = [deque() for _ in range(nm)]
        self.taken = bytearray(n)
        self.gptr = 0  # every request before it has been taken
        self.arrived = 0
        self.done = [math.nan] * n
        self.missed = bytearray(n)
        self.policy = [make_policy(eviction) for _ in range(workers)]
        self.res: list[dict[int, Resident]] = [{} for _ in range(workers)]
        self.used = [0] * workers
        self.peak = [0] * workers
        self.loading = [-1] * workers
        self.local: list[dict[int, list[int]]] = [{} for _ in range(workers)]
        self.computing = [-1] * workers  # the model of the batch in flight
        self.holders: list[set[int]] = [set() for _ in range(nm)]  # resident or loading
        self.idle: dict[int, None] = dict.fromkeys(range(workers))  # compute free, in order
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = count()
        i0 = min(n - 1, int(n * p.warmup))
        self.first, self.t0, self.t1 = i0, self.arr[i0], self.arr[-1]
        self.loads = self.evictions = 0
        self.load_s = self.busy_s = 0.0

    # ---- the loop -------------------------------------------------------------------

    def run(self) -> FleetRun:
        arr, heap, n = self.arr, self.heap, len(self.arr)
        i = 0
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
        return self._metrics()

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
        for k, r in res.items():
            r.busy = k == self.computing[w] or k in self.local[w]
        free = self.p.memory_budget - self.used[w]
        out = victims(self.policy[w], list(res.values()), self.size[m], free, t)
        if out is None:
            return False
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
            rate_rps=self.rate,
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


@dataclass
class Config:
    workers: int
    affinity: bool
    eviction: str

    @property
    def label(self) -> str:
        return f"{self.workers}w affinity {'on' if self.affinity else 'off'} {self.eviction}"


@dataclass
class Comparison:
    params: FleetParams
    seed: int
    runs: list[FleetRun] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": asdict(self.params),
            "seed": self.seed,
            "runs": [asdict(r) for r in self.runs],
        }


def _config_task(args: tuple[Config, FleetParams, int]) -> FleetRun:
    c, p, seed = args
    wl = make_fleet_workload(p, c.workers, seed)
    return simulate_fleet(wl, c.workers, p, affinity=c.affinity, eviction=c.eviction)


def configs(
    workers: Sequence[int], affinity: Sequence[bool], evictions: Sequence[str]
) -> list[Config]:
    return [Config(w, a, e) for w in workers for a in affinity for e in evictions]


def compare(
    cfgs: Sequence[Config],
    p: FleetParams,
    seed: int = 0,
    jobs: int = 1,
    progress: Callable[[FleetRun], None] | None = None,
) -> Comparison:
    """Every configuration, in ``jobs`` processes when more than one; the same requests
    for every configuration with the same number of workers."""
    tasks = [(c, p, seed) for c in cfgs]
    out = Comparison(p, seed)
    if jobs <= 1:
        for task in tasks:
            out.runs.append(_config_task(task))
            if progress:
                progress(out.runs[-1])
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    # the largest fleets first, so that the two processes finish together
    order = sorted(range(len(tasks)), key=lambda k: -tasks[k][0].workers)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        runs = dict(zip(order, pool.map(_config_task, [tasks[k] for k in order]), strict=True))
    for k in range(len(tasks)):
        out.runs.append(runs[k])
        if progress:
            progress(runs[k])
    return out


__all__ = [
    "EVICTIONS",
    "SIZE_CLASSES",
    "Comparison",
    "Config",
    "FleetParams",
    "FleetRun",
    "FleetSim",
    "FleetWorkload",
    "Model",
    "compare",
    "configs",
    "make_fleet_workload",
    "make_models",
    "parse_bytes",
    "simulate_fleet",
]
