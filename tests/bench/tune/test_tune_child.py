"""tune_child: the background tune's child process, stopped with its server."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from fleetserve.bench.tune import tune_child
from fleetserve.bench.tune.pauses import Ledger
from fleetserve.bench.tune.runs import RunStore, now_iso
from fleetserve.bench.tune.tune_child import TuneChild

DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"  # noqa: E501


async def test_a_child_killed_before_it_wrote_its_end_leaves_its_run_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tune at nice 10 on busy cores may not stop within the grace after SIGTERM; it
    is killed, and its run would have said ``running`` for good (a device process's
    tune, with the whole suite beside it)."""
    monkeypatch.setattr(tune_child, "STOP_S", 0.3)
    runs = RunStore(tmp_path / "runs")
    runs.write({"id": "run-1", "status": "running", "started_at": now_iso()})
    runs.write({"id": "run-2", "status": "running", "started_at": now_iso()})  # another's
    child = TuneChild({}, tmp_path / "profiles", tmp_path / "runs", Ledger(tmp_path / "ledger"))
    child.run_id = "run-1"
    child.proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", DEAF, stdout=asyncio.subprocess.PIPE, start_new_session=True
    )
    assert child.proc.stdout is not None and await child.proc.stdout.readline()  # deaf now
    await child.stop()
    assert child.proc.returncode == -9
    run = runs.get("run-1")
    assert run["status"] == "cancelled" and "killed" in run["error"] and run["finished_at"]
    assert runs.get("run-2")["status"] == "running"
