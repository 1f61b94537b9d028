"""The runtimes' cache directory, and its entries built atomically: made in a temporary
directory beside the entry and renamed into place, so that no reader ever sees half an
entry (ONNX exports, OpenVINO conversions)."""

from __future__ import annotations

import logging
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("fleetserve.runtimes")
DEFAULT_CACHE = Path("~/.cache/fleetserve").expanduser()


def build_entry(
    entry: Path, complete: Callable[[Path], bool], build: Callable[[Path], None]
) -> Path:
    """``entry`` if ``complete(entry)``; else ``build(tmp)`` fills a fresh temporary
    directory that then becomes ``entry``. An incomplete entry is rebuilt; if another
    process finished the same entry first, its entry stands."""
    if complete(entry):
        return entry
    if entry.exists():
        log.warning("cache entry %s is incomplete; rebuilding it", entry)
        shutil.rmtree(entry, ignore_errors=True)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.parent / f".tmp-{entry.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        build(tmp)
        try:
            tmp.rename(entry)
        except OSError:  # another process finished the same entry first
            if not complete(entry):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


__all__ = ["DEFAULT_CACHE", "build_entry"]
