"""The spec ``fleetserve add`` writes: the fields it inferred, each with a comment that
says where it came from, in the order a person reads a spec; written atomically, and
never over a file that exists."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import yaml

from .source import Refused

ORDER = (
    "id", "description", "family", "runtime", "sources", "pooling", "normalize",
    "max_seq_len", "dimensions", "options",
)  # fmt: skip


def file_for(catalog_dir: Path, model_id: str) -> Path:
    """Where ``model_id``'s spec goes (``org/name`` -> ``org__name.yaml``)."""
    return catalog_dir / (model_id.replace("/", "__") + ".yaml")


def render(fields: Mapping[str, object], evidence: Mapping[str, str], header: str) -> str:
    """YAML for ``fields``, each key under a comment naming its ``evidence``."""
    keys = [k for k in ORDER if k in fields] + sorted(k for k in fields if k not in ORDER)
    out = [f"# {line}".rstrip() for line in header.splitlines()]
    for key in keys:
        why = evidence.get(key)
        if why:
            out.append(f"# {key}: {why}")
        out.append(yaml.safe_dump({key: fields[key]}, sort_keys=False, width=88).rstrip())
    return "\n".join(out) + "\n"


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
