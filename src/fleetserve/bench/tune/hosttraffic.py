"""Traffic anywhere on this host steps a background tune aside, not only its own.

Co-located fleetserve processes (several workers, or a worker beside ``serve``) take
turns to tune (:mod:`.hostlock`), but the one tuning used to pause its child only for
its own requests: a neighbour's traffic ran beside a tune that took every core. Now
each process holds a *shared* ``flock`` on one file while it has work (requests wait
or run), and the tuning process looks each poll whether anyone does: an exclusive
try that fails means some process holds it. The kernel drops a process's lock when
it exits, however it exits, so a killed neighbour never leaves the host looking busy;
nothing is written while the host is quiet, and a look is two system calls.

A process that does not tune (``--tune off`` or ``quick``, or another class's
profiles) publishes its load all the same (:func:`publish_forever`): its neighbour's
tune must step aside for it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from collections.abc import Callable
from pathlib import Path

from .hostlock import default_path

log = logging.getLogger("fleetserve.bench.tune")

TRIES = 3  # a shared take that meets another process's look (a moment) tries again
POLL_S = 0.02  # how often a process's load is looked at and published


def path_for(lock: Path) -> Path:
    """The traffic file beside the host's tune lock."""
    return lock.with_name(lock.name + ".busy")


class HostTraffic:
    """This process's side: :meth:`publish` its own load, :meth:`others` look at the
    rest of the host's. A file that cannot be opened is no signal (each process then
    steps aside for its own traffic only, as before)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mine: int | None = None  # the fd holding the shared lock, while busy
        self._look: int | None = None  # the fd an exclusive try is made on

    @property
    def busy(self) -> bool:
        """This process holds the shared lock (it published work)."""
        return self._mine is not None

    def publish(self, busy: bool) -> None:
        """Hold the shared lock while this process has work; let go when it has none."""
        if busy and self._mine is None:
            fd = self._open()
            if fd is None:
                return
            for _ in range(TRIES):
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except OSError:
                    continue
                self._mine = fd
                return
            os.close(fd)  # looked at that very moment thrice: the next poll tries again
        elif not busy and self._mine is not None:
            fd, self._mine = self._mine, None
            os.close(fd)  # closing the description drops its lock

    def others(self) -> bool:
        """Another process on this host has work. (Call it while this one has none:
        its own shared lock would count.)"""
        if self._look is None:
            self._look = self._open()
            if self._look is None:
                return False
        try:
            fcntl.flock(self._look, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(self._look, fcntl.LOCK_UN)
        return False

    def close(self) -> None:
        self.publish(False)
        fd, self._look = self._look, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _open(self) -> int | None:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            return None


async def publish_forever(busy: Callable[[], bool], tune_lock: str = "") -> None:
    """Publish ``busy()`` every :data:`POLL_S` until cancelled, beside the host's tune
    lock (``tune_lock``, or the default one). Never raises: a look that fails is no
    signal this time."""
    traffic = HostTraffic(path_for(Path(tune_lock) if tune_lock else default_path()))
    try:
        while True:
            try:
                traffic.publish(busy())
            except Exception as exc:
                log.debug("host traffic: %s", exc)
            await asyncio.sleep(POLL_S)
    finally:
        traffic.close()


__all__ = ["POLL_S", "HostTraffic", "path_for", "publish_forever"]
