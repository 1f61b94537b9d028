"""RSS of the server's processes over time, sampled from a thread every few seconds.

Each sample holds, per named process (``server``; or ``gateway``, ``worker-a``...,
``nats``), the RSS summed over that process and its descendants, and the CPU seconds
they used (read from ``/proc``: Linux only); plus this machine's load average, since
other work shares the cores.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) from ``/proc/PID/stat``; None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return None
    rest = raw[raw.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / TICK


def _rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text(encoding="utf-8").split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def tree(pid: int) -> tuple[int, float]:
    """(RSS bytes, CPU seconds) of ``pid`` and its descendants; (0, 0) if it is gone."""
    parents: dict[int, list[int]] = {}
    cpu_of: dict[int, float] = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (st := _stat(int(d))) is not None:
            parents.setdefault(st[0], []).append(int(d))
            cpu_of[int(d)] = st[1]
    if pid not in cpu_of:
        return 0, 0.0
    rss, cpu, todo = 0, 0.0, [pid]
    while todo:
        p = todo.pop()
        rss += _rss(p)
        cpu += cpu_of.get(p, 0.0)
        todo += parents.get(p, [])
    return rss, cpu


class Sampler:
    """Calls ``pids()`` (name -> pid of what is alive now) every ``every`` seconds."""

    def __init__(self, pids: Callable[[], dict[str, int]], every: float, t0: float) -> None:
        self.pids = pids
        self.every = every
        self.t0 = t0
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def sample(self) -> dict[str, Any]:
        rss: dict[str, int] = {}
        cpu: dict[str, float] = {}
        for name, pid in self.pids().items():
            rss[name], cpu[name] = tree(pid)
        s = {
            "t": round(time.time() - self.t0, 2),
            "rss": rss,
            "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
            "load1": round(os.getloadavg()[0], 2),
        }
        self.samples.append(s)
        return s

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
