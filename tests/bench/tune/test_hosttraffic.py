"""Traffic anywhere on the host steps a background tune aside: each process holds a
shared lock while it has work, the tuning one looks whether anyone does."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from fleetserve.bench.tune.hosttraffic import HostTraffic, path_for, publish_forever

from ...conftest import TINY, ServerThread, tiny_settings
from ...waiting import async_wait_for
from .test_background import MODEL, Host, cancelled, child_pid, settings, stopped, tuner

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
        await async_wait_for(lambda: child_pid(bt) is not None, 120)
        pid = child_pid(bt)
        assert pid is not None and not stopped(pid)
        neighbour.publish(True)  # a request came to a co-located worker
        await async_wait_for(lambda: stopped(pid), timeout=0.5)
        assert bt.states[MODEL].state == "paused"
        neighbour.publish(False)
        await async_wait_for(lambda: not stopped(pid), timeout=2.0)
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
        await async_wait_for(lambda: bt.states[MODEL].state == "rules", timeout=10)  # it runs
        assert not look.others()
        host.is_busy = True
        await async_wait_for(look.others, timeout=0.5)
        host.is_busy = False
        await async_wait_for(lambda: not look.others(), timeout=0.5)
    finally:
        look.close()
        await cancelled(task)
    assert not look.others()


async def test_a_process_that_does_not_tune_publishes_its_load(tmp_path: Path) -> None:
    lock = tmp_path / "tune.lock"
    look = HostTraffic(path_for(lock))
    busy = False
    task = asyncio.create_task(publish_forever(lambda: busy, str(lock)))
    try:
        await asyncio.sleep(0.1)  # a window in which an idle process's load would show
        assert not look.others()
        busy = True
        await async_wait_for(look.others, timeout=0.5)
        busy = False
        await async_wait_for(lambda: not look.others(), timeout=0.5)
        busy = True
        await async_wait_for(look.others, timeout=0.5)
    finally:
        await cancelled(task)
    assert not look.others()  # cancelled: its lock is let go


def test_a_server_with_tune_off_steps_a_neighbours_tune_aside(
    tiny_catalog: Path, tmp_path: Path
) -> None:
    lock = tmp_path / "tune.lock"
    srv = ServerThread(tiny_settings(tiny_catalog, tune_lock=str(lock))).start()
    look = HostTraffic(path_for(lock))
    done = threading.Event()

    def load() -> None:  # requests back to back, until the look has seen them
        with httpx.Client(timeout=30) as c:
            while not done.is_set():
                body = {"model": TINY, "input": [f"text {i} " * 8 for i in range(64)]}
                c.post(f"{srv.url}/v1/embeddings", json=body).raise_for_status()

    clients = [threading.Thread(target=load) for _ in range(2)]
    try:
        assert "host-traffic" in srv.call(lambda: list(srv.server.tasks))  # type: ignore[union-attr]
        assert not look.others()  # idle: nothing published
        for t in clients:
            t.start()
        seen = threading.Event()
        for _ in range(2000):  # (a look every 5 ms, for up to 10 s)
            if look.others():
                seen.set()
                break
            time.sleep(0.005)
        assert seen.is_set()
    finally:
        done.set()
        for t in clients:
            t.join(30)
        look.close()
        srv.stop()
