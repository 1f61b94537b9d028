"""Spec completion: what a spec leaves out, its model's own files fill in.

A two-line spec (``id``, ``sources``) used to get the defaults of
``ModelSpec.from_dict``: mean pooling and 512 tokens, whatever the model was trained
with. Where the weights are on this machine when the catalog is built, the keys a
spec did not give (``ModelSpec.given``) come from :func:`.infer.infer` instead: the
family, pooling, normalization, ``max_seq_len`` and the prefixes and method the
family reads from its options. A key the spec gives always wins, and only keys the
family reads are filled, so the bundled specs, which state theirs, come out as
written. A spec whose weights are absent, or whose files say nothing sure, stays as
parsed (its load then says what is wrong).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

from .infer import infer
from .infer_family import FamilyUndecided
from .model_files import CheckpointError
from .sources import DEFAULT_CACHE, locate
from .spec import ModelSpec

log = logging.getLogger("fleetserve.catalog")

Locate = Callable[[tuple[str, ...]], Path | None]
HF_CACHE = Path("~/.cache/huggingface/hub").expanduser()  # Settings.hf_cache's default

# the spec keys each family reads, which completion may fill
FILLS: dict[str, tuple[str, ...]] = {
    "dense": ("pooling", "normalize", "max_seq_len"),
    "sparse": ("max_seq_len",),
    "multivector": ("normalize", "max_seq_len"),
    "cross_encoder": ("max_seq_len",),
    "ner": ("max_seq_len",),
    "span_ner": ("max_seq_len",),
    "zero_shot": ("pooling", "max_seq_len"),
    "image": ("normalize", "max_seq_len"),
    "generate": ("max_seq_len",),
}
# the options each family reads, which completion may fill
FILL_OPTIONS: dict[str, tuple[str, ...]] = {
    "dense": ("query_prefix", "document_prefix"),
    "zero_shot": ("method",),
}


def locator(hf_cache: Path = HF_CACHE, cache_dir: Path = DEFAULT_CACHE) -> Locate:
    """Where a spec's weights are on this machine, without fetching or converting."""
    return lambda sources: locate(sources, hf_cache, cache_dir)


def nowhere(sources: tuple[str, ...]) -> Path | None:
    """A locator that finds nothing: the specs stay as written."""
    return None


def complete(spec: ModelSpec, path: Path) -> ModelSpec:
    """``spec`` with the keys it did not give read from the model files in ``path``."""
    given_family = spec.family if "family" in spec.given else None
    try:
        found = infer(path, family=given_family)
    except FamilyUndecided as exc:
        log.warning(
            "%s: no family given and its files do not decide one (%s; candidates: %s); "
            "serving it as %s, the default",
            spec.id, exc.why, ", ".join(exc.candidates), spec.family,
        )  # fmt: skip
        try:
            found = infer(path, family=spec.family)
        except CheckpointError:
            return spec
    except CheckpointError as exc:
        log.debug("%s: left as written: %s", spec.id, exc.message)
        return spec
    fill = set(FILLS[found.family]) - spec.given
    wanted = [k for k in FILL_OPTIONS.get(found.family, ()) if k in found.options]
    missing = {k: found.options[k] for k in wanted if k not in spec.options}
    done = dataclasses.replace(
        spec,
        family=spec.family if given_family else found.family,
        pooling=found.pooling if "pooling" in fill and found.pooling else spec.pooling,
        normalize=(
            found.normalize
            if "normalize" in fill and found.normalize is not None
            else spec.normalize
        ),
        max_seq_len=(
            found.max_seq_len if "max_seq_len" in fill and found.max_seq_len else spec.max_seq_len
        ),
        options={**missing, **spec.options},
    )
    if done != spec:
        log.debug("%s: completed from its files (%s)", spec.id, "; ".join(
            f"{k}: {v}" for k, v in found.evidence.items()
        ))  # fmt: skip
    return done


def complete_present(spec: ModelSpec, where: Locate) -> ModelSpec:
    """:func:`complete` where ``where`` finds the weights on this machine, else ``spec``."""
    if spec.runtime == "external":
        return spec  # served elsewhere: the directory holds a tokenizer at most
    path = where(spec.sources)
    return spec if path is None else complete(spec, path)


__all__ = [
    "FILLS",
    "FILL_OPTIONS",
    "HF_CACHE",
    "Locate",
    "complete",
    "complete_present",
    "locator",
    "nowhere",
]
