from __future__ import annotations

import numpy as np
import pytest

from fleetserve.lora.train.mining import columns_wanted, given, mine, negatives_for, same_text
from fleetserve.wire.finetune import Pair


def fan(n: int) -> np.ndarray:
    """``n`` unit vectors at growing angles from (1, 0): passage j ranks j-th for a
    query along (1, 0)."""
    angles = np.linspace(0.0, 1.5, n)
    return np.stack([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)


QUERY = np.array([[2.0, 0.0]], np.float32)  # not unit length: cosine is used


def test_picks_the_highest_ranked_non_positives() -> None:
    corpus = fan(6)
    assert mine(QUERY, corpus, [{0}], 2, ratio=None) == [[1, 2]]
    assert mine(QUERY, corpus, [{1}], 3, ratio=None) == [[0, 2, 3]]
    assert mine(QUERY, corpus, [{0}], 2, skip=[{1}], ratio=None) == [[2, 3]]
    assert mine(QUERY, corpus, [set()], 0) == [[]]


def test_passes_over_what_scores_almost_as_well_as_the_positive() -> None:
    corpus = fan(6)  # cosines to the query: 1.0, 0.955, 0.825, 0.622, 0.362, 0.071
    assert mine(QUERY, corpus, [{0}], 2) == [[2, 3]]  # 0.955 > 0.95 x 1.0: an answer, likely
    assert mine(QUERY, corpus, [{0}], 2, ratio=0.5) == [[4, 5]]
    assert mine(QUERY, corpus, [{2}], 2) == [[3, 4]]  # above 0.95 x 0.85: 0 and 1
    assert mine(QUERY, corpus, [{0, 3}], 1) == [[4]]  # the lowest positive sets the bar
    assert mine(QUERY, corpus, [{0}], 2, ratio=0.01) == [[5, 4]]  # none safe: the easiest
    assert mine(QUERY, corpus, [{0}], 5, ratio=0.9) == [[2, 3, 4, 5, 1]]  # topped up


def test_skips_texts_equal_to_a_positive_and_repeats() -> None:
    corpus = fan(6)
    texts = ["the answer", "The  ANSWER", "b", "b ", "c", "d"]  # 1 is 0's text; 3 is 2's
    assert mine(QUERY, corpus, [{0}], 3, texts=texts) == [[2, 4, 5]]


def test_runs_out_of_corpus_gracefully() -> None:
    corpus = fan(3)
    assert mine(QUERY, corpus, [{0}], 5) == [[1, 2]]
    assert mine(np.zeros((0, 2), np.float32), corpus, [], 2) == []


def test_each_row_has_its_own_query_and_positives() -> None:
    corpus = fan(5)
    backwards = corpus[4:5] * 3
    picks = mine(np.concatenate([QUERY, backwards]), corpus, [{0}, {4}], 2)
    assert picks == [[1, 2], [3, 2]]
    with pytest.raises(ValueError):
        mine(QUERY, corpus, [{0}, {1}], 2)


def test_a_deep_search_when_the_top_is_all_duplicates() -> None:
    corpus = fan(200)
    texts = ["same"] * 150 + [f"t{j}" for j in range(50)]
    assert mine(QUERY, corpus, [{0}], 2, texts=texts) == [[150, 151]]


def test_columns_wanted() -> None:
    plain, brings = Pair("q", "p"), Pair("q2", "p2", ("n",))
    assert columns_wanted([plain], 0) == 0
    assert columns_wanted([plain, brings], 0) == 1
    assert columns_wanted([plain], 3) == 3


def test_given_negatives_are_cleaned() -> None:
    pair = Pair("q", "The answer", ("x", "the  answer", "X", "y", "z"))
    assert given(pair, 2) == ["x", "y"]
    assert same_text(" A\tb ") == "a b"


def test_negatives_for_puts_given_first_then_mined() -> None:
    pairs = [
        Pair("q0", "p0", ("p3",)),
        Pair("q1", "p1"),
        Pair("q0", "p2"),  # the same query: p0 and p2 both answer it
    ]
    corpus = ["p0", "p1", "p2", "p3", "p4"]
    # q0 is near p0 then p1, p2, p3, p4; q1 is near p4 then p3...
    vectors = fan(5)
    queries = ["q0", "q1"]
    qv = np.stack([vectors[0], vectors[4]])
    out = negatives_for(pairs, 2, corpus, vectors, queries, qv, ratio=None)
    assert out.columns == 2
    assert out.rows == [["p3", "p1"], ["p4", "p3"], ["p1", "p3"]]
    assert out.mined == 1 + 2 + 2


def test_negatives_for_without_mining() -> None:
    pairs = [Pair("q0", "p0", ("a", "b")), Pair("q1", "p1", ("c",))]
    out = negatives_for(pairs, 1, ["p0", "p1"], None)
    assert (out.rows, out.columns, out.mined) == ([["a"], ["c"]], 1, 0)
    none = negatives_for([Pair("q", "p")], 0, ["p"], None)
    assert (none.rows, none.columns) == ([[]], 0)
    with pytest.raises(ValueError, match="encodings"):
        negatives_for([Pair("q", "p")], 1, ["p"], None)


def test_every_row_gets_as_many_as_the_poorest() -> None:
    pairs = [Pair("q0", "p0", ("a", "b", "c")), Pair("q1", "p1")]
    corpus = ["p0", "p1", "a", "b", "c"]
    vectors = fan(5)
    # q1's answer p1; the corpus has 4 others, enough: 3 each
    out = negatives_for(pairs, 3, corpus, vectors, ["q0", "q1"], vectors[:2])
    assert out.columns == 3 and all(len(r) == 3 for r in out.rows)
    small = negatives_for(pairs, 3, ["p0", "p1"], vectors[:2], ["q0", "q1"], vectors[:2])
    assert small.columns == 1  # q1 can only get p0
    assert small.rows == [["a"], ["p0"]]
    assert small.mined == 1
