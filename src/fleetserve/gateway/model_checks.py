"""What ``POST /v1/models`` checks before a spec reaches the server: the model id's
form, and that its sources are ones an API caller may make the server read.

An API caller must not make the server read arbitrary files or reach arbitrary URLs,
so a source is one of: ``package:<module>/<dir>`` and ``hf:<org>/<name>`` (installed
packages and the Hugging Face cache), a local path under one of the directories of
``--model-roots`` (symlinks resolved), or an ``s3://`` prefix listed there; each may
be wrapped in ``gguf:``. A ``..`` anywhere, a relative path or another URL scheme is
refused with a 400 naming the source.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from ..wire import InvalidInput

MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}(/[A-Za-z0-9][A-Za-z0-9._-]{0,127})?")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
GGUF = "gguf:"
OPEN = ("package:", "hf:")  # installed packages and the Hugging Face cache


def check_model_id(model_id: object) -> str:
    """``model_id`` if it is a well-formed id (``name`` or ``org/name``: letters,
    digits, ``.``, ``_``, ``-``, at most 128 each, no ``..``); else a 400 naming it."""
    if not isinstance(model_id, str) or not model_id:
        raise InvalidInput(f"key 'id' must be a non-empty string, not {model_id!r}", field="id")
    if MODEL_ID.fullmatch(model_id) is None or ".." in model_id:
        raise InvalidInput(
            f"model id {model_id!r} is malformed: use name or org/name, of letters, digits, "
            "'.', '_' and '-' (at most 128 each, no '..')",
            field="id",
        )
    return model_id


def check_sources(sources: Sequence[str], roots: Sequence[str]) -> None:
    """Each of ``sources`` is one an API caller may name (see the module); else a 400
    naming the first that is not. ``roots``: ``--model-roots``, directories and
    ``s3://`` prefixes."""
    for src in sources:
        why = _refused(src, roots)
        if why:
            allowed = ", ".join(roots) or "none"
            raise InvalidInput(
                f"source {src!r} {why}; an API caller may name package:, hf:, or a path or "
                f"s3:// prefix under --model-roots ({allowed})",
                field="sources",
            )


def _refused(src: str, roots: Sequence[str]) -> str:
    """Why ``src`` is refused ("" when it is allowed)."""
    inner = src[len(GGUF) :] if src.startswith(GGUF) else src
    if ".." in re.split(r"[/\\:]", inner):  # hf:../x too
        return "escapes its directory with '..'"
    if inner.startswith(OPEN):
        return ""
    if inner.startswith("s3://"):
        prefixes = [r.rstrip("/") for r in roots if r.startswith("s3://")]
        if any(inner == p or inner.startswith(p + "/") for p in prefixes):
            return ""
        return "is not under an s3:// prefix of --model-roots"
    if inner.startswith("file://"):
        inner = inner[len("file://") :]
    elif _SCHEME.match(inner):
        return "uses a URL scheme the server does not read for API callers"
    path = Path(inner).expanduser()
    if not path.is_absolute():
        return "is a relative path (give an absolute one)"
    real = Path(os.path.realpath(path))
    for root in roots:
        if root.startswith("s3://"):
            continue
        base = Path(os.path.realpath(Path(root).expanduser()))
        if real == base or base in real.parents:
            return ""
    return "is outside the directories the server may read"
