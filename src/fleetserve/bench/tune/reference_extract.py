"""References for the extraction, image and generation families (see
:mod:`.reference_libs` for the embedding and scoring ones).

=================  =================================================================
family             reference
=================  =================================================================
``ner``            transformers' ``token-classification`` pipeline, with the spec's
                   ``aggregation`` (the caller's choice in the pipeline too) and the
                   pipeline's own ``ignore_labels`` (``["O"]``): spans, labels, scores
``zero_shot``      transformers' ``zero-shot-classification`` pipeline (NLI method),
                   with the spec's ``hypothesis_template``; by embedding,
                   sentence-transformers' embeddings of the texts and hypotheses
``image``          transformers' ``AutoModel`` (CLIP, SigLIP), its image processor and
                   tokenizer: ``get_image_features`` and ``get_text_features``
``generate``       ``AutoModelForCausalLM.generate(do_sample=False)``: the greedy text
``span_ner``       GLiNER's package (``GLiNER.inference``, the spec's threshold); it pins
                   transformers<5.17, and is installed beside ours without its
                   dependencies: its predictions on our transformers equal its own
                   on 5.16 (``tests/bench/tune/test_reference.py``)
``multivector``    PyLate layout: :mod:`.reference_libs`; HF/stanford-nlp layout:
                   colbert-ai, in a process of its own (:mod:`.reference_colbert`)
=================  =================================================================
"""

from __future__ import annotations

import base64
import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ...catalog import ModelSpec
from ...wire import Task
from .reference_libs import Library, NoReference, installed, version


def extract_library(spec: ModelSpec, weights: Path, device: str) -> Library:
    """The reference for the extraction, image and generation families; a
    :class:`NoReference` where there is none here."""
    fam = spec.family
    if fam == "ner":
        return NerPipeline(spec, weights, device)
    if fam == "zero_shot":
        if spec.options.get("method", "nli") != "nli":
            if not (weights / "modules.json").is_file():
                raise NoReference(
                    "sentence-transformers",
                    "zero_shot by embedding over a model that is not a sentence-transformers "
                    "directory (no modules.json) has no reference library: unchecked",
                )
            return ZeroShotEmbedding(spec, weights, device)
        return ZeroShotPipeline(spec, weights, device)
    if fam == "image":
        return ImageModel(weights, device)
    if fam == "generate":
        return CausalLm(weights, device)
    if fam == "span_ner":
        return gliner_library(spec, weights, device)
    raise NoReference("", f"no reference library for the {fam} family: unchecked")


def _device(device: str) -> Any:
    import torch

    return torch.device(device)


class NerPipeline:
    name = "transformers"

    def __init__(self, spec: ModelSpec, path: Path, device: str) -> None:
        self.path, self.device = path, device
        self.aggregation = str(spec.options.get("aggregation", "simple"))
        self.threshold = float(spec.options.get("threshold", 0.0))
        self.version = version("transformers")
        self._pipe: Any = None

    def load(self) -> None:
        from transformers import pipeline

        self._pipe = pipeline(
            "token-classification",
            model=str(self.path),
            aggregation_strategy=self.aggregation,
            device=_device(self.device),
        )

    def reply(self, task: Task, body: dict[str, Any]) -> dict[str, object]:
        texts = list(body["inputs"])
        found = self._pipe(texts)
        results = []
        for text, entities in zip(texts, found, strict=True):
            results.append(
                [
                    {
                        "start": int(e["start"]),
                        "end": int(e["end"]),
                        "text": text[int(e["start"]) : int(e["end"])],
                        "label": str(e.get("entity_group", e.get("entity"))),
                        "score": float(e["score"]),
                    }
                    for e in entities
                    if float(e["score"]) >= self.threshold
                ]
            )
        return {"results": results}


class ZeroShotPipeline:
    name = "transformers"

    def __init__(self, spec: ModelSpec, path: Path, device: str) -> None:
        self.path, self.device = path, device
        self.template = str(spec.options.get("hypothesis_template", "This example is {}."))
        self.version = version("transformers")
        self._pipe: Any = None

    def load(self) -> None:
        from transformers import pipeline

        self._pipe = pipeline(
            "zero-shot-classification", model=str(self.path), device=_device(self.device)
        )

    def reply(self, task: Task, body: dict[str, Any]) -> dict[str, object]:
        out = self._pipe(
            list(body["inputs"]),
            candidate_labels=list(body["labels"]),
            hypothesis_template=self.template,
            multi_label=bool(body.get("multi_label", False)),
        )
        out = out if isinstance(out, list) else [out]
        return {
            "results": [
                {"labels": list(r["labels"]), "scores": [float(s) for s in r["scores"]]}
                for r in out
            ]
        }


class ZeroShotEmbedding:
    """``zero_shot`` by embedding: sentence-transformers embeds the texts and each
    label's hypothesis; their cosines, squashed as the family defines it (softmax over
    the labels at the spec's ``temperature``, or per label a sigmoid about its
    ``midpoint``), labels by score. The library puts the embeddings on trial."""

    name = "sentence-transformers"

    def __init__(self, spec: ModelSpec, path: Path, device: str) -> None:
        self.path, self.device = path, device
        opts = spec.options
        self.template = str(opts.get("hypothesis_template", "This text is about {}."))
        self.temperature = float(opts.get("temperature", 0.05))
        self.midpoint = float(opts.get("midpoint", 0.15))
        self.version = version("sentence-transformers")
        self._model: Any = None

    def load(self) -> None:
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(self.path), device=self.device)

    def reply(self, task: Task, body: dict[str, Any]) -> dict[str, object]:
        texts, labels = list(body["inputs"]), list(body["labels"])
        hyps = [self.template.format(label) for label in labels]
        emb = self._model.encode(texts + hyps, convert_to_numpy=True, normalize_embeddings=True)
        emb = np.asarray(emb, np.float64)
        cos = emb[: len(texts)] @ emb[len(texts) :].T
        if body.get("multi_label", False):
            scores = 1.0 / (1.0 + np.exp(-(cos - self.midpoint) / self.temperature))
        else:
            z = cos / self.temperature
            e = np.exp(z - z.max(axis=1, keepdims=True))
            scores = e / e.sum(axis=1, keepdims=True)
        results = []
        for row in scores:
            order = sorted(range(len(labels)), key=lambda k: -row[k])
            results.append({"labels": [labels[k] for k in order],
                            "scores": [float(row[k]) for k in order]})  # fmt: skip
        return {"results": results}


class ImageModel:
    """CLIP or SigLIP through its processor: image and text features (unnormalized;
    the check compares their directions)."""

    name = "transformers"

    def __init__(self, path: Path, device: str) -> None:
        self.path, self.device = path, device
        self.version = version("transformers")
        self._model: Any = None
        self._images: Any = None
        self._tok: Any = None
        self._siglip = False
        self._text_len = 0

    def load(self) -> None:
        import transformers

        auto: Any = transformers  # its Auto classes are untyped
        self._images = auto.AutoImageProcessor.from_pretrained(str(self.path))
        self._tok = auto.AutoTokenizer.from_pretrained(str(self.path))
        self._model = auto.AutoModel.from_pretrained(str(self.path)).to(self.device).eval()
        self._siglip = self._model.config.model_type == "siglip"
        # the tokenizer's limit, else (a tokenizer that states none) the text tower's
        positions = int(self._model.config.text_config.max_position_embeddings)
        self._text_len = min(int(self._tok.model_max_length), positions)

    def reply(self, task: Task, body: dict[str, Any]) -> dict[str, object]:
        import torch
        from PIL import Image

        inputs = list(body["inputs"])
        rows: list[Any] = []
        with torch.inference_mode():
            for x in inputs:
                if isinstance(x, dict):
                    img = Image.open(io.BytesIO(base64.b64decode(x["image"]))).convert("RGB")
                    px = self._images(images=[img], return_tensors="pt")["pixel_values"]
                    feats = self._model.get_image_features(pixel_values=px.to(self.device))
                else:
                    pad = "max_length" if self._siglip else True
                    enc = self._tok([x], padding=pad, truncation=True,
                                     max_length=self._text_len, return_tensors="pt")  # fmt: skip
                    keep = ("input_ids", "attention_mask")  # what the tokenizer gives of them
                    enc = {k: v.to(self.device) for k, v in enc.items() if k in keep}
                    feats = self._model.get_text_features(**enc)
                feats = getattr(feats, "pooler_output", feats)  # transformers 5: an output
                rows.append(feats[0].float().cpu().numpy().astype(np.float64))
        return {"embeddings": [r.tolist() for r in rows]}


def gliner_library(spec: ModelSpec, weights: Path, device: str) -> Library:
    """GLiNER's own package over the checkpoint; :class:`NoReference` where it is not
    installed, or the checkpoint names its encoder by hub id only (``options.encoder``:
    gliner would fetch it)."""
    if not installed("gliner"):
        raise NoReference(
            "gliner",
            "GLiNER's package is not installed here (pip install --no-deps gliner==0.2.29: "
            "it pins transformers<5.17, which it does not need): span_ner is unchecked",
        )
    if "encoder" in spec.options:
        raise NoReference(
            "gliner",
            "the checkpoint names its encoder by hub id only (options.encoder), which "
            "gliner would fetch from the hub: span_ner is unchecked",
        )
    return Gliner(spec, weights, device)


class Gliner:
    """``GLiNER.inference`` with the spec's threshold (a request's own, flat or nested
    and multi-label choices passed as they come)."""

    name = "gliner"

    def __init__(self, spec: ModelSpec, path: Path, device: str) -> None:
        self.path, self.device = path, device
        self.threshold = float(spec.options.get("threshold", 0.5))
        self.version = version("gliner")
        self._model: Any = None

    def load(self) -> None:
        from gliner import GLiNER

        model: Any = GLiNER.from_pretrained(str(self.path), local_files_only=True)
        self._model = model.to(self.device).eval()

    def reply(self, task: Task, body: dict[str, Any]) -> dict[str, object]:
        texts = list(body["inputs"])
        with warnings.catch_warnings():  # its notice of a text cut to max_len: by design
            warnings.filterwarnings("ignore", "Sentence of length", UserWarning)
            found = self._model.inference(
                texts,
                list(body["labels"]),
                threshold=float(body.get("threshold", self.threshold)),
                flat_ner=bool(body.get("flat_ner", True)),
                multi_label=bool(body.get("multi_label", False)),
                batch_size=8,
            )
        keys = ("start", "end", "text", "label", "score")
        return {"results": [[{k: e[k] for k in keys} for e in row] for row in found]}


class CausalLm:
    """The greedy continuation of the raw prompt (tokenized as the family does, with
    the tokenizer's special tokens), decoded without special tokens."""

    name = "transformers"

    def __init__(self, path: Path, device: str) -> None:
        self.path, self.device = path, device
        self.version = version("transformers")
        self._model: Any = None
        self._tok: Any = None

    def load(self) -> None:
        import transformers

        auto: Any = transformers  # its Auto classes are untyped
        self._tok = auto.AutoTokenizer.from_pretrained(str(self.path))
        self._model = auto.AutoModelForCausalLM.from_pretrained(str(self.path))
        self._model = self._model.to(self.device).eval()

    def reply(self, task: Task, body: dict[str, Any]) -> dict[str, object]:
        import torch

        enc = self._tok(str(body["prompt"]), return_tensors="pt").to(self.device)
        with torch.inference_mode():
            out = self._model.generate(
                **enc, do_sample=False, max_new_tokens=int(body.get("max_tokens", 16))
            )
        new = out[0, enc["input_ids"].shape[1] :].tolist()
        return {"text": self._tok.decode(new, skip_special_tokens=True)}


__all__ = [
    "CausalLm",
    "Gliner",
    "ImageModel",
    "NerPipeline",
    "ZeroShotEmbedding",
    "ZeroShotPipeline",
    "extract_library",
]
