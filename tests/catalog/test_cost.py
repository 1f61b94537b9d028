"""catalog/spec.py's CostModel: the batch cap while interactive work waits."""

from __future__ import annotations

import pytest

from fleetserve.catalog.profiles import Choice
from fleetserve.catalog.spec import (
    INTERACTIVE_BATCH_MS,
    INTERACTIVE_SHARE,
    CostModel,
    Profile,
)

# fitted by `fleetserve tune` on cpu-amx (2-core Xeon): MiniLM, and a 110M BERT-base
MINILM = CostModel(fixed_ms=1.695831, per_token_ms=0.0, per_padded_token_ms=0.027603)
BERT_BASE = CostModel(fixed_ms=9.132663, per_token_ms=0.0, per_padded_token_ms=0.151209)


def rate(c: CostModel, tokens: int) -> float:
    """Tokens per ms of a dense batch of ``tokens`` padded tokens."""
    return tokens / c.predict_ms(tokens, tokens, 1)


def test_a_fast_model_keeps_the_25_ms_batch() -> None:
    """MiniLM's 25 ms batch (832 tokens) already runs near its full rate."""
    assert MINILM.interactive_cap(2048) == MINILM.tokens_within(INTERACTIVE_BATCH_MS) == 832
    assert rate(MINILM, 832) >= INTERACTIVE_SHARE * rate(MINILM, 2048)


def test_a_model_whose_25_ms_batch_wastes_the_machine_gets_the_efficient_one() -> None:
    """The 110M model's 25 ms batch is 64 tokens at about half its full rate: the cap
    is the smallest batch at INTERACTIVE_SHARE of it instead, 320 tokens (~57 ms)."""
    assert BERT_BASE.tokens_within(INTERACTIVE_BATCH_MS) == 64
    assert rate(BERT_BASE, 64) < 0.6 * rate(BERT_BASE, 2048)
    cap = BERT_BASE.interactive_cap(2048)
    assert cap == 320
    assert rate(BERT_BASE, cap) >= INTERACTIVE_SHARE * rate(BERT_BASE, 2048)
    assert rate(BERT_BASE, cap - 64) < INTERACTIVE_SHARE * rate(BERT_BASE, 2048)


@pytest.mark.parametrize(
    "cost",
    [
        CostModel(fixed_ms=0.0, per_token_ms=0.0, per_padded_token_ms=0.1),  # no fixed cost
        CostModel(fixed_ms=5.0, per_token_ms=0.0, per_padded_token_ms=0.0),  # no slope
    ],
)
def test_degenerate_fits_never_divide_by_zero(cost: CostModel) -> None:
    assert 64 <= cost.interactive_cap(2048) <= 2048


def test_the_cap_never_passes_the_batch_budget() -> None:
    """A budget of 100 tokens: the efficient batch (85 tokens) rounds up to 128."""
    slow_start = CostModel(fixed_ms=500.0, per_token_ms=0.0, per_padded_token_ms=0.01)
    assert slow_start.efficient_tokens(100, INTERACTIVE_SHARE) == 100
    assert slow_start.interactive_cap(100) == 100


def test_a_tuned_profile_without_a_written_cap_reads_the_same_rule() -> None:
    profile = Profile("cpu-amx", max_batch_tokens=2048, cost=BERT_BASE)
    assert Choice(profile, "tuned", "").interactive_batch_tokens == 320
    assert Choice(profile, "rule", "").interactive_batch_tokens == 2048  # no evidence
