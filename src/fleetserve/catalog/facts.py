"""Small facts a load computes once, kept on local disk: the quality gate's passes
(``gate/``), a model's activation peak (``peak/``), what its weights hold as loaded
(``held/``). A restart, a device child or another worker of the host reads them
instead of computing them again.

A fact is ``<root>/<key>.json``, its key a digest of everything the fact depends on.
It is written whole or not at all (a temporary file, then ``os.replace``). A file that
does not read back as an object for its key (torn, corrupt, another key's) counts as
none, and the next put rewrites it. Where the disk refuses a write, one warning says
so, and the fact is computed again next time."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

log = logging.getLogger("fleetserve.catalog")

# the library whose kernels a runtime's facts depend on
LIBRARIES = {"torch": "torch", "torch_compile": "torch", "onnx": "onnxruntime",
             "openvino": "openvino"}  # fmt: skip


def library_version(runtime: str) -> str:
    """fleetserve's version and ``runtime``'s library's: a fact from other versions is
    computed again."""
    found = []
    for package in ("fleetserve", LIBRARIES.get(runtime, "")):
        try:
            found.append(metadata.version(package) if package else "")
        except metadata.PackageNotFoundError:
            found.append("")
    return "/".join(found)


def fact_key(*parts: str | bytes) -> str:
    """A digest of ``parts`` (each delimited, so that no two lists of parts collide)."""
    h = hashlib.sha256()
    for part in parts:
        raw = part.encode() if isinstance(part, str) else part
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)
    return h.hexdigest()[:32]


class Facts:
    """The facts under ``root``; ``what`` names them in the one warning."""

    def __init__(self, root: Path, what: str) -> None:
        self.root = root
        self.what = what
        self._warned = False

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            data = json.loads((self.root / f"{key}.json").read_text())
        except (OSError, ValueError):  # none yet, or torn
            return None
        return data if isinstance(data, dict) and data.get("key") == key else None

    def put(self, key: str, body: dict[str, Any]) -> None:
        tmp = self.root / f".{key}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"key": key, **body}))
            os.replace(tmp, self.root / f"{key}.json")
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if not self._warned:
                self._warned = True
                log.warning("cannot keep %s in %s (%s): computed at each load", self.what,
                            self.root, exc)  # fmt: skip


__all__ = ["LIBRARIES", "Facts", "fact_key", "library_version"]
