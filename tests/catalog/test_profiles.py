"""Profile lookup: tuned (yours, then bundled), the spec's own, fallbacks, then rules;
profile files that do not parse are clear errors (one of yours is passed over with one
line); writes are atomic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetserve.catalog import Catalog, ModelSpec, Profile
from fleetserve.catalog.hardware import Hardware
from fleetserve.catalog.profiles import (
    ProfileError,
    Profiles,
    bundled_dir,
    read_profile_file,
    slug,
    write_profile_file,
)

from ..conftest import REAL
from ..tinymodels import build_bert, write_spec

SPEC_DICT: dict[str, Any] = {"id": "org/model", "sources": ["/nowhere"], "family": "dense"}
SPEC = ModelSpec.from_dict(SPEC_DICT)


def machine(*features: str) -> Hardware:
    return Hardware("cpu", "x86_64", "Test CPU", 2, 8 * 2**30, frozenset(features))


AMX = machine("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16")
ZEN4 = machine("avx2", "avx512f", "avx512_bf16")


def tuned(root: Path, cls: str, model: str = "org/model", **fields: Any) -> Path:
    prof = Profile.from_dict(cls, {"precision": "fp32", "max_batch_size": 8, **fields})
    return write_profile_file(root, model, prof, {"date": "2026-12-01", "machine": "test"})


def test_yours_beats_bundled_beats_the_spec_beats_the_rules(tmp_path: Path) -> None:
    bundled, mine = tmp_path / "bundled", tmp_path / "mine"
    spec = ModelSpec.from_dict({**SPEC_DICT, "profiles": {"cpu": {"max_batch_size": 3}}})
    assert Profiles(AMX, user_dir=mine, bundled=bundled).choose(spec).how == "catalog"
    tuned(bundled, "cpu-amx", max_batch_size=16)
    c = Profiles(AMX, user_dir=mine, bundled=bundled).choose(spec)
    assert (c.how, c.profile.max_batch_size, c.provenance["date"]) == ("tuned", 16, "2026-12-01")
    assert "bundled" in c.reason and c.file.endswith("org--model.yaml")
    tuned(mine, "cpu-amx", max_batch_size=64)
    c = Profiles(AMX, user_dir=mine, bundled=bundled).choose(spec)
    assert (c.how, c.profile.max_batch_size) == ("tuned", 64)
    assert "yours" in c.reason
    assert c.describe()["how"] == "tuned" and c.describe()["hardware_class"] == "cpu-amx"


def test_a_fallback_stands_in_only_where_the_rule_precision_is_the_same(tmp_path: Path) -> None:
    bundled = tmp_path / "bundled"
    tuned(bundled, "cpu-avx512", max_batch_size=24)
    zen4 = Profiles(ZEN4, bundled=bundled).choose(SPEC)  # cpu-avx512bf16 -> cpu-avx512
    assert (zen4.how, zen4.profile.max_batch_size) == ("fallback", 24)
    assert "cpu-avx512" in zen4.reason
    amx = Profiles(AMX, bundled=bundled).choose(SPEC)  # AMX changes what wins: no fallback
    assert amx.how == "rule" and amx.profile.precision == "bf16"
    assert "fleetserve tune org/model" in amx.reason


def test_a_fallback_is_passed_over_where_the_evidence_wins_at_another_precision(
    tmp_path: Path,
) -> None:
    """A Zen 4 (cpu-avx512bf16) falls back to cpu-avx2's fp32 profile, unless the
    nearest tunes whose precision it runs natively (cpu-amx's, bf16) say otherwise."""
    bundled, model = tmp_path / "bundled", "sentence-transformers/all-MiniLM-L6-v2"
    spec = Catalog.load().get(model)
    tuned(bundled, "cpu-avx2", model, runtime="torch", max_batch_size=24)
    assert Profiles(ZEN4, bundled=bundled).choose(spec).how == "fallback"
    tuned(bundled, "cpu-amx", model, runtime="torch", precision="bf16")
    c = Profiles(ZEN4, bundled=bundled).choose(spec)
    assert (c.how, c.profile.precision) == ("rule", "bf16"), c.reason
    assert "cpu-avx2's profile runs fp32" in c.reason
    sky = Profiles(machine("avx2", "avx512f"), bundled=bundled).choose(spec)
    assert (sky.how, sky.profile.max_batch_size) == ("fallback", 24)  # its nearest: cpu-avx2


def test_a_bundled_profile_whose_runtime_is_absent_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The package's own choice must not break an install without that extra; yours
    is kept, and then fails to load naming the extra (tests/bench/tune/test_gate.py)."""
    import fleetserve.catalog.profiles as profiles_mod

    monkeypatch.setattr(profiles_mod, "missing_extra", lambda rt: "openvino" * (rt == "openvino"))
    bundled, mine = tmp_path / "bundled", tmp_path / "mine"
    tuned(bundled, "cpu-amx", runtime="openvino", precision="bf16")
    c = Profiles(AMX, user_dir=mine, bundled=bundled).choose(SPEC)
    assert c.how == "rule" and "pip install 'fleetserve[openvino]'" in c.reason
    tuned(mine, "cpu-amx", runtime="openvino", precision="bf16")
    assert Profiles(AMX, user_dir=mine, bundled=bundled).choose(SPEC).how == "tuned"


def test_the_class_asked_for_overrides_the_detected_one(tmp_path: Path) -> None:
    bundled = tmp_path / "bundled"
    tuned(bundled, "cpu-avx2", max_batch_size=5)
    c = Profiles(AMX, "cpu-avx2", bundled=bundled).choose(SPEC)
    assert (c.how, c.profile.max_batch_size, c.profile.hardware) == ("tuned", 5, "cpu-avx2")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("model: [unclosed", "cannot read it"),
        ("- a list", "must be a mapping"),
        ("model: org/model\nhardware_class: cpu-amx\n", "'profile' is missing"),
        ("model: m\nhardware_class: cpu-amx\nprofile: {precision: fp7}\n", "field precision"),
        ("model: m\nhardware_class: cpu-amx\nprofile: {max_batch_size: -1}\n", "max_batch_size"),
        ("model: m\nhardware_class: cpu-amx\nprofile: {treads: 2}\n", "unknown field 'treads'"),
        ("model: m\nhardware_class: cpu-avx2\nprofile: {}\n", "sits under cpu-amx"),
        ("model: m\nhardware_class: cpu-amx\nprofile: {}\nextra: 1\n", "unknown field 'extra'"),
        ("model: m\nhardware_class: cpu-amx\nprofile: {runtime: opnvino}\n", "field runtime"),
        ("model: m\nhardware_class: cpu-amx\nprofile: {adapters: graph}\n", "field adapters"),
    ],
)
def test_a_broken_profile_file_names_the_file_and_the_field(
    tmp_path: Path, text: str, match: str
) -> None:
    f = tmp_path / "cpu-amx" / "m.yaml"
    f.parent.mkdir()
    f.write_text(text)
    with pytest.raises(ProfileError, match=match) as info:
        read_profile_file(f, "cpu-amx")
    assert str(f) in str(info.value)


def test_where_adapters_run_is_written_and_read_back_and_absent_when_unjudged(
    tmp_path: Path,
) -> None:
    for verdict in ("in_graph", "torch", ""):
        f = tuned(tmp_path / verdict, "cpu-amx", runtime="openvino", adapters=verdict)
        assert ("adapters:" in f.read_text()) == bool(verdict)
        assert read_profile_file(f, "cpu-amx").profile.adapters == verdict


def test_a_broken_profile_of_yours_is_ignored_with_one_line_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad = tmp_path / "cpu-amx" / "org--model.yaml"
    bad.parent.mkdir()
    bad.write_text("model: org/model\nhardware_class: cpu-amx\nprofile: {precision: fp64}\n")
    profiles = Profiles(AMX, user_dir=tmp_path, bundled=tmp_path / "none")
    assert profiles.ignored == [str(bad)]
    assert profiles.choose(SPEC).how == "rule"  # as if it were not there: --tune auto re-tunes
    (line,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert str(bad) in line.getMessage() and "precision" in line.getMessage()


def test_a_broken_bundled_profile_still_fails(tmp_path: Path) -> None:
    bad = tmp_path / "cpu-amx" / "m.yaml"
    bad.parent.mkdir()
    bad.write_text("- a list")
    with pytest.raises(ProfileError, match="must be a mapping"):
        Profiles(AMX, bundled=tmp_path)


@pytest.mark.slow
def test_start_up_serves_past_a_broken_profile_of_yours_with_one_line(
    tmp_path: Path,
) -> None:
    cat = tmp_path / "catalog"
    write_spec(cat, "tiny/p", build_bert(tmp_path / "model"))
    bad = tmp_path / "profiles" / "cpu-avx2" / "tiny--p.yaml"
    bad.parent.mkdir(parents=True)
    bad.write_text("model: tiny/p\nhardware_class: cpu-avx2\nprofile: {precision: fp64}\n")
    r = subprocess.run(
        [sys.executable, "-m", "fleetserve", "hardware", "--catalog", str(cat),
         "--hardware-class", "cpu-avx2", "--profile-dir", str(tmp_path / "profiles")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.count(str(bad)) == 1 and "precision" in r.stderr


def test_writes_are_atomic_and_never_leave_a_file_that_would_not_load(tmp_path: Path) -> None:
    path = tuned(tmp_path, "cpu-amx", max_batch_size=32)
    assert read_profile_file(path, "cpu-amx").profile.max_batch_size == 32
    before = path.read_text()
    with pytest.raises(ProfileError):  # an unknown precision is caught before the rename
        write_profile_file(tmp_path, "org/model", Profile("cpu-amx", precision="fp7"), {}, "header")
    assert path.read_text() == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


def test_the_written_file_says_where_it_came_from(tmp_path: Path) -> None:
    prof = Profile.from_dict("cpu-amx", {"runtime": "openvino", "precision": "bf16"})
    f = write_profile_file(tmp_path, "a/b", prof, {"date": "d"}, "Written by test\nline 2")
    text = f.read_text()
    assert text.startswith("# Written by test\n# line 2\n")
    doc = yaml.safe_load(text)
    assert doc["model"] == "a/b" and doc["profile"]["runtime"] == "openvino"
    assert f.name == f"{slug('a/b')}.yaml" == "a--b.yaml"


def test_every_bundled_profile_parses_and_belongs_to_a_catalog_model() -> None:
    catalog = Catalog.load()
    files = sorted(bundled_dir().glob("*/*.yaml"))
    assert files, "the package ships no tuned profile"
    for f in files:
        pf = read_profile_file(f, f.parent.name, bundled=True)
        assert pf.model in catalog, f
        assert pf.provenance.get("written_by") == "fleetserve tune", f  # never by hand
        for key in ("fleetserve", "date", "machine", "figures"):
            assert key in pf.provenance, (f, key)


def test_the_default_model_has_a_tuned_profile_for_a_class() -> None:
    classes = {f.parent.name for f in bundled_dir().glob(f"*/{slug(REAL)}.yaml")}
    assert classes, "all-MiniLM-L6-v2 ships no tuned profile"


def test_the_bundled_profiles_are_package_data() -> None:
    """A wheel carries them: every bundled file matches a package-data glob."""
    import fnmatch
    import tomllib

    root = Path(__file__).resolve().parents[2]
    data = tomllib.loads((root / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["fleetserve"]
    package = root / "src" / "fleetserve"
    files = [str(f.relative_to(package)) for f in bundled_dir().glob("*/*.yaml")]
    assert files and all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files)


def test_unbundled_serves_as_a_class_with_no_bundled_profile(tmp_path: Path) -> None:
    bundled, mine = tmp_path / "bundled", tmp_path / "mine"
    tuned(bundled, "cpu-amx", max_batch_size=16)
    assert Profiles(AMX, bundled=bundled).choose(SPEC).how == "tuned"
    c = Profiles(AMX, user_dir=mine, bundled=bundled, unbundled=True).choose(SPEC)
    assert c.how == "rule"
    tuned(mine, "cpu-amx", max_batch_size=64)  # yours still count: what --tune auto writes
    c = Profiles(AMX, user_dir=mine, bundled=bundled, unbundled=True).choose(SPEC)
    assert (c.how, c.profile.max_batch_size) == ("tuned", 64)
