"""The fleet's charge checked against what the process holds, after every load and
eviction (``fleet/drift.py``): a drift over 10 % is logged with the model and the
figures, and counted."""

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
    """A fake model whose load makes the process hold ``real`` MiB (its charge: ``mib``)."""

    def __init__(self, clock: Clock, proc: Process, model_id: str, mib: int, real: int) -> None:
        super().__init__(clock, model_id, mib)
        self.proc, self.real = proc, real * MIB

    async def load(self):  # type: ignore[no-untyped-def]
        got = await super().load()
        self.proc.models[self.model_id] = self.real
        return got

    def unload(self) -> None:
        super().unload()
        self.proc.models.pop(self.model_id, None)


def counted(m: Metrics, event: str) -> float:
    return m.registry.get_sample_value("fleetserve_memory_drift_total", {"event": event}) or 0.0


def test_the_base_is_set_at_the_first_check_and_again_after_imports() -> None:
    proc, m = Process(), Metrics()
    d = Drift(proc, m, modules=lambda: proc.modules)
    proc.models["a"] = 100 * MIB
    proc.base += 250 * MIB  # the first load imported its runtime
    assert d.check("load", "a", 90 * MIB, 90 * MIB) is None and d.base == 560 * MIB
    proc.models["b"] = 95 * MIB
    assert d.check("load", "b", 180 * MIB, 90 * MIB) is None  # 185 held, within 10 %
    assert m.registry.get_sample_value("fleetserve_memory_unaccounted_bytes") == 5 * MIB
    proc.modules += 40  # another runtime's first load: its imports are the process's
    proc.base += 80 * MIB
    proc.models["c"] = 95 * MIB
    assert d.check("load", "c", 270 * MIB, 90 * MIB) is None and counted(m, "load") == 0


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
    assert "load of b" in rec.message and "holds 230.0 MiB" in rec.message
    assert "charges 180.0 MiB" in rec.message and "+50.0 MiB" in rec.message
    assert counted(m, "load") == 1
    del proc.models["a"]
    proc.models["b"] = 140 * MIB
    proc.base += 60 * MIB  # the eviction gave 30 of a's 90 MiB back
    # b's 50 MiB over its charge, and the 60 the eviction did not give back
    assert d.check("evict", "a", 90 * MIB, 90 * MIB) == 110 * MIB
    assert counted(m, "evict") == 1


async def test_the_fleet_checks_after_each_load_and_eviction(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c, proc, m = Clock(), Process(), Metrics()
    a = Holding(c, proc, "a", 40, real=40)
    b = Holding(c, proc, "b", 40, real=40)
    big = Holding(c, proc, "big", 40, real=70)  # its engine holds more than it counts
    f = Fleet(100 * MIB, LRU(), clock=c, metrics=m, room_wait=0.0, actual=proc)
    for x in (a, b, big):
        f.add(x)
    with caplog.at_level(logging.WARNING, "fleetserve.fleet"):
        await use(f, "a")  # the base
        await use(f, "b")
        assert not caplog.records
        await use(f, "big")  # a leaves (evict: in line), then big loads 30 MiB over
    assert [r.message.split(":")[0] for r in caplog.records] == [
        "memory drift after the load of big"
    ]
    assert counted(m, "load") == 1 and counted(m, "evict") == 0
    assert f.drift is not None and f.drift.last == 30 * MIB


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
