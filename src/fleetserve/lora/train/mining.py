"""Hard negatives mined with the base model, and the negative columns of the training rows.

A pair that brings no negative (or fewer than asked for) gets the passages the base
model ranks highest for its query that are not one of that query's answers: the
mistakes the adapter should learn not to make. In-batch negatives alone are mostly
easy ones. Pure numpy: the caller encodes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ...wire.finetune import Pair
from .ireval import top_k, unit_rows

CHUNK = 256  # query rows scored at a time (a [CHUNK, corpus] float32 block)
# a candidate scoring above this share of the query's positive is more likely another
# answer than a mistake (NV-Retriever's positive-aware mining, "TopK-PercPos" at 95 %)
FALSE_NEGATIVE_RATIO = 0.95


def same_text(text: str) -> str:
    """The key under which two passages count as the same text: whitespace collapsed,
    case folded."""
    return " ".join(text.split()).casefold()


def mine(
    queries: NDArray[np.float32],
    corpus: NDArray[np.float32],
    positives: Sequence[Collection[int]],
    k: int,
    *,
    texts: Sequence[str] | None = None,
    skip: Sequence[Collection[int]] | None = None,
    ratio: float | None = FALSE_NEGATIVE_RATIO,
) -> list[list[int]]:
    """For each row i of ``queries`` (one per pair), up to ``k`` corpus indices, best
    ranked first by cosine similarity, that are not in ``positives[i]`` nor
    ``skip[i]``. With ``texts`` (the corpus's), a passage whose text is that of one of
    row i's positives (or skipped passages), or of a passage picked already, is passed
    over too. With ``ratio``, so is one scoring above ``ratio`` times the lowest
    score of row i's positives: probably an answer the pairs do not list (a false
    negative). A row left short by that gets the passages scored *lowest* instead:
    easy negatives, but never an answer in disguise, and every row keeps its ``k``
    columns (the base model of a language it was not trained on ranks many passages
    above the positive; its "hard" negatives there are mostly other answers). Fewer
    than ``k`` only when the corpus runs out."""
    n, m = len(queries), len(corpus)
    if len(positives) != n or (skip is not None and len(skip) != n):
        raise ValueError(f"{n} query rows for {len(positives)} positive sets")
    if k <= 0 or m == 0:
        return [[] for _ in range(n)]
    keys = [same_text(t) for t in texts] if texts is not None else None
    q, c = unit_rows(queries), unit_rows(corpus)
    out: list[list[int]] = []
    for start in range(0, n, CHUNK):
        scores = q[start : start + CHUNK] @ c.T
        for r, row in enumerate(scores):
            i = start + r
            banned = set(positives[i]) | (set(skip[i]) if skip is not None else set())
            limit = float("inf")
            own = [float(row[j]) for j in positives[i] if 0 <= j < m]
            if ratio is not None and own and min(own) > 0:
                limit = ratio * min(own)
            picks = _pick(row, banned, k, keys, limit)
            if len(picks) < k and limit < float("inf"):  # none safe: easy ones, the
                more = _pick(-row, banned | set(picks), k - len(picks), keys)  # lowest
                picks += [j for j in more if keys is None or keys[j] not in
                          {keys[p] for p in picks}]  # fmt: skip
            out.append(picks)
    return out


def _pick(
    row: NDArray[np.float32],
    banned: set[int],
    k: int,
    keys: list[str] | None,
    limit: float = float("inf"),
) -> list[int]:
    seen = {keys[j] for j in banned if 0 <= j < len(row)} if keys is not None else set()
    depth = min(len(row), 4 * (k + len(banned)) + 16)
    while True:
        picks: list[int] = []
        taken = set(seen)
        for j in top_k(row[None, :], depth)[0]:
            j = int(j)
            if j in banned or row[j] > limit or (keys is not None and keys[j] in taken):
                continue
            picks.append(j)
            if keys is not None:
                taken.add(keys[j])
            if len(picks) == k:
                return picks
        if depth == len(row):
            return picks
        depth = len(row)  # many near-duplicates near the top: look at all of them


def columns_wanted(pairs: Sequence[Pair], k: int) -> int:
    """Negative columns per row: ``k``, or 1 when ``k`` is 0 but a row brings
    negatives (they are used, and the rows must all have the same columns)."""
    if k <= 0 and any(p.negatives for p in pairs):
        return 1
    return max(0, k)


@dataclass(frozen=True)
class Negatives:
    """Each pair's negatives, all ``columns`` long; ``mined``: how many were mined."""

    rows: list[list[str]]
    columns: int
    mined: int


def given(pair: Pair, k: int) -> list[str]:
    """A pair's own negatives, without repeats or its positive's text, at most ``k``."""
    out: dict[str, str] = {}
    banned = same_text(pair.positive)
    for text in pair.negatives:
        key = same_text(text)
        if key != banned and key not in out:
            out[key] = text
    return list(out.values())[:k]


def negatives_for(
    pairs: Sequence[Pair],
    k: int,
    corpus: Sequence[str],
    corpus_vectors: NDArray[np.float32] | None,
    queries: Sequence[str] = (),
    query_vectors: NDArray[np.float32] | None = None,
    ratio: float | None = FALSE_NEGATIVE_RATIO,
) -> Negatives:
    """The negative columns for ``pairs``: each pair's own negatives first, then mined
    ones from ``corpus`` up to ``k``. ``queries`` are the distinct queries with their
    base encodings ``query_vectors``, ``corpus_vectors`` the corpus's (both may be
    ``None`` when no pair needs mining). A query's answers (any pair's positive for the
    same query) are never its negatives. When the corpus is too small for every row
    to get ``k``, every row gets as many as the poorest (the columns must agree).
    ``ratio``: see :func:`mine`."""
    own = [given(p, k) for p in pairs]
    mined: list[list[int]] = [[] for _ in pairs]
    need = [i for i, g in enumerate(own) if len(g) < k]
    if need:
        if corpus_vectors is None or query_vectors is None:
            raise ValueError("pairs need mined negatives but no encodings were given")
        where = {text: j for j, text in enumerate(corpus)}
        row_of = {q: i for i, q in enumerate(queries)}
        answers: dict[str, set[int]] = {}
        for p in pairs:
            answers.setdefault(p.query, set()).update(_ids(where, [p.positive]))
        mined_need = mine(
            query_vectors[[row_of[pairs[i].query] for i in need]],
            corpus_vectors,
            [answers[pairs[i].query] for i in need],
            k,
            texts=corpus,
            skip=[_ids(where, own[i]) for i in need],
            ratio=ratio,
        )
        for i, picks in zip(need, mined_need, strict=True):
            mined[i] = picks[: k - len(own[i])]
    rows = [g + [corpus[j] for j in picks] for g, picks in zip(own, mined, strict=True)]
    columns = min((len(r) for r in rows), default=0)
    rows = [r[:columns] for r in rows]
    count = sum(max(0, columns - len(g)) for g in own)
    return Negatives(rows, columns, count)


def pairs_negatives(
    pairs: Sequence[Pair],
    hard_negatives: int,
    passages: Sequence[str],
    passage_vectors: NDArray[np.float32],
    encode: Callable[[list[str]], NDArray[np.float32]],
    mining: Callable[[], None] = lambda: None,
) -> Negatives:
    """A run's negative columns: ``hard_negatives`` per pair (:func:`columns_wanted`),
    each pair's own, then mined from ``passages`` (every passage the run has seen, with
    their encodings) for the queries ``encode`` encodes; ``mining`` is called first
    when any pair needs mined ones."""
    k = columns_wanted(pairs, hard_negatives)
    corpus = list(dict.fromkeys(t for p in pairs for t in (p.positive, *p.negatives)))
    queries = list(dict.fromkeys(p.query for p in pairs))
    need = k > 0 and any(len(given(p, k)) < k for p in pairs)  # as negatives_for counts
    if need:
        mining()
    where = {t: j for j, t in enumerate(passages)}
    return negatives_for(
        pairs, k, corpus,
        passage_vectors[[where[t] for t in corpus]] if need else None,
        queries, encode(queries) if need else None,
    )  # fmt: skip


def _ids(where: dict[str, int], texts: Sequence[str]) -> set[int]:
    return {where[t] for t in texts if t in where}
