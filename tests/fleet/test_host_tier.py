"""Sleep before evict, on fake models: under pressure a model that can sleep lets its
weights go from the memory budget into the host tier's, wakes at its next use without
a load, and leaves for good only when the host tier is full (``fleet/host_tier.py``)."""

from __future__ import annotations

from fleetserve.fleet.manager import State
from fleetserve.fleet.policy import GDSF, LRU, Resident

from ..hangup import sample
from .test_manager import MIB, Clock, FakeModel, fleet, use


async def test_under_pressure_a_model_sleeps_and_its_next_use_wakes_it() -> None:
    c = Clock()
    a, b = FakeModel(c, "a", 60, load_s=2.0, sleeps=True), FakeModel(c, "b", 60, sleeps=True)
    f = fleet(c, 100, a, b, host_budget=200 * MIB)
    await use(f, "a")
    await use(f, "b")  # a and b do not fit together: a sleeps
    assert f.state("a") is State.SLEEPING and f.state("b") is State.RESIDENT
    assert a.asleep and a.loads == 1
    assert f.used() == 60 * MIB  # a's weights left the memory budget ...
    assert f.room.host.used == 60 * MIB  # ... for the host tier's
    assert f.info("a")["state"] == "sleeping" and f.info("a")["bytes"] == 60 * MIB
    t0 = c.now
    await use(f, "a")  # woken: no load
    assert a.wakes == 1 and a.loads == 2 and c.now - t0 < 0.1
    assert f.state("a") is State.RESIDENT and f.state("b") is State.SLEEPING
    assert f.used() == 60 * MIB and f.room.host.used == 60 * MIB
    assert f.metrics is not None
    text = f.metrics.render().decode()
    assert sample(text, "fleetserve_model_loads_total", model="a", outcome="woken") == 1
    assert sample(text, "fleetserve_model_loads_total", model="a", outcome="ok") == 1
    assert sample(text, "fleetserve_model_sleeps_total", model="a") == 1
    assert sample(text, "fleetserve_sleeping_bytes") == 60 * MIB
    assert sample(text, "fleetserve_host_tier_budget_bytes") == 200 * MIB


async def test_a_full_host_tier_lets_its_cheapest_sleeper_go_for_good() -> None:
    """Sleepers are priced by their next full load: with room for two, the one that
    loads fastest leaves when a third falls asleep."""
    c = Clock()
    slow = FakeModel(c, "slow", 50, load_s=5.0, sleeps=True)
    fast = FakeModel(c, "fast", 50, load_s=0.5, sleeps=True)
    mid = FakeModel(c, "mid", 50, load_s=2.0, sleeps=True)
    last = FakeModel(c, "last", 50, load_s=1.0, sleeps=True)
    f = fleet(c, 60, slow, fast, mid, last, host_budget=100 * MIB)
    for m in ("slow", "fast", "mid", "last"):  # one at a time fits: each sends one to sleep
        await use(f, m)
    assert f.state("last") is State.RESIDENT
    assert f.state("slow") is State.SLEEPING and f.state("mid") is State.SLEEPING
    assert f.state("fast") is State.COLD and not fast.asleep and not fast.loaded
    assert f.room.host.used == 100 * MIB
    await use(f, "fast")  # a load, not a wake
    assert fast.wakes == 0 and fast.loads == 2


async def test_a_model_larger_than_the_host_tier_is_evicted_and_without_one_none_sleeps() -> None:
    c = Clock()
    big, small = FakeModel(c, "big", 80, sleeps=True), FakeModel(c, "small", 80, sleeps=True)
    f = fleet(c, 100, big, small, host_budget=50 * MIB)
    await use(f, "big")
    await use(f, "small")
    assert f.state("big") is State.COLD and not big.asleep and f.room.host.used == 0
    c2 = Clock()
    a, b = FakeModel(c2, "a", 80, sleeps=True), FakeModel(c2, "b", 80, sleeps=True)
    off = fleet(c2, 100, a, b)  # host_budget 0: the default of a bare Fleet
    await use(off, "a")
    await use(off, "b")
    assert off.state("a") is State.COLD and not a.asleep


async def test_a_model_that_cannot_sleep_is_evicted_as_before() -> None:
    c = Clock()
    a, b = FakeModel(c, "a", 60), FakeModel(c, "b", 60, sleeps=True)
    f = fleet(c, 100, a, b, host_budget=200 * MIB, policy=LRU())
    await use(f, "a")
    await use(f, "b")
    assert f.state("a") is State.COLD and f.room.host.used == 0


async def test_a_sleeping_model_removed_or_swapped_leaves_for_good() -> None:
    c = Clock()
    a, b, d = (FakeModel(c, m, 60, sleeps=True) for m in "abd")
    f = fleet(c, 100, a, b, d, host_budget=200 * MIB, policy=LRU())
    await use(f, "a")
    await use(f, "b")
    await use(f, "d")
    assert f.state("a") is State.SLEEPING and f.state("b") is State.SLEEPING
    f.remove("a")
    assert not a.asleep and "a" not in f.room.host and f.room.host.used == 60 * MIB
    async with f.swaps.holding("b") as state:  # a new profile: loaded afresh, not woken
        assert state is State.COLD
    assert not b.asleep and f.room.host.used == 0


class Prices(GDSF):
    """GDSF, noting the price (``reload_s``) of each use it is told of."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, float]] = []

    def used(self, r: Resident, now: float) -> None:
        self.seen.append((r.model, round(r.reload_s, 4)))
        super().used(r, now)


async def test_a_model_that_sleeps_is_priced_by_its_wake_not_its_load() -> None:
    """What evicting a model costs its next use is a wake where it would sleep, a load
    where it cannot; before its own first wake, another model's wake per byte prices it.
    Before: priced by its last load (a torch model's first took 0.4 to 0.7 s on a
    2-core cpu-avx2, its wakes 3 to 20 ms), a sleeper outranked OpenVINO models that
    cannot sleep and reload in 0.2 to 0.4 s, and GDSF evicted those first."""
    c = Clock()
    a, b, d = (FakeModel(c, m, 40, load_s=0.6, sleeps=True, wake_s=0.01) for m in "abd")
    o = FakeModel(c, "o", 40, load_s=0.3)
    prices = Prices()
    f = fleet(c, 85, a, b, d, o, policy=prices, host_budget=200 * MIB)
    await use(f, "a")  # no wake seen yet: its load prices it
    await use(f, "b")
    await use(f, "o")  # a sleeps: into the host tier, priced by its load
    assert f.state("a") is State.SLEEPING
    await use(f, "a")  # woken in 10 ms: that is its price now; b (0.6) sleeps, not o
    assert f.state("b") is State.SLEEPING and f.state("o") is State.RESIDENT
    await use(f, "d")  # never woken: priced by a's wake, per byte; a sleeps, not o
    assert f.state("a") is State.SLEEPING and f.state("o") is State.RESIDENT
    assert prices.seen == [
        ("a", 0.6), ("b", 0.6), ("a", 0.6), ("o", 0.3),  # a into the host tier at 0.6
        ("b", 0.6), ("a", 0.01),  # b into the host tier; a woken
        ("a", 0.6), ("d", 0.01),  # a into the host tier; d loaded
    ]  # fmt: skip
    assert o.loads == 1  # the model that cannot sleep was never evicted
