"""Multi-vector settings and tokenization: markers, lengths, query expansion, kept tokens.

Settings come from the spec's ``options`` first, then from the checkpoint (PyLate's
``config_sentence_transformers.json``, ColBERT's ``artifact.metadata``), then defaults:

- ``projection``: ``auto`` (the checkpoint's linear layers, if any) or ``none``;
- ``query_prefix`` / ``document_prefix``: a marker token (``[unused0]``, ``[Q] ``)
  inserted after the first special token as ColBERT and PyLate do, or, when it is no
  single token of the vocabulary, a string prepended to the text as is (``"query: "``);
- ``query_length``: queries are truncated to it and, with ``query_expansion``, padded to
  it with ``[MASK]`` tokens whose vectors are kept; ``attend_to_expansion`` lets the
  other tokens attend to them (ColBERT's default is not to);
- ``document_length``: documents are truncated to it (default: ``max_seq_len``);
- ``skip_cls`` / ``skip_sep``: drop the leading / trailing special token's vector;
- ``skip_punctuation``: ``none``, ``documents`` (ColBERT) or ``all``: drop the vectors
  of ``skiplist`` tokens (default: each character of ``string.punctuation``).

Padding never yields vectors. Lengths count every token, special and marker included.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from ..wire.values import Array

_KEYS = {
    "projection",
    "query_prefix",
    "document_prefix",
    "query_length",
    "document_length",
    "query_expansion",
    "attend_to_expansion",
    "skip_cls",
    "skip_sep",
    "skip_punctuation",
    "skiplist",
}


@dataclass(frozen=True)
class MvSettings:
    projection: str = "auto"
    query_prefix: str = ""
    document_prefix: str = ""
    query_length: int | None = None
    document_length: int | None = None
    query_expansion: bool = False
    attend_to_expansion: bool = False
    skip_cls: bool = False
    skip_sep: bool = False
    skip_punctuation: str = "none"
    skiplist: tuple[str, ...] = tuple(string.punctuation)

    @classmethod
    def resolve(cls, options: dict[str, Any], checkpoint: dict[str, Any] | None) -> MvSettings:
        opts = dict(options)
        if "doc_prefix" in opts:
            opts.setdefault("document_prefix", opts.pop("doc_prefix"))
        unknown = set(opts) - _KEYS
        if unknown:
            raise ValueError(
                f"unknown multivector options {sorted(unknown)}; known: {sorted(_KEYS)}"
            )
        merged = {**(checkpoint or {}), **opts}
        if merged.get("projection", "auto") not in ("auto", "none"):
            raise ValueError("option projection must be auto or none")
        skip = merged.get("skip_punctuation", "none")
        skip = (
            {True: "documents", False: "none"}.get(skip, skip) if isinstance(skip, bool) else skip
        )
        if skip not in ("none", "documents", "all"):
            raise ValueError("option skip_punctuation must be none, documents or all")
        merged["skip_punctuation"] = skip
        if "skiplist" in merged:
            merged["skiplist"] = tuple(str(w) for w in merged["skiplist"])
        for key in ("query_length", "document_length"):
            if merged.get(key) is not None:
                merged[key] = int(merged[key])
        return cls(**merged)


@dataclass(frozen=True, slots=True)
class MvItem:
    """One input for ``forward``: ids, how many are attended, which rows to keep."""

    ids: list[int]
    attend: int  # the first ``attend`` ids are attended to
    keep: Array  # int64 positions whose vectors are returned
    tokens: int  # real tokens (not expansion), reported as usage

    def __len__(self) -> int:
        return len(self.ids)


class MvTokenizer:
    def __init__(self, path: Path, settings: MvSettings, max_len: int) -> None:
        file = path / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"{file} is missing: fleetserve needs a fast tokenizer")
        tok = Tokenizer.from_file(str(file))
        pad = tok.padding
        tok.no_padding()
        tok.no_truncation()
        self._tok = tok
        self.s = settings
        self.max_len = max_len
        self.n_special = tok.num_special_tokens_to_add(False)
        pid = tok.token_to_id("[PAD]") if pad is None else pad.get("pad_id")
        self.pad_id = int(pid or 0)
        mask = tok.token_to_id("[MASK]")
        mask = tok.token_to_id("<mask>") if mask is None else mask
        self.mask_id = int(mask or 0)
        self.markers = {True: self._marker(settings.query_prefix)}
        self.markers[False] = self._marker(settings.document_prefix)
        ids = (tok.token_to_id(w) for w in settings.skiplist)
        self.skip_ids = np.array(sorted({i for i in ids if i is not None}), dtype=np.int64)

    def _marker(self, prefix: str) -> int | None:
        if not prefix:
            return None
        tid = self._tok.token_to_id(prefix)
        tid = self._tok.token_to_id(prefix.strip()) if tid is None else tid
        return None if tid is None else int(tid)

    def limit(self, is_query: bool) -> int:
        """The model's own length limit for a query or a document."""
        own = self.s.query_length if is_query else self.s.document_length
        return min(own or self.max_len, self.max_len)

    def minimum(self, is_query: bool) -> int:
        return self.n_special + (self.markers[is_query] is not None) + 1

    def encode(
        self, texts: list[str], is_query: bool, limit: int, truncate: bool
    ) -> tuple[list[MvItem], int | None]:
        """Items for texts of one kind, each at most ``limit`` tokens long; with
        ``truncate`` false, also the index of the first text over the model's limit."""
        s, marker = self.s, self.markers[is_query]
        prefix = "" if marker is not None else (s.query_prefix if is_query else s.document_prefix)
        encs = self._tok.encode_batch([prefix + t for t in texts], add_special_tokens=False)
        budget = limit - self.n_special - (marker is not None)
        own_budget = self.limit(is_query) - self.n_special - (marker is not None)
        expand = is_query and s.query_expansion and s.query_length is not None
        skip_punct = s.skip_punctuation == "all" or (
            s.skip_punctuation == "documents" and not is_query
        )
        items = []
        for i, enc in enumerate(encs):
            if not truncate and len(enc.ids) > own_budget:
                return [], i
            enc.truncate(budget)
            full = self._tok.post_process(enc)
            ids, special = list(full.ids), np.array(full.special_tokens_mask, dtype=bool)
            if marker is not None:
                at = 1 if len(special) and special[0] else 0
                ids.insert(at, marker)
                special = np.insert(special, at, False)
            n = len(ids)
            keep = np.ones(n, dtype=bool)
            if s.skip_cls and n and special[0]:
                keep[0] = False
            if s.skip_sep and n and special[-1]:
                keep[-1] = False
            if skip_punct and len(self.skip_ids):
                keep &= ~np.isin(np.asarray(ids), self.skip_ids)
            positions = np.flatnonzero(keep)
            if expand and n < limit:
                ids += [self.mask_id] * (limit - n)
                positions = np.concatenate([positions, np.arange(n, limit)])
            attend = len(ids) if expand and s.attend_to_expansion else n
            items.append(MvItem(ids, attend, positions.astype(np.int64), n))
        return items, None
