"""One background tune per host at a time.

Co-located fleetserve processes (several workers, or a worker beside ``serve``) each
tune in the background, and each child takes every core while it runs: two at once
would measure each other and slow each other's traffic. Whoever tunes holds an
exclusive ``flock`` on a file in the host's temporary directory; the others wait
for it (a non-blocking try on each look for work). The kernel releases the lock when
its holder exits, however it exits, so a killed process never leaves it held.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path

NAME = "fleetserve-tune.lock"


def default_path() -> Path:
    return Path(tempfile.gettempdir()) / NAME


class HostLock:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_path()
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if no other process holds it (True if this one now does). A
        lock file that cannot be opened is no lock: tuning goes on without one."""
        if self._fd is not None:
            return True
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        with contextlib.suppress(OSError):  # who holds it, for a person looking
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        return True

    def holder(self) -> str:
        """The pid written by the process that holds it ("" if unknown)."""
        try:
            return self.path.read_text().strip()
        except OSError:
            return ""

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


__all__ = ["HostLock", "default_path"]
