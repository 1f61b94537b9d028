"""Quality gates: a candidate's replies against the fp32 torch reference's.

Each family gets calibration *requests*, which go through the adapter exactly as the
worker runs them (preprocess, forward, postprocess) and are compared as the client
would see them. The gates, per reply field:

=====================  ===============================================================
``embeddings``         each row (a vector, or a token vector) at cosine >= 0.9999
``scores``, scores of  within 1 % of the largest reference score, and rankings
entities and labels    identical (items whose reference scores are closer than that
                       may swap)
labels, spans, text    identical (generation: greedy tokens identical)
=====================  ===============================================================

A candidate that fails is reported with its measured quality and never chosen.
"""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...catalog import ModelSpec
from ...families import AnyFamily
from ...runtimes.calibration import CALIBRATION
from ...wire import Encoding, Envelope, Task
from ...wire.values import Array

MIN_COSINE = 0.9999
SCORE_TOLERANCE = 0.01  # of the largest |reference score|
SCORE_FLOOR = 1e-3  # the scale below which score differences are judged absolutely
LABELS = ["sports", "finance", "cooking", "technology", "health", "travel"]
ENTITY_LABELS = ["person", "location", "organization", "date"]
SCORE_KEYS = frozenset({"scores", "score", "relevance_score", "values"})


@dataclass(frozen=True)
class Quality:
    metric: str
    value: float
    threshold: float
    passed: bool
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "value": self.value,
            "threshold": self.threshold,
            "passed": self.passed,
            "detail": self.detail,
        }


def calibration(spec: ModelSpec) -> list[tuple[Task, dict[str, object]]]:
    """The family's calibration requests: (task, JSON body)."""
    texts = list(CALIBRATION)
    fam = spec.family
    if fam in ("dense", "multivector"):
        return [(Task.ENCODE, {"inputs": texts[k : k + 8]}) for k in range(0, len(texts), 8)]
    if fam in ("sparse", "cross_encoder"):
        return [(Task.SCORE, {"query": texts[q], "items": texts[q + 1 : q + 17]}) for q in range(8)]
    if fam == "ner":
        return [(Task.EXTRACT, {"inputs": texts[k : k + 8]}) for k in range(0, len(texts), 8)]
    if fam in ("zero_shot", "span_ner"):
        labels = LABELS if fam == "zero_shot" else ENTITY_LABELS
        return [
            (Task.EXTRACT, {"inputs": texts[k : k + 8], "labels": labels})
            for k in range(0, len(texts), 8)
        ]
    if fam == "image":
        return [(Task.ENCODE, {"inputs": [{"image": img} for img in images(8)]})]
    if fam == "generate":
        prompts = ["The capital of France is", "def fibonacci(n):", "Three colours:", "Hi"]
        return [
            (Task.GENERATE, {"prompt": p, "max_tokens": 24, "temperature": 0.0}) for p in prompts
        ]
    raise ValueError(f"no quality gate for the {fam} family")


def json_envelope(model: str, task: Task, request_id: str) -> Envelope:
    """The envelope of a JSON request sent straight to an adapter (no gateway)."""
    return Envelope(
        request_id=request_id,
        model=model,
        task=task,
        content_type=Encoding.JSON,
        accept=Encoding.JSON,
        cost_hint=0,
        deadline=float("inf"),
    )


def replies(
    adapter: AnyFamily,
    spec: ModelSpec,
    requests: Sequence[tuple[Task, dict[str, object]]],
    deadline: float | None = None,
    times: list[float] | None = None,
    plan: Callable[[int], AbstractContextManager[None]] | None = None,
) -> list[object]:
    """Each request through preprocess, forward and postprocess; the decoded replies.
    ``deadline`` (``time.monotonic()``): a TimeoutError once it has passed, between two
    requests (the compute thread cannot be interrupted within one). ``times``: each
    request's seconds are appended to it. ``plan(rows)``: a block each forward runs in
    (an adapter on every row)."""
    out: list[object] = []
    for task, body in requests:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"the quality set ran past its deadline after {len(out)} requests")
        t0 = time.monotonic()
        env = json_envelope(spec.id, task, "calibration")
        prepared = adapter.preprocess(env, json.dumps(body).encode())
        with plan(len(prepared.items)) if plan is not None else nullcontext():
            rows = list(adapter.forward(prepared.items))
        out.append(json.loads(adapter.postprocess(env, prepared, rows)))
        if times is not None:
            times.append(time.monotonic() - t0)
    return out


@dataclass(frozen=True)
class Figures:
    """What a walk of two reply trees measured, and where: the lowest row cosine and
    the largest score error with the path of the row or score list they were found
    at (``embeddings[3]``), a changed ranking, and the first field that differs
    (labels, spans, text). ``None``: the replies had no such values."""

    min_cosine: float | None
    min_cosine_at: str
    max_score_error: float | None
    max_score_error_at: str
    rank_detail: str
    mismatch: str
    rows: int


def measure(reference: object, candidate: object) -> Figures:
    """The figures :func:`compare` judges, with their locations (for a report that
    names the item that failed)."""
    acc = _walked(reference, candidate)
    low = min(range(len(acc.cosines)), key=acc.cosines.__getitem__, default=None)
    high = max(range(len(acc.score_errors)), key=acc.score_errors.__getitem__, default=None)
    return Figures(
        min_cosine=None if low is None else acc.cosines[low],
        min_cosine_at="" if low is None else acc.cosine_at[low],
        max_score_error=None if high is None else acc.score_errors[high],
        max_score_error_at="" if high is None else acc.score_at[high],
        rank_detail=acc.rank_detail,
        mismatch=acc.mismatch,
        rows=len(acc.cosines),
    )


def _walked(reference: object, candidate: object) -> _Acc:
    acc = _Acc()
    _walk(reference, candidate, "", acc)
    return acc


def compare(reference: object, candidate: object) -> Quality:
    """Walk both reply trees; the first failing gate, else the tightest margin."""
    acc = _walked(reference, candidate)
    if acc.mismatch:
        return Quality("identical", 0.0, 1.0, False, acc.mismatch)
    if acc.cosines:
        low = min(acc.cosines)
        detail = f"{len(acc.cosines)} rows" + (f"; {acc.rank_detail}" if acc.rank_detail else "")
        ok = low >= MIN_COSINE and not acc.rank_detail
        return Quality("min_cosine", low, MIN_COSINE, ok, detail)
    if acc.score_errors:
        err = max(acc.score_errors)
        ok = err <= SCORE_TOLERANCE and not acc.rank_detail
        return Quality("max_score_error", err, SCORE_TOLERANCE, ok, acc.rank_detail)
    return Quality("identical", 1.0, 1.0, True, "labels and text identical")


@dataclass
class _Acc:
    cosines: list[float] = field(default_factory=list)
    cosine_at: list[str] = field(default_factory=list)  # each row's path
    score_errors: list[float] = field(default_factory=list)
    score_at: list[str] = field(default_factory=list)  # each error's path
    mismatch: str = ""
    rank_detail: str = ""


def _walk(a: object, b: object, path: str, acc: _Acc) -> None:
    if acc.mismatch:
        return
    key = path.rsplit(".", 1)[-1].split("[", 1)[0]
    if key in ("id", "usage", "created", "meta") or key.endswith("_ms"):
        return  # ids, token counts and timings are not outputs
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            acc.mismatch = f"{path or 'reply'}: fields differ"
        if _labelled(a) and _labelled(b):  # labels sorted by score: compare by label
            _by_label(a, b, path, acc)
            rest = {k: v for k, v in a.items() if k not in ("labels", "scores")}
        else:
            rest = a
        for k in rest:
            _walk(a[k], b.get(k), f"{path}.{k}" if path else k, acc)
    elif key == "embeddings":
        for i, (x, y) in enumerate(zip(_rows(a), _rows(b), strict=False)):
            acc.cosines.append(_cosine(x, y))
            acc.cosine_at.append(f"{path}[{i}]")
        if len(_rows(a)) != len(_rows(b)):
            acc.mismatch = f"{path}: row counts differ"
    elif key in SCORE_KEYS and _numeric(a) and _numeric(b):
        _scores(np.asarray(a, np.float64), np.asarray(b, np.float64), path, acc)
    elif key == "ranking":
        return  # judged from the scores, with ties allowed
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            acc.mismatch = f"{path}: {len(a)} entries, candidate {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _walk(x, y, f"{path}[{i}]", acc)
    elif isinstance(a, float) and isinstance(b, float | int):
        scale = max(1.0, abs(a))
        acc.score_errors.append(abs(a - float(b)) / scale)
        acc.score_at.append(path)
    elif a != b:
        acc.mismatch = f"{path}: {a!r} became {b!r}"[:200]


def _labelled(d: dict[str, Any]) -> bool:
    labels, scores = d.get("labels"), d.get("scores")
    return (
        isinstance(labels, list)
        and all(isinstance(x, str) for x in labels)
        and _numeric(scores)
        and len(labels) == len(scores or [])
    )


def _by_label(a: dict[str, Any], b: dict[str, Any], path: str, acc: _Acc) -> None:
    """Labels sorted by score (zero-shot): the same labels, their scores within the
    tolerance, and an order that changes only between near ties."""
    if set(a["labels"]) != set(b["labels"]):
        acc.mismatch = f"{path}.labels: {a['labels']!r} became {b['labels']!r}"[:200]
        return
    got = dict(zip(b["labels"], b["scores"], strict=True))
    ref = np.asarray(a["scores"], np.float64)
    cand = np.asarray([got[label] for label in a["labels"]], np.float64)
    _scores(ref, cand, f"{path}.scores", acc)


def _scores(a: Array, b: Array, path: str, acc: _Acc) -> None:
    """``a`` the reference's scores, ``b`` the candidate's, item by item."""
    if a.shape != b.shape:
        acc.mismatch = f"{path}: shapes differ"
        return
    if a.size == 0:
        return
    scale = max(float(np.abs(a).max()), SCORE_FLOOR)
    diff = np.abs(a - b)
    acc.score_errors.append(float(diff.max()) / scale)
    acc.score_at.append(f"{path}[{int(diff.argmax())}]")
    tol = SCORE_TOLERANCE * scale
    order = [int(i) for i in np.argsort(-b, kind="stable")]
    for x, i in enumerate(order):  # every pair the candidate ranks i above j
        for j in order[x + 1 :]:
            if a[j] - a[i] > tol and not acc.rank_detail:
                acc.rank_detail = f"{path}: ranking changed (items {i} and {j})"


def _numeric(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(x, int | float) for x in v)


def _rows(v: object) -> list[Array]:
    """The innermost number lists of a nested list (vectors or token vectors)."""
    if _numeric(v):
        return [np.asarray(v, np.float64)] if v else []
    if isinstance(v, list):
        return [r for x in v for r in _rows(x)]
    return []


def _cosine(x: Array, y: Array) -> float:
    if x.shape != y.shape:
        return 0.0
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx < 1e-12 or ny < 1e-12:
        return 1.0 if max(nx, ny) < 1e-12 else 0.0
    return float(x @ y) / (nx * ny)


def images(n: int) -> list[str]:
    """``n`` deterministic 64x64 test images (gradients and noise), as base64 PNG."""
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for k in range(n):
        yy, xx = np.mgrid[0:64, 0:64]
        base = np.stack([xx * (k + 1), yy * (8 - k), (xx + yy) * 2], axis=-1) % 256
        noisy = (base + rng.integers(0, 40, base.shape)) % 256
        buf = io.BytesIO()
        Image.fromarray(noisy.astype(np.uint8)).save(buf, format="PNG")
        out.append(base64.b64encode(buf.getvalue()).decode())
    return out


__all__ = [
    "MIN_COSINE",
    "SCORE_TOLERANCE",
    "Figures",
    "Quality",
    "calibration",
    "compare",
    "images",
    "json_envelope",
    "measure",
    "replies",
]
