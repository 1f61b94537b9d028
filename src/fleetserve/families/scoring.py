"""The score and rerank routes, shared by every family that scores a query against items.

``POST /v1/score/{model}`` (native) and ``POST /v1/rerank`` (Cohere/Jina) carry the
same thing: one query and many documents. Families parse both with ``parse`` and
answer both with ``reply``; only the scoring in between is theirs.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..wire import Envelope, InvalidInput, Task
from ..wire.codec import TypedDecoder, dumps
from ..wire.requests import RerankRequest, ScoreRequest

_SCORE = TypedDecoder(ScoreRequest)
_RERANK = TypedDecoder(RerankRequest)
SCORE_TASKS = frozenset({Task.SCORE, Task.RERANK})


@dataclass(frozen=True, slots=True)
class ScoreQuery:
    query: str
    documents: list[str]
    truncate: bool = True
    top_n: int | None = None
    return_documents: bool = False


def parse(envelope: Envelope, body: bytes) -> ScoreQuery:
    """Decode a score or rerank body and check it; raises ``InvalidInput`` naming the field."""
    if envelope.task is Task.RERANK:
        r = _RERANK.decode(body, envelope.content_type)
        docs = [d if isinstance(d, str) else d.text for d in r.documents]
        q = ScoreQuery(r.query, docs, True, r.top_n, r.return_documents)
        field = "documents"
    else:
        s = _SCORE.decode(body, envelope.content_type)
        q = ScoreQuery(s.query, s.items, s.truncate)
        field = "items"
    if not q.query:
        raise InvalidInput("query must not be empty", field="query")
    if not q.documents:
        raise InvalidInput(f"{field} must not be empty: nothing to score", field=field)
    for i, d in enumerate(q.documents):
        if not d:
            raise InvalidInput(f"{field}[{i}] is an empty string", field=f"{field}[{i}]")
    if q.top_n is not None and q.top_n < 1:
        raise InvalidInput("top_n must be at least 1", field="top_n")
    return q


def reply(
    envelope: Envelope, model: str, q: ScoreQuery, scores: npt.ArrayLike, tokens: int
) -> bytes:
    """The reply body for ``envelope.task``: native scores and ranking, or Cohere results."""
    values = [float(s) for s in np.asarray(scores, dtype=np.float64).reshape(-1)]
    ranking = sorted(range(len(values)), key=lambda i: -values[i])
    if envelope.task is Task.RERANK:
        top = ranking[: q.top_n] if q.top_n is not None else ranking
        results: list[dict[str, object]] = []
        for i in top:
            r: dict[str, object] = {"index": i, "relevance_score": values[i]}
            if q.return_documents:
                r["document"] = {"text": q.documents[i]}
            results.append(r)
        body: dict[str, object] = {
            "id": envelope.request_id or uuid.uuid4().hex,
            "model": model,
            "results": results,
            "meta": {"billed_units": {"search_units": 1, "input_tokens": tokens}},
            "usage": {"total_tokens": tokens},
        }
    else:
        body = {
            "model": model,
            "scores": values,
            "ranking": ranking,
            "usage": {"tokens": tokens},
        }
    return dumps(body, envelope.accept)
