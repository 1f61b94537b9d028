"""What the fleet manager manages: members, their states and their footprints."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


class State(enum.StrEnum):
    COLD = "cold"
    LOADING = "loading"
    RESIDENT = "resident"
    SLEEPING = "sleeping"  # loaded, its weights out of memory (the host tier holds them)
    FAILED = "failed"


@dataclass(frozen=True)
class Footprint:
    """What a model holds: its weights for as long as it is resident, the activation
    peak of one full batch while that batch runs, and what its load holds beside the
    weights for a moment (``load``, charged while it loads: :meth:`loading`). A worker
    runs one batch at a time (one compute thread), so the budget holds every resident
    model's weights plus the largest of their peaks, not the sum of the peaks; loads
    run beside batches, so what a load holds adds to the weights."""

    weights: int = 0
    peak: int = 0
    load: int = 0  # held for a moment by its load, beyond its weights (not in ``total``)
    state: int = 0  # held beside the weights as it serves (generation's KV cache)

    @property
    def kept(self) -> int:
        """What it keeps for as long as it is resident: its weights and the state it
        serves with (generation's KV cache at its full token budget, allocated as its
        sequences run)."""
        return self.weights + self.state

    @property
    def total(self) -> int:
        return self.kept + self.peak

    def loading(self) -> Footprint:
        """What its load reserves until it ends: the weights and what the load holds
        beside them for a moment (the file read beside the tensors built from it, the
        quality gate's fp32 reference), and the activation peak of its first batch
        (the warm-up). The fleet charges this before the load starts and the
        difference is released when it ends."""
        return Footprint(self.weights + self.load, self.peak, 0, self.state)


def held_together(prints: Iterable[Footprint]) -> int:
    """What models hold together on one worker: all they keep (weights and state), the
    largest peak."""
    kept = peak = 0
    for f in prints:
        kept, peak = kept + f.kept, max(peak, f.peak)
    return kept + peak


class Member(Protocol):
    """A model the fleet manages (a worker's runner; a fake one in tests)."""

    @property
    def model_id(self) -> str: ...

    @property
    def pinned(self) -> bool: ...

    @property
    def keep_alive(self) -> float: ...

    @property
    def loaded(self) -> bool:
        """Whether it holds its weights now (a fleet may take over a loaded one: the
        tuner's, or a swap's)."""
        ...

    def expected(self) -> Footprint:
        """Its footprint before it loads: measured last time, its profile's, or an
        estimate (zeros if unknown: the load is checked once it is measured)."""
        ...

    async def load(self) -> Footprint:
        """Load it (off the compute thread), or wake it if it sleeps; what it now holds."""
        ...

    def sleep(self) -> int:
        """Let its weights' memory go and keep it loaded, to wake cheaply at its next
        ``load``; the bytes let go (0: it cannot sleep, and stays as it was)."""
        ...

    @property
    def sleeps(self) -> bool:
        """Whether it could sleep now (``sleep``): loaded, with its weights where a
        wake finds them again (a mapped copy)."""
        ...

    def unload(self) -> None: ...


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error: Python's, or torch's (CUDA and the CPU allocator)."""
    return isinstance(exc, MemoryError) or "out of memory" in str(exc).lower()


__all__ = ["Footprint", "Member", "State", "held_together", "is_oom"]
