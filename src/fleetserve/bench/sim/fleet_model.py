"""The fleet scenario's inputs: its parameters, the models and the request stream, and
the metrics of one run (``FleetRun``). The scenario itself is described in ``fleet.py``."""

from __future__ import annotations

import random
import re
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

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
EVICTIONS = ("gdsf", "lru", "hindsight")  # hindsight: the simulator's alone
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
    # a closed loop: this many clients, each sending the trace's next request when its
    # last is answered (as a benchmark's clients do); 0: Poisson arrivals (utilization)
    clients: int = 0
    # a model with requests waiting for it may not leave, as in an embedded server,
    # which admits a request when it arrives and holds its model busy until it is
    # answered; False: only the batch in flight and the requests a worker pulled hold
    # it (workers pulling from a shared queue)
    admitted_busy: bool = False

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
        if self.clients < 0:
            raise ValueError("clients must be 0 (open arrivals) or more")
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
            (
                f"a closed loop of {self.clients} clients, each sending its next request "
                "when its last is answered"
                if self.clients
                else f"Poisson arrivals at {self.utilization:.0%} of the fleet's compute"
            )
            + f"; {self.requests_per_worker} requests per worker, the first "
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
