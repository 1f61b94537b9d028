"""The reference check's comparison: the library's replies against fleetserve's, per
kind of request, with the tuner's gates (``quality.compare``) and their figures
(``quality.measure``), and the first failing item named in one line."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...wire import FleetError
from .quality import Quality, compare, measure
from .reference_set import Request


@dataclass(frozen=True)
class Check:
    """One kind of request (encode, score, extract, generate) over the calibration set.

    Figures are ``None`` where the replies hold no such values: ``min_cosine`` (rows),
    ``max_score_diff`` (scores, norms and entity scores, relative to the largest
    reference score), ``ranking_equal`` (scores, and zero-shot labels in score order),
    ``labels_equal`` (extraction: labels and spans), ``tokens_equal`` (generation).
    ``mismatch``: the first failing item, one line; empty when it passed."""

    name: str
    requests: int
    items: int
    passed: bool
    min_cosine: float | None = None
    max_score_diff: float | None = None
    ranking_equal: bool | None = None
    labels_equal: bool | None = None
    tokens_equal: bool | None = None
    mismatch: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "requests": self.requests,
            "items": self.items,
            "passed": self.passed,
            "min_cosine": self.min_cosine,
            "max_score_diff": self.max_score_diff,
            "ranking_equal": self.ranking_equal,
            "labels_equal": self.labels_equal,
            "tokens_equal": self.tokens_equal,
            "mismatch": self.mismatch,
        }


def checks(
    reqs: Sequence[Request],
    ref: Sequence[dict[str, object]],
    got: Sequence[dict[str, object] | FleetError],
) -> list[Check]:
    """One :class:`Check` per task, in the order the tasks first appear."""
    names = list(dict.fromkeys(r.name for r in reqs))
    return [
        _check(name, [(k, r) for k, r in enumerate(reqs) if r.name == name], ref, got)
        for name in names
    ]


def _check(
    name: str,
    mine: list[tuple[int, Request]],
    ref: Sequence[dict[str, object]],
    got: Sequence[dict[str, object] | FleetError],
) -> Check:
    cosines: list[float] = []
    errors: list[float] = []
    ranked: list[bool] = []
    same: list[bool] = []
    first = ""
    for k, r in mine:
        cand = got[k]
        if isinstance(cand, FleetError):
            first = first or f"{name}: request {k}: fleetserve answered {cand.code}: {cand.message}"
            same.append(False)
            continue
        want_all, got_all = comparable(r.family, ref[k], cand)
        for aspect, want in want_all.items():  # each compared field on its own
            a, b = {aspect: want}, {aspect: got_all.get(aspect)}
            q, f = compare(a, b), measure(a, b)
            if f.min_cosine is not None:
                cosines.append(f.min_cosine)
            if f.max_score_error is not None:
                errors.append(f.max_score_error)
            if aspect == "scores" or r.family == "zero_shot":  # scores, or labels by score
                ranked.append(not f.rank_detail)
            if aspect != "scores":
                same.append(not f.mismatch)
            if not q.passed and not first:
                first = f"{name}: request {k}: {_what(r, q, f.min_cosine_at, f.max_score_error_at)}"
    return Check(
        name=name,
        requests=len(mine),
        items=sum(r.items for _, r in mine),
        passed=not first,
        min_cosine=min(cosines) if cosines else None,
        max_score_diff=max(errors) if errors else None,
        ranking_equal=all(ranked) if ranked else None,
        labels_equal=all(same) if name == "extract" and same else None,
        tokens_equal=all(same) if name == "generate" and same else None,
        mismatch=first,
    )


def comparable(
    family: str, ref: dict[str, object], got: dict[str, object]
) -> tuple[dict[str, object], dict[str, object]]:
    """The compared fields of both replies: fleetserve's cut to the reference's fields;
    for ``dense``, each row's norm beside its vector (a cosine cannot see a missing or
    an extra normalization; norms are held to the score gate); for ``sparse``, the term
    weights as vectors over the vocabulary (held to the cosine gate)."""
    cand = {k: got.get(k) for k in ref}
    if "embeddings" not in ref:
        return ref, cand
    if family == "sparse":
        rows_a, rows_b = _terms(ref["embeddings"]), _terms(cand["embeddings"])
        width = 1 + max((max(r, default=-1) for r in [*rows_a, *rows_b]), default=0)
        return {"embeddings": _dense(rows_a, width)}, {"embeddings": _dense(rows_b, width)}
    if family == "dense":
        ref = {**ref, "norms": _norms(ref["embeddings"])}
        cand["norms"] = _norms(cand["embeddings"])
    return ref, cand


def _norms(rows: object) -> list[float] | None:
    if not isinstance(rows, list):
        return None
    return [float(np.linalg.norm(np.asarray(r, np.float64))) for r in rows]


def _terms(rows: object) -> list[dict[int, float]]:
    """Sparse rows (``{"indices", "values"}``) as term -> weight."""
    out: list[dict[int, float]] = []
    for r in rows if isinstance(rows, list) else []:
        if isinstance(r, dict):
            out.append(dict(zip(r.get("indices") or [], r.get("values") or [], strict=False)))
    return out


def _dense(rows: list[dict[int, float]], width: int) -> list[list[float]]:
    out = []
    for r in rows:
        v = np.zeros(width, np.float64)
        v[list(r)] = list(r.values())
        out.append(v.tolist())
    return out


_INDEX = re.compile(r"\[(\d+)\]")


def _what(r: Request, q: Quality, cosine_at: str, score_at: str) -> str:
    """The failing item and the difference, in one line."""
    if q.metric == "min_cosine" and q.value < q.threshold:
        return f"{_item(r, cosine_at)}: {cosine_at} at cosine {q.value:.6f}, needs >= {q.threshold}"
    if q.metric == "max_score_error" and q.value > q.threshold:
        return (
            f"{_item(r, score_at)}: {score_at} off by {q.value:.2%} of the largest score, "
            f"needs <= {q.threshold:.0%}"
        )
    detail = q.detail  # a changed ranking, or a field that differs
    return f"{_item(r, detail)}: {detail}"


def _item(r: Request, path: str) -> str:
    """The input a reply path points at: ``inputs[3] "The quick…"``, else the query or
    prompt the whole request was about."""
    body = r.body
    found = _INDEX.search(path)
    for key in ("inputs", "items"):
        values = body.get(key)
        if found and isinstance(values, list) and int(found.group(1)) < len(values):
            i = int(found.group(1))
            return f"{key}[{i}] {_quote(values[i])}"
    for key in ("query", "prompt"):
        if isinstance(body.get(key), str):
            return f"{key} {_quote(body[key])}"
    return "the request"


def _quote(v: object) -> str:
    text = v if isinstance(v, str) else "(an image)"
    return json.dumps(text[:40] + ("…" if len(text) > 40 else ""), ensure_ascii=False)


__all__ = ["Check", "checks", "comparable"]
