"""Fit a model's cost coefficients: ``ms = fixed + per_token * tokens + per_padded * slots``.

Times the forward pass over a grid of batch sizes and mixed lengths (real tokens and
padded slots, ``max_len * batch``, vary apart), fits by least squares, and judges the
fit with the profile's own formula (:meth:`CostModel.predict_ms`) on held-out shapes.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..catalog import CostModel
from ..families import FamilyAdapter
from .harness import Request
from .quality import json_envelope

Forward = Callable[[list[Any]], Any]
Pool = list[tuple[Any, int]]
BANDS = ((0.0, 0.3), (0.3, 0.7), (0.7, 1.0), None)  # length quantile bands; None: mixed


@dataclass(frozen=True)
class CostFit:
    cost: CostModel
    median_rel_error: float  # on held-out shapes
    points: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "fixed_ms": self.cost.fixed_ms,
            "per_token_ms": self.cost.per_token_ms,
            "per_padded_token_ms": self.cost.per_padded_token_ms,
            "median_rel_error": self.median_rel_error,
            "points": self.points,
        }


def item_pool(adapter: FamilyAdapter, model: str, requests: Sequence[Request]) -> Pool:
    """The prepared items of ``requests`` and their lengths, as the worker batches them."""
    pool: Pool = []
    for req in requests:
        prepared = adapter.preprocess(json_envelope(model, req.task, "cost"), req.body)
        pool += list(zip(prepared.items, prepared.lengths, strict=True))
    return pool


def fit(
    forward: Forward,
    pool: Sequence[tuple[Any, int]],
    *,
    max_batch_size: int,
    max_batch_tokens: int,
    repeats: int = 3,
    seed: int = 0,
    deadline: float = float("inf"),
) -> CostFit:
    """Time ``forward`` on batches drawn from ``pool`` (prepared items and their
    lengths, as the worker batches them): every batch size up to the budget, from
    short, middle, long and mixed items. Fit on every other shape, report the error
    on the rest, keep the coefficients fitted on all of them. No new shape starts after
    ``deadline`` (``time.monotonic()``)."""
    rng = random.Random(seed)
    ranked = sorted(pool, key=lambda x: x[1])
    shapes: list[tuple[int, int, int]] = []  # real tokens, max length, batch size
    times: list[float] = []
    sizes = sorted({1, 2, 4, 8, 16, 32, 64, 128, max_batch_size})
    for batch in (b for b in sizes if b <= max_batch_size):
        for band in BANDS:
            if band is None:
                chosen = [ranked[rng.randrange(len(ranked))] for _ in range(batch)]
            else:
                lo, hi = int(band[0] * len(ranked)), max(int(band[1] * len(ranked)), 1)
                chosen = [ranked[lo + (i % max(1, hi - lo))] for i in range(batch)]
            if time.monotonic() > deadline:
                break  # the budget is spent: fit on the shapes timed so far
            longest = max(n for _, n in chosen)
            if longest * batch > max_batch_tokens and batch > 1:
                continue
            items = [it for it, _ in chosen]
            forward(items)
            ts = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                forward(items)
                ts.append((time.perf_counter() - t0) * 1e3)
            shapes.append((sum(n for _, n in chosen), longest, batch))
            times.append(statistics.median(ts))
    if len(shapes) < 6:
        raise ValueError(f"too few shapes fit the budget to fit a cost model ({len(shapes)})")
    train = list(range(0, len(shapes), 2))
    test = list(range(1, len(shapes), 2))
    cost = _lstsq([shapes[i] for i in train], [times[i] for i in train])
    err = _error(cost, [shapes[i] for i in test], [times[i] for i in test])
    return CostFit(_lstsq(shapes, times), err, len(shapes))


def _lstsq(shapes: Sequence[tuple[int, int, int]], times: Sequence[float]) -> CostModel:
    a = np.asarray([(1.0, t, m * b) for t, m, b in shapes], dtype=np.float64)
    coef, *_ = np.linalg.lstsq(a, np.asarray(times), rcond=None)
    fixed, per_token, per_padded = (max(float(c), 0.0) for c in coef)
    return CostModel(fixed, per_token, per_padded)


def _error(
    cost: CostModel, shapes: Sequence[tuple[int, int, int]], times: Sequence[float]
) -> float:
    pred = np.asarray([cost.predict_ms(t, m, b) for t, m, b in shapes])
    return float(np.median(np.abs(pred - np.asarray(times)) / np.asarray(times)))


__all__ = ["CostFit", "fit", "item_pool"]
