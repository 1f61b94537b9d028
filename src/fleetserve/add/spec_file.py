"""Where ``fleetserve add`` writes the spec (``catalog.spec_yaml`` renders it, each
inferred field with a comment that says where it came from): at once, and never over
a file that exists."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .source import Refused


def file_for(catalog_dir: Path, model_id: str) -> Path:
    """Where ``model_id``'s spec goes (``org/name`` -> ``org__name.yaml``)."""
    return catalog_dir / (model_id.replace("/", "__") + ".yaml")


def write(path: Path, text: str) -> None:
    """``text`` to ``path`` at once (a temporary file renamed); refused if it exists."""
    if path.exists():
        raise Refused(f"{path} exists: remove it, or give the model another --id")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".add-", suffix=".tmp")
    except OSError as exc:
        raise Refused(f"{path.parent}: cannot write the spec there ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.link(tmp, path)  # fails if the file appeared meanwhile: never overwritten
    except FileExistsError:
        raise Refused(f"{path} exists: remove it, or give the model another --id") from None
    finally:
        os.unlink(tmp)
