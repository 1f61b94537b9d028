"""Every process's CPU, read from ``/proc`` each tick (Linux only).

A thread that, every ``tick`` seconds, reads each process's user and system time
(``/proc/<pid>/stat``) and keeps what each gained since the last read, keyed by the pid
and its start time (a pid comes back). A process is recorded when first seen: its
parent, command line and name (kernel threads have no command line), read again at its
next two reads, since a child seen between its fork and its exec has its parent's. What a
process that lived less than a tick used is not seen: the report sets the sum seen
against the run's own total (``getrusage`` of the command, once it is reaped).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
KTHREADD = 2  # the parent of every kernel thread
YOUNG = 3  # a new process's command line is read at its first reads: an exec changes it


@dataclass(frozen=True)
class Proc:
    key: str  # "<pid>:<start>": unique over the run
    pid: int
    ppid: int
    start: int  # clock ticks since boot
    cmd: str  # empty for a kernel thread
    name: str  # /proc/<pid>/comm

    @property
    def kernel(self) -> bool:
        return self.ppid == KTHREADD or self.pid == KTHREADD


@dataclass
class Samples:
    procs: dict[str, Proc] = field(default_factory=dict)
    ticks: list[tuple[float, dict[str, float]]] = field(default_factory=list)


def read_stat(proc: Path) -> tuple[int, int, float, int] | None:
    """(pid, ppid, CPU seconds, start ticks), or None where the process is gone."""
    try:
        raw = (proc / "stat").read_text()
    except OSError:
        return None
    rest = raw[raw.rindex(")") + 2 :].split()
    return int(proc.name), int(rest[1]), (int(rest[11]) + int(rest[12])) / HZ, int(rest[19])


def _describe(proc: Path, pid: int, ppid: int, start: int) -> Proc:
    try:
        cmd = (
            (proc / "cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .strip()[:300]
            .decode(errors="replace")
        )
        name = (proc / "comm").read_text().strip()
    except OSError:
        cmd, name = "", "?"
    return Proc(f"{pid}:{start}", pid, ppid, start, cmd, name)


class Sampler(threading.Thread):
    """Start it, run the command, ``stop()`` it: ``samples`` then holds the run.

    Processes alive at the first tick count from there (``baseline``), not from birth."""

    def __init__(self, tick: float = 0.5, root: Path = Path("/proc")) -> None:
        super().__init__(name="suite-sampler", daemon=True)
        self.tick, self.root = tick, root
        self.samples = Samples()
        self._last: dict[str, float] = {}
        self._young: dict[str, int] = {}  # how many more reads of its command line
        self._done = threading.Event()
        self._first = True

    def sample(self) -> None:
        now, gained = time.time(), {}
        for proc in self.root.iterdir():
            if not proc.name.isdigit():
                continue
            stat = read_stat(proc)
            if stat is None:
                continue
            pid, ppid, cpu, start = stat
            key = f"{pid}:{start}"
            if key not in self.samples.procs:
                self._last[key] = cpu if self._first else 0.0  # baseline, or from birth
                self._young[key] = YOUNG
            if self._young.get(key):  # seen between its fork and its exec: read again
                seen = _describe(proc, pid, ppid, start)
                if seen.name != "?" or key not in self.samples.procs:  # (not if gone since)
                    self.samples.procs[key] = seen
                self._young[key] -= 1
            if cpu > self._last[key]:
                gained[key] = round(cpu - self._last[key], 3)
            self._last[key] = cpu
        self._first = False
        self.samples.ticks.append((now, gained))

    def run(self) -> None:
        while True:
            began = time.monotonic()
            self.sample()
            if self._done.wait(max(0.0, self.tick - (time.monotonic() - began))):
                self.sample()  # the last gains of what is still alive
                return

    def stop(self) -> Samples:
        self._done.set()
        self.join()
        return self.samples
