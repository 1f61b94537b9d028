"""Retrieval figures for a fine-tuning job: nDCG@10 and recall@10 over held-out pairs.

The held-out queries search a corpus of every passage the job has seen (train and
validation, positives and negatives), so that an adapter is measured on telling the
right passage from the user's own near misses, not from an easy random corpus. The
measures come from pytrec_eval (trec_eval's code), not from a hand-written nDCG.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from ...wire.finetune import Pair

MEASURES = ("ndcg_cut.10", "recall.10")
INSTALL = "install the train extra: pip install 'fleetserve[train]'"


@dataclass(frozen=True)
class Scores:
    """Means over the queries of nDCG@10 and recall@10 (binary relevance)."""

    ndcg_at_10: float
    recall_at_10: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class EvalSet:
    """Distinct held-out ``queries``, the ``passages`` they search and, for each query,
    the indices of its positives in ``passages``."""

    queries: list[str]
    passages: list[str]
    relevant: list[set[int]]


def build_eval_set(train: Sequence[Pair], validation: Sequence[Pair]) -> EvalSet:
    """The validation queries (distinct, in order of first appearance) against the
    distinct passages of both sets. A query's positives are every passage paired with
    it as a positive, in either set (a validation query that also occurs in training
    keeps those answers relevant)."""
    passages: dict[str, int] = {}
    for pair in (*train, *validation):
        for text in (pair.positive, *pair.negatives):
            passages.setdefault(text, len(passages))
    wanted = {pair.query for pair in validation}
    relevant: dict[str, set[int]] = {}
    for pair in validation:
        relevant.setdefault(pair.query, set())
    for pair in (*train, *validation):
        if pair.query in wanted:
            relevant[pair.query].add(passages[pair.positive])
    return EvalSet(list(relevant), list(passages), list(relevant.values()))


def unit_rows(x: npt.ArrayLike) -> NDArray[np.float32]:
    """Rows scaled to length 1 (a zero row stays zero), as float32."""
    rows = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    out: NDArray[np.float32] = rows / np.maximum(norms, 1e-12)
    return out


def top_k(scores: NDArray[np.float32], k: int) -> NDArray[np.intp]:
    """Column indices of each row's ``k`` highest scores, best first."""
    k = min(k, scores.shape[1])
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
    out: NDArray[np.intp] = np.take_along_axis(part, order, axis=1)
    return out


def evaluate(
    queries: NDArray[np.float32],
    passages: NDArray[np.float32],
    relevant: Sequence[set[int]],
    k: int = 100,
) -> Scores:
    """nDCG@10 and recall@10 of ranking ``passages`` by cosine similarity to each of
    ``queries`` (row i's relevant passages: ``relevant[i]``); the run handed to
    pytrec_eval is each query's top ``k``. A query without a relevant passage, or no
    query at all, is a ``ValueError`` (it would be left out of the means silently)."""
    if len(queries) == 0 or len(queries) != len(relevant):
        raise ValueError(f"{len(queries)} query vectors for {len(relevant)} relevance sets")
    n = len(passages)
    if any(not 0 <= j < n for rel in relevant for j in rel):
        raise ValueError(f"a relevant passage index is outside 0..{n - 1}")
    scores = unit_rows(queries) @ unit_rows(passages).T
    best = top_k(scores, max(k, 10))
    run = [{int(j): float(scores[i, j]) for j in best[i]} for i in range(len(queries))]
    return evaluate_run(run, relevant)


def evaluate_run(run: Sequence[dict[int, float]], relevant: Sequence[set[int]]) -> Scores:
    """nDCG@10 and recall@10 of a ranking: ``run[i]`` scores query i's candidates (by
    passage index; a relevant passage left out of them counts as not found), with
    pytrec_eval. ``ValueError`` as :func:`evaluate` says."""
    try:
        import pytrec_eval
    except ImportError as exc:
        raise RuntimeError(f"retrieval evaluation needs pytrec_eval: {INSTALL}") from exc
    if len(run) == 0 or len(run) != len(relevant):
        raise ValueError(f"{len(run)} rankings for {len(relevant)} relevance sets")
    if any(not rel for rel in relevant):
        raise ValueError("every query needs at least one relevant passage")
    ranked = {f"q{i}": {f"d{j}": s for j, s in row.items()} for i, row in enumerate(run)}
    qrels = {f"q{i}": {f"d{j}": 1 for j in rel} for i, rel in enumerate(relevant)}
    per_query = pytrec_eval.RelevanceEvaluator(qrels, set(MEASURES)).evaluate(ranked)
    return Scores(
        ndcg_at_10=float(np.mean([v["ndcg_cut_10"] for v in per_query.values()])),
        recall_at_10=float(np.mean([v["recall_10"] for v in per_query.values()])),
    )
