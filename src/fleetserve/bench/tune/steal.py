"""CPU steal time: the share of a virtual machine's CPU time its hypervisor gave to
other guests. A measurement taken while it is high measured a shared machine.

Linux counts it in ``/proc/stat``: the aggregate ``cpu`` line holds, in clock ticks,
``user nice system idle iowait irq softirq steal guest guest_nice``; ``guest`` and
``guest_nice`` are already inside ``user`` and ``nice``, so the elapsed CPU time is
the sum of the first eight. Where there is no ``/proc/stat`` (macOS, Windows) the
readings are ``None`` and the report says "unknown".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
SHARED = 0.05  # steal above this: the machine is being shared with other guests


@dataclass(frozen=True)
class CpuTimes:
    """Clock ticks of every CPU together since boot (or summed over windows)."""

    total: int
    steal: int

    def __add__(self, other: CpuTimes) -> CpuTimes:
        return CpuTimes(self.total + other.total, self.steal + other.steal)

    def __sub__(self, other: CpuTimes) -> CpuTimes:
        return CpuTimes(self.total - other.total, self.steal - other.steal)

    @property
    def fraction(self) -> float | None:
        """Steal over elapsed CPU time; ``None`` when no time elapsed."""
        return self.steal / self.total if self.total > 0 else None


def parse(text: str) -> CpuTimes | None:
    """The aggregate ``cpu`` line of ``/proc/stat``'s text; ``None`` if it has none.
    A kernel older than 2.6.11 has no steal column: its steal is 0."""
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0] != "cpu":
            continue
        try:
            ticks = [int(v) for v in fields[1:9]]
        except ValueError:
            return None
        if len(ticks) < 4:
            return None
        return CpuTimes(sum(ticks), ticks[7] if len(ticks) > 7 else 0)
    return None


def read(path: Path = PROC_STAT) -> CpuTimes | None:
    """This machine's CPU times now, or ``None`` where ``path`` cannot be read."""
    try:
        return parse(path.read_text(encoding="utf-8"))
    except OSError:
        return None


def window(before: CpuTimes | None, after: CpuTimes | None) -> CpuTimes | None:
    """The ticks between two readings; ``None`` if either is unknown or the counters
    went backwards (a reading from another machine, or a reset)."""
    if before is None or after is None:
        return None
    d = after - before
    return d if d.total >= 0 and d.steal >= 0 else None


def fraction(before: CpuTimes | None, after: CpuTimes | None) -> float | None:
    """Steal as a fraction of the CPU time elapsed between two readings."""
    d = window(before, after)
    return d.fraction if d is not None else None


def describe(steal: float | None) -> str:
    """``CPU steal 0.2 %``, and whether that means the machine is shared."""
    if steal is None:
        return "CPU steal unknown (no /proc/stat)"
    line = f"CPU steal {steal:.1%}"
    if steal > SHARED:
        line += ": the machine is being shared (the hypervisor gave that time to other guests)"
    return line


__all__ = ["PROC_STAT", "SHARED", "CpuTimes", "describe", "fraction", "parse", "read", "window"]
