"""Which family a model directory is, from its describing files, or why it is not decided.

The rules, first match wins (each decision carries its evidence, the file and the key):

- remote code (``auto_map``, ``trust_remote_code``, a module class outside
  sentence-transformers and PyLate): refused, never run;
- ``gliner_config.json``: ``span_ner``;
- sentence-transformers: a SPLADE head (``SpladePooling``, model_type ``SparseEncoder``)
  is ``sparse``; PyLate (``Dense`` modules and no ``Pooling``, model_type ``ColBERT``)
  ``multivector``; a ``Pooling`` module ``dense``;
- stanford-nlp ColBERT (``HF_ColBERT``, ``linear.weight``): ``multivector``;
- ``model_type`` clip or siglip: ``image``;
- ``*ForSequenceClassification``: ``zero_shot`` with NLI labels (entailment,
  contradiction), ``cross_encoder`` with one label or transformers' default names;
- ``*ForTokenClassification``: ``ner``;
- ``*ForCausalLM`` with a chat template: ``generate``;
- ``*ForMaskedLM`` with no sentence-transformers pooling: ``sparse`` (the masked-LM
  head is what SPLADE reads; no other family uses it).

Anything else (a bare encoder such as ``BertModel`` with no sentence-transformers
files, a text classifier, a causal LM without a chat template) is not decided:
:class:`FamilyUndecided` names the candidates and asks for ``--family``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .model_files import CheckpointError, ModelFiles
from .names import FAMILY_NAMES

TEXT_ENCODERS = ("dense", "multivector", "zero_shot")
_DEFAULT_LABEL = re.compile(r"LABEL_\d+")
_ST_PREFIXES = ("sentence_transformers.", "pylate.")


class FamilyUndecided(CheckpointError):
    """The files fit more than one family, or none for sure: give ``--family``.
    ``candidates`` are the families that may fit, ``why`` what the files say."""

    def __init__(
        self,
        message: str,
        *,
        field: str | None = "family",
        retry_after: float | None = None,
        candidates: tuple[str, ...] = (),
        why: str = "",
    ) -> None:
        super().__init__(message, field=field, retry_after=retry_after)
        self.candidates = candidates
        self.why = why


class FamilyMismatch(CheckpointError):
    """The family asked for does not fit the checkpoint."""


class RemoteCode(CheckpointError):
    """The checkpoint needs code from its repository, which fleetserve never runs."""


@dataclass(frozen=True)
class Decision:
    family: str
    evidence: str  # the file and key that decided it


@dataclass(frozen=True)
class Shape:
    """What the checkpoint is, in the terms the families care about."""

    kind: str  # gliner, st_sparse, pylate, st_dense, colbert, image, sequence_classification,
    # token_classification, causal_lm, masked_lm, encoder, other, none
    evidence: str


def refuse_remote_code(files: ModelFiles) -> None:
    """A :class:`RemoteCode` when any file asks for code shipped with the checkpoint."""
    why = ""
    if (files.config or {}).get("auto_map"):
        why = "config.json: auto_map"
    elif (files.tokenizer_config or {}).get("auto_map"):
        why = "tokenizer_config.json: auto_map"
    else:
        for key, value in (files.st_config or {}).items():
            if isinstance(value, dict) and value.get("trust_remote_code"):
                why = f"sentence_bert_config.json: {key}.trust_remote_code"
                break
        for m in files.modules or ():
            if not why and not m.type.startswith(_ST_PREFIXES):
                why = f"modules.json: module {m.type}"
    if why:
        raise RemoteCode(
            f"{files.path} needs code from the model's own repository ({why}), which "
            "fleetserve does not run (no trust_remote_code); use a checkpoint that "
            "transformers loads by itself",
            field="source",
        )


def shape_of(files: ModelFiles) -> Shape:
    """Classify the checkpoint (see the module docstring for the order)."""
    if files.gliner is not None:
        return Shape("gliner", "gliner_config.json")
    kinds = {m.kind for m in files.modules or ()}
    st_type = str((files.st_meta or {}).get("model_type") or "")
    meta = f"config_sentence_transformers.json: model_type {st_type}"
    if "SpladePooling" in kinds:
        return Shape("st_sparse", "modules.json: a SpladePooling module")
    if st_type == "SparseEncoder":
        return Shape("st_sparse", meta)
    if st_type in ("ColBERT", "MultiVectorEncoder"):
        return Shape("pylate", meta)
    if "Dense" in kinds and "Pooling" not in kinds:
        return Shape("pylate", "modules.json: Dense modules and no Pooling (PyLate)")
    pooling = files.module("Pooling")
    if pooling is not None:
        return Shape("st_dense", f"modules.json: {pooling.path or 'Pooling'} (a Pooling module)")
    archs = files.architectures
    arch = archs[0] if archs else ""
    if "HF_ColBERT" in archs:
        return Shape("colbert", "config.json: architectures HF_ColBERT")
    if files.colbert_linear is not None and files.config is not None:
        return Shape("colbert", "model.safetensors: linear.weight (a ColBERT projection)")
    if files.model_type in ("clip", "siglip"):
        return Shape("image", f"config.json: model_type {files.model_type}")
    if files.config is None:
        return Shape("none", "no config.json")
    for suffix, kind in (
        ("ForSequenceClassification", "sequence_classification"),
        ("ForTokenClassification", "token_classification"),
        ("ForCausalLM", "causal_lm"),
        ("LMHeadModel", "causal_lm"),
        ("ForMaskedLM", "masked_lm"),
    ):
        if arch.endswith(suffix):
            return Shape(kind, f"config.json: architectures {arch}")
    if arch.endswith("Model") or (not arch and files.model_type):
        return Shape("encoder", f"config.json: architectures {arch or '(none)'}")
    return Shape("other", f"config.json: architectures {arch}")


def labels_of(files: ModelFiles) -> tuple[str, ...]:
    """``id2label`` in id order (empty when absent)."""
    raw = (files.config or {}).get("id2label")
    if not isinstance(raw, dict) or not raw:
        return ()
    try:
        by_id = {int(k): str(v) for k, v in raw.items()}
    except ValueError:
        return ()
    return tuple(by_id[i] for i in sorted(by_id))


def is_nli(labels: tuple[str, ...]) -> bool:
    """Entailment and contradiction (or not_entailment) classes: an NLI model."""
    low = [x.lower() for x in labels]
    return any(x.startswith("entail") for x in low) and any(
        x.startswith(("contradict", "not_entail", "non_entail", "not-entail")) for x in low
    )


def decide(files: ModelFiles) -> Decision:
    """The family the files decide, or :class:`FamilyUndecided` with the candidates."""
    shape = shape_of(files)
    direct = {
        "gliner": "span_ner",
        "st_sparse": "sparse",
        "pylate": "multivector",
        "st_dense": "dense",
        "colbert": "multivector",
        "image": "image",
        "masked_lm": "sparse",
    }
    if shape.kind in direct:
        why = " (a masked-LM head, which SPLADE reads)" if shape.kind == "masked_lm" else ""
        return Decision(direct[shape.kind], shape.evidence + why)
    labels = labels_of(files)
    if shape.kind == "sequence_classification":
        if is_nli(labels):
            return Decision("zero_shot", f"config.json: id2label {', '.join(labels)} (NLI)")
        if len(labels) <= 1 or all(_DEFAULT_LABEL.fullmatch(x) for x in labels):
            what = "one label" if len(labels) <= 1 else "unnamed labels"
            return Decision("cross_encoder", f"{shape.evidence}, {what}: a reranker")
        st = _cross_encoder_marker(files)
        if st:
            return Decision("cross_encoder", f"{shape.evidence}; {st}")
        raise _undecided(
            files,
            ("cross_encoder",),
            f"{shape.evidence} with labels {', '.join(labels)} is a text classifier, "
            "not a reranker (one label) nor NLI (entailment, contradiction)",
        )
    if shape.kind == "token_classification":
        check_fits(files, "ner")  # its labels, or why not
        return Decision("ner", shape.evidence)
    if shape.kind == "causal_lm":
        if files.chat_template:
            return Decision("generate", f"{shape.evidence}, chat template in {files.chat_template}")
        raise _undecided(files, ("generate",), f"{shape.evidence} has no chat template")
    if shape.kind == "encoder":
        raise _undecided(
            files, TEXT_ENCODERS, f"{shape.evidence} and no sentence-transformers files"
        )
    if shape.kind == "none":
        raise CheckpointError(
            f"{files.path} has no config.json (nor gliner_config.json): not a model "
            "directory fleetserve reads",
            field="source",
        )
    raise _undecided(files, FAMILY_NAMES, f"{shape.evidence}, which no family recognizes")


def _cross_encoder_marker(files: ModelFiles) -> str:
    """Where sentence-transformers marked the checkpoint a CrossEncoder, if it did."""
    if str((files.st_meta or {}).get("model_type") or "") == "CrossEncoder":
        return "config_sentence_transformers.json: model_type CrossEncoder"
    if isinstance((files.config or {}).get("sentence_transformers"), dict):
        return "config.json: sentence_transformers (a CrossEncoder's settings)"
    return ""


def _undecided(files: ModelFiles, candidates: tuple[str, ...], why: str) -> FamilyUndecided:
    return FamilyUndecided(
        f"{files.path}: the files do not decide the family ({why}); candidates: "
        f"{', '.join(candidates)}; give one with --family",
        candidates=candidates,
        why=why,
    )


# which shapes each family can serve when it is asked for explicitly
_FITS: dict[str, frozenset[str]] = {
    "dense": frozenset({"st_dense", "encoder", "masked_lm"}),
    "multivector": frozenset({"pylate", "colbert", "st_dense", "encoder", "masked_lm"}),
    "zero_shot": frozenset({"st_dense", "encoder", "masked_lm", "sequence_classification"}),
    "sparse": frozenset({"st_sparse", "masked_lm"}),
    "cross_encoder": frozenset({"sequence_classification"}),
    "ner": frozenset({"token_classification"}),
    "span_ner": frozenset({"gliner"}),
    "image": frozenset({"image"}),
    "generate": frozenset({"causal_lm"}),
}
_NEEDS = {
    "dense": "a text encoder",
    "multivector": "a text encoder or a ColBERT checkpoint",
    "zero_shot": "a text encoder or an NLI sequence classifier",
    "sparse": "a masked-LM head (SPLADE)",
    "cross_encoder": "a sequence-classification head",
    "ner": "a token-classification head",
    "span_ner": "a gliner_config.json",
    "image": "a CLIP or SigLIP model",
    "generate": "a causal LM",
}


def check_fits(files: ModelFiles, family: str) -> str:
    """The evidence that ``family`` fits, or :class:`FamilyMismatch` saying why not and
    what the files do say."""
    if family not in FAMILY_NAMES:
        raise FamilyMismatch(
            f"unknown family {family!r}; allowed: {', '.join(FAMILY_NAMES)}", field="family"
        )
    shape = shape_of(files)
    fits = shape.kind in _FITS[family]
    if fits and family == "zero_shot" and shape.kind == "sequence_classification":
        fits = is_nli(labels_of(files))
    if fits and family == "ner" and not labels_of(files):
        raise FamilyMismatch(
            f"{files.path}/config.json has no id2label: family ner needs the token labels",
            field="family",
        )
    if fits:
        return f"given (--family {family}); {shape.evidence}"
    raise FamilyMismatch(
        f"family {family} does not fit {files.path}: it needs {_NEEDS[family]}, and "
        f"{shape.evidence}; {suggestion(files)}",
        field="family",
    )


def suggestion(files: ModelFiles) -> str:
    """What the files fit, in words: for the one line a refusal ends with."""
    try:
        found = decide(files)
    except FamilyUndecided as exc:
        return (
            f"its files do not decide a family ({exc.why}; candidates: {', '.join(exc.candidates)})"
        )
    except CheckpointError as exc:
        return exc.message
    return f"its files fit family {found.family} ({found.evidence})"


__all__ = [
    "TEXT_ENCODERS",
    "Decision",
    "FamilyMismatch",
    "FamilyUndecided",
    "RemoteCode",
    "Shape",
    "check_fits",
    "decide",
    "is_nli",
    "labels_of",
    "refuse_remote_code",
    "shape_of",
    "suggestion",
]
