"""Loading a checkpoint that has every weight the head needs, or failing in one line.

transformers fills weights a checkpoint lacks with random ones and logs "newly
initialized": a cross-encoder spec over an embedding checkpoint then answers with
random scores. Every transformers load of a served model goes through
:func:`load_checked` (the torch runtime, the ONNX and OpenVINO conversions, the
generation family), which asks ``from_pretrained`` for its loading report and raises
:class:`IncompleteCheckpoint` naming the missing pieces and the family the files fit.
The model then fails to load alone; the fleet reports it and keeps serving the rest.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from ..catalog.infer import family_hint

SHOWN = 4  # missing pieces named in the message; the rest are counted
# Loaded as a bare encoder, a BERT-style pooler feeds no output fleetserve reads (the
# pooling is over the last hidden state), and checkpoints saved without a task head or
# for late interaction often lack it. A sequence-classification head reads it.
UNREAD_BY_ENCODERS = ("pooler",)


class IncompleteCheckpoint(ValueError):
    """A checkpoint that lacks weights the head it is loaded with needs."""


_checking: ContextVar[bool] = ContextVar("checking", default=False)


class _OwnReport(logging.Filter):
    """Drops transformers' multi-line, colour-coded "LOAD REPORT" warning during a
    checked load: what it says that matters (weights newly initialized) is the one
    line :class:`IncompleteCheckpoint` raises; the rest (unused weights) is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_checking.get() and "LOAD REPORT" in record.getMessage())


logging.getLogger("transformers.modeling_utils").addFilter(_OwnReport())


def load_checked(
    model_class: Any, path: Path, what: str, *, unread: Sequence[str] = (), **kwargs: Any
) -> Any:
    """``model_class.from_pretrained(path, **kwargs)``, refusing a model whose load left
    any weight newly initialized (``what`` names the head: "sequence-classification
    head"), except in modules named in ``unread`` (whose output nothing reads)."""
    token = _checking.set(True)
    try:
        model, info = model_class.from_pretrained(str(path), output_loading_info=True, **kwargs)
    finally:
        _checking.reset(token)
    check_loading_info(path, what, info, unread)
    return model


def check_loading_info(
    path: Path, what: str, info: Mapping[str, Any], unread: Sequence[str] = ()
) -> None:
    """Raise :class:`IncompleteCheckpoint` when ``info`` (``from_pretrained``'s loading
    report) has missing or mismatched weights outside the modules named in ``unread``."""
    missing = [str(k) for k in info.get("missing_keys") or () if not _within(str(k), unread)]
    missing += [str(m[0]) for m in info.get("mismatched_keys") or ()]
    if not missing:
        return
    raise IncompleteCheckpoint(
        f"{path}: the checkpoint has no weights for {pieces(missing)} of the {what}, which "
        f"loading would initialize at random; {family_hint(path)}"
    )


def _within(key: str, modules: Sequence[str]) -> bool:
    return any(part in modules for part in key.split("."))


def pieces(keys: Sequence[str]) -> str:
    """Missing weight names grouped by module (``classifier (2 tensors)``), the largest
    groups first, at most :data:`SHOWN` of them."""
    groups = Counter(_module(k) for k in keys)
    named = [f"{name} ({n} tensor{'s' if n > 1 else ''})" for name, n in groups.most_common(SHOWN)]
    rest = len(groups) - len(named)
    return ", ".join(named) + (f" and {rest} more modules" if rest > 0 else "")


def _module(key: str) -> str:
    """The first two parts of the module path, without the parameter's name:
    ``bert.encoder.layer.0.attention.self.query.weight`` -> ``bert.encoder``."""
    parts = key.split(".")[:-1] or [key]
    return ".".join(parts[:2])


__all__ = [
    "UNREAD_BY_ENCODERS",
    "IncompleteCheckpoint",
    "check_loading_info",
    "load_checked",
    "pieces",
]
