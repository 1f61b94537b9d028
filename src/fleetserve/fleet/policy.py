"""Which resident models leave to make room: cost-aware (GDSF) or by recency (LRU).

The fleet manager and the queue simulator (``fleetserve bench sim``) share these.
A policy only orders the models that may leave; the manager decides which may: never
a pinned one, one with work in flight, or one inside its ``keep_alive``.

GreedyDual-Size-Frequency gives each resident model the priority

    H = L + frequency * reload_seconds / size

and evicts the lowest first. ``L`` (the inflation) rises to the priority of each model
evicted, so a model used long ago ages out even if it was once used often. A large
model that reloads fast and is rarely used leaves before a small one that is slow to
load or used all the time, which is what recency alone gets wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

MIB = float(1 << 20)


@dataclass
class Resident:
    """What a policy sees of one resident model."""

    model: str
    bytes: int
    reload_s: float  # how long its last load took: the cost of evicting it
    pinned: bool = False
    busy: bool = False  # work in flight
    last_used: float = 0.0
    keep_until: float = 0.0  # its keep_alive after the last use
    hits: int = 0  # uses since it was loaded
    priority: float = 0.0  # kept by the policy


def evictable(r: Resident, now: float, busy_too: bool = False) -> bool:
    return not r.pinned and (busy_too or not r.busy) and now >= r.keep_until


class Policy(Protocol):
    name: str

    def loaded(self, r: Resident, now: float) -> None:
        """``r`` has just been loaded (the request that loaded it comes as ``used``)."""

    def used(self, r: Resident, now: float) -> None:
        """``r`` serves one more request."""

    def evicted(self, r: Resident) -> None:
        """``r`` leaves."""

    def order(self, candidates: Iterable[Resident]) -> list[Resident]:
        """The candidates, first to leave first."""


class GDSF:
    """GreedyDual-Size-Frequency over reload seconds (the cost) and bytes (the size).

    Uses count from the load on, as the classic policy does. Keeping them across an
    eviction was tried twice on the fleet trace: with its charges noisy, no fewer
    loads; with them steady (16 models, 1,000 requests, torch and OpenVINO, 2-core
    cpu-avx2), load seconds 0.80x and 0.97x LRU's in two invocations of three runs
    each, against 1.04x and 1.03x counted from the load, while LRU's own medians moved
    from 29.8 to 35.0 s between invocations of the same code: not shown apart from
    the noise. A third try, decayed with a 10-minute half-life (2-core cpu-avx512bf16,
    a budget of two thirds): 1.00x, where LRU's median moved from 9.3 to 7.9 s between
    two invocations."""

    name = "gdsf"

    def __init__(self) -> None:
        self.inflation = 0.0

    def _score(self, r: Resident) -> None:
        size_mib = max(r.bytes, 1) / MIB
        r.priority = self.inflation + max(r.hits, 1) * max(r.reload_s, 1e-3) / size_mib

    def loaded(self, r: Resident, now: float) -> None:
        r.hits = 0
        self._score(r)

    def used(self, r: Resident, now: float) -> None:
        r.hits += 1
        self._score(r)

    def evicted(self, r: Resident) -> None:
        self.inflation = max(self.inflation, r.priority)

    def order(self, candidates: Iterable[Resident]) -> list[Resident]:
        return sorted(candidates, key=lambda r: (r.priority, r.last_used))


class LRU:
    """Least recently used first: the baseline that ignores size and reload cost."""

    name = "lru"

    def loaded(self, r: Resident, now: float) -> None:
        r.hits = 0

    def used(self, r: Resident, now: float) -> None:
        r.hits += 1

    def evicted(self, r: Resident) -> None:
        pass

    def order(self, candidates: Iterable[Resident]) -> list[Resident]:
        return sorted(candidates, key=lambda r: r.last_used)


POLICIES: dict[str, type[GDSF] | type[LRU]] = {"gdsf": GDSF, "lru": LRU}


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(
            f"unknown eviction policy {name!r}; choose one of: {', '.join(POLICIES)}"
        ) from None


def victims(
    policy: Policy,
    residents: Sequence[Resident],
    need: int,
    free: int,
    now: float,
    busy_too: bool = False,
) -> list[Resident] | None:
    """The models to evict so that ``need`` bytes fit in ``free`` plus what they hold,
    in the policy's order; ``None`` if even evicting every evictable one is not enough.
    ``[]`` when it fits already. ``busy_too``: as ``victims_until``."""
    return victims_until(policy, residents, lambda gone: need <= free + _bytes(gone), now, busy_too)


def victims_until(
    policy: Policy,
    residents: Sequence[Resident],
    fits: Callable[[Sequence[Resident]], bool],
    now: float,
    busy_too: bool = False,
) -> list[Resident] | None:
    """The fewest evictable models, in the policy's order, whose leaving ``fits`` (a
    model's leaving may free more than its record's bytes: its activation peak, where
    it was the largest); ``None`` if even evicting every evictable one does not fit,
    ``[]`` when it fits already. ``busy_too``: as if those with work in flight could
    leave (what the policy would pick were they idle)."""
    chosen: list[Resident] = []
    if fits(chosen):
        return chosen
    for r in policy.order(x for x in residents if evictable(x, now, busy_too)):
        chosen.append(r)
        if fits(chosen):
            return chosen
    return None


def worth_waiting(chosen: Sequence[Resident], first: Sequence[Resident] | None) -> float:
    """The reload seconds saved were the policy's ``first`` choices (``victims...(...,
    busy_too=True)``, busy among them) to leave instead of the idle ``chosen``: how
    long a load may wait for them to finish. Nothing when none of them is busy."""
    if not first or not any(r.busy for r in first):
        return 0.0
    return max(0.0, sum(r.reload_s for r in chosen) - sum(r.reload_s for r in first))


def _bytes(rs: Sequence[Resident]) -> int:
    return sum(r.bytes for r in rs)


__all__ = [
    "GDSF",
    "LRU",
    "POLICIES",
    "Policy",
    "Resident",
    "evictable",
    "make_policy",
    "victims",
    "victims_until",
    "worth_waiting",
]
