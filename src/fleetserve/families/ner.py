"""Token-classification NER: per-token tags aggregated into character spans.

Serves ``/v1/extract/{model}`` for ``*ForTokenClassification`` checkpoints (BIO, IOB1
or plain tags in ``config.json`` ``id2label``). Aggregation follows transformers'
token-classification pipeline (``simple``, ``first``, ``average``, ``max``); spans carry
character offsets into the original text from the fast tokenizer. Texts longer than
``max_seq_len`` are split into overlapping windows (``stride`` tokens of overlap), and
overlapping spans from neighbouring windows are merged as the pipeline does.

Spec options: ``aggregation`` (default ``simple``), ``stride`` (default a quarter of
``max_seq_len``), ``threshold`` (default 0), ``ignore_labels`` (default ``["O"]``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from ..catalog import ModelSpec
from ..catalog.infer import family_hint
from ..runtimes import Head, Output, Runtime
from ..runtimes.checked_load import IncompleteCheckpoint
from ..wire import Envelope, Task
from ..wire.codec import dumps
from ..wire.values import Array
from . import ner_spans as spans
from .base import Family, Prepared, pad_batch, rows
from .extract import fast_tokenizer, parse_extract


@dataclass(frozen=True, slots=True)
class _Window:
    text: int  # index of the input it belongs to
    offsets: list[tuple[int, int]]
    words: list[int | None]  # word index per token; None for special tokens


@dataclass(frozen=True, slots=True)
class _Options:
    texts: list[str]
    windows: list[_Window]
    threshold: float


class NerFamily(Family[list[int], _Options, Array]):
    tasks = frozenset({Task.EXTRACT})

    def __init__(self, spec: ModelSpec, runtime: Runtime, path: Path) -> None:
        self.spec = spec
        self.runtime = runtime
        self.path = path
        opts = spec.options
        self.aggregation = str(opts.get("aggregation", "simple"))
        if self.aggregation not in spans.STRATEGIES:
            raise ValueError(
                f"model {spec.id}: aggregation must be one of {', '.join(spans.STRATEGIES)}"
            )
        self.stride = int(opts.get("stride", spec.max_seq_len // 4))
        self.threshold = float(opts.get("threshold", 0.0))
        self.ignore = frozenset(str(x) for x in opts.get("ignore_labels", ["O"]))
        self.labels: list[str] = []
        self._tok: Tokenizer | None = None
        self.pad_id = 0

    def load(self) -> None:
        config = json.loads((self.path / "config.json").read_text())
        if not config.get("id2label"):
            raise IncompleteCheckpoint(
                f"{self.path}/config.json has no id2label: the token labels are unknown, "
                f"so family ner cannot name what it finds; {family_hint(self.path)}"
            )
        tok, self.pad_id = fast_tokenizer(self.path)
        budget = self.spec.max_seq_len - tok.num_special_tokens_to_add(False)
        if not 0 <= self.stride < budget:
            raise ValueError(f"model {self.spec.id}: stride must be in [0, {budget})")
        tok.enable_truncation(max_length=self.spec.max_seq_len, stride=self.stride)
        self._tok = tok
        id2label = {int(k): str(v) for k, v in config["id2label"].items()}
        self.labels = [id2label[i] for i in range(len(id2label))]
        self.runtime.load(self.path, Head.TOKEN_CLASSIFICATION)

    def warmup(self) -> None:
        self.forward([self.tokenizer.encode("warm up").ids] * 2)

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tok is None:
            raise RuntimeError("adapter is not loaded")
        return self._tok

    def memory_bytes(self) -> int:
        return self.runtime.memory_bytes()

    def preprocess(self, envelope: Envelope, body: bytes) -> Prepared[list[int], _Options]:
        req = parse_extract(envelope, body)
        texts: list[str] = list(req.inputs)
        items: list[list[int]] = []
        windows: list[_Window] = []
        for i, enc in enumerate(self.tokenizer.encode_batch(texts)):
            for w in [enc, *enc.overflowing]:
                words = [
                    None if special else word
                    for word, special in zip(w.word_ids, w.special_tokens_mask, strict=True)
                ]
                items.append(w.ids)
                windows.append(_Window(i, w.offsets, words))
        threshold = self.threshold if req.threshold is None else req.threshold
        return Prepared(
            items=items,
            options=_Options(texts, windows, threshold),
            tokens=sum(len(x) for x in items),
        )

    def forward(self, items: Sequence[list[int]]) -> Sequence[Array]:
        ids, mask = pad_batch(items, self.pad_id)
        return rows(self.runtime.run(ids, mask, Output.LOGITS))

    def postprocess(
        self, envelope: Envelope, prepared: Prepared[list[int], _Options], outputs: list[Array]
    ) -> bytes:
        o = prepared.options
        found: list[list[spans.Span]] = [[] for _ in o.texts]
        counts = [0] * len(o.texts)
        for w, logits, n in zip(o.windows, outputs, prepared.lengths, strict=True):
            probs = spans.softmax(np.asarray(logits[:n], dtype=np.float32))
            entities = spans.aggregate(probs, w.offsets, w.words, self.labels, self.aggregation)
            found[w.text].extend(e for e in entities if e.label not in self.ignore)
            counts[w.text] += 1
        results = []
        for text, entities, windows in zip(o.texts, found, counts, strict=True):
            if windows > 1:
                entities = spans.merge_overlapping(entities)
            results.append(
                [
                    {
                        "start": e.start,
                        "end": e.end,
                        "text": text[e.start : e.end],
                        "label": e.label,
                        "score": e.score,
                    }
                    for e in entities
                    if e.score >= o.threshold
                ]
            )
        body = {"model": self.spec.id, "results": results, "usage": {"tokens": prepared.tokens}}
        return dumps(body, envelope.accept)
