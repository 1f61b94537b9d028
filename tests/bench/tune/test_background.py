"""``--tune auto``: the server is ready at once, tunes what runs on the rules in the
background (a real ``fleetserve tune`` child), steps aside for traffic, swaps in what
wins, does not tune again at the next start, and survives every fault of the tune.

The control tests drive :class:`BackgroundTuner` through its ``Host`` seam with a real
child tune of a tiny model; the end-to-end ones run the real server."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from fleetserve.assembly import build_catalog, build_profiles
from fleetserve.bench.tune.background import BackgroundTuner
from fleetserve.bench.tune.runs import RunStore
from fleetserve.catalog.hardware import detect
from fleetserve.catalog.profiles import Choice, read_profile_file
from fleetserve.catalog.weights import weights_path
from fleetserve.settings import Settings

from ... import forked
from ...conftest import ServerThread
from ...tinymodels import build_bert, write_spec
from ...waiting import async_wait_for

MODEL = "tiny/auto-bert"
BUDGET = 30.0  # a quick search of the tiny model, its knee included (45 s fitted only the
# reference once, in a clean-clone run on a 2-core cpu-avx2)
PAUSE_S = 8.0  # how long the control test's traffic holds the tune
# the control test's budget: with 30 s (and 2-s windows, before they followed the
# budget) it fitted only the fp32 reference twice, in clean-clone runs on a 2-core
# cpu-avx512bf16 with another tune beside it (`make test` runs two at a time), after
# its pause; 45 s did, and in the 0.8-s windows of 35 s it holds more candidates
PAUSED_BUDGET = 35.0


def settings(root: Path, **extra: object) -> Settings:
    cat = root / "catalog"
    if not cat.exists():  # no profile in the spec: the rules choose
        write_spec(cat, MODEL, build_bert(root / "model"), profiles={}, max_seq_len=32)
    return Settings.load(
        overrides={
            "port": 0,
            "catalog": str(cat),
            "models": MODEL,
            "device": "cpu",
            "profile_dir": str(root / "profiles"),
            "tune_dir": str(root / "runs"),
            "cache_dir": str(root / "cache"),
            "tune": "auto",
            "tune_budget": BUDGET,
            "tune_refine_budget": 0,
            "tune_idle": 0.1,
            **extra,
        }
    )


class Host:
    """The server's side of the seam, over a real catalog and the real profile files."""

    def __init__(self, s: Settings) -> None:
        self.s = s
        self.catalog = build_catalog(s)
        self.choices = {m.id: build_profiles(s).choose(m) for m in self.catalog}
        self.resident = True
        self.is_busy = False
        self.swapped: list[Choice] = []
        self.held, self.budget = 0, 64 << 30  # the models' bytes, the memory budget

    def choice(self, model: str) -> Choice:
        return self.choices[model]

    def reread(self, model: str) -> Choice:
        return build_profiles(self.s).choose(self.catalog.get(model))

    def loaded(self, model: str) -> bool:
        return self.resident

    def busy(self) -> bool:
        return self.is_busy

    def memory(self) -> tuple[int, int]:
        return self.held, self.budget

    def weights(self, model: str) -> Path:
        return weights_path(self.catalog.get(model), self.s)

    def keep(self, model: str, choice: Choice) -> None:
        self.choices[model] = choice

    async def swap(self, model: str, choice: Choice) -> tuple[bool, str]:
        self.swapped.append(choice)
        self.choices[model] = choice
        return True, ""


def tuner(s: Settings, host: Host) -> BackgroundTuner:
    return BackgroundTuner(s, host.catalog, host, detect().hardware_class, os.environ)


async def cancelled(task: asyncio.Task[None]) -> None:
    """Cancel the tuner's task and wait until it has stopped (its child with it)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def child_pid(bt: BackgroundTuner) -> int | None:
    return bt.child_pid


def stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0] in (
        "T",
        "t",
    )


def profile_files(root: Path) -> list[Path]:
    return [p for p in (root / "profiles").rglob("*") if p.is_file()]


async def test_a_tune_stops_for_traffic_and_swaps_in_its_winner(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", "fleetserve.bench.tune")
    s = settings(tmp_path, tune_budget=PAUSED_BUDGET)
    host = Host(s)
    assert host.choice(MODEL).how == "rule"
    bt = tuner(s, host)
    task = asyncio.create_task(bt.run())
    try:
        await async_wait_for(lambda: child_pid(bt) is not None, 120)
        pid = child_pid(bt)
        assert pid is not None
        await async_wait_for(lambda: bool(RunStore(tmp_path / "runs").list()), 120)  # it measures
        (live,) = RunStore(tmp_path / "runs").list()
        assert live["status"] == "running" and bt.states[MODEL].run == live["id"]  # shown live
        host.is_busy = True  # a request came
        await async_wait_for(lambda: stopped(pid), timeout=0.5)  # well within a poll or two
        assert bt.states[MODEL].state == "paused"
        await asyncio.sleep(PAUSE_S)  # traffic for a while: none of it in the budget
        host.is_busy = False
        await async_wait_for(lambda: not stopped(pid), timeout=2.0)
        await async_wait_for(lambda: bt.states[MODEL].state in ("tuned", "failed"), timeout=180)
    finally:
        await cancelled(task)
    st = bt.states[MODEL]
    assert st.state == "tuned", st
    assert st.run == live["id"] and st.after_tokens_s and st.noise is not None
    found = host.reread(MODEL)
    assert found.how == "tuned" and found.provenance["quick"] is True
    swaps = [r.getMessage() for r in caplog.records if r.getMessage().startswith("swapped")]
    tried = [  # what the run did with each candidate, for a failure's message
        (c["id"], c["status"], c.get("tokens_per_s"), c.get("reason"))
        for c in RunStore(tmp_path / "runs").get(st.run)["candidates"]
    ]
    assert st.before_tokens_s and st.after_tokens_s and st.noise is not None, (st.reason, tried)
    if st.swaps:  # the winner beat the rule's own point in the run (verdict.verdict)
        assert host.swapped == [found] and st.reason.startswith("swapped in")
        assert st.after_tokens_s >= st.before_tokens_s
        beyond = st.after_tokens_s > st.before_tokens_s * (1 + max(0.02, st.noise))
        tie = "a tie goes to the tuned one" in st.reason  # what runs is a rule's profile
        assert beyond or tie or "(a duel)" in st.reason, st.reason
        (line,) = swaps
        assert f"{st.after_tokens_s:.0f} tokens/s" in line
    else:
        assert host.swapped == [] and swaps == [] and st.reason.startswith("kept")
    run = RunStore(tmp_path / "runs").get(st.run)
    assert run["status"] == "succeeded"
    wall = _seconds(run["finished_at"]) - _seconds(run["started_at"])
    assert run["elapsed_s"] <= PAUSED_BUDGET + 2
    assert wall >= run["elapsed_s"] + PAUSE_S - 2  # the pause is not in its own time


async def test_a_killed_tune_leaves_the_model_as_it_was_and_nothing_half_written(
    tmp_path: Path,
) -> None:
    s = settings(tmp_path)
    host = Host(s)
    bt = tuner(s, host)
    task = asyncio.create_task(bt.run())
    try:
        await async_wait_for(lambda: child_pid(bt) is not None, 120)
        await async_wait_for(
            lambda: bool(RunStore(tmp_path / "runs").list()), 120
        )  # it is under way
        pid = child_pid(bt)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await async_wait_for(lambda: bt.states[MODEL].state == "failed", timeout=30)
        runs = len(RunStore(tmp_path / "runs").list())
        bt.refresh()  # the next look for work
        assert bt.states[MODEL].state == "failed" and await bt._next() is None  # not retried
        assert child_pid(bt) is None and len(RunStore(tmp_path / "runs").list()) == runs
    finally:
        await cancelled(task)
    assert host.swapped == [] and host.choice(MODEL).how == "rule"
    assert profile_files(tmp_path) == []  # no profile, no temporary file


async def test_a_failed_quick_search_goes_on_to_the_full_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", "fleetserve.bench.tune")
    s = settings(tmp_path, tune_budget=5.0, tune_refine_budget=40.0)  # 5 s: it fails
    host = Host(s)
    bt = tuner(s, host)
    task = asyncio.create_task(bt.run())
    try:
        await async_wait_for(lambda: bt.states[MODEL].state in ("tuned", "failed"), timeout=240)
    finally:
        await cancelled(task)
    st = bt.states[MODEL]
    assert st.state == "tuned", st
    assert any("the quick search failed" in r.getMessage() for r in caplog.records)
    found = host.reread(MODEL)
    assert found.how == "tuned" and not found.provenance.get("quick")


async def test_an_evicted_model_stops_its_tune(tmp_path: Path) -> None:
    s = settings(tmp_path)
    host = Host(s)
    bt = tuner(s, host)
    task = asyncio.create_task(bt.run())
    try:
        await async_wait_for(lambda: child_pid(bt) is not None, 120)
        pid = child_pid(bt)
        assert pid is not None
        host.resident = False  # the fleet evicted it
        # the child is reaped a moment before the tuner's await of it returns
        await async_wait_for(lambda: bt.states[MODEL].state not in ("tuning", "paused"), timeout=15)
        await async_wait_for(
            lambda: not Path(f"/proc/{pid}").exists(), timeout=5
        )  # stopped, reaped
        assert bt.states[MODEL].state == "rules"
        assert "evicted" in bt.states[MODEL].reason
    finally:
        await cancelled(task)
    assert profile_files(tmp_path) == [] and host.swapped == []


async def test_a_tune_that_outgrows_the_memory_budget_stops_and_serving_keeps_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The child's memory counts beside the models': where the two pass the budget,
    the tune stops (the full search is not tried: it needs the same room), one
    warning, nothing written, not retried."""
    s = settings(tmp_path, tune_refine_budget=60.0)
    host = Host(s)
    host.held, host.budget = 200 << 20, 260 << 20  # 60 MiB beside: less than any tune
    bt = tuner(s, host)
    task = asyncio.create_task(bt.run())
    try:
        await async_wait_for(lambda: bt.states[MODEL].state == "failed", timeout=60)
        assert child_pid(bt) is None and await bt._next() is None  # not retried
    finally:
        await cancelled(task)
    st = bt.states[MODEL]
    assert st.error and st.error.startswith("stopped for memory"), st
    assert "passed --memory-budget (260 MiB)" in st.error
    assert st.memory_bytes and st.memory_bytes > 60 << 20 and st.phase == ""
    runs = RunStore(tmp_path / "runs").list()  # (none if it was stopped at its imports)
    assert len(runs) <= 1 and all(r["status"] == "cancelled" and r["quick"] for r in runs)
    assert profile_files(tmp_path) == [] and host.swapped == []
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "stopped for memory" in warnings[0].getMessage()


async def test_an_unwritable_profile_directory_means_one_warning_and_no_tune(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "file").write_text("")
    s = settings(tmp_path, profile_dir=str(tmp_path / "file" / "profiles"))
    host = Host(s)
    bt = tuner(s, host)
    await asyncio.wait_for(bt.run(), 5)  # it returns: nothing is retried in a loop
    assert child_pid(bt) is None and host.swapped == []
    assert "not writable" in str(bt.states[MODEL].error)
    assert len([r for r in caplog.records if "not writable" in r.getMessage()]) == 1


def test_the_server_is_ready_at_once_tunes_and_the_next_start_does_not(
    tmp_path: Path,
) -> None:
    s = settings(tmp_path)
    bad = tmp_path / "profiles" / detect().hardware_class / "tiny--auto-bert.yaml"
    bad.parent.mkdir(parents=True)
    bad.write_text("model: [unclosed")  # a corrupt profile: ignored, then tuned afresh
    srv = ServerThread(s, background=True).start()
    try:
        url = srv.url
        first = info(url)
        assert first["profile"]["how"] == "rule"
        assert first["tuning"]["state"] in ("waiting", "tuning", "paused")
        ref = encode(url)  # ready at once, on the rules' choice
        deadline = time.monotonic() + 180
        while info(url)["tuning"]["state"] not in ("tuned", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        done = info(url)
        assert done["tuning"]["state"] == "tuned", done["tuning"]
        if done["tuning"]["swaps"]:
            assert done["profile"]["how"] == "tuned"
        np.testing.assert_allclose(encode(url), ref, atol=2e-3)  # fp32 either way
    finally:
        srv.stop()
    cls = detect().hardware_class
    assert read_profile_file(bad, cls).provenance["written_by"] == "fleetserve tune"
    runs = len(RunStore(tmp_path / "runs").list())
    srv = ServerThread(s, background=True).start()
    try:
        again = info(srv.url)
        assert again["profile"]["how"] == "tuned" and again["tuning"]["state"] == "tuned"
        time.sleep(1.0)  # the point: two looks for work, in which no tune may start
        assert len(RunStore(tmp_path / "runs").list()) == runs  # not tuned again
    finally:
        srv.stop()


def test_sigterm_during_a_background_tune_stops_the_server_and_the_tune(
    tmp_path: Path,
) -> None:
    s = settings(tmp_path)
    env = {**os.environ, **s.to_env(), Settings.env_name("tune"): "auto"}  # (the default)
    proc = forked.popen(
        [sys.executable, "-m", "fleetserve", "serve", "--port", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # (the test's timeout bounds it)
            seen.append(line)
            if "tuning in the background" in line:
                break
        assert proc.poll() is None, "".join(seen)
        deadline = time.monotonic() + 60
        while not (children := tune_children(proc.pid)):  # (it is being started)
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        while not RunStore(tmp_path / "runs").list():  # the search is under way
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert "Traceback" not in out
        for pid in children:
            assert not Path(f"/proc/{pid}").exists() or zombie(pid)
        (run,) = RunStore(tmp_path / "runs").list()
        assert run["status"] == "cancelled"
        assert profile_files(tmp_path) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _seconds(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def info(url: str) -> dict[str, Any]:
    (m,) = [d for d in httpx.get(url + "/v1/models").json()["data"] if d["id"] == MODEL]
    return m


def encode(url: str) -> np.ndarray:
    r = httpx.post(url + f"/v1/encode/{MODEL}", json={"inputs": ["a quick fox"]}, timeout=30)
    assert r.status_code == 200, r.text
    return np.array(r.json()["embeddings"], dtype=np.float32)


def tune_children(ppid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat[1]) == ppid and b"tune" in cmd:
            out.append(int(d.name))
    return out


def zombie(pid: int) -> bool:
    try:
        return (
            Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0]
            == "Z"
        )
    except OSError:
        return True
