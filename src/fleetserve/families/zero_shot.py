"""Zero-shot classification: labels chosen per request, single- or multi-label.

Serves ``/v1/extract/{model}`` with ``labels`` required. Two methods, picked by the
spec option ``method``:

- ``nli`` (default): an NLI cross-encoder scores each (text, hypothesis) pair, as
  transformers' zero-shot-classification pipeline does (see ``zero_shot_nli``);
- ``embedding``: a sentence embedder compares each text with each label's hypothesis
  by cosine similarity (see ``zero_shot_embed``).

Every (text, label) pair, or every text and label embedding, is its own item, so one
forward batch mixes requests with different label sets. The reply is
``{"model", "results": [{"labels", "scores"} per input, best first], "usage"}``;
with ``threshold`` (request, else spec option) labels scoring below it are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..catalog import ModelSpec
from ..runtimes import Runtime
from ..wire import Envelope, InvalidInput, Task
from ..wire.codec import dumps
from ..wire.values import Array
from .base import Family, Prepared
from .extract import parse_extract
from .zero_shot_embed import EmbeddingMethod
from .zero_shot_method import Method
from .zero_shot_nli import NliMethod

METHODS = ("nli", "embedding")
# an item of either method: token ids (embedding), or ids and token type ids (nli)
ZeroShotItem = list[int] | tuple[list[int], list[int]]


@dataclass(frozen=True, slots=True)
class _Options:
    labels: list[str]
    multi_label: bool
    threshold: float | None
    state: object  # the method's


class ZeroShotFamily(Family[ZeroShotItem, _Options, Array]):
    tasks = frozenset({Task.EXTRACT})

    def __init__(self, spec: ModelSpec, runtime: Runtime, path: Path) -> None:
        self.spec = spec
        self.runtime = runtime
        self.path = path
        method = str(spec.options.get("method", "nli"))
        self.method: Method[Any, Any]  # picked by the spec
        if method == "nli":
            self.method = NliMethod(spec, runtime, path)
        elif method == "embedding":
            self.method = EmbeddingMethod(spec, runtime, path)
        else:
            raise ValueError(f"model {spec.id}: method must be one of {', '.join(METHODS)}")
        threshold = spec.options.get("threshold")
        self.threshold = None if threshold is None else float(threshold)

    def load(self) -> None:
        self.method.load()

    def warmup(self) -> None:
        p = self.method.prepare(["warm up"], ["warm", "cold"])
        self.method.scores(p.options, list(self.method.forward(p.items)), False)

    def memory_bytes(self) -> int:
        return self.runtime.memory_bytes()

    def preprocess(self, envelope: Envelope, body: bytes) -> Prepared[ZeroShotItem, _Options]:
        req = parse_extract(envelope, body)
        if not req.labels:
            raise InvalidInput("labels must list at least one candidate label", field="labels")
        seen: set[str] = set()
        for i, label in enumerate(req.labels):
            if not label.strip():
                raise InvalidInput(f"labels[{i}] is empty", field=f"labels[{i}]")
            if label in seen:
                raise InvalidInput(f"labels[{i}] repeats {label!r}", field=f"labels[{i}]")
            seen.add(label)
        texts: list[str] = list(req.inputs)
        p = self.method.prepare(texts, req.labels)
        threshold = self.threshold if req.threshold is None else req.threshold
        opts = _Options(req.labels, req.multi_label, threshold, p.options)
        return Prepared(p.items, opts, p.tokens, p.lengths)

    def forward(self, items: Sequence[ZeroShotItem]) -> Sequence[Array]:
        return self.method.forward(items)

    def postprocess(
        self, envelope: Envelope, prepared: Prepared[ZeroShotItem, _Options], outputs: list[Array]
    ) -> bytes:
        o = prepared.options
        # one label cannot be normalized across labels: score it on its own, as transformers does
        multi = o.multi_label or len(o.labels) == 1
        scores = self.method.scores(o.state, outputs, multi)
        results = []
        for row in scores:
            order = sorted(range(len(o.labels)), key=lambda j: -float(row[j]))
            if o.threshold is not None:
                order = [j for j in order if row[j] >= o.threshold]
            results.append(
                {"labels": [o.labels[j] for j in order], "scores": [float(row[j]) for j in order]}
            )
        body = {"model": self.spec.id, "results": results, "usage": {"tokens": prepared.tokens}}
        return dumps(body, envelope.accept)
