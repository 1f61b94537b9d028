"""Assembly: the batch cap while queries wait follows the threads a process runs with."""

from __future__ import annotations

import os

import pytest

from fleetserve.assembly import interactive_tokens
from fleetserve.catalog import CostModel
from fleetserve.catalog.profiles import Choice
from fleetserve.catalog.spec import Profile
from fleetserve.settings import Settings


def choice(threads: int = 0) -> Choice:
    cost = CostModel(fixed_ms=1.0, per_token_ms=0.0, per_padded_token_ms=0.01)
    profile = Profile("cpu-x", max_batch_tokens=8192, cost=cost, threads=threads)
    return Choice(profile, "tuned", "tuned for cpu-x")


def test_the_cap_of_a_tuned_profile_comes_from_its_cost_model() -> None:
    # (25 - 1) / 0.01 = 2400 tokens in 25 ms, a multiple of 64 below: 2368
    assert choice().interactive_batch_tokens == 2368
    assert interactive_tokens(choice(), Settings.load(overrides={})) == 2368


def test_fewer_threads_than_tuned_with_shrink_the_cap() -> None:
    cores = os.cpu_count() or 1
    if cores < 2:
        pytest.skip("needs at least 2 CPU cores (fewer threads than tuned with)")
    half = Settings.load(overrides={"torch_threads": cores // 2})
    assert interactive_tokens(choice(), half) == 2368 * (cores // 2) // cores // 64 * 64
    # a profile tuned with those threads already predicts their speed: no change
    assert interactive_tokens(choice(threads=cores // 2), half) == 2368
