"""Quality-gate verdicts kept on local disk, so that a load the gate passed once is not
judged again: not after an eviction, and not in the next process (a restart, a device
child, another worker of the host).

A verdict is ``<cache_dir>/gate/<key>.json``. The key covers what the verdict depends
on: the model, the runtime and precision served, the hardware class, the versions of
fleetserve and of the runtime's library, and the weights' fingerprint (config.json and
each weight file's name, size and mtime). Only passes are kept: a failure is judged
again at the next load. A file that does not read back as a pass for its key (torn,
corrupt) counts as none, and the next pass rewrites it. Where the disk refuses the
write, one warning says so and the load goes on, judged (:mod:`fleetserve.catalog.facts`)."""

from __future__ import annotations

from pathlib import Path

from ...catalog.facts import Facts, fact_key
from .quality import Quality


class Verdicts:
    """The passes under ``root``, one file each (:class:`~fleetserve.catalog.facts.Facts`)."""

    def __init__(self, root: Path) -> None:
        self.facts = Facts(root, "quality-gate verdicts")

    def key(self, model: str, precision: str, fingerprint: bytes) -> str:
        return fact_key(model, precision, fingerprint)

    def passed(self, key: str) -> bool:
        found = self.facts.get(key)
        return found is not None and found.get("passed") is True

    def record(self, key: str, model: str, precision: str, quality: Quality) -> None:
        """Keep ``quality``, a pass, for ``key``."""
        self.facts.put(key, {"passed": True, "model": model, "precision": precision,
                             "metric": quality.metric, "value": quality.value})  # fmt: skip


__all__ = ["Verdicts"]
