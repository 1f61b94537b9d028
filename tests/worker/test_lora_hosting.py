"""The hot tier: least recently used adapters leave first, never one in use or pinned,
and what adapters hold counts in the fleet's memory budget."""

from __future__ import annotations

from typing import Any

from fleetserve.fleet.manager import Fleet
from fleetserve.fleet.policy import GDSF
from fleetserve.worker.lora_hosting import HotTier


class Bank:
    """What the tier calls on a model's bank: ``remove``."""

    def __init__(self) -> None:
        self.removed: list[str] = []

    def remove(self, key: str) -> None:
        self.removed.append(key)


def test_the_least_recently_used_idle_unpinned_adapter_leaves_first() -> None:
    tier, bank = HotTier(cap=300), Bank()
    b: Any = bank
    for key in ("a", "b", "c"):
        assert tier.admit("m", key, 100, b) == []
    tier.touch("m", "a")  # order now: b, c, a
    assert tier.admit("m", "d", 100, b) == ["m:b"]
    tier.mark("m", "c", +1)  # a batch is about to run c
    assert tier.admit("m", "e", 100, b) == ["m:a"]  # c is in use: a goes instead
    tier.mark("m", "c", -1)
    assert tier.admit("m", "p", 100, b, pinned=True) == ["m:c"]
    assert tier.admit("m", "f", 100, b) == ["m:d"]
    assert tier.admit("m", "g", 100, b) == ["m:e"]
    assert tier.admit("m", "h", 100, b) == ["m:f"]  # p is pinned: it stays
    assert bank.removed == ["b", "a", "c", "d", "e", "f"] and tier.nbytes == 300


def test_a_model_leaving_takes_its_adapters_and_its_torch_copy() -> None:
    tier, bank = HotTier(cap=1000), Bank()
    b: Any = bank
    tier.admit("m", "a", 100, b, pinned=True)
    tier.admit("n", "a", 100, b)
    tier.copies["m"] = 500
    assert tier.held == 700
    tier.forget("m")
    assert tier.held == 100 and tier.nbytes == 100 and not tier.pinned


def test_the_fleet_counts_what_adapters_hold() -> None:
    tier = HotTier(cap=1000)
    fleet = Fleet(10_000, GDSF())
    assert fleet.used() == 0
    fleet.adapters = lambda: tier.held
    tier.copies["m"] = 700
    tier.admit("m", "a", 100, Bank())  # type: ignore[arg-type]
    assert fleet.used() == 800
