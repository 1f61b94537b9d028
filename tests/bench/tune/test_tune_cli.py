"""``fleetserve tune`` end to end on a tiny model: a profile and a report are written;
Ctrl-C, a budget too small, an unknown model or absent weights write nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fleetserve.catalog import CostModel
from fleetserve.catalog.profiles import read_profile_file

from ... import forked
from ...tinymodels import build_bert, write_spec

MODEL = "tiny/tune-bert"


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tune")
    cat = root / "catalog"
    write_spec(cat, MODEL, build_bert(root / "model"), max_seq_len=64)
    write_spec(cat, "tiny/absent", root / "no-such-dir")
    return cat


def tune_argv(catalog: Path, tmp: Path, *extra: str, budget: float = 32) -> list[str]:
    return [
        sys.executable, "-m", "fleetserve", "tune", MODEL, "--catalog", str(catalog),
        "--budget", str(budget), "--measure", "0.4", "--knee-seconds", "0.4",
        "--output", str(tmp / "profiles"), "--tune-dir", str(tmp / "runs"),
        "--cache-dir", str(tmp / "cache"), "--device", "cpu", *extra,
    ]  # fmt: skip


def runs(tmp: Path) -> list[dict[str, Any]]:
    out = []
    for f in (tmp / "runs").glob("*.json"):
        try:
            out.append(json.loads(f.read_text()))
        except ValueError:
            continue  # being replaced right now
    return out


def test_a_tune_writes_a_profile_with_provenance_and_a_report(
    catalog: Path, tmp_path: Path
) -> None:
    argv = tune_argv(catalog, tmp_path, "--max-processes", "1")  # one process: a knee
    r = forked.run(argv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (cls_dir,) = (tmp_path / "profiles").iterdir()
    pf = read_profile_file(cls_dir / "tiny--tune-bert.yaml", cls_dir.name)
    assert pf.model == MODEL and pf.profile.hardware == cls_dir.name
    # the cost model was fitted, and the cap while queries wait comes from it
    prof = pf.profile
    assert prof.cost != CostModel()
    want = prof.cost.interactive_cap(prof.max_batch_tokens)
    assert prof.priority_cap == want > 0
    prov = pf.provenance
    assert prov["written_by"] == "fleetserve tune" and prov["figures"]["tokens_per_s"] > 0
    assert prov["figures"]["quality"]["passed"] is True and "machine" in prov
    (run,) = runs(tmp_path)
    assert run["status"] == "succeeded" and run["model"] == MODEL
    ids = {c["id"]: c for c in run["candidates"]}
    winner = ids[run["winner"]]
    assert winner["status"] == "won" and winner["tokens_per_s"] > 0
    assert run["profile"]["precision"] == winner["precision"]
    assert {c["status"] for c in ids.values()} - {"won"}  # others lost, were rejected...
    for c in ids.values():
        if c["status"] in ("lost", "rejected", "skipped"):
            assert c["reason"], c  # every loser says why
    assert run["knee"] and run["knee"]["points"], "the winner's knee was measured"
    assert not any(c["processes"] > 1 for c in ids.values())
    for key in ("markdown", "json", "png"):
        assert Path(run["report"][key]).is_file()
    md = Path(run["report"]["markdown"]).read_text(encoding="utf-8")
    assert f"Winner: `{run['winner']}`" in md and "noise" in md


def test_ctrl_c_leaves_no_profile_and_says_cancelled(catalog: Path, tmp_path: Path) -> None:
    proc = forked.popen(
        tune_argv(catalog, tmp_path, budget=120),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until two candidates are measured
            done = [c for r in runs(tmp_path) for c in r["candidates"] if c.get("tokens_per_s")]
            if len(done) >= 2 or proc.poll() is not None:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "no profile was written" in err
    assert not list((tmp_path / "profiles").rglob("*.yaml"))
    (run,) = runs(tmp_path)
    assert run["status"] == "cancelled" and run["finished_at"]


def test_a_budget_too_small_says_so_and_writes_nothing(catalog: Path, tmp_path: Path) -> None:
    r = forked.run(
        tune_argv(catalog, tmp_path, budget=5), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2
    assert "too small to measure anything" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "profiles").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("model", "says"),
    [("nope/model", "unknown model 'nope/model'"), ("tiny/absent", "no-such-dir")],
)
def test_an_unknown_model_or_absent_weights_is_one_line(
    catalog: Path, tmp_path: Path, model: str, says: str
) -> None:
    argv = tune_argv(catalog, tmp_path)
    argv[argv.index(MODEL)] = model
    r = forked.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert says in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("run_id", "models", "says"),
    [
        ("../escape", 1, "a run id is letters, digits"),
        ("two-models", 2, "names the run of one model"),
        ("taken", 1, "a run of that id exists already"),
    ],
)
def test_a_run_id_that_cannot_name_the_run_is_one_line(
    catalog: Path, tmp_path: Path, run_id: str, models: int, says: str
) -> None:
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "taken.json").write_text("{}")
    argv = tune_argv(catalog, tmp_path, "--run-id", run_id)
    if models == 2:
        argv.insert(argv.index(MODEL) + 1, MODEL)
    r = forked.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["taken.json"]
    assert not (tmp_path / "profiles").exists()
