"""What a search is given: its options, and the clock that holds it to its budget."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from . import pauses as pauses_mod

MIN_BUDGET_S = 20.0  # the fp32 reference and one more candidate, gated and measured
ADAPTER_S = 12.0  # the adapters' gate, of a winner that may run them in its graph


class TuneError(Exception):
    """The tune cannot go on: the message says why, in one line."""


@dataclass
class Options:
    budget_s: float = 600.0
    quick: bool = False
    workload: str = "mix"
    clients: int = 4
    batch: int = 32
    measure_s: float = 3.0
    knee: bool = True
    knee_s: float = 2.5
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
