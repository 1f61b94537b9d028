"""The default memory budget, split between the processes of one host that run on
it: real processes register, a killed one stops counting, and a fleet's budget
follows the count at its next load."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from fleetserve.assembly import build_fleet
from fleetserve.fleet.host_share import HostShare, live
from fleetserve.fleet.manager import Fleet, State
from fleetserve.fleet.memory import default_budget
from fleetserve.fleet.policy import GDSF
from fleetserve.metrics import Metrics
from fleetserve.settings import Settings

from ..waiting import wait_for
from .test_manager import MIB, Clock, FakeModel, use

JOIN = "import sys; from pathlib import Path; from fleetserve.fleet.host_share import HostShare; "
JOIN += "HostShare(0, Path(sys.argv[1])); print('joined', flush=True); sys.stdin.read()"


def neighbour(directory: Path) -> subprocess.Popen[str]:
    """Another process on this host that registers and lives until its stdin closes."""
    p = subprocess.Popen(
        [sys.executable, "-c", JOIN, str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "joined"
    return p


def end(p: subprocess.Popen[str], sig: int = signal.SIGKILL) -> None:
    if p.poll() is None:
        os.kill(p.pid, sig)
    p.wait()
    for pipe in (p.stdin, p.stdout):
        if pipe is not None:
            pipe.close()


def test_processes_count_while_they_live_and_a_killed_one_stops_at_once(tmp_path: Path) -> None:
    share = HostShare(100, tmp_path)
    assert share.parts() == 1 and share.budget() == 100
    a, b = neighbour(tmp_path), neighbour(tmp_path)
    try:
        assert share.parts() == 3 and share.budget() == 33
        end(a)
        assert share.parts() == 2  # its lock went with it
        assert not list(tmp_path.glob(f"{a.pid}-*.proc"))  # and its file with the count
        assert b.stdin is not None
        b.stdin.close()  # it ends as it would: its own exit drops the lock
        b.wait(10)
        assert share.parts() == 1
    finally:
        end(a)
        end(b)


def test_a_process_registers_once_however_many_fleets_it_builds(tmp_path: Path) -> None:
    HostShare(100, tmp_path)
    (first,) = tmp_path.glob("*.proc")
    HostShare(100, tmp_path)
    assert live(tmp_path) == 1 and list(tmp_path.glob("*.proc")) == [first]  # names are unique


def test_a_directory_it_cannot_use_leaves_the_whole_budget(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    share = HostShare(100, blocked / "share")
    assert share.parts() == 1 and share.budget() == 100


def test_a_fleets_budget_follows_the_share_at_its_next_load(tmp_path: Path) -> None:
    share = HostShare(100 * MIB, tmp_path)
    c = Clock()
    models = [FakeModel(c, m, 40) for m in ("a", "b", "c")]
    metrics = Metrics()
    f = Fleet(100 * MIB, GDSF(), clock=c, metrics=metrics, room_wait=0.0, budget_now=share.budget)
    for m in models:
        f.add(m)
    asyncio.run(use(f, "a"))
    asyncio.run(use(f, "b"))
    assert f.budget == 100 * MIB and f.used() == 80 * MIB
    other = neighbour(tmp_path)
    try:
        asyncio.run(use(f, "c"))  # 50 MiB each now: only one 40 MiB model fits
        assert f.budget == 50 * MIB and f.used() <= f.budget
        assert [f.state(m) for m in "abc"] == [State.COLD, State.COLD, State.RESIDENT]
        assert metrics.memory_budget._value.get() == 50 * MIB
    finally:
        end(other)
    wait_for(lambda: share.parts() == 1, 10)
    asyncio.run(use(f, "a"))  # the neighbour is gone: the whole budget again
    assert f.budget == 100 * MIB and f.state("c") is State.RESIDENT


def test_a_worker_beside_another_on_the_default_budget_takes_half(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What a user saw: two workers started apart each said "memory budget 16873.5
    MiB" on a 23.5 GiB host. A set --memory-budget is not split."""
    caplog.set_level(logging.INFO, "fleetserve.fleet")
    full, _ = default_budget("cpu")
    s = Settings.load(overrides={"device": "cpu", "memory_share_dir": str(tmp_path)})
    other = neighbour(tmp_path)
    try:
        fleet = build_fleet(s, {}, Metrics(), Console(stderr=True))
        assert fleet.budget == full // 2
        assert "split 2 ways with the other fleetserve processes on this host" in caplog.text
        apart = tmp_path / "set"  # a set budget registers nowhere and is not split
        given = dataclasses.replace(s, memory_budget="1GiB", memory_share_dir=str(apart))
        assert build_fleet(given, {}, Metrics(), Console(stderr=True)).budget == 1 << 30
        assert not apart.exists()
    finally:
        end(other)
