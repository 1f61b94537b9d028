"""``fleetserve serve --tune quick``: an untuned pinned model is tuned briefly at first
start, served with the winner, and found tuned at the next start."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from fleetserve.assembly import build_catalog, build_profiles
from fleetserve.bench.tune.quick import wanted
from fleetserve.catalog.hardware import detect
from fleetserve.catalog.profiles import Profiles, read_profile_file
from fleetserve.settings import Settings

from ...conftest import ServerThread
from ...tinymodels import build_bert, write_spec

MODEL = "tiny/quick-bert"


def settings(root: Path, **extra: object) -> Settings:
    cat = root / "catalog"
    if not cat.exists():  # no profile in the spec: the rules would choose
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
            **extra,
        }
    )


def test_quick_tunes_untuned_pinned_models_once(tmp_path: Path) -> None:
    s = settings(tmp_path, tune="quick", tune_budget=42)
    srv = ServerThread(s).start()
    try:
        (m,) = [d for d in httpx.get(srv.url + "/v1/models").json()["data"] if d["id"] == MODEL]
        assert m["profile"]["how"] == "tuned" and "yours" in m["profile"]["reason"]
        r = httpx.post(srv.url + f"/v1/encode/{MODEL}", json={"inputs": ["a fox"]}, timeout=30)
        assert r.status_code == 200
        runs = httpx.get(srv.url + "/v1/tuning/runs").json()["data"]
        assert runs and runs[0]["model"] == MODEL and runs[0]["status"] == "succeeded"
    finally:
        srv.stop()
    cls = detect().hardware_class
    f = tmp_path / "profiles" / cls / "tiny--quick-bert.yaml"
    assert read_profile_file(f, cls).provenance["written_by"] == "fleetserve tune"
    catalog = build_catalog(s)
    choices = {sp.id: build_profiles(s).choose(sp) for sp in catalog}
    assert wanted(s, catalog, choices) == []  # the next start has nothing to tune


def test_off_and_tuned_models_are_left_alone(tmp_path: Path) -> None:
    s = settings(tmp_path)
    catalog = build_catalog(s)
    profiles: Profiles = build_profiles(s)
    choices = {sp.id: profiles.choose(sp) for sp in catalog}
    assert choices[MODEL].how == "rule"
    assert wanted(s, catalog, choices) == []  # tune=off
    quick = settings(tmp_path, tune="quick")
    assert wanted(quick, catalog, choices) == [MODEL]
    with pytest.raises(ValueError, match="tune must be one of off, quick"):
        wanted(settings(tmp_path, tune="slow"), catalog, choices)


async def test_quick_does_not_tune_for_a_class_this_machine_is_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from rich.console import Console

    from fleetserve.bench.tune.quick import quick_tune

    other = "cpu-generic" if detect().hardware_class != "cpu-generic" else "cpu-avx2"
    s = settings(tmp_path, tune="quick", hardware_class=other)
    profiles = build_profiles(s)
    done = await quick_tune(s, build_catalog(s), profiles, [MODEL], Console(quiet=True))
    assert done == [] and "not tuning for" in caplog.text
    assert not (tmp_path / "profiles").exists()
