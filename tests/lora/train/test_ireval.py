from __future__ import annotations

import math

import numpy as np
import pytest

from fleetserve.lora.train.ireval import EvalSet, Scores, build_eval_set, evaluate, top_k
from fleetserve.wire.finetune import Pair

pytest.importorskip("pytrec_eval", reason="needs pytrec_eval (pytrec_eval-terrier)")


def ranked(order: list[int], n: int = 12) -> np.ndarray:
    """A query vector that ranks one-hot passage ``order[0]`` first, then the rest."""
    q = np.zeros(n, np.float32)
    for rank, j in enumerate(order):
        q[j] = n - rank
    return q


def test_matches_hand_computed_ndcg_and_recall() -> None:
    passages = np.eye(12, dtype=np.float32) * 3.0  # not unit length: cosine is used
    queries = np.stack(
        [
            ranked(list(range(12))),  # relevant passage 0 at rank 1
            ranked([5, 7, 2, *[j for j in range(12) if j not in (5, 7, 2)]]),  # 2 at rank 3
            ranked([3, 1, *[j for j in range(12) if j not in (3, 1, 11)], 11]),  # ranks 2, 12
        ]
    )
    relevant = [{0}, {2}, {1, 11}]
    scores = evaluate(queries, passages, relevant)
    inv = 1 / math.log2(3)
    ndcg = [1.0, 1 / math.log2(4), inv / (1 + inv)]  # the third: one of two found at rank 2
    assert scores.ndcg_at_10 == pytest.approx(sum(ndcg) / 3, abs=1e-4)
    assert scores.recall_at_10 == pytest.approx((1 + 1 + 0.5) / 3, abs=1e-4)
    assert scores.to_dict() == {
        "ndcg_at_10": scores.ndcg_at_10,
        "recall_at_10": scores.recall_at_10,
    }
    # neither the vectors' lengths nor the run's depth change the figures at 10
    again = evaluate(queries * 7, passages, relevant, k=10).to_dict()
    assert again == pytest.approx(scores.to_dict())


def test_a_perfect_and_a_hopeless_ranking() -> None:
    passages = np.eye(20, dtype=np.float32)
    perfect = evaluate(passages[:2], passages, [{0}, {1}])
    assert perfect == Scores(1.0, 1.0)
    last = np.stack([ranked([j for j in range(20) if j != 0] + [0], 20)])
    assert evaluate(last, passages, [{0}]) == Scores(0.0, 0.0)


def test_refuses_queries_without_relevant_passages() -> None:
    passages = np.eye(3, dtype=np.float32)
    with pytest.raises(ValueError, match="at least one relevant"):
        evaluate(passages[:2], passages, [{0}, set()])
    with pytest.raises(ValueError, match="outside"):
        evaluate(passages[:1], passages, [{3}])
    with pytest.raises(ValueError, match="query vectors"):
        evaluate(passages[:2], passages, [{0}])


def test_top_k_is_best_first() -> None:
    s = np.array([[0.1, 0.9, 0.5, 0.7]])
    assert top_k(s, 3).tolist() == [[1, 3, 2]]
    assert top_k(s, 10).tolist() == [[1, 3, 2, 0]]


def test_build_eval_set_groups_by_query() -> None:
    train = [Pair("q1", "p1", ("n1",)), Pair("q2", "p2")]
    validation = [
        Pair("v1", "p3"),
        Pair("v1", "p1"),
        Pair("v2", "p4", ("p2",)),
        Pair("q2", "p5"),  # also a training query: its training answer stays relevant
    ]
    es = build_eval_set(train, validation)
    assert es == EvalSet(
        queries=["v1", "v2", "q2"],
        passages=["p1", "n1", "p2", "p3", "p4", "p5"],
        relevant=[{3, 0}, {4}, {2, 5}],
    )
