"""Pausing a background tune while the server has traffic, without spoiling its figures.

The server's background tuner runs ``fleetserve tune`` as a child process and stops it
(``SIGSTOP``) the moment a request arrives, continuing it (``SIGCONT``) once the
server has been idle a while: a stopped process takes no CPU, so traffic gets every
core within one poll of the tuner (20 ms), whatever the tune was doing.

The two processes share a *pause ledger*, a small file the parent rewrites
atomically after each pause: ``<pauses> <paused seconds>``. The child reads it

- in its budget's clock, which counts only the time it was let run, and
- around each measurement window: a window during which the count changed was
  spoiled by the pause (its latencies hold the stop) and is measured again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

Read = Callable[[], "Pauses"]
T = TypeVar("T")
SPOILED_TRIES = 20  # windows a busy server may spoil before the measurement is given up
# and the seconds they may run in all: a window longer than the server's idle spells is
# cut every time (an emulated precision under light traffic), however few tries that is
SPOILED_S = 60.0
PROBE_BYTES = 4096  # written to the profile and tune directories to show they take files


@dataclass(frozen=True)
class Pauses:
    count: int = 0
    seconds: float = 0.0


NONE = Pauses()


def never() -> Pauses:
    """The ledger of a tune nobody pauses (one run by hand)."""
    return NONE


def reader(path: Path | None) -> Read:
    """The child's view of the ledger at ``path`` (no pauses when ``None`` or unreadable:
    a tune run by hand is never paused)."""
    if path is None:
        return never

    def read() -> Pauses:
        try:
            count, seconds = path.read_text().split()
            return Pauses(int(count), float(seconds))
        except (OSError, ValueError):
            return NONE

    return read


class Budget(Protocol):
    """The search's clock: what it has run, and what it is not charged."""

    @property
    def elapsed(self) -> float: ...

    forgiven: float


class Spoiled(RuntimeError):
    """Every try of a measurement was cut by a pause: no figure rather than a spoiled one."""


async def unspoiled(
    read: Read,
    clock: Budget,
    measure: Callable[[], Awaitable[T]],
    *,
    give_up_s: float = SPOILED_S,
) -> T:
    """``measure()`` again until no pause cut into it (its latencies would hold the
    stop); the time spoiled tries ran is not charged to ``clock``. After
    :data:`SPOILED_TRIES` spoiled tries, or once they have run ``give_up_s`` seconds in
    all, :class:`Spoiled`."""
    spent = 0.0
    for _ in range(SPOILED_TRIES):
        count, t0 = read().count, clock.elapsed
        got = await measure()
        if read().count == count:
            return got
        ran = max(0.0, clock.elapsed - t0)
        clock.forgiven += ran
        spent += ran
        if spent >= give_up_s:
            raise Spoiled(
                f"the server's traffic cut every window for {spent:.0f} s "
                f"(each ran longer than its idle spells)"
            )
    raise Spoiled(f"the server was busy through {SPOILED_TRIES} windows")


class Ledger:
    """The parent's side: stop and continue process ``pid``, and keep the ledger."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.clock = clock
        self.pid: int | None = None
        self.count = 0
        self.seconds = 0.0
        self._since: float | None = None  # when the current pause began
        self._write()

    @property
    def paused(self) -> bool:
        return self._since is not None

    def attach(self, pid: int | None) -> None:
        """The process to pause from now on (``None``: none); a pause in force carries
        over, so that a new phase's child starts stopped if traffic is about."""
        self.pid = pid
        if pid is not None and self.paused:
            self._signal(signal.SIGSTOP)

    def pause(self) -> None:
        if self.paused:
            return
        self._since = self.clock()
        self.count += 1  # counted before the stop: a window that sees it is spoiled
        self._write()
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._since is None:
            return
        self.seconds += self.clock() - self._since
        self._since = None
        self._write()  # the child reads it first thing after it continues
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        if self.pid is None:
            return
        with contextlib.suppress(ProcessLookupError):  # it ended: the caller reaps it
            if os.getpgid(self.pid) == self.pid:  # it leads its own group (the tune's
                os.killpg(self.pid, sig)  # children pause with it)
            else:
                os.kill(self.pid, sig)

    def _write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(f"{self.count} {self.seconds:.3f}\n")
        os.replace(tmp, self.path)


class WriteError(OSError):
    """A directory the background tune writes to does not take files."""

    def __init__(self, where: Path, exc: OSError) -> None:
        self.where, self.why = where, str(exc.strerror or exc)
        super().__init__(f"{where} is not writable ({self.why})")


def open_ledger(*dirs: Path) -> Ledger:
    """A fresh ledger in the last of ``dirs``, once each of them took a file of a few
    KiB (a full disk fails that too); :class:`WriteError` naming the one that did not."""
    where = dirs[0]
    try:
        for where in dirs:
            where.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=where) as f:
                f.write(b"\0" * PROBE_BYTES)
                f.flush()
                os.fsync(f.fileno())
        return Ledger(Path(tempfile.mkdtemp(dir=where, prefix=".pauses-")) / "l")
    except OSError as exc:
        raise WriteError(where, exc) from exc


__all__ = [
    "NONE", "SPOILED_S", "SPOILED_TRIES", "Budget", "Ledger", "Pauses", "Read", "Spoiled",
    "WriteError", "never", "open_ledger", "reader", "unspoiled",
]  # fmt: skip
