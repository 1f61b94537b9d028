"""The default memory budget, shared by the fleetserve processes on one host.

Without ``--memory-budget``, a process's budget is 70 % of the host's memory (or its
cgroup limit). Two workers started apart on one host would each claim that: 140 %.
Each process that runs on the default budget registers in one directory, and its
budget is the default divided by the processes registered and alive there.

A process registers once (every fleet it builds shares one registration) with a file
it holds an exclusive ``flock`` on for as long as it lives. The kernel drops the lock
when the process exits, however it exits, so a killed process stops counting at
once; whoever counts next removes its file. The file is locked before it is given
its name, so a count never sees a registration without its lock.

The share is looked at before each load (a load is when the budget decides
anything): a process that started first gives up its excess at its next load,
evicting what no longer fits, as it would for any budget.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import threading
import uuid
from pathlib import Path

log = logging.getLogger("fleetserve.fleet")
NAME = "fleetserve-memory"
SUFFIX = ".proc"
_lock = threading.Lock()
# (directory, pid) -> this process's registration: the open file (its lock says we
# live) and its name (unique: pids repeat across PID namespaces and over time)
_joined: dict[tuple[Path, int], tuple[int, str]] = {}


def default_dir() -> Path:
    """One per user: another user's files could be neither created nor removed."""
    return Path(tempfile.gettempdir()) / f"{NAME}-{os.getuid()}"


def join(directory: Path) -> None:
    """Register this process in ``directory`` (once; later calls do nothing)."""
    with _lock:
        if (directory, os.getpid()) in _joined:  # a forked child has not joined
            return
        directory.mkdir(parents=True, exist_ok=True)
        name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}{SUFFIX}"
        tmp = directory / f".{name}.tmp"
        fd = os.open(tmp, os.O_CREAT | os.O_WRONLY, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # our own new file: never taken
        os.rename(tmp, directory / name)
        _joined[directory, os.getpid()] = (fd, name)


def live(directory: Path) -> int:
    """The processes registered in ``directory`` and alive (this one included, if it
    joined); the files of those that died are removed."""
    count = 0
    mine = _joined.get((directory, os.getpid()), (-1, ""))[1]
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    for name in names:
        if not name.endswith(SUFFIX):
            continue
        if name == mine:
            count += 1
            continue
        path = directory / name
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # removed meanwhile, or not ours to read
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            count += 1  # its owner holds it: alive
        else:
            with contextlib.suppress(OSError):
                path.unlink()  # nobody holds it: its process is gone (names never repeat)
        finally:
            os.close(fd)
    return count


class HostShare:
    """This process's share of the default budget ``full``: ``budget()`` now, ``parts()``
    the ways it is split (at least 1)."""

    def __init__(self, full: int, directory: Path | None = None) -> None:
        self.full = full
        self.directory = directory or default_dir()
        self._parts = 1
        try:
            join(self.directory)
        except OSError as exc:  # a directory it cannot write: the whole budget, as before
            log.warning("cannot share the memory budget through %s: %s", self.directory, exc)

    def parts(self) -> int:
        try:
            return max(1, live(self.directory))
        except OSError:
            return 1

    def budget(self) -> int:
        parts = self.parts()
        if parts != self._parts:
            self._parts = parts
            log.info(
                "memory budget %.1f MiB: the default budget split %d ways (fleetserve "
                "processes on this host on the default budget)",
                self.full / parts / 2**20, parts,
            )  # fmt: skip
        return self.full // parts
