"""tune/costfit.py: the cost model ``fleetserve tune`` fits for every winner."""

from __future__ import annotations

import math
import random
import time

import pytest

from fleetserve.bench.tune.costfit import Shape, fit_times, time_shapes
from fleetserve.catalog import CostModel

TRUE = CostModel(fixed_ms=1.5, per_token_ms=0.004, per_padded_token_ms=0.04)


def grid(seed: int, noise: float, cost: CostModel = TRUE) -> tuple[list[Shape], list[float]]:
    """Shapes as :func:`time_shapes` draws them (batch sizes up to 32, short, middle,
    long and mixed items, 2048 tokens at most) and times from ``cost`` with a
    multiplicative noise of ``noise`` (a timing spread grows with the batch's time)."""
    rng = random.Random(seed)
    shapes: list[Shape] = []
    times: list[float] = []
    for batch in (1, 2, 4, 8, 16, 32):
        for lo, hi in ((8, 16), (16, 48), (48, 128), (8, 128)):
            lens = [rng.randint(lo, hi) for _ in range(batch)]
            if max(lens) * batch > 2048 and batch > 1:
                continue
            shape = (sum(lens), max(lens), batch)
            shapes.append(shape)
            times.append(cost.predict_ms(*shape) * math.exp(rng.gauss(0.0, noise)))
    return shapes, times


def test_exact_times_give_back_the_coefficients() -> None:
    fitted = fit_times(*grid(0, noise=0.0))
    assert fitted.cost.fixed_ms == pytest.approx(TRUE.fixed_ms, rel=1e-6)
    assert fitted.cost.per_token_ms == pytest.approx(TRUE.per_token_ms, rel=1e-6)
    assert fitted.cost.per_padded_token_ms == pytest.approx(TRUE.per_padded_token_ms, rel=1e-6)
    assert fitted.median_rel_error < 1e-6


@pytest.mark.parametrize("seed", range(8))
def test_a_few_percent_of_noise_gives_a_few_percent_of_error(seed: int) -> None:
    """8 % timing noise on a linear cost: the held-out error stays near the noise, and
    the fixed term near the truth. Plain least squares let the largest batches' noise
    move the fixed term: 6-45 % held-out error on these seeds, fixed 0.16-2.4 ms."""
    fitted = fit_times(*grid(seed, noise=0.08))
    assert fitted.median_rel_error < 0.12, fitted
    assert fitted.cost.fixed_ms == pytest.approx(TRUE.fixed_ms, rel=0.25), fitted


def test_no_coefficient_is_negative_and_the_rest_are_fitted_without_it() -> None:
    """Times that fall with real tokens at a fixed padded size would want a negative
    per-token term: it is left out and the other two fitted alone (a coefficient
    clipped after the fit left the others fitted to it)."""
    shapes: list[Shape] = [
        (t, 64, b) for b in (1, 2, 4, 8, 16, 32) for t in (b * 20, b * 40, b * 60)
    ]
    times = [2.0 + 0.05 * m * b - 0.01 * t for t, m, b in shapes]
    fitted = fit_times(shapes, times)
    c = fitted.cost
    assert min(c.fixed_ms, c.per_token_ms, c.per_padded_token_ms) >= 0.0
    assert c.per_token_ms == 0.0
    assert fitted.median_rel_error < 0.08, fitted  # clipped after the fit: 12.1 %


def test_too_few_shapes_is_a_value_error() -> None:
    shapes, times = grid(0, noise=0.0)
    with pytest.raises(ValueError, match="too few shapes"):
        fit_times(shapes[:5], times[:5])


def test_the_grid_stays_within_the_budget_and_times_each_shape() -> None:
    pool = [(f"item{n}", n) for n in range(8, 129, 4)]
    calls: list[list[str]] = []
    shapes, times = time_shapes(
        calls.append, pool, max_batch_size=32, max_batch_tokens=2048, repeats=3
    )
    assert shapes and len(shapes) == len(times)
    assert all(b == 1 or m * b <= 2048 for _, m, b in shapes)
    assert {b for _, _, b in shapes} == {1, 2, 4, 8, 16, 32}
    assert len(calls) == 4 * len(shapes)  # a warm call, then the repeats


def test_no_new_shape_starts_after_the_deadline() -> None:
    pool = [(n, n) for n in range(8, 64)]
    shapes, _ = time_shapes(
        lambda items: None, pool, max_batch_size=64, max_batch_tokens=4096,
        deadline=time.monotonic() - 1.0,
    )  # fmt: skip
    assert shapes == []
    with pytest.raises(ValueError, match="too few shapes"):
        fit_times(shapes, [])
