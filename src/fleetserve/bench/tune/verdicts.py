"""Quality-gate verdicts kept on local disk, so that a load the gate passed once is not
judged again: not after an eviction, and not in the next process (a restart, a device
child, another worker of the host).

A verdict is ``<cache_dir>/gate/<key>.json``. The key covers what the verdict depends
on: the model, the runtime and precision served, the hardware class, the versions of
fleetserve and of the runtime's library, and the weights' fingerprint (config.json and
each weight file's name, size and mtime). Only passes are kept: a failure is judged
again at the next load. A file that does not read back as a pass for its key (torn,
corrupt, from another version) counts as none, and the next pass rewrites it. Where
the disk refuses the write, one warning says so and the load goes on, judged."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import uuid
from importlib import metadata
from pathlib import Path

from .quality import Quality

log = logging.getLogger("fleetserve.bench.tune")

# the library whose kernels a runtime's verdict depends on
LIBRARIES = {"torch": "torch", "torch_compile": "torch", "onnx": "onnxruntime",
             "openvino": "openvino"}  # fmt: skip


def library_version(runtime: str) -> str:
    """``runtime``'s library version, and fleetserve's: a new one is judged again."""
    found = []
    for package in ("fleetserve", LIBRARIES.get(runtime, "")):
        try:
            found.append(metadata.version(package) if package else "")
        except metadata.PackageNotFoundError:
            found.append("")
    return "/".join(found)


class Verdicts:
    """The passes under ``root``, one file each."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._warned = False

    def key(self, model: str, precision: str, fingerprint: bytes) -> str:
        h = hashlib.sha256(f"{model}\0{precision}\0".encode())
        h.update(fingerprint)
        return h.hexdigest()[:32]

    def passed(self, key: str) -> bool:
        try:
            data = json.loads((self.root / f"{key}.json").read_text())
        except (OSError, ValueError):  # none yet, or torn: judged again
            return False
        return isinstance(data, dict) and data.get("key") == key and data.get("passed") is True

    def record(self, key: str, model: str, precision: str, quality: Quality) -> None:
        """Keep ``quality``, a pass, for ``key``: written whole or not at all."""
        body = {"key": key, "passed": True, "model": model, "precision": precision,
                "metric": quality.metric, "value": quality.value}  # fmt: skip
        tmp = self.root / f".{key}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(body))
            os.replace(tmp, self.root / f"{key}.json")
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if not self._warned:
                self._warned = True
                log.warning("cannot keep quality-gate verdicts in %s (%s): each load of "
                            "%s is judged", self.root, exc, model)  # fmt: skip


__all__ = ["LIBRARIES", "Verdicts", "library_version"]
