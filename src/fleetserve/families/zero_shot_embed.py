"""Zero-shot classification by embedding similarity, with any dense embedder.

Texts and ``hypothesis_template.format(label)`` are embedded (the spec's pooling) and
compared by cosine similarity ``c``. Single-label scores are ``softmax(c / temperature)``
over the labels; multi-label scores are ``sigmoid((c - midpoint) / temperature)`` per
label. These are similarities squashed into [0, 1], not calibrated probabilities:
``midpoint`` is the cosine at which a label counts as even odds and is model-specific.

Label embeddings are cached (LRU) across requests, since label sets repeat; usage
still counts every label's tokens, so it does not depend on the cache.

Spec options: ``hypothesis_template`` (default ``"This text is about {}."``),
``temperature`` (default 0.05), ``midpoint`` (default 0.15), ``label_cache`` (entries,
default 4096).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..catalog import ModelSpec
from ..runtimes import Head, Output, Runtime
from ..wire.values import Array
from .base import Prepared, pad_batch, rows
from .tokenize import TextTokenizer
from .zero_shot_method import Method, check_template

DEFAULT_TEMPLATE = "This text is about {}."


@dataclass(frozen=True, slots=True)
class _State:
    texts: int
    hypotheses: list[str]
    cached: dict[str, Array]  # label vectors known at preprocess time
    missing: list[str]  # hypotheses embedded in this request, after the texts


class _LabelCache:
    """A small thread-safe LRU of hypothesis -> unit vector."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[str, Array] = OrderedDict()
        self._lock = threading.Lock()

    def get_many(self, keys: list[str]) -> dict[str, Array]:
        out = {}
        with self._lock:
            for k in keys:
                v = self._data.get(k)
                if v is not None:
                    self._data.move_to_end(k)
                    out[k] = v
        return out

    def put_many(self, items: dict[str, Array]) -> None:
        with self._lock:
            for k, v in items.items():
                self._data[k] = v
                self._data.move_to_end(k)
            while len(self._data) > self.size:
                self._data.popitem(last=False)


class EmbeddingMethod(Method[list[int], _State]):
    def __init__(self, spec: ModelSpec, runtime: Runtime, path: Path) -> None:
        self.spec = spec
        self.runtime = runtime
        self.path = path
        opts = spec.options
        self.template = check_template(
            spec.id, str(opts.get("hypothesis_template", DEFAULT_TEMPLATE))
        )
        self.temperature = float(opts.get("temperature", 0.05))
        if self.temperature <= 0:
            raise ValueError(f"model {spec.id}: temperature must be positive")
        self.midpoint = float(opts.get("midpoint", 0.15))
        self.output = Output.CLS if spec.pooling == "cls" else Output.MEAN
        self.cache = _LabelCache(int(opts.get("label_cache", 4096)))
        self._tok: TextTokenizer | None = None

    def load(self) -> None:
        self._tok = TextTokenizer(self.path, self.spec.max_seq_len)
        self.runtime.load(self.path, Head.BASE)

    def prepare(self, texts: list[str], labels: list[str]) -> Prepared[list[int], _State]:
        if self._tok is None:
            raise RuntimeError("adapter is not loaded")
        hyps = [self.template.format(label) for label in labels]
        cached = self.cache.get_many(hyps)
        ids, _ = self._tok.encode(texts + hyps, truncate=True)
        tokens = sum(len(x) for x in ids)  # cached labels count too: usage does not vary
        pairs = zip(ids[len(texts) :], hyps, strict=True)
        missing_ids, missing = [], []
        for x, h in pairs:
            if h not in cached:
                missing_ids.append(x)
                missing.append(h)
        items = ids[: len(texts)] + missing_ids
        return Prepared(items, _State(len(texts), hyps, cached, missing), tokens)

    def forward(self, items: Sequence[list[int]]) -> Sequence[Array]:
        pad = self._tok.pad_id if self._tok else 0
        ids, mask = pad_batch(items, pad, self.spec.max_seq_len)
        return rows(self.runtime.run(ids, mask, self.output))

    def scores(self, state: _State, outputs: list[Array], multi_label: bool) -> Array:
        s = state
        vecs = _unit(np.stack(outputs).astype(np.float64))
        fresh = {h: v.copy() for h, v in zip(s.missing, vecs[s.texts :], strict=True)}
        self.cache.put_many(fresh)
        known = {**s.cached, **fresh}
        cos = vecs[: s.texts] @ np.stack([known[h] for h in s.hypotheses]).T
        if multi_label:
            z = (cos - self.midpoint) / self.temperature
            out: Array = 1.0 / (1.0 + np.exp(-z))
        else:
            z = cos / self.temperature
            e = np.exp(z - z.max(axis=1, keepdims=True))
            out = e / e.sum(axis=1, keepdims=True)
        return out


def _unit(x: Array) -> Array:
    out: Array = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return out
