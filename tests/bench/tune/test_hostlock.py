"""One background tune per host: the lock, and co-located tuners taking turns."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from pathlib import Path

from fleetserve import __version__
from fleetserve.bench.tune.hostlock import HostLock
from fleetserve.bench.tune.stale import model_digest
from fleetserve.catalog.profiles import write_profile_file

from ...waiting import async_wait_for
from .test_background import MODEL, Host, cancelled, child_pid, settings, tuner

HOLD = "import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n" \
    "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.read()\n"  # fmt: skip


def test_one_holder_at_a_time_and_a_killed_holder_frees_it(tmp_path: Path) -> None:
    path = tmp_path / "tune.lock"
    a, b = HostLock(path), HostLock(path)
    assert a.try_acquire() and a.held
    assert not b.try_acquire() and not b.held
    a.release()
    assert b.try_acquire()
    b.release()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        assert not a.try_acquire()
        proc.kill()
        proc.wait()
        assert a.try_acquire()  # the kernel let go of a killed holder's lock
    finally:
        a.release()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_a_lock_file_that_cannot_be_opened_does_not_stop_tuning(tmp_path: Path) -> None:
    assert HostLock(tmp_path / "missing-dir" / "tune.lock").try_acquire()


async def test_a_tuner_waits_while_another_process_on_the_host_tunes(tmp_path: Path) -> None:
    lock = tmp_path / "tune.lock"
    s = settings(tmp_path, tune_lock=str(lock))
    host = Host(s)
    bt = tuner(s, host)
    other = HostLock(lock)
    assert other.try_acquire()
    (lock).write_text("4242\n")  # (what the holder writes: its pid)
    task = asyncio.create_task(bt.run())
    try:
        await async_wait_for(lambda: "waits its turn" in bt.states[MODEL].reason, timeout=30)
        assert "4242" in bt.states[MODEL].reason
        assert child_pid(bt) is None and bt.states[MODEL].state == "waiting"
        other.release()
        await async_wait_for(lambda: child_pid(bt) is not None, timeout=30)  # its turn
        assert not HostLock(lock).try_acquire()  # held while it tunes
    finally:
        other.release()
        await cancelled(task)
    assert HostLock(lock).try_acquire()  # and let go when it stops


async def test_a_process_that_waited_its_turn_adopts_what_its_neighbour_tuned(
    tmp_path: Path,
) -> None:
    """Two processes of one host (the devices of one worker): while one tunes, the
    other waits for the lock; its turn come, it finds the fresh profile its neighbour
    wrote and runs it, with no tune of its own."""
    lock = tmp_path / "tune.lock"
    s = settings(tmp_path, tune_lock=str(lock))
    host = Host(s)
    bt = tuner(s, host)
    neighbour = HostLock(lock)
    assert neighbour.try_acquire()
    task = asyncio.create_task(bt.run())
    children: set[int] = set()

    def adopted() -> bool:
        if (pid := child_pid(bt)) is not None:
            children.add(pid)
        return bt.states[MODEL].state in ("tuned", "failed")

    try:
        await async_wait_for(lambda: "waits its turn" in bt.states[MODEL].reason, timeout=30)
        rule = host.choice(MODEL).profile
        spec = host.catalog.get(MODEL)
        provenance = {  # what the neighbour's quick search writes
            "written_by": "fleetserve tune", "fleetserve": __version__, "quick": True,
            "model_digest": model_digest(spec, host.weights(MODEL)),
            "figures": {"tokens_per_s": 1234.0},
        }  # fmt: skip
        tuned = dataclasses.replace(rule, max_batch_size=rule.max_batch_size // 2)
        write_profile_file(Path(s.profile_dir), MODEL, tuned, provenance)
        neighbour.release()
        await async_wait_for(adopted, timeout=30)
    finally:
        neighbour.release()
        await cancelled(task)
    st = bt.states[MODEL]
    assert st.state == "tuned" and st.reason.startswith("tuned by another process"), st
    assert children == set()  # it never ran a tune of its own
    (swapped,) = host.swapped
    assert swapped.how == "tuned" and swapped.profile == tuned and st.swaps == 1
    assert st.after_tokens_s == 1234.0
