"""Cross-encoders: score each (query, document) pair with a sequence-classification head.

Serves ``/v1/score/{model}`` and ``/v1/rerank`` (Cohere/Jina). Each pair is one item.
Long pairs are cut on the document side only, so the query survives intact; a query
longer than ``max_query_tokens`` (default: half of ``max_seq_len``) is cut to that first.

Spec ``options``:

- ``activation``: ``sigmoid``, ``softmax`` or ``none``. The default follows
  sentence-transformers: the activation saved in ``config.json`` if any, else sigmoid
  for one label and softmax for more.
- ``label_index``: which label is the relevance score (default 0 for one label, 1 for
  two; models with more labels must set it).
- ``max_query_tokens``: the longest query kept, in tokens.
- ``token_type_ids``: pass segment ids to the model (default: when ``config.json``
  has ``type_vocab_size`` above 1, as BERT does).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np
from tokenizers import Encoding, Tokenizer

from ..catalog import ModelSpec
from ..runtimes import Head, Output, Runtime
from ..wire import Envelope, InvalidInput
from ..wire.values import Array
from . import scoring
from .base import Family, Prepared, pad_batch, rows
from .tokenize import cut_long, encoded

ACTIVATIONS = ("sigmoid", "softmax", "none")
Pair = tuple[list[int], list[int]]  # a (query, document) pair's ids and token type ids
_ST_ACTIVATIONS = {"Sigmoid": "sigmoid", "Softmax": "softmax", "Identity": "none"}


class _Config(TypedDict, total=False):
    """The fields of a checkpoint's config.json the family reads."""

    type_vocab_size: int
    pad_token_id: int | None
    id2label: dict[str, str]
    num_labels: int
    sentence_transformers: dict[str, str]  # activation_fn, e.g. torch.nn...Sigmoid


class PairTokenizer:
    """Encodes (query, document) pairs with the model's fast tokenizer, cutting documents."""

    def __init__(self, path: Path, max_len: int, max_query_tokens: int) -> None:
        file = path / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"{file} is missing: fleetserve needs a fast tokenizer")
        self._tok = Tokenizer.from_file(str(file))  # encodes each text, whole
        self._tok.no_padding()
        self._tok.no_truncation()
        self._pair = Tokenizer.from_file(str(file))  # joins pairs, cutting the document
        self._pair.no_padding()
        self._pair.enable_truncation(max_length=max_len, strategy="only_second")
        self.max_len = max_len
        self.specials = self._tok.num_special_tokens_to_add(is_pair=True)
        if not 0 < max_query_tokens < max_len - self.specials:
            raise ValueError(
                f"max_query_tokens must be between 1 and {max_len - self.specials - 1} "
                f"(max_seq_len {max_len} less {self.specials} special tokens), "
                f"not {max_query_tokens}"
            )
        self.max_query_tokens = max_query_tokens

    def _whole(self, texts: list[str]) -> list[Encoding]:
        return list(self._tok.encode_batch(texts, add_special_tokens=False))

    def _over(self, enc: Encoding) -> bool:
        return len(enc.ids) > self.max_len

    def token_id(self, *names: str) -> int | None:
        for name in names:
            tid = self._tok.token_to_id(name)
            if tid is not None:
                return int(tid)
        return None

    def encode(
        self, query: str, docs: list[str], *, truncate: bool
    ) -> tuple[list[Pair], int | None]:
        """(ids, type ids) per pair; and when not truncating, the first pair that is too
        long (-1 for the query alone), else None."""
        whole = self._whole  # only what can matter of a long text is tokenized
        # a long text's cut is tokenized once, while it is cut (encoded takes it as it is)
        q = encoded(cut_long([query], self.max_len, whole, self._over), whole)[0]
        encs = encoded(cut_long(docs, self.max_len, whole, self._over), whole)
        if truncate:
            if len(q.ids) > self.max_query_tokens:
                q.truncate(self.max_query_tokens)
        else:
            if len(q.ids) + self.specials >= self.max_len:
                return [], -1
            for i, d in enumerate(encs):
                if len(q.ids) + len(d.ids) + self.specials > self.max_len:
                    return [], i
        pairs = []
        for d in encs:
            e = self._pair.post_process(q, d, add_special_tokens=True)
            pairs.append((e.ids, e.type_ids))
        return pairs, None


@dataclass(frozen=True, slots=True)
class ScoreHead:
    """How logits become one score: which label, through which activation."""

    activation: str
    label_index: int


class CrossEncoderFamily(Family[Pair, scoring.ScoreQuery, Array]):
    tasks = scoring.SCORE_TASKS

    def __init__(self, spec: ModelSpec, runtime: Runtime, path: Path) -> None:
        self.spec = spec
        self.runtime = runtime
        self.path = path
        opts = spec.options
        act = opts.get("activation")
        if act is not None and act not in ACTIVATIONS:
            raise ValueError(f"model {spec.id}: options.activation must be one of {ACTIVATIONS}")
        self._activation: str | None = act
        label = opts.get("label_index")
        self._label_index: int | None = None if label is None else int(label)
        self._max_query = int(opts.get("max_query_tokens") or spec.max_seq_len // 2)
        types = opts.get("token_type_ids")
        self._types_option: bool | None = None if types is None else bool(types)
        self._tok: PairTokenizer | None = None
        self.head = ScoreHead("none", 0)
        self.use_types = False
        self.pad_id = 0

    def load(self) -> None:
        cfg_file = self.path / "config.json"
        config: _Config = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        self._tok = PairTokenizer(self.path, self.spec.max_seq_len, self._max_query)
        self.head = self._head(config)
        types = self._types_option
        self.use_types = int(config.get("type_vocab_size", 0)) > 1 if types is None else types
        pad = config.get("pad_token_id")
        if pad is None:
            pad = self._tok.token_id("[PAD]", "<pad>")
        self.pad_id = int(pad or 0)
        self.runtime.load(self.path, Head.SEQUENCE_CLASSIFICATION)

    def _head(self, config: _Config) -> ScoreHead:
        # transformers leaves id2label out of config.json for its default of two labels
        labels = len(config.get("id2label") or {}) or int(config.get("num_labels", 2))
        label = self._label_index
        if label is None:
            if labels > 2:
                raise ValueError(
                    f"model {self.spec.id} has {labels} labels: set options.label_index "
                    "to the one that means relevant"
                )
            label = labels - 1
        if not 0 <= label < labels:
            raise ValueError(f"model {self.spec.id}: label_index {label} is not in [0, {labels})")
        act = self._activation
        if act is None:
            st_act = (config.get("sentence_transformers") or {}).get("activation_fn") or ""
            act = _ST_ACTIVATIONS.get(st_act.rsplit(".", 1)[-1])
        if act is None:
            act = "sigmoid" if labels == 1 else "softmax"
        return ScoreHead(act, label)

    def warmup(self) -> None:
        pairs, _ = self.tokenizer.encode("warm up", ["a document", "another"], truncate=True)
        self.forward(pairs)

    @property
    def tokenizer(self) -> PairTokenizer:
        if self._tok is None:
            raise RuntimeError("adapter is not loaded")
        return self._tok

    def memory_bytes(self) -> int:
        return self.runtime.memory_bytes()

    def preprocess(self, envelope: Envelope, body: bytes) -> Prepared[Pair, scoring.ScoreQuery]:
        q = scoring.parse(envelope, body)
        pairs, over = self.tokenizer.encode(q.query, q.documents, truncate=q.truncate)
        if over is not None:
            field = "query" if over < 0 else f"items[{over}]"
            what = "the query is" if over < 0 else f"the query and {field} together are"
            raise InvalidInput(
                f"{what} longer than the model's limit of "
                f"{self.spec.max_seq_len} tokens and truncate is false",
                field=field,
            )
        lengths = [len(ids) for ids, _ in pairs]
        return Prepared(items=pairs, options=q, tokens=sum(lengths), lengths=lengths)

    def forward(self, items: Sequence[Pair]) -> Sequence[Array]:
        ids, mask = pad_batch([it[0] for it in items], self.pad_id, self.spec.max_seq_len)
        types = None
        if self.use_types:
            types = np.zeros_like(ids)
            for i, (_, tt) in enumerate(items):
                types[i, : len(tt)] = tt
        out = self.runtime.run(ids, mask, Output.LOGITS, types)
        return rows(out.reshape(len(items), -1))

    def postprocess(
        self, envelope: Envelope, prepared: Prepared[Pair, scoring.ScoreQuery], outputs: list[Array]
    ) -> bytes:
        scores = scores_from_logits(np.stack(outputs), self.head)
        return scoring.reply(envelope, self.spec.id, prepared.options, scores, prepared.tokens)


def scores_from_logits(logits: Array, head: ScoreHead) -> Array:
    """One score per row of ``[n, labels]`` logits."""
    x = logits.astype(np.float64)
    if head.activation == "softmax":
        e = np.exp(x - x.max(axis=1, keepdims=True))
        x = e / e.sum(axis=1, keepdims=True)
    col = x[:, head.label_index]
    if head.activation == "sigmoid":
        col = 0.5 * (1.0 + np.tanh(0.5 * col))  # sigmoid, without overflow
    return col


__all__ = [
    "ACTIVATIONS",
    "CrossEncoderFamily",
    "PairTokenizer",
    "ScoreHead",
    "scores_from_logits",
]
