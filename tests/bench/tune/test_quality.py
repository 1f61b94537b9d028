"""The quality gates: replies compared as a client would see them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fleetserve.bench.tune.quality import MIN_COSINE, calibration, compare, measure
from fleetserve.catalog import ModelSpec


def test_identical_replies_pass_every_gate() -> None:
    reply = {"model": "m", "embeddings": [[1.0, 2.0], [3.0, 4.0]], "usage": {"tokens": 5}}
    q = compare(reply, reply)
    assert q.passed and q.metric == "min_cosine" and q.value == pytest.approx(1.0)


def test_embeddings_gate_on_the_worst_row() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(4, 64))
    b = a.copy()
    b[2] += rng.normal(size=64) * 0.05  # one row moved: cosine about 0.9988
    q = compare({"embeddings": a.tolist()}, {"embeddings": b.tolist()})
    assert not q.passed and q.value < MIN_COSINE and q.threshold == MIN_COSINE
    near = a + rng.normal(size=a.shape) * 1e-4
    assert compare({"embeddings": a.tolist()}, {"embeddings": near.tolist()}).passed


def test_token_vectors_are_rows_too() -> None:
    mats = [[[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0]]]
    moved = [[[1.0, 0.0], [0.3, 1.0]], [[1.0, 1.0]]]
    q = compare({"embeddings": mats}, {"embeddings": moved})
    assert not q.passed and q.detail.startswith("3 rows")


def test_scores_within_tolerance_and_rankings_that_hold() -> None:
    ref = {"scores": [9.0, 5.0, 1.0], "ranking": [0, 1, 2]}
    close = {"scores": [9.05, 4.97, 1.02], "ranking": [0, 1, 2]}
    assert compare(ref, close).passed
    far = {"scores": [9.0, 5.0, 1.3], "ranking": [0, 1, 2]}  # 0.3 of 9: 3.3 %
    q = compare(ref, far)
    assert not q.passed and q.metric == "max_score_error"
    swapped = {"scores": [5.0, 9.0, 1.0], "ranking": [1, 0, 2]}
    q = compare(ref, swapped)
    assert not q.passed


def test_near_ties_may_swap() -> None:
    ref = {"scores": [5.0, 4.99, 1.0]}
    got = {"scores": [4.99, 5.0, 1.0]}
    assert compare(ref, got).passed


def test_labels_and_text_must_be_identical() -> None:
    ents = {"entities": [[{"start": 0, "end": 5, "label": "PER", "score": 0.99}]]}
    other = {"entities": [[{"start": 0, "end": 5, "label": "LOC", "score": 0.99}]]}
    q = compare(ents, other)
    assert not q.passed and "PER" in q.detail and "LOC" in q.detail
    assert not compare({"text": "Paris."}, {"text": "Paris!"}).passed
    assert compare({"text": "Paris.", "id": "a"}, {"text": "Paris.", "id": "b"}).passed


@pytest.mark.parametrize(
    "family", ["dense", "multivector", "sparse", "cross_encoder", "ner", "zero_shot", "span_ner",
               "image", "generate"],
)  # fmt: skip
def test_every_family_has_calibration_requests(family: str) -> None:
    spec = ModelSpec.from_dict({"id": "o/m", "sources": ["/w"], "family": family})
    reqs: list[tuple[Any, dict[str, Any]]] = calibration(spec)
    assert reqs and all(isinstance(body, dict) for _, body in reqs)


def test_zero_shot_labels_are_compared_by_label() -> None:
    ref = {"results": [{"labels": ["sports", "travel", "cooking"], "scores": [0.9, 0.051, 0.049]}]}
    near_tie = {"results": [{"labels": ["sports", "cooking", "travel"],
                             "scores": [0.9, 0.0505, 0.0495]}]}  # fmt: skip
    assert compare(ref, near_tie).passed
    other = {"results": [{"labels": ["sports", "travel", "finance"], "scores": [0.9, 0.05, 0.05]}]}
    q = compare(ref, other)
    assert not q.passed and "finance" in q.detail
    flipped = {"results": [{"labels": ["travel", "sports", "cooking"],
                            "scores": [0.9, 0.051, 0.049]}]}  # fmt: skip
    assert not compare(ref, flipped).passed


def test_an_inversion_between_items_that_are_not_neighbours_is_caught() -> None:
    ref = {"scores": [1.0, 0.993, 0.986]}  # neighbours within 1 %, items 0 and 2 not
    got = {"scores": [0.991, 0.9935, 0.995]}  # each within 1 %, but 2 now above 0
    q = compare(ref, got)
    assert not q.passed and "ranking changed" in q.detail


def test_scores_near_zero_are_judged_on_an_absolute_floor() -> None:
    assert compare({"scores": [0.0, 0.0]}, {"scores": [1e-7, -1e-7]}).passed


def test_replies_stop_between_requests_once_the_deadline_passed() -> None:
    from fleetserve.bench.tune.quality import replies
    from fleetserve.wire import Task

    spec = ModelSpec.from_dict({"id": "o/m", "sources": ["/w"], "family": "dense"})
    with pytest.raises(TimeoutError, match="after 0 requests"):
        replies(None, spec, [(Task.ENCODE, {"inputs": ["x"]})], deadline=0.0)  # type: ignore[arg-type]


def test_measure_names_the_worst_row_and_the_worst_score() -> None:
    rng = np.random.default_rng(1)
    a = rng.normal(size=(4, 16))
    b = a.copy()
    b[2] += rng.normal(size=16) * 0.3
    f = measure({"embeddings": a.tolist()}, {"embeddings": b.tolist()})
    assert f.min_cosine_at == "embeddings[2]" and f.rows == 4
    assert f.min_cosine is not None and f.min_cosine < MIN_COSINE
    f = measure({"scores": [0.9, 0.5, 0.1]}, {"scores": [0.9, 0.4, 0.1]})
    assert f.max_score_error_at == "scores[1]" and f.max_score_error == pytest.approx(0.1 / 0.9)
    assert f.min_cosine is None and not f.mismatch
