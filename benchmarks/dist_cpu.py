"""How busy the machine is with work that is not the benchmark's (Linux ``/proc``).

On a shared 2-core machine another process at 100 % halves what the benchmark can
use and stalls its intra-op threads, so each measurement records the CPU that the
bench's own process tree did not use (``foreign``) and the hypervisor's ``steal``,
and a measurement may first wait, within a limit, for the machine to be quiet.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Sample:
    at: float
    busy: int  # jiffies, all CPUs, steal excluded
    steal: int
    mine: int  # jiffies of the given processes


def _tick() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100


def _proc_jiffies(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return 0
    f = stat.rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])  # utime, stime


class CpuMeter:
    """Samples ``/proc/stat`` and the bench's processes; inert where there is no /proc."""

    def __init__(self, pids: Callable[[], Sequence[int]]) -> None:
        self.pids = pids
        self.tick = _tick()
        self.enabled = Path("/proc/stat").exists()
        self._seen: dict[int, int] = {}  # last jiffies of each pid: exits do not go back

    def sample(self) -> Sample:
        if not self.enabled:
            return Sample(time.monotonic(), 0, 0, 0)
        cpu = Path("/proc/stat").read_text(encoding="utf-8").split("\n", 1)[0].split()[1:]
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, cpu[:8])
        for pid in [os.getpid(), *self.pids()]:
            self._seen[pid] = max(self._seen.get(pid, 0), _proc_jiffies(pid))
        busy = user + nice + system + irq + softirq
        return Sample(time.monotonic(), busy, steal, sum(self._seen.values()))

    def between(self, a: Sample, b: Sample) -> dict[str, float]:
        """Cores in use on average from ``a`` to ``b``: the bench's, others', stolen."""
        secs = max(b.at - a.at, 1e-6) * self.tick
        mine = (b.mine - a.mine) / secs
        return {
            "mine_cores": mine,
            "foreign_cores": max(0.0, (b.busy - a.busy) / secs - mine),
            "steal_cores": (b.steal - a.steal) / secs,
        }

    def wait_quiet(self, limit: float, threshold: float = 0.25, every: float = 0.5) -> float:
        """Wait (at most ``limit`` s) until others use under ``threshold`` cores.

        Returns the seconds waited; a quiet machine costs one ``every`` sample."""
        t0 = time.monotonic()
        while self.enabled:
            a = self.sample()
            time.sleep(every)
            load = self.between(a, self.sample())
            if load["foreign_cores"] + load["steal_cores"] < threshold:
                break
            if time.monotonic() - t0 >= limit:
                break
        return time.monotonic() - t0
