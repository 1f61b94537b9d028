"""Traffic anywhere on the host steps a background tune aside: each process holds a
shared lock while it has work, the tuning one looks whether anyone does."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from fleetserve.tune.hosttraffic import HostTraffic, path_for

from .test_background import MODEL, Host, cancelled, child_pid, settings, stopped, tuner, until

BUSY = "import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n" \
    "fcntl.flock(fd, fcntl.LOCK_SH)\nprint('busy', flush=True)\nsys.stdin.read()\n"  # fmt: skip


def test_a_neighbour_is_seen_while_it_has_work_and_not_after(tmp_path: Path) -> None:
    path = tmp_path / "t.busy"
    tuning, a, b = HostTraffic(path), HostTraffic(path), HostTraffic(path)
    assert not tuning.others()  # a quiet host
    a.publish(True)
    b.publish(True)  # shared: both hold it at once
    assert a.busy and b.busy and tuning.others()
    a.publish(False)
    assert tuning.others()  # b still has work
    b.publish(False)
    b.publish(False)  # idempotent
    assert not tuning.others() and not a.busy
    a.publish(True)
    a.close()
    assert not tuning.others()
    tuning.close()


def test_a_killed_neighbour_does_not_leave_the_host_busy(tmp_path: Path) -> None:
    path = tmp_path / "t.busy"
    tuning = HostTraffic(path)
    proc = subprocess.Popen(
        [sys.executable, "-c", BUSY, str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "busy\n"
        assert tuning.others()
        proc.kill()
        proc.wait()
        assert not tuning.others()  # the kernel let go of its lock
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
        tuning.close()


def test_a_file_that_cannot_be_opened_is_no_signal(tmp_path: Path) -> None:
    t = HostTraffic(tmp_path / "missing-dir" / "t.busy")
    t.publish(True)
    assert not t.busy and not t.others()


async def test_a_neighbours_traffic_pauses_the_tune_and_its_end_continues_it(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "tune.lock"
    s = settings(tmp_path, tune_lock=str(lock))
    host = Host(s)  # this process has no traffic of its own
    bt = tuner(s, host)
    neighbour = HostTraffic(path_for(lock))
    task = asyncio.create_task(bt.run())
    try:
        await until(lambda: child_pid(bt) is not None)
        pid = child_pid(bt)
        assert pid is not None and not stopped(pid)
        neighbour.publish(True)  # a request came to a co-located worker
        await until(lambda: stopped(pid), timeout=0.5)
        assert bt.states[MODEL].state == "paused"
        neighbour.publish(False)
        await until(lambda: not stopped(pid), timeout=2.0)
        assert bt.states[MODEL].state == "tuning"
    finally:
        neighbour.close()
        await cancelled(task)


async def test_this_process_publishes_its_own_traffic_for_the_others(tmp_path: Path) -> None:
    lock = tmp_path / "tune.lock"
    s = settings(tmp_path, tune_lock=str(lock))
    host = Host(s)
    bt = tuner(s, host)
    look = HostTraffic(path_for(lock))
    host.resident = False  # nothing loaded: nothing to tune, but its load is published
    task = asyncio.create_task(bt.run())
    try:
        await until(lambda: bt.states[MODEL].state == "rules", timeout=10)  # it runs
        assert not look.others()
        host.is_busy = True
        await until(look.others, timeout=0.5)
        host.is_busy = False
        await until(lambda: not look.others(), timeout=0.5)
    finally:
        look.close()
        await cancelled(task)
    assert not look.others()
