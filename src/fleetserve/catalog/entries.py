"""Cache entries built once per host: GGUF conversions, ONNX exports, OpenVINO IR.

An entry is a directory filled in a temporary directory beside it and renamed into
place, so that no reader ever sees half of one. Its builders take an exclusive
``flock`` on a lock file beside it first: where several processes of a host (device
children, workers, a tune, the server) want the same entry at once, one builds it and
the others wait for it and read it, instead of each spending the conversion's
CPU-seconds and memory to throw all but one away. The kernel drops a lock whose holder
dies, so a builder that is killed leaves the next one to build."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger("fleetserve.catalog")


def build_entry(
    entry: Path, complete: Callable[[Path], bool], build: Callable[[Path], None]
) -> Path:
    """``entry`` if ``complete(entry)``; else ``build(tmp)`` fills a fresh temporary
    directory that then becomes ``entry``, under the entry's lock. An incomplete entry
    is rebuilt; one that another process completed while this one waited stands."""
    if complete(entry):
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    with entry_lock(entry):
        if complete(entry):  # built by the process this one waited for
            return entry
        if entry.exists():
            log.warning("cache entry %s is incomplete; rebuilding it", entry)
            shutil.rmtree(entry, ignore_errors=True)
        tmp = entry.parent / f".tmp-{entry.name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            build(tmp)
            try:
                tmp.rename(entry)
            except OSError:  # a builder that takes no lock (an older version) was first
                if not complete(entry):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return entry


@contextlib.contextmanager
def entry_lock(entry: Path) -> Iterator[None]:
    """Held while ``entry`` is built: another builder of the same entry, in this
    process or another, waits (saying so once) until it is released. The lock file
    goes with it: a builder that waited on it, or one that comes later, finds the
    entry complete when it looks again."""
    path = entry.parent / f".{entry.name}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process building %s", entry)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:  # not a later builder's file
                os.unlink(path)
        os.close(fd)  # releases the lock


__all__ = ["build_entry", "entry_lock"]
