"""The hot tier: least recently used adapters leave first, never one in use or pinned,
and what adapters hold counts in the fleet's memory budget."""

from __future__ import annotations

from typing import Any

import pytest

from fleetserve.fleet.manager import Fleet
from fleetserve.fleet.policy import GDSF
from fleetserve.worker.lora_tier import HotTier


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
    fleet.room.adapters = lambda: tier.held
    tier.copies["m"] = 700
    tier.admit("m", "a", 100, Bank())  # type: ignore[arg-type]
    assert fleet.used() == 800


async def test_a_torch_copy_makes_room_and_is_charged_before_it_loads() -> None:
    """A base served on a runtime that cannot take adapters runs adapter batches on a
    torch copy of itself: charged before it loads (the served model's count), others
    evicted for it as for a load, then charged its own count. A copy that fails to
    load is charged nothing."""
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from fleetserve.catalog import ModelSpec
    from fleetserve.fleet.manager import State
    from fleetserve.worker.lora_hosting import AdapterHosting

    from ..fleet.test_manager import MIB, Clock, FakeModel, use

    class Copy:
        runtime = SimpleNamespace(name="torch", precision="fp32")

        def __init__(self, fail: bool = False) -> None:
            self.fail = fail
            self.started, self.go = threading.Event(), threading.Event()

        def load(self) -> None:
            self.started.set()
            assert self.go.wait(10)
            if self.fail:
                raise RuntimeError("torch copy failed")

        def warmup(self) -> None:
            pass

        def memory_bytes(self) -> int:
            return 45 * MIB

    c = Clock()
    fleet = Fleet(100 * MIB, GDSF(), clock=c, room_wait=0.0)
    tier = HotTier(cap=10 * MIB)
    fleet.room.adapters = lambda: tier.held
    for m in ("m", "o"):
        fleet.add(FakeModel(c, m, 40))
        await use(fleet, m)
    served = SimpleNamespace(
        runtime=SimpleNamespace(name="onnx", precision="fp32"), memory_bytes=lambda: 40 * MIB
    )
    spec = ModelSpec.from_dict({"id": "m", "sources": ["/w"], "family": "dense"})
    for fail in (True, False):
        copy = Copy(fail)
        hosting = AdapterHosting(spec, lambda: served, ThreadPoolExecutor(1))  # type: ignore[arg-type,return-value]
        hosting.host(object(), tier)  # type: ignore[arg-type]
        hosting.torch_factory = lambda copy=copy: copy  # type: ignore[misc]
        hosting.room = fleet.room_beside
        task = asyncio.create_task(hosting.prepare())
        await asyncio.to_thread(copy.started.wait, 10)
        assert tier.copies == {"m": 40 * MIB}  # charged while it loads ...
        assert fleet.state("o") is State.COLD and fleet.state("m") is State.RESIDENT
        assert fleet.used() == 80 * MIB  # ... beside its base, the other evicted for it
        copy.go.set()
        if fail:
            with pytest.raises(RuntimeError, match="torch copy failed"):
                await task
            assert tier.copies == {} and fleet.used() == 40 * MIB
        else:
            await task
            assert tier.copies == {"m": 45 * MIB} and fleet.used() == 85 * MIB
