"""The libraries models are made for, answering the calibration requests in the shape
of fleetserve's JSON replies (only the fields the check compares).

=================  =================================================================
family             reference
=================  =================================================================
``dense``          sentence-transformers' ``SentenceTransformer``: its modules (pooling,
                   normalization), ``max_seq_length`` and prompts (``encode_query``,
                   ``encode_document``, ``similarity``)
``sparse``         transformers' ``AutoModelForMaskedLM``, max over tokens of
                   ``log1p(relu(logits))`` (SPLADE, as the family defines it)
``cross_encoder``  sentence-transformers' ``CrossEncoder`` (its activation; softmax
                   over several labels)
``multivector``    sentence-transformers' ``MultiVectorEncoder`` (PyLate checkpoints;
                   the HF/stanford-nlp layout: colbert-ai, :mod:`.reference_colbert`)
``ner``, others    :mod:`.reference_extract`
=================  =================================================================

Nothing here reads the spec's choices where the model's files decide (pooling,
prefixes, limits, labels): those are what the check puts on trial.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ...catalog import ModelSpec
from ...wire import Task


class Library(Protocol):
    """A reference: ``load`` once, then ``reply`` per calibration request."""

    name: str
    version: str

    def load(self) -> None: ...

    def reply(self, task: Task, body: dict[str, Any]) -> dict[str, object]: ...


class NoReference(Exception):
    """No reference for this spec here: its library is not installed, or no
    comparison is written for it (the check is skipped, and says why)."""

    def __init__(self, library: str, message: str) -> None:
        super().__init__(message)
        self.library = library


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def text_library(spec: ModelSpec, weights: Path, device: str) -> Library | None:
    """The reference for ``spec``'s family over the directory ``weights``, for the
    embedding and scoring families (None for the others)."""
    fam = spec.family
    if fam == "dense":
        return SentenceTransformers(weights, device)
    if fam == "sparse":
        return Splade(weights, device)
    if fam == "cross_encoder":
        return CrossEncoders(spec, weights, device)
    if fam == "multivector" and (weights / "modules.json").is_file():
        return MultiVectors(weights, device)
    return None


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


class SentenceTransformers:
    """``dense``: a SentenceTransformer as its files describe it. ``encode`` as the
    library's callers get it (a ``default_prompt_name`` applies there, and fleetserve's
    encode adds no prefix: such a model fails the check); scores with
    ``encode_query``, ``encode_document`` and the model's own ``similarity`` (a model
    scored by dot product without normalization fails against fleetserve's cosine)."""

    name = "sentence-transformers"

    def __init__(self, path: Path, device: str) -> None:
        self.path, self.device = path, device
        self.version = version("sentence-transformers")
        self._model: Any = None

    def load(self) -> None:
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(self.path), device=self.device)

    def reply(self, task: Task, body: dict[str, Any]) -> dict[str, object]:
        m = self._model
        if task is Task.SCORE:
            q = m.encode_query([body["query"]], convert_to_tensor=True)
            d = m.encode_document(list(body["items"]), convert_to_tensor=True)
            scores = m.similarity(q, d)[0].float().cpu().numpy()
            return {"scores": [float(s) for s in scores]}
        emb = np.asarray(m.encode(list(body["inputs"]), convert_to_numpy=True), np.float64)
        return {"embeddings": emb.tolist()}


class Splade:
    """``sparse``: the masked-LM logits, max-pooled ``log1p(relu(.))`` over the real
    tokens; nonzero terms as ``{"indices", "values"}``; scores as dot products."""

    name = "transformers"

    def __init__(self, path: Path, device: str) -> None:
        self.path, self.device = path, device
        self.version = version("transformers")
        self._model: Any = None
        self._tok: Any = None
        self.max_len = 0

    def load(self) -> None:
        from transformers import AutoModelForMaskedLM, AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(self.path))
        self._model = AutoModelForMaskedLM.from_pretrained(str(self.path)).to(self.device).eval()
        # the tokenizer's limit, else (a tokenizer that states none) the model's positions
        positions = int(getattr(self._model.config, "max_position_embeddings", 512))
        self.max_len = min(int(self._tok.model_max_length), positions)

    def _vectors(self, texts: list[str]) -> Any:
        import torch

        batch = self._tok(
            texts, padding=True, truncation=True, max_length=self.max_len, return_tensors="pt"
        )
        batch = {k: v.to(self.device) for k, v in batch.items()}
        with torch.inference_mode():
            logits = self._model(**batch).logits.float()
        weights = torch.log1p(torch.relu(logits)) * batch["attention_mask"].unsqueeze(-1)
        return weights.max(dim=1).values.cpu().numpy().astype(np.float64)

    def reply(self, task: Task, body: dict[str, Any]) -> dict[str, object]:
        if task is Task.SCORE:
            vecs = self._vectors([body["query"], *body["items"]])
            return {"scores": [float(s) for s in vecs[1:] @ vecs[0]]}
        vecs = self._vectors(list(body["inputs"]))
        rows = []
        for v in vecs:
            idx = np.flatnonzero(v)
            rows.append({"indices": idx.tolist(), "values": v[idx].tolist()})
        return {"embeddings": rows}


class MultiVectors:
    """``multivector``, a PyLate (sentence-transformers layout) checkpoint:
    sentence-transformers' ``MultiVectorEncoder``, which reads PyLate's settings
    (markers, query length and expansion, skiplist). Token vectors L2-normalized, as
    ColBERT and PyLate give them; scores by the model's ``similarity`` (MaxSim)."""

    name = "sentence-transformers"

    def __init__(self, path: Path, device: str) -> None:
        self.path, self.device = path, device
        self.version = version("sentence-transformers")
        self._model: Any = None

    def load(self) -> None:
        from sentence_transformers.multi_vector_encoder import MultiVectorEncoder

        self._model = MultiVectorEncoder(str(self.path), device=self.device)

    def _encode(self, texts: list[str], query: bool) -> list[Any]:
        fn = self._model.encode_query if query else self._model.encode_document
        return list(fn(texts, convert_to_numpy=True, normalize_embeddings=True))

    def reply(self, task: Task, body: dict[str, Any]) -> dict[str, object]:
        if task is Task.SCORE:
            q = self._encode([body["query"]], True)
            d = self._encode(list(body["items"]), False)
            scores = self._model.similarity(q, d)[0].float().cpu().numpy()
            return {"scores": [float(s) for s in scores]}
        mats = self._encode(list(body["inputs"]), bool(body.get("is_query", False)))
        return {"embeddings": [np.asarray(m, np.float64).tolist() for m in mats]}


class CrossEncoders:
    """``cross_encoder``: sentence-transformers' ``CrossEncoder`` with its own
    activation; with two labels, the softmax of the second (the relevant one by
    convention); with more, the library names no relevance label, so the spec's
    ``label_index`` picks the column (and is not itself checked)."""

    name = "sentence-transformers"

    def __init__(self, spec: ModelSpec, path: Path, device: str) -> None:
        self.path, self.device = path, device
        self.label = spec.options.get("label_index")
        self.version = version("sentence-transformers")
        self._model: Any = None

    def load(self) -> None:
        from sentence_transformers import CrossEncoder

        self._model = CrossEncoder(str(self.path), device=self.device)

    def reply(self, task: Task, body: dict[str, Any]) -> dict[str, object]:
        pairs = [(body["query"], d) for d in body["items"]]
        labels = int(self._model.num_labels)
        out = np.asarray(
            self._model.predict(pairs, apply_softmax=labels > 1, convert_to_numpy=True),
            np.float64,
        )
        if out.ndim == 2:
            col = 1 if labels == 2 or self.label is None else int(self.label)
            out = out[:, col]
        return {"scores": [float(s) for s in out.reshape(-1)]}


__all__ = ["Library", "NoReference", "installed", "text_library", "version"]
