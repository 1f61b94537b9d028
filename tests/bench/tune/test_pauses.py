"""The pause ledger: a stopped child makes no progress and takes no CPU, its pauses
leave its budget's clock, and a measurement window a pause cut into is measured again."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import pytest

from fleetserve.bench.tune.candidates import Candidate
from fleetserve.bench.tune.harness import Request, Stack, saturate
from fleetserve.bench.tune.pauses import (
    NONE,
    SPOILED_TRIES,
    Ledger,
    Pauses,
    Spoiled,
    reader,
    unspoiled,
)
from fleetserve.bench.tune.search import Clock, Options, Search
from fleetserve.catalog import ModelSpec
from fleetserve.catalog.hardware import Hardware

COUNTER = "import sys, time\nn = 0\nwhile True:\n    n += 1\n    if n % 20000 == 0:\n" \
    "        sys.stdout.write(f'{n}\\n'); sys.stdout.flush()\n"  # fmt: skip


def test_the_ledger_counts_pauses_and_their_seconds(tmp_path: Path) -> None:
    now = [100.0]
    ledger = Ledger(tmp_path / "l", clock=lambda: now[0])
    read = reader(ledger.path)
    assert read() == Pauses(0, 0.0)
    ledger.pause()
    ledger.pause()  # already paused: one pause
    assert read() == Pauses(1, 0.0) and ledger.paused
    now[0] = 102.5
    ledger.resume()
    ledger.resume()
    assert read() == Pauses(1, 2.5) and not ledger.paused


def test_no_ledger_or_an_unreadable_one_reads_as_no_pauses(tmp_path: Path) -> None:
    assert reader(None)() == NONE
    assert reader(tmp_path / "missing")() == NONE
    (tmp_path / "bad").write_text("not numbers")
    assert reader(tmp_path / "bad")() == NONE


def test_a_paused_child_makes_no_progress_until_resumed(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", COUNTER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # it runs
        ledger = Ledger(tmp_path / "l")
        ledger.attach(proc.pid)
        ledger.pause()
        cpu0 = _cpu_ticks(proc.pid)
        time.sleep(0.3)  # (a stopped process cannot signal that it stays stopped)
        assert _cpu_ticks(proc.pid) - cpu0 <= 1  # no CPU while stopped
        ledger.resume()
        assert proc.stdout.readline()  # it goes on
    finally:
        proc.kill()
        proc.communicate()  # reaps it and closes its pipe


def test_a_new_child_attached_during_a_pause_starts_stopped(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l")
    ledger.pause()
    proc = subprocess.Popen([sys.executable, "-c", COUNTER], stdout=subprocess.PIPE, text=True)
    try:
        ledger.attach(proc.pid)
        assert _stopped(proc.pid, True)
        ledger.resume()
        assert _stopped(proc.pid, False)
    finally:
        proc.kill()
        proc.communicate()  # reaps it and closes its pipe


def test_the_clock_leaves_out_the_pauses(tmp_path: Path) -> None:
    now = [0.0]
    ledger = Ledger(tmp_path / "l", clock=lambda: now[0])
    clock = Clock(60.0, pauses=reader(ledger.path))
    ledger.pause()
    now[0] = 1000.0  # a long pause, by the ledger's clock
    ledger.resume()
    assert clock.elapsed < 5.0 and clock.fits(50.0)


class Req:
    items = 4


class PausedStack:
    """A stack whose requests take 50 ms each; the ``cut``-th is held 0.5 s by a pause
    of the server (as a SIGSTOP would: time passes, the ledger counts it)."""

    def __init__(self, ledger: Ledger, cut: int) -> None:
        self.ledger, self.cut, self.sent = ledger, cut, 0

    async def send(self, request: object) -> int:
        self.sent += 1
        await asyncio.sleep(0.05)
        if self.sent == self.cut:
            self.ledger.pause()
            await asyncio.sleep(0.5)
            self.ledger.resume()
        return 100


async def test_a_window_a_pause_cuts_into_leaves_the_pause_out_of_its_figures(
    tmp_path: Path,
) -> None:
    """Light traffic cuts into windows as often as it likes: the window runs its own
    time, its throughput is over the time it ran, and the cut request leaves the
    latencies; nothing is measured again."""
    ledger = Ledger(tmp_path / "l")
    read, reqs = reader(ledger.path), cast(list[Request], [Req()] * 4)
    clean = await saturate(cast(Stack, PausedStack(ledger, 0)), reqs, 1, 0.6, pauses=read)
    cut = await saturate(cast(Stack, PausedStack(ledger, 6)), reqs, 1, 0.6, pauses=read)
    assert clean.paused_s == 0.0 and cut.paused_s == pytest.approx(0.5, abs=0.05)
    assert cut.seconds >= 0.6 + 0.5  # it ran 0.6 s of its own
    assert cut.tokens_per_s == pytest.approx(clean.tokens_per_s, rel=0.25)  # ~2,000
    assert cut.p99_ms < 200 and clean.p99_ms < 200  # the held request is not in them
    assert cut.requests == pytest.approx(clean.requests, abs=2)


async def test_a_search_under_traffic_measures_each_window_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(tmp_path / "l")
    spec = ModelSpec.from_dict({"id": "o/m", "sources": ["/w"], "family": "dense"})
    hw = Hardware("cpu", "x86_64", "Test CPU", 2, 8 * 2**30, frozenset({"avx2"}))
    s = Search(spec, Path("/w"), hw, "cpu-avx2", Options(pause_file=ledger.path, measure_s=0.6))
    s.requests = cast(list[Request], [Req()] * 4)
    p = s._add(Candidate("torch", "fp32", 2, 1, 2048, 64))
    await s._measure(cast(Stack, PausedStack(ledger, 3)), p)
    assert len(p.samples) == 1 and p.samples[0] > 1000  # the pause is not in it
    assert s.clock.forgiven == 0.0 and s.clock.elapsed < 1.2 + s.warmup_s * 2 + 0.5


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _stopped(pid: int, want: bool) -> bool:
    """Whether ``pid`` reaches the stopped state ``want`` within 2 s (signals land
    asynchronously)."""
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        st = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0]
        if (st in ("T", "t")) == want:
            return True
        time.sleep(0.005)
    return False


async def test_unspoiled_gives_up_after_every_window_was_spoiled(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l")
    clock = Clock(60.0, pauses=reader(ledger.path))
    tries = []

    async def always_cut() -> int:
        tries.append(1)
        ledger.pause()
        ledger.resume()
        return 1

    with pytest.raises(Spoiled):
        await unspoiled(reader(ledger.path), clock, always_cut)
    assert len(tries) == SPOILED_TRIES


async def test_unspoiled_gives_up_once_spoiled_windows_ran_too_long(tmp_path: Path) -> None:
    """A window longer than every idle spell is cut each time: the tries stop at a
    wall-time cap, not only at a count, and the message says why. (Each window moves
    the clock by a second rather than sleeping: under load a real 50 ms sleep ran past
    the whole cap, and only one window was tried.)"""
    ledger = Ledger(tmp_path / "l")
    clock = Clock(60.0, pauses=reader(ledger.path))
    tries = []

    async def long_window() -> int:
        tries.append(1)
        clock.t0 -= 1.0  # a window of one second
        ledger.pause()
        ledger.resume()
        return 1

    with pytest.raises(Spoiled, match="cut every window"):
        await unspoiled(reader(ledger.path), clock, long_window, give_up_s=2.5)
    assert len(tries) == 3 < SPOILED_TRIES
    assert clock.forgiven >= 2.5 and clock.elapsed < 0.5


async def test_a_knee_the_server_keeps_spoiling_is_no_knee_not_a_failed_tune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetserve.bench.tune import steps

    ledger = Ledger(tmp_path / "l")
    spec = ModelSpec.from_dict({"id": "o/m", "sources": ["/w"], "family": "dense"})
    hw = Hardware("cpu", "x86_64", "Test CPU", 2, 8 * 2**30, frozenset({"avx2"}))
    s = Search(spec, Path("/w"), hw, "cpu-avx2", Options(pause_file=ledger.path, knee_s=0.01))

    class Busy:  # every request it serves, traffic arrives at the server
        async def send(self, req: object) -> int:
            ledger.pause()
            ledger.resume()
            return 1

    p = s._add(Candidate("torch", "fp32", 2, 1, 2048, 64))
    s.requests = []
    monkeypatch.setattr(steps, "requests", lambda *a, **k: [object()])
    doc = await steps.knee(s, Busy(), p, rates_n=4)  # type: ignore[arg-type]
    assert doc["knee_rps"] is None and "busy" in doc["reason"] and p.knee is doc
