"""The requests of a run and the workers that serve them. The requests are synthetic:
arrival gaps and item lengths in tokens, no text (real texts: ``tune/workload.py``)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from .params import Params


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
