"""Zero-shot classification with an NLI cross-encoder, as transformers' pipeline does it.

Each (text, ``hypothesis_template.format(label)``) pair is one item, truncated on the
text side only at ``max_seq_len``. Single-label scores are a softmax of the
*entailment* logits over the labels; multi-label scores are, per label, a softmax of
entailment against contradiction. The entailment and contradiction classes come from
``config.json`` ``label2id`` (names starting with ``entail`` and ``contradict``; a
two-class model's other class stands in for contradiction).

Spec option: ``hypothesis_template`` (default ``"This example is {}."``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from ..catalog import ModelSpec
from ..catalog.infer import family_hint
from ..runtimes import Head, Output, Runtime
from ..runtimes.checked_load import IncompleteCheckpoint
from ..wire.values import Array
from .base import Prepared, pad_batch, rows
from .extract import fast_tokenizer
from .zero_shot_method import Method, check_template

DEFAULT_TEMPLATE = "This example is {}."
NliItem = tuple[list[int], list[int]]  # a (text, hypothesis) pair's ids and token type ids


@dataclass(frozen=True, slots=True)
class _State:
    texts: int
    labels: int


def nli_classes(label2id: dict[str, int]) -> tuple[int, int]:
    """(entailment, contradiction) class indices from a config's ``label2id``."""
    by_name = {k.lower(): int(v) for k, v in label2id.items()}
    ent = next((i for k, i in by_name.items() if k.startswith("entail")), None)
    if ent is None:
        raise ValueError(
            "config.json label2id has no entailment class: not an NLI model "
            f"(labels: {', '.join(label2id)})"
        )
    contr = next((i for k, i in by_name.items() if k.startswith("contradict")), None)
    if contr is None:  # two-class models: entailment / not_entailment
        contr = len(by_name) - 1 if ent == 0 else 0
    return ent, contr


class NliMethod(Method[NliItem, _State]):
    def __init__(self, spec: ModelSpec, runtime: Runtime, path: Path) -> None:
        self.spec = spec
        self.runtime = runtime
        self.path = path
        template = str(spec.options.get("hypothesis_template", DEFAULT_TEMPLATE))
        self.template = check_template(spec.id, template)
        self.entailment = self.contradiction = 0
        self.use_types = False
        self.pad_id = 0
        self._tok: Tokenizer | None = None
        self._fallback: Tokenizer | None = None

    def load(self) -> None:
        self._tok, self.pad_id = fast_tokenizer(self.path)
        self._tok.enable_truncation(max_length=self.spec.max_seq_len, strategy="only_first")
        # when the hypothesis alone is too long for only_first, truncate both sides
        self._fallback, _ = fast_tokenizer(self.path)
        self._fallback.enable_truncation(max_length=self.spec.max_seq_len)
        config = json.loads((self.path / "config.json").read_text())
        try:
            self.entailment, self.contradiction = nli_classes(config.get("label2id") or {})
        except ValueError as exc:
            raise IncompleteCheckpoint(f"{self.path}/{exc}; {family_hint(self.path)}") from None
        # BERT-like models have segment embeddings; RoBERTa, DeBERTa-v3 and BART do not
        self.use_types = int(config.get("type_vocab_size") or 0) >= 2
        self.runtime.load(self.path, Head.SEQUENCE_CLASSIFICATION)

    def prepare(self, texts: list[str], labels: list[str]) -> Prepared[NliItem, _State]:
        if self._tok is None or self._fallback is None:
            raise RuntimeError("adapter is not loaded")
        hyps = [self.template.format(label) for label in labels]
        pairs = [(t, h) for t in texts for h in hyps]
        encs: list[Encoding]
        try:
            encs = self._tok.encode_batch(pairs)
        except Exception:  # tokenizers raises a plain Exception for a too-long hypothesis
            encs = [self._encode_one(p) for p in pairs]
        items = [(e.ids, e.type_ids) for e in encs]
        lengths = [len(e.ids) for e in encs]
        return Prepared(items, _State(len(texts), len(labels)), sum(lengths), lengths)

    def _encode_one(self, pair: tuple[str, str]) -> Encoding:
        assert self._tok is not None and self._fallback is not None
        try:
            return self._tok.encode(*pair)
        except Exception:
            return self._fallback.encode(*pair)

    def forward(self, items: Sequence[NliItem]) -> Sequence[Array]:
        ids, mask = pad_batch([it[0] for it in items], self.pad_id)
        types = None
        if self.use_types:
            types, _ = pad_batch([it[1] for it in items], 0)
        return rows(self.runtime.run(ids, mask, Output.LOGITS, token_type_ids=types))

    def scores(self, state: _State, outputs: list[Array], multi_label: bool) -> Array:
        s = state
        logits = np.stack(outputs).astype(np.float64).reshape(s.texts, s.labels, -1)
        if multi_label:
            pair = logits[..., [self.contradiction, self.entailment]]
            return _softmax(pair)[..., 1]
        return _softmax(logits[..., self.entailment])


def _softmax(x: Array) -> Array:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out: Array = e / e.sum(axis=-1, keepdims=True)
    return out
