"""Dense embeddings: mean or CLS pooling, normalize, Matryoshka dimensions, dtypes.

Serves ``/v1/encode/{model}`` (native: float32, float16, int8 and binary, see
:mod:`.quantize`), ``/v1/embeddings`` (OpenAI: float or base64 float32), and
``/v1/score/{model}`` and ``/v1/rerank`` by cosine similarity: the query and the
documents are items of one request, so they share batches.

Spec options: ``query_prefix`` and ``document_prefix`` (for example E5's ``"query: "``
and ``"passage: "``) are prepended to the texts when scoring; encode clients add
their own.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..catalog import ModelSpec
from ..runtimes import Head, Output, Runtime
from ..wire import Envelope, InvalidInput, Task
from ..wire.codec import TypedDecoder, dumps
from ..wire.requests import EmbeddingsRequest, EncodeRequest
from ..wire.values import Array
from . import scoring
from .base import Family, Prepared, pad_batch, rows
from .quantize import check_output_dtype, vectors_body
from .token_ids import check_ids, id_fields, split_input
from .tokenize import TextTokenizer

_ENCODE = TypedDecoder(EncodeRequest)
_EMBEDDINGS = TypedDecoder(EmbeddingsRequest)


@dataclass(frozen=True, slots=True)
class DenseOptions:
    normalize: bool
    output_dtype: str
    dimensions: int | None
    openai_base64: bool = False


DenseOpts = DenseOptions | scoring.ScoreQuery  # encode and embeddings | score and rerank


class DenseFamily(Family[list[int], DenseOpts, Array]):
    tasks = frozenset({Task.ENCODE, Task.EMBEDDINGS, Task.SCORE, Task.RERANK})

    def __init__(self, spec: ModelSpec, runtime: Runtime, path: Path) -> None:
        self.spec = spec
        self.runtime = runtime
        self.path = path
        self._tok: TextTokenizer | None = None
        self.dim = spec.dimensions or 0
        self.query_prefix = str(spec.options.get("query_prefix", ""))
        self.document_prefix = str(spec.options.get("document_prefix", ""))

    def load(self) -> None:
        self._tok = TextTokenizer(self.path, self.spec.max_seq_len)
        self.runtime.load(self.path, Head.BASE)

    def warmup(self) -> None:
        out = self.forward([self.tokenizer.encode(["warm up"], truncate=True)[0][0]] * 2)
        self.dim = int(out[0].shape[0])

    @property
    def tokenizer(self) -> TextTokenizer:
        if self._tok is None:
            raise RuntimeError("adapter is not loaded")
        return self._tok

    def memory_bytes(self) -> int:
        return self.runtime.memory_bytes()

    # -- preprocess -------------------------------------------------------------
    def preprocess(self, envelope: Envelope, body: bytes) -> Prepared[list[int], DenseOpts]:
        if envelope.task in scoring.SCORE_TASKS:
            return self._prepare_score(envelope, body)
        texts: str | list[str]
        if envelope.task is Task.EMBEDDINGS:
            req = _EMBEDDINGS.decode(body, envelope.content_type)
            if req.encoding_format not in ("float", "base64"):
                raise InvalidInput(
                    "encoding_format must be 'float' or 'base64'", field="encoding_format"
                )
            texts, token_ids = split_input(req.input)
            field = "input"
            opts = DenseOptions(True, "float32", req.dimensions, req.encoding_format == "base64")
            truncate = True
            if token_ids is not None:  # the model's own ids: straight to the model
                self._check_dimensions(opts)
                tok = self.tokenizer
                where = id_fields(req.input, token_ids)
                ids = check_ids(token_ids, tok.vocab_size, tok.max_len, where)
                return Prepared(items=ids, options=opts, tokens=sum(len(x) for x in ids))
        else:
            r = _ENCODE.decode(body, envelope.content_type)
            check_output_dtype(r.output_dtype)
            texts, field, truncate = r.inputs, "inputs", r.truncate
            normalize = self.spec.normalize if r.normalize is None else r.normalize
            opts = DenseOptions(normalize, r.output_dtype, r.dimensions)
        if isinstance(texts, str):
            texts = [texts]
        if not texts:
            raise InvalidInput(f"{field} must not be empty", field=field)
        for i, t in enumerate(texts):
            if not t:
                raise InvalidInput(f"{field}[{i}] is an empty string", field=f"{field}[{i}]")
        self._check_dimensions(opts)
        ids = self._tokenize(texts, truncate, [f"{field}[{i}]" for i in range(len(texts))])
        return Prepared(items=ids, options=opts, tokens=sum(len(x) for x in ids))

    def _check_dimensions(self, opts: DenseOptions) -> None:
        if opts.dimensions is not None and not (0 < opts.dimensions <= self.dim):
            raise InvalidInput(f"dimensions must be between 1 and {self.dim}", field="dimensions")

    def _prepare_score(self, envelope: Envelope, body: bytes) -> Prepared[list[int], DenseOpts]:
        q = scoring.parse(envelope, body)
        texts = [self.query_prefix + q.query] + [self.document_prefix + d for d in q.documents]
        docs = "documents" if envelope.task is Task.RERANK else "items"
        fields = ["query"] + [f"{docs}[{i}]" for i in range(len(q.documents))]
        ids = self._tokenize(texts, q.truncate, fields)
        return Prepared(items=ids, options=q, tokens=sum(len(x) for x in ids))

    def _tokenize(self, texts: list[str], truncate: bool, fields: list[str]) -> list[list[int]]:
        ids, truncated = self.tokenizer.encode(texts, truncate=truncate)
        if truncated is not None:
            raise InvalidInput(
                f"{fields[truncated]} is longer than the model's limit of "
                f"{self.spec.max_seq_len} tokens and truncate is false",
                field=fields[truncated],
            )
        return ids

    # -- forward ----------------------------------------------------------------
    def forward(self, items: Sequence[list[int]]) -> Sequence[Array]:
        ids, mask = pad_batch(items, self.tokenizer.pad_id, self.spec.max_seq_len)
        return rows(self.runtime.run(ids, mask, Output(self.spec.pooling)))

    # -- postprocess ------------------------------------------------------------
    def postprocess(
        self, envelope: Envelope, prepared: Prepared[list[int], DenseOpts], outputs: list[Array]
    ) -> bytes:
        emb = np.stack(outputs)
        o = prepared.options
        if isinstance(o, scoring.ScoreQuery):  # score and rerank
            unit = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
            scores = unit[1:] @ unit[0]
            return scoring.reply(envelope, self.spec.id, o, scores, prepared.tokens)
        if o.dimensions is not None:
            emb = emb[:, : o.dimensions]
        if o.normalize:
            norms = np.linalg.norm(emb, axis=1, keepdims=True)
            emb = emb / np.maximum(norms, 1e-12)
        if envelope.task is Task.EMBEDDINGS:
            emb32 = np.ascontiguousarray(emb, np.float32)
            return self._openai_body(envelope, o, prepared.tokens, emb32)
        body: dict[str, object] = {"model": self.spec.id, "usage": {"tokens": prepared.tokens}}
        body.update(vectors_body(emb, o.output_dtype, envelope.accept))
        return dumps(body, envelope.accept)

    def _openai_body(self, envelope: Envelope, o: DenseOptions, tokens: int, emb: Array) -> bytes:
        vecs: Sequence[object]
        vecs = _b64_rows(emb.astype("<f4", copy=False)) if o.openai_base64 else emb.tolist()
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vecs)]
        body = {
            "object": "list",
            "data": data,
            "model": self.spec.id,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        return dumps(body, envelope.accept)


def _b64_rows(arr: Array) -> list[str]:
    """Base64 of each row. When a row is a multiple of 3 bytes, one encode of the whole
    buffer sliced per row gives the same strings at a fraction of the cost."""
    row_bytes = arr.shape[1] * arr.itemsize
    if row_bytes % 3:
        return [base64.b64encode(r.tobytes()).decode() for r in arr]
    text = base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode()
    step = row_bytes // 3 * 4
    return [text[k : k + step] for k in range(0, len(text), step)]
