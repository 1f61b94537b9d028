"""What a search is given: its options, and the clock that holds it to its budget."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from . import pauses as pauses_mod

ADAPTER_S = 12.0  # the adapters' gate, of a winner that may run them in its graph
WARMUP_S = 1.0  # unmeasured traffic before each window (at most a third of the window)
LOAD_GATE_S = 6.0  # a candidate's load and quality gate, besides its window
MEASURE_S, KNEE_S = 3.0, 2.5  # a search's windows, where its budget affords them
QUICK_MEASURE_S, QUICK_KNEE_S = 2.0, 1.5  # ... a quick search's
SHORTEST_S = 0.5  # the shortest window a small budget brings
MEASURE_PARTS, KNEE_PARTS = 45, 60  # a window is at most this share of the budget


def windows(budget_s: float, quick: bool = False) -> tuple[float, float]:
    """Seconds per measurement and per knee rate that a budget affords: a 45th and a
    60th of it, at least ``SHORTEST_S`` and at most a search's own (3 and 2.5 s, from
    budgets of 135 and 150 s up; a quick one's 2 and 1.5 s, from 90 s up). A small
    budget then compares engines in shorter windows rather than measuring the
    reference alone: in 3-s windows a search needed 52 s for its reference, one
    candidate and the winner's knee, and ``fleetserve add --budget 40`` was refused.
    (``--tune quick`` took these from the start; a server's background quick search
    took 2 and 1.5 s whatever its budget.)"""
    top = (QUICK_MEASURE_S, QUICK_KNEE_S) if quick else (MEASURE_S, KNEE_S)
    return (
        min(top[0], max(SHORTEST_S, budget_s / MEASURE_PARTS)),
        min(top[1], max(SHORTEST_S, budget_s / KNEE_PARTS)),
    )


def warmup_s(measure_s: float) -> float:
    return min(WARMUP_S, measure_s / 3)


def min_budget_s(measure_s: float) -> float:
    """What a search needs before its final steps: the fp32 reference and one more
    candidate, each loaded, gated, warmed up and measured (20 s with 3-s windows)."""
    return 2 * (LOAD_GATE_S + measure_s + warmup_s(measure_s))


class TuneError(Exception):
    """The tune cannot go on: the message says why, in one line."""


@dataclass
class Options:
    budget_s: float = 600.0
    quick: bool = False
    workload: str = "mix"
    clients: int = 4
    batch: int = 32
    measure_s: float = MEASURE_S
    knee: bool = True
    knee_s: float = KNEE_S
    slo_ms: float | None = None
    device: str = "cpu"
    max_processes: int = 0  # processes per device to try at most (0: as many as cores)
    pause_file: Path | None = None  # the server's pause ledger, when it runs this tune
    start: tuple[str, str] | None = None  # (runtime, precision) to screen first
    cache_dir: Path = field(default_factory=lambda: Path("~/.cache/fleetserve").expanduser())


class Clock:
    """The budget. The search keeps ``reserve_s`` back for the winner's knee and cost
    fit; those final steps spend it (``final=True``)."""

    def __init__(
        self,
        budget_s: float,
        reserve_s: float = 0.0,
        pauses: pauses_mod.Read = pauses_mod.never,
    ) -> None:
        self.pauses = pauses
        self.t0 = time.monotonic()
        self.paused0 = pauses().seconds  # pauses before the start do not count
        self.budget_s = budget_s
        self.reserve_s = reserve_s
        self.forgiven = 0.0  # run in windows a pause spoiled: measured again, not charged

    @property
    def elapsed(self) -> float:
        """Seconds this search was let run (a background tune's pauses, and the windows
        they spoiled, excluded)."""
        paused = self.pauses().seconds - self.paused0
        return time.monotonic() - self.t0 - paused - self.forgiven

    def fits(self, seconds: float, *, final: bool = False) -> bool:
        return seconds <= self.left(final=final)

    def left(self, *, final: bool = False) -> float:
        """Seconds still in the budget (the reserve kept back unless ``final``)."""
        keep = 0.0 if final else self.reserve_s
        return self.budget_s - self.elapsed - keep
