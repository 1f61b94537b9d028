"""Multi-vector (ColBERT-style late interaction): one vector per kept token.

``/v1/encode/{model}`` returns one ``[tokens, dim]`` matrix per input (msgpack: one
array each; JSON: nested lists), in any output dtype of :mod:`.quantize` (int8 gives
one scale per token vector). ``/v1/score/{model}`` and ``/v1/rerank`` score by MaxSim:
for each query vector the best dot product with a document vector, summed over the
query vectors. The query and the documents are items of one request, so they batch.

Which tokens yield vectors, the markers, lengths and query expansion are settings of
:mod:`.multivector_tokens`; the projection comes from the checkpoint
(:mod:`.colbert_load`, HF and PyLate layouts). Vectors are L2-normalized per token when
the spec says ``normalize`` (the default), as ColBERT and PyLate do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..catalog import ModelSpec
from ..runtimes import Head, Output, Runtime
from ..wire import Envelope, InvalidInput, Task
from ..wire.codec import TypedDecoder, dumps
from ..wire.requests import MultiVectorEncodeRequest
from ..wire.values import Array
from . import scoring
from .base import Family, Prepared, padded_width
from .colbert_load import Checkpoint, read_checkpoint
from .multivector_tokens import MvItem, MvSettings, MvTokenizer
from .quantize import check_output_dtype, ragged_body


@dataclass(frozen=True, slots=True)
class _EncodeOptions:
    output_dtype: str
    normalize: bool


_ENCODE = TypedDecoder(MultiVectorEncodeRequest)
MvOptions = _EncodeOptions | scoring.ScoreQuery  # encode | score and rerank


class MultiVectorFamily(Family[MvItem, MvOptions, Array]):
    tasks = frozenset({Task.ENCODE, Task.SCORE, Task.RERANK})

    def __init__(self, spec: ModelSpec, runtime: Runtime, path: Path) -> None:
        self.spec = spec
        self.runtime = runtime
        self.path = path
        self.checkpoint = Checkpoint("plain", path)
        self.settings = MvSettings.resolve(spec.options, None)
        self._tok: MvTokenizer | None = None
        self.dim = 0

    def load(self) -> None:
        ckpt = read_checkpoint(self.path)
        self.settings = MvSettings.resolve(self.spec.options, ckpt.settings)
        if self.settings.projection == "none":
            ckpt = Checkpoint(ckpt.layout, ckpt.encoder_dir, (), ckpt.settings)
        self.checkpoint = ckpt
        self._tok = MvTokenizer(ckpt.encoder_dir, self.settings, self.spec.max_seq_len)
        self.runtime.load(ckpt.encoder_dir, Head.BASE)

    def warmup(self) -> None:
        tok = self.tokenizer
        q, _ = tok.encode(["warm up"], True, tok.limit(True), True)
        d, _ = tok.encode(["warm up"], False, tok.limit(False), True)
        out = self.forward(q + d)
        self.dim = int(out[0].shape[1])

    @property
    def tokenizer(self) -> MvTokenizer:
        if self._tok is None:
            raise RuntimeError("adapter is not loaded")
        return self._tok

    def memory_bytes(self) -> int:
        return self.runtime.memory_bytes() + self.checkpoint.nbytes

    # -- preprocess -------------------------------------------------------------
    def preprocess(self, envelope: Envelope, body: bytes) -> Prepared[MvItem, MvOptions]:
        if envelope.task in scoring.SCORE_TASKS:
            q = scoring.parse(envelope, body)
            docs = "documents" if envelope.task is Task.RERANK else "items"
            query = self._encode([q.query], True, None, q.truncate, "query")
            items = query + self._encode(q.documents, False, None, q.truncate, docs)
            return self._prepared(items, q)
        if envelope.task is not Task.ENCODE:
            raise InvalidInput(f"model {self.spec.id} does not serve {envelope.task}", field="path")
        r = _ENCODE.decode(body, envelope.content_type)
        check_output_dtype(r.output_dtype)
        texts = [r.inputs] if isinstance(r.inputs, str) else r.inputs
        if not texts:
            raise InvalidInput("inputs must not be empty", field="inputs")
        normalize = self.spec.normalize if r.normalize is None else r.normalize
        items = self._encode(texts, r.is_query, r.max_tokens, r.truncate, "inputs")
        return self._prepared(items, _EncodeOptions(r.output_dtype, normalize))

    def _encode(
        self, texts: list[str], is_query: bool, max_tokens: int | None, truncate: bool, field: str
    ) -> list[MvItem]:
        tok = self.tokenizer
        for i, t in enumerate(texts):
            if not t:
                f = field if field == "query" else f"{field}[{i}]"
                raise InvalidInput(f"{f} is an empty string", field=f)
        limit = tok.limit(is_query)
        if max_tokens is not None:
            if max_tokens < tok.minimum(is_query):
                raise InvalidInput(
                    f"max_tokens must be at least {tok.minimum(is_query)} "
                    "(special and marker tokens count)",
                    field="max_tokens",
                )
            limit = min(limit, max_tokens)
        items, over = tok.encode(texts, is_query, limit, truncate)
        if over is not None:
            f = field if field == "query" else f"{field}[{over}]"
            raise InvalidInput(
                f"{f} is longer than the model's limit of {tok.limit(is_query)} tokens "
                "and truncate is false",
                field=f,
            )
        return items

    @staticmethod
    def _prepared(items: list[MvItem], options: MvOptions) -> Prepared[MvItem, MvOptions]:
        return Prepared(items=items, options=options, tokens=sum(it.tokens for it in items))

    # -- forward ----------------------------------------------------------------
    def forward(self, items: Sequence[MvItem]) -> list[Array]:
        """Each item's kept token vectors, projected (not yet normalized)."""
        width = padded_width(max(len(it.ids) for it in items), self.spec.max_seq_len)
        ids = np.full((len(items), width), self.tokenizer.pad_id, dtype=np.int64)
        mask = np.zeros((len(items), width), dtype=np.int64)
        for i, it in enumerate(items):
            ids[i, : len(it.ids)] = it.ids
            mask[i, : it.attend] = 1
        hidden = self.runtime.run(ids, mask, Output.HIDDEN)
        rows = np.concatenate([hidden[i, it.keep] for i, it in enumerate(items)])
        flat = self.checkpoint.project(rows)
        cuts = np.cumsum([len(it.keep) for it in items])[:-1]
        return list(np.split(flat, cuts))

    # -- postprocess ------------------------------------------------------------
    def postprocess(
        self, envelope: Envelope, prepared: Prepared[MvItem, MvOptions], outputs: list[Array]
    ) -> bytes:
        o = prepared.options
        if isinstance(o, scoring.ScoreQuery):  # score and rerank
            vecs = [_unit(m) for m in outputs] if self.spec.normalize else outputs
            scores = [maxsim(vecs[0], d) for d in vecs[1:]]
            return scoring.reply(envelope, self.spec.id, o, scores, prepared.tokens)
        mats = [_unit(m) for m in outputs] if o.normalize else outputs
        body: dict[str, object] = {"model": self.spec.id, "usage": {"tokens": prepared.tokens}}
        body.update(ragged_body(mats, o.output_dtype, mats[0].shape[1], envelope.accept))
        return dumps(body, envelope.accept)


def maxsim(query: Array, doc: Array) -> float:
    """Late interaction: sum over query vectors of the best dot product with the doc."""
    if not len(query) or not len(doc):
        return 0.0
    return float((query @ doc.T).max(axis=1).sum())


def _unit(m: Array) -> Array:
    return np.asarray(m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12))
