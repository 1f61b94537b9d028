"""Sparse (SPLADE) embeddings: one weight per vocabulary term, and sparse dot-product scoring.

Serves ``/v1/encode/{model}``, ``/v1/score/{model}`` and ``/v1/rerank``. The runtime
returns ``max over tokens of log(1 + relu(logits))`` for each text; this family keeps
the nonzero terms (or the ``top_k`` heaviest) as ``{"indices", "values"}``, indices in
ascending order. Scores are dot products of the query's and each document's vector.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from ..catalog import ModelSpec
from ..runtimes import Head, Output, Runtime
from ..wire import Encoding, Envelope, InvalidInput, Task
from ..wire.codec import TypedDecoder, array_to_wire, dumps
from ..wire.requests import SparseEncodeRequest
from ..wire.values import Array
from . import scoring
from .base import Family, Prepared, pad_batch, rows
from .tokenize import TextTokenizer

_ENCODE = TypedDecoder(SparseEncodeRequest)


@dataclass(frozen=True, slots=True)
class SparseOptions:
    top_k: int | None = None
    return_tokens: bool = False
    query: scoring.ScoreQuery | None = None  # set for score and rerank


class SparseFamily(Family[list[int], SparseOptions, Array]):
    tasks = frozenset({Task.ENCODE, *scoring.SCORE_TASKS})

    def __init__(self, spec: ModelSpec, runtime: Runtime, path: Path) -> None:
        self.spec = spec
        self.runtime = runtime
        self.path = path
        self._tok: TextTokenizer | None = None
        self._vocab: Tokenizer | None = None

    def load(self) -> None:
        self._tok = TextTokenizer(self.path, self.spec.max_seq_len)
        self._vocab = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.runtime.load(self.path, Head.MASKED_LM)

    def warmup(self) -> None:
        ids, _ = self.tokenizer.encode(["warm up", "a sparse vector"], truncate=True)
        self.forward(ids)

    @property
    def tokenizer(self) -> TextTokenizer:
        if self._tok is None:
            raise RuntimeError("adapter is not loaded")
        return self._tok

    def memory_bytes(self) -> int:
        return self.runtime.memory_bytes()

    # -- preprocess -------------------------------------------------------------
    def preprocess(self, envelope: Envelope, body: bytes) -> Prepared[list[int], SparseOptions]:
        if envelope.task in scoring.SCORE_TASKS:
            q = scoring.parse(envelope, body)
            texts = [q.query, *q.documents]
            docs_field = "documents" if envelope.task is Task.RERANK else "items"
            fields = ["query"] + [f"{docs_field}[{i}]" for i in range(len(q.documents))]
            opts = SparseOptions(query=q)
            truncate = q.truncate
        else:
            r = _ENCODE.decode(body, envelope.content_type)
            texts = [r.inputs] if isinstance(r.inputs, str) else r.inputs
            if not texts:
                raise InvalidInput("inputs must not be empty", field="inputs")
            for i, t in enumerate(texts):
                if not t:
                    raise InvalidInput(f"inputs[{i}] is an empty string", field=f"inputs[{i}]")
            if r.top_k is not None and r.top_k < 1:
                raise InvalidInput("top_k must be at least 1", field="top_k")
            fields = [f"inputs[{i}]" for i in range(len(texts))]
            opts = SparseOptions(r.top_k, r.return_tokens)
            truncate = r.truncate
        ids, over = self.tokenizer.encode(texts, truncate=truncate)
        if over is not None:
            raise InvalidInput(
                f"{fields[over]} is longer than the model's limit of "
                f"{self.spec.max_seq_len} tokens and truncate is false",
                field=fields[over],
            )
        return Prepared(items=ids, options=opts, tokens=sum(len(x) for x in ids))

    # -- forward ----------------------------------------------------------------
    def forward(self, items: Sequence[list[int]]) -> Sequence[Array]:
        ids, mask = pad_batch(items, self.tokenizer.pad_id, self.spec.max_seq_len)
        return rows(self.runtime.run(ids, mask, Output.SPLADE))

    # -- postprocess ------------------------------------------------------------
    def postprocess(
        self, envelope: Envelope, prepared: Prepared[list[int], SparseOptions], outputs: list[Array]
    ) -> bytes:
        o = prepared.options
        if o.query is not None:
            query = np.asarray(outputs[0], dtype=np.float32)
            docs = np.stack(outputs[1:]).astype(np.float32, copy=False)
            return scoring.reply(envelope, self.spec.id, o.query, docs @ query, prepared.tokens)
        msgpack = envelope.accept is Encoding.MSGPACK
        embeddings = []
        for row in outputs:
            idx, vals = sparsify(np.asarray(row), o.top_k)
            emb: dict[str, object]
            if msgpack:
                emb = {"indices": array_to_wire(idx), "values": array_to_wire(vals)}
            else:
                emb = {"indices": idx.tolist(), "values": vals.tolist()}
            if o.return_tokens:
                emb["tokens"] = self._token_strings(idx)
            embeddings.append(emb)
        body = {
            "model": self.spec.id,
            "embeddings": embeddings,
            "usage": {"tokens": prepared.tokens},
        }
        return dumps(body, envelope.accept)

    def _token_strings(self, idx: Array) -> list[str]:
        vocab = self._vocab
        if vocab is None:
            raise RuntimeError("adapter is not loaded")
        return [vocab.id_to_token(int(i)) or "" for i in idx]


def sparsify(row: Array, top_k: int | None = None) -> tuple[Array, Array]:
    """The positive entries of a dense row (the ``top_k`` largest when given), as uint32
    indices in ascending order and their float32 values."""
    idx = np.flatnonzero(row > 0)
    if top_k is not None and len(idx) > top_k:
        keep = np.argpartition(-row[idx], top_k - 1)[:top_k]
        idx = np.sort(idx[keep])
    return idx.astype(np.uint32), row[idx].astype(np.float32)
