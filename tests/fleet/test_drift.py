"""The fleet's charge checked against what the process holds, at every load
(``fleet/drift.py``): a drift over 10 % is logged with the model and the figures, and
counted."""

from __future__ import annotations

import asyncio
import logging

import pytest

from fleetserve.fleet.drift import Drift
from fleetserve.fleet.manager import Fleet
from fleetserve.fleet.policy import LRU
from fleetserve.metrics import Metrics

from .test_manager import Clock, FakeModel, use

MIB = 1 << 20


class Process:
    """A made-up resident set: a base, plus what each model really holds."""

    def __init__(self) -> None:
        self.base = 300 * MIB
        self.models: dict[str, int] = {}
        self.modules = 1000

    def __call__(self) -> int:
        return self.base + sum(self.models.values())


class Holding(FakeModel):
    """A fake model whose load makes the process hold ``real`` MiB (its charge: ``mib``);
    ``kept``: what its eviction leaves behind."""

    def __init__(
        self, clock: Clock, proc: Process, model_id: str, mib: int, real: int, kept: int = 0
    ) -> None:
        super().__init__(clock, model_id, mib)
        self.proc, self.real, self.kept = proc, real * MIB, kept * MIB

    async def load(self):  # type: ignore[no-untyped-def]
        got = await super().load()
        self.proc.models[self.model_id] = self.real
        return got

    def unload(self) -> None:
        super().unload()
        self.proc.models.pop(self.model_id, None)
        self.proc.base += self.kept


def counted(m: Metrics) -> float:
    return m.registry.get_sample_value("fleetserve_memory_drift_total", {"event": "load"}) or 0.0


def test_each_interval_is_judged_once_and_imports_are_not() -> None:
    proc, m = Process(), Metrics()
    d = Drift(proc, m, modules=lambda: proc.modules)
    proc.models["a"] = 100 * MIB
    proc.base += 250 * MIB  # the first load imported its runtime: not judged
    assert d.check("load", "a", 90 * MIB, 90 * MIB) is None
    proc.models["b"] = 95 * MIB
    assert d.check("load", "b", 180 * MIB, 90 * MIB) is None  # grew 95 for 90: within 10 %
    assert m.registry.get_sample_value("fleetserve_memory_unaccounted_bytes") == 5 * MIB
    proc.modules += 40  # another runtime's first load: its imports are the process's
    proc.base += 80 * MIB
    proc.models["c"] = 95 * MIB
    assert d.check("load", "c", 270 * MIB, 90 * MIB) is None and counted(m) == 0


def test_a_drift_over_ten_percent_is_logged_with_the_model_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    proc, m = Process(), Metrics()
    d = Drift(proc, m, modules=lambda: proc.modules)
    proc.models["a"] = 90 * MIB
    d.check("load", "a", 90 * MIB, 90 * MIB)
    proc.models["b"] = 140 * MIB  # held; 90 charged
    with caplog.at_level(logging.WARNING, "fleetserve.fleet"):
        assert d.check("load", "b", 180 * MIB, 90 * MIB) == 50 * MIB
    (rec,) = caplog.records
    assert "load of b" in rec.message and "grew +140.0 MiB" in rec.message
    assert "charge +90.0 MiB" in rec.message and "+50.0 MiB unaccounted" in rec.message
    assert counted(m) == 1
    del proc.models["a"]  # evicted for c, but 60 of its 90 MiB stay in the process
    proc.base += 60 * MIB
    proc.models["c"] = 90 * MIB
    assert d.check("load", "c", 180 * MIB, 90 * MIB) == 60 * MIB  # reported once, here
    assert counted(m) == 2
    assert m.registry.get_sample_value("fleetserve_memory_unaccounted_bytes") == 110 * MIB
    proc.models["d"] = 90 * MIB
    assert d.check("load", "d", 270 * MIB, 90 * MIB) is None  # the next interval is clean


async def test_the_fleet_checks_at_each_load_with_the_evictions_made_for_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c, proc, m = Clock(), Process(), Metrics()
    a = Holding(c, proc, "a", 40, real=40, kept=30)  # its eviction gives back 10 of 40
    b = Holding(c, proc, "b", 40, real=40)
    big = Holding(c, proc, "big", 40, real=42)
    f = Fleet(100 * MIB, LRU(), clock=c, metrics=m, room_wait=0.0, actual=proc)
    for x in (a, b, big):
        f.add(x)
    with caplog.at_level(logging.WARNING, "fleetserve.fleet"):
        await use(f, "a")  # the first check
        await use(f, "b")  # grew 40 for 40
        assert not caplog.records
        await use(f, "big")  # a leaves for it, keeping 30: grew 32 for a charge of 0
    assert [r.message.split(":")[0] for r in caplog.records] == ["memory drift at the load of big"]
    assert counted(m) == 1 and f.drift is not None and f.drift.unaccounted == 32 * MIB


async def test_what_an_unload_left_behind_is_charged_and_the_next_load_evicts_for_it() -> None:
    """An unload that leaves 30 of its 40 MiB in the process (a runtime's pool): the
    drift's sum is charged, less the activation peak the budget keeps for a batch, and
    the next load evicts two models where the charges alone would need one."""
    c, proc = Clock(), Process()
    a = Holding(c, proc, "a", 40, real=40, kept=30)
    b = Holding(c, proc, "b", 40, real=40)
    big = Holding(c, proc, "big", 40, real=42)
    d = Holding(c, proc, "d", 30, real=30)
    f = Fleet(100 * MIB, LRU(), clock=c, metrics=Metrics(), room_wait=0.0, actual=proc)
    for x in (a, b, big, d):
        f.add(x)
    for m in ("a", "b", "big"):
        await use(f, m)  # a leaves for big and keeps 30: 32 MiB unaccounted
    assert f.room.retained == 32 * MIB
    assert f.room.used() == 80 * MIB + 32 * MIB
    await use(f, "d")  # on the charges b alone would go; with the 32 kept, 28 < 30: big too
    assert {m: f.state(m) for m in ("a", "b", "big", "d")} == {
        "a": "cold",
        "b": "cold",
        "big": "cold",
        "d": "resident",
    }
    assert f.room.retained == 30 * MIB  # the next check: 30 grew for 30 charged, less 82


async def test_the_peak_kept_for_a_batch_covers_what_the_allocator_kept_of_one() -> None:
    c, proc = Clock(), Process()
    a = Holding(c, proc, "a", 40, real=40)
    b = Holding(c, proc, "b", 20, real=40)  # a batch's 20 MiB stay with the allocator
    b.peak = 25 * MIB
    f = Fleet(200 * MIB, LRU(), clock=c, metrics=Metrics(), room_wait=0.0, actual=proc)
    f.add(a), f.add(b)
    await use(f, "a")
    await use(f, "b")
    assert f.drift is not None and f.drift.unaccounted == 20 * MIB
    assert f.room.retained == 0  # within the 25 MiB the budget keeps for b's batch


async def test_what_the_process_retained_never_stops_a_load_that_fits_its_charge() -> None:
    """The sum is an estimate: where evicting every model that may leave cannot make
    room for it too, the load goes ahead on the charges alone, as it would without."""
    c = Clock()
    p, a, b = FakeModel(c, "p", 60, pinned=True), FakeModel(c, "a", 30), FakeModel(c, "b", 40)
    f = Fleet(100 * MIB, LRU(), clock=c, metrics=Metrics(), room_wait=0.0)
    for x in (p, a, b):
        f.add(x)
    await use(f, "p")
    await use(f, "a")
    f.room.retain(32 * MIB)
    await use(f, "b")  # 100 - 60 pinned - 32 < 40 even with a gone: on the charges
    states = {m: f.state(m) for m in ("p", "a", "b")}
    assert states == {"p": "resident", "a": "cold", "b": "resident"}


async def test_no_check_while_another_load_holds_part_of_its_reservation() -> None:
    c, proc = Clock(), Process()
    a = Holding(c, proc, "a", 40, real=40)
    slow = Holding(c, proc, "slow", 40, real=40)
    f = Fleet(200 * MIB, LRU(), clock=c, metrics=Metrics(), room_wait=0.0, actual=proc)
    f.add(a), f.add(slow)
    seen: list[str] = []
    assert f.drift is not None
    check = f.drift.check
    f.drift.check = lambda event, model, *rest: seen.append(model) or check(event, model, *rest)  # type: ignore[method-assign]
    slow.gate = asyncio.Event()
    loading = asyncio.create_task(use(f, "slow"))
    try:
        while slow.loads == 0:
            await asyncio.sleep(0)
        await use(f, "a")  # slow is loading: not checked
    finally:
        slow.gate.set()
    await loading
    assert seen == ["slow"]


def test_a_difference_under_the_floor_is_noise_not_drift() -> None:
    """A 1.2 MiB model whose load the process grew 0.2 MiB for: 83 % off, and 1 MiB,
    the resident set's own noise (seen on a tiny ColBERT in a test process)."""
    proc, m = Process(), Metrics()
    d = Drift(proc, m, modules=lambda: proc.modules)
    d.check("load", "a", 0, 0)
    proc.models["tiny"] = MIB // 5
    assert d.check("load", "tiny", 6 * MIB // 5, 6 * MIB // 5) is None and counted(m) == 0


def test_a_kv_cache_held_or_let_go_is_within_the_slack() -> None:
    """Generation's KV cache is charged whole but allocated as sequences run: a check
    while it is held (or after it was let go) is judged only beyond it."""
    proc, m = Process(), Metrics()
    d = Drift(proc, m, modules=lambda: proc.modules)
    d.check("load", "g", 0, 0)
    proc.models["g"], proc.models["kv"] = 90 * MIB, 60 * MIB  # a generation is running
    assert d.check("load", "g", 90 * MIB, 90 * MIB, slack=64 * MIB) is None
    del proc.models["kv"]
    proc.models["a"] = 40 * MIB
    assert d.check("load", "a", 130 * MIB, 40 * MIB, slack=64 * MIB) is None  # let go
    proc.models["b"] = 140 * MIB  # 100 MiB over: 36 beyond the slack
    assert d.check("load", "b", 170 * MIB, 40 * MIB, slack=64 * MIB) == 36 * MIB
