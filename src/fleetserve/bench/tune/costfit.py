"""Fit a model's cost coefficients: ``ms = fixed + per_token * tokens + per_padded * slots``.

Times the forward pass over a grid of batch sizes and mixed lengths (real tokens and
padded slots, ``max_len * batch``, vary apart), fits by least squares, and judges the
fit with the profile's own formula (:meth:`CostModel.predict_ms`) on held-out shapes.
"""

from __future__ import annotations

import itertools
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ...catalog import CostModel
from ...families import AnyFamily
from .harness import Request
from .quality import json_envelope

Forward = Callable[[list[object]], object]
Pool = list[tuple[object, int]]
BANDS = ((0.0, 0.3), (0.3, 0.7), (0.7, 1.0), None)  # length quantile bands; None: mixed


@dataclass(frozen=True)
class CostFit:
    cost: CostModel
    median_rel_error: float  # on held-out shapes
    points: int

    def as_dict(self) -> dict[str, object]:
        return {
            "fixed_ms": self.cost.fixed_ms,
            "per_token_ms": self.cost.per_token_ms,
            "per_padded_token_ms": self.cost.per_padded_token_ms,
            "median_rel_error": self.median_rel_error,
            "points": self.points,
        }


def item_pool(adapter: AnyFamily, model: str, requests: Sequence[Request]) -> Pool:
    """The prepared items of ``requests`` and their lengths, as the worker batches them."""
    pool: Pool = []
    for req in requests:
        prepared = adapter.preprocess(json_envelope(model, req.task, "cost"), req.body)
        pool += list(zip(prepared.items, prepared.lengths, strict=True))
    return pool


Shape = tuple[int, int, int]  # real tokens, max length, batch size


def time_shapes(
    forward: Forward,
    pool: Sequence[tuple[object, int]],
    *,
    max_batch_size: int,
    max_batch_tokens: int,
    repeats: int = 3,
    seed: int = 0,
    deadline: float = float("inf"),
) -> tuple[list[Shape], list[float]]:
    """Time ``forward`` on batches drawn from ``pool`` (prepared items and their
    lengths, as the worker batches them): every batch size up to the budget, from
    short, middle, long and mixed items; each shape's median of ``repeats`` after one
    warm call. No new shape starts after ``deadline`` (``time.monotonic()``)."""
    rng = random.Random(seed)
    ranked = sorted(pool, key=lambda x: x[1])
    shapes: list[Shape] = []
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
                return shapes, times  # the budget is spent: the shapes timed so far
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
    return shapes, times


def fit_times(shapes: Sequence[Shape], times: Sequence[float]) -> CostFit:
    """Fit on every other shape, report the error on the rest, keep the coefficients
    fitted on all of them: ``fit_times(*time_shapes(forward, pool, ...))``."""
    if len(shapes) < 6:
        raise ValueError(f"too few shapes fit the budget to fit a cost model ({len(shapes)})")
    train = list(range(0, len(shapes), 2))
    test = list(range(1, len(shapes), 2))
    cost = _lstsq([shapes[i] for i in train], [times[i] for i in train])
    err = _error(cost, [shapes[i] for i in test], [times[i] for i in test])
    return CostFit(_lstsq(shapes, times), err, len(shapes))


def _lstsq(shapes: Sequence[Shape], times: Sequence[float]) -> CostModel:
    """Least squares on the *relative* error, with no coefficient below zero.

    Each shape is weighted by 1 / its time, so a 2 ms batch counts as much as a 200 ms
    one: plain least squares let a few percent of noise on the largest batches move the
    fixed term by more than a small batch takes (held-out errors of 14-234 % on the
    bundled tunes), and the interactive cap is read where batches are small. The
    non-negative solution is the best fit among the subsets of the three terms whose
    coefficients all come out non-negative (exact for three terms); clipping a negative
    coefficient to zero after the fit, as before, left the others fitted to it."""
    a = np.asarray([(1.0, t, m * b) for t, m, b in shapes], dtype=np.float64)
    y = np.asarray(times, dtype=np.float64)
    w = 1.0 / np.maximum(y, 1e-9)
    aw, yw = a * w[:, None], y * w
    best: tuple[float, np.ndarray] | None = None
    for k in (3, 2, 1):
        for cols in itertools.combinations(range(3), k):
            sub = list(cols)
            coef, *_ = np.linalg.lstsq(aw[:, sub], yw, rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(3)
            full[sub] = coef
            resid = float(np.sum((aw @ full - yw) ** 2))
            if best is None or resid < best[0]:
                best = (resid, full)
    fixed, per_token, per_padded = (float(c) for c in best[1]) if best else (0.0, 0.0, 0.0)
    return CostModel(fixed, per_token, per_padded)


def _error(
    cost: CostModel, shapes: Sequence[tuple[int, int, int]], times: Sequence[float]
) -> float:
    pred = np.asarray([cost.predict_ms(t, m, b) for t, m, b in shapes])
    return float(np.median(np.abs(pred - np.asarray(times)) / np.asarray(times)))


__all__ = ["CostFit", "fit_times", "item_pool", "time_shapes"]
