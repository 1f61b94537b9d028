"""``fleetserve add`` tunes what it adds (the search ``fleetserve tune`` runs) within
``--budget``, writes the profile the server then reads, and reports the winner against
torch fp32. Run apart, two at a time (marker ``tunes``: tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetserve.catalog.profiles import read_profile_file
from fleetserve.cli import main

from ..tiny_st import build_st

pytestmark = pytest.mark.tunes


def test_add_tunes_within_its_budget_and_reports_against_torch_fp32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, sub in (("CATALOG", "catalog"), ("PROFILE_DIR", "profiles"), ("TUNE_DIR", "tune")):
        monkeypatch.setenv(f"FLEETSERVE_{name}", str(tmp_path / sub))
    model = build_st(tmp_path / "m", max_seq_length=32)
    assert main(["add", str(model), "--id", "tiny/added", "--budget", "40"]) == 0
    report = json.loads((tmp_path / "tune/reports/add-tiny--added.json").read_text())
    tuned = report["tuned"]
    assert tuned is not None, report["not_tuned"]
    assert tuned["tokens_per_s"] > 0 and tuned["torch_fp32_tokens_per_s"] > 0
    assert tuned["vs_torch_fp32"] == pytest.approx(
        tuned["tokens_per_s"] / tuned["torch_fp32_tokens_per_s"]
    )
    profile = read_profile_file(Path(tuned["profile_file"]), report["hardware_class"])
    assert profile.model == "tiny/added" and profile.provenance["written_by"] == "fleetserve tune"
    assert Path(tuned["profile_file"]).is_relative_to(tmp_path / "profiles")
    assert report["resident_bytes"] and report["seconds"]["total"] > 0
