"""A model directory's family and spec fields, from its own files, with the evidence.

``infer(path)`` reads the files that describe the checkpoint (:mod:`.model_files`),
decides the family (:mod:`.infer_family`) and reads the fields that family needs
(:mod:`.infer_fields`): pooling, normalization, the sequence limit, prefixes,
dimensions and labels. Every field carries the file and key it came from, so that a
spec written from it can say why, and nothing is guessed: files that do not decide
the family raise :class:`FamilyUndecided` (give ``family=``), a family that does not
fit raises :class:`FamilyMismatch`, a checkpoint that needs its own code
:class:`RemoteCode`. All are :class:`CheckpointError`, an ``InvalidInput``.

Used by ``fleetserve add`` (which writes the spec) and by the catalog, which fills
what a spec leaves out (:mod:`.complete`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from . import infer_fields as f
from .infer_family import (
    FamilyMismatch,
    FamilyUndecided,
    RemoteCode,
    check_fits,
    decide,
    labels_of,
    refuse_remote_code,
    shape_of,
    suggestion,
)
from .model_files import CheckpointError, CorruptFile, ModelFiles, read_model_files

_SPARSE_MODULES = frozenset({"Transformer", "MLMTransformer", "SpladePooling"})


@dataclass(frozen=True)
class Inferred:
    """What a checkpoint's files say, in ``ModelSpec.from_dict``'s terms.

    ``None`` (and empty options) means the files say nothing the family uses there;
    ``evidence`` maps each inferred field (``options.query_prefix`` for an option) to
    the file and key it came from; ``notes`` are what a user should know that no
    field says (a default prompt that encode requests do not get, say)."""

    family: str
    runtime: str = "torch"
    pooling: str | None = None
    normalize: bool | None = None
    max_seq_len: int | None = None
    dimensions: int | None = None
    options: Mapping[str, object] = field(default_factory=dict)
    labels: tuple[str, ...] = ()  # id2label in order (ner, cross_encoder, zero_shot NLI)
    evidence: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def spec_fields(self) -> dict[str, object]:
        """The spec keys inferred (no ``id``, no ``sources``), ready for YAML."""
        out: dict[str, object] = {"family": self.family, "runtime": self.runtime}
        for key, value in (
            ("pooling", self.pooling),
            ("normalize", self.normalize),
            ("max_seq_len", self.max_seq_len),
            ("dimensions", self.dimensions),
        ):
            if value is not None:
                out[key] = value
        if self.options:
            out["options"] = dict(self.options)
        return out


class _Builder:
    """Collects fields and their evidence while one family's readers run."""

    def __init__(self, family: str, why: str) -> None:
        self.family = family
        self.fields: dict[str, object] = {}
        self.options: dict[str, object] = {}
        self.evidence: dict[str, str] = {"family": why}
        self.labels: tuple[str, ...] = ()
        self.notes: list[str] = []

    def put(self, key: str, found: tuple[object, str] | None) -> None:
        if found is not None:
            self.fields[key], self.evidence[key] = found

    def option(self, key: str, value: object, why: str) -> None:
        self.options[key] = value
        self.evidence[f"options.{key}"] = why

    def build(self) -> Inferred:
        def _int(key: str) -> int | None:
            v = self.fields.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) else None

        pooling, normalize = self.fields.get("pooling"), self.fields.get("normalize")
        return Inferred(
            family=self.family,
            pooling=pooling if isinstance(pooling, str) else None,
            normalize=normalize if isinstance(normalize, bool) else None,
            max_seq_len=_int("max_seq_len"),
            dimensions=_int("dimensions"),
            options=MappingProxyType(dict(self.options)),
            labels=self.labels,
            evidence=MappingProxyType(dict(self.evidence)),
            notes=tuple(self.notes),
        )


def infer(path: Path, *, family: str | None = None) -> Inferred:
    """The family and spec fields of the model in ``path`` (a local directory).

    With ``family`` given, check that it fits (else :class:`FamilyMismatch`, saying
    why and what the files fit) and read that family's fields."""
    files = read_model_files(path)
    refuse_remote_code(files)
    if not files.weights:
        raise CheckpointError(
            f"{path} has no weights (model.safetensors, pytorch_model.bin): not a "
            "checkpoint fleetserve can load",
            field="source",
        )
    if family is None:
        decision = decide(files)
        b = _Builder(decision.family, decision.evidence)
    else:
        b = _Builder(family, check_fits(files, family))
    _READERS[b.family](files, b)
    if b.family not in ("image", "span_ner", "generate") and not files.has_tokenizer_json:
        b.notes.append("no tokenizer.json: fleetserve needs a fast tokenizer's tokenizer.json")
    return b.build()


def _dense(files: ModelFiles, b: _Builder) -> None:
    f.check_st_modules(files, f.DENSE_MODULES, b.family)
    f.check_lowercase(files)
    pooling, dims = f.st_pooling(files)
    b.put("pooling", pooling)
    if b.family == "dense":
        b.put("normalize", f.st_normalize(files))
        b.put("dimensions", dims or f.hidden_size(files))
        for option, (value, where) in f.prefixes(files).items():
            b.option(option, value, where)
        meta = files.st_meta or {}
        if meta.get("default_prompt_name"):
            b.notes.append(
                f"config_sentence_transformers.json: default_prompt_name "
                f"{meta['default_prompt_name']!r} is not added to /v1/encode inputs"
            )
        similarity = meta.get("similarity_fn_name")
        if similarity not in (None, "cosine") and b.fields.get("normalize") is False:
            b.notes.append(
                f"config_sentence_transformers.json: similarity_fn_name {similarity}; "
                "/v1/score and /v1/rerank rank by cosine"
            )
    b.put("max_seq_len", f.sequence_limit(files, b.family))


def _zero_shot(files: ModelFiles, b: _Builder) -> None:
    if shape_of(files).kind == "sequence_classification":
        b.option("method", "nli", "config.json: id2label (entailment, contradiction)")
        b.put("pooling", ("none", "the NLI head scores (text, label) pairs"))
        b.labels = labels_of(files)
        b.evidence["labels"] = "config.json: id2label"
        b.put("max_seq_len", f.sequence_limit(files, b.family))
        return
    b.option("method", "embedding", "a text encoder: labels are compared by embedding")
    _dense(files, b)


def _sparse(files: ModelFiles, b: _Builder) -> None:
    f.check_st_modules(files, _SPARSE_MODULES, b.family)
    splade = files.module("SpladePooling")
    if splade is not None:
        cfg, name = files.module_config(splade)
        strategy = (cfg or {}).get("pooling_strategy", "max")
        if strategy != "max":
            raise f.Unsupported(
                f"{files.path / name}: pooling_strategy {strategy}, which fleetserve does "
                "not do (SPLADE's max over tokens)",
                field="pooling",
            )
    b.put("pooling", ("none", "sparse: one weight per vocabulary term, max over tokens"))
    b.put("normalize", (False, "sparse: SPLADE weights are not normalized"))
    b.put("max_seq_len", f.sequence_limit(files, b.family))


def _multivector(files: ModelFiles, b: _Builder) -> None:
    b.put("normalize", (True, "multivector: ColBERT token vectors are unit length"))
    b.put("dimensions", f.colbert_dimensions(files))
    b.put("max_seq_len", f.sequence_limit(files, b.family))


def _classifier(files: ModelFiles, b: _Builder) -> None:
    b.put("pooling", ("none", f"{b.family}: the checkpoint's head reads the tokens"))
    b.labels = labels_of(files)
    if b.labels:
        b.evidence["labels"] = "config.json: id2label"
    if b.family == "cross_encoder" and len(b.labels) > 2:
        b.notes.append(f"{len(b.labels)} labels: set options.label_index to the relevant one")
    b.put("max_seq_len", f.sequence_limit(files, b.family))


def _image(files: ModelFiles, b: _Builder) -> None:
    b.put("pooling", ("none", f"config.json: model_type {files.model_type} pools itself"))
    b.put("normalize", (True, "image: CLIP and SigLIP compare unit vectors"))
    b.put("dimensions", f.image_dimensions(files))
    b.put("max_seq_len", f.sequence_limit(files, b.family))


def _generate(files: ModelFiles, b: _Builder) -> None:
    if not files.chat_template:
        b.notes.append("no chat template: /v1/chat/completions cannot format messages")
    b.put("max_seq_len", f.sequence_limit(files, b.family))
    gen = files.generation or {}
    if gen.get("do_sample"):  # the sampling the model's authors set, for requests that omit it
        for key in ("temperature", "top_p"):
            value = gen.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                b.option(key, float(value), f"generation_config.json: {key} (do_sample)")


_READERS = {
    "dense": _dense,
    "zero_shot": _zero_shot,
    "sparse": _sparse,
    "multivector": _multivector,
    "cross_encoder": _classifier,
    "ner": _classifier,
    "span_ner": _classifier,
    "image": _image,
    "generate": _generate,
}


def family_hint(path: Path) -> str:
    """What the files in ``path`` fit, in words, for an error's one line; never raises."""
    try:
        return suggestion(read_model_files(path))
    except CheckpointError as exc:
        return exc.message


__all__ = [
    "CheckpointError",
    "CorruptFile",
    "FamilyMismatch",
    "FamilyUndecided",
    "Inferred",
    "RemoteCode",
    "family_hint",
    "infer",
]
