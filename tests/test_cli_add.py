"""``fleetserve add SOURCE``: one command, no YAML. The spec comes from the model's own
files, passes the reference check, is written with its evidence beside a report, and
serves; what cannot be a model, or cannot be decided, is refused with nothing written.
(The tune it runs by default: ``tests/add/test_tune.py``.)"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from fleetserve.catalog import Catalog
from fleetserve.cli import main
from fleetserve.gateway.auth import hash_key

from .conftest import TINY, ServerThread, tiny_settings
from .tiny_colbert import build_hf_colbert
from .tiny_st import build_st
from .tinymodels import build_bert, write_spec

ADMIN = "fs-add-admin-key"


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    d = {k: tmp_path / k for k in ("catalog", "tune", "profiles", "cache", "hf")}
    for name in ("catalog", "tune_dir", "profile_dir", "cache_dir", "hf_cache"):
        key = "tune" if name == "tune_dir" else name.removesuffix("_dir").removesuffix("_cache")
        key = {"profile": "profiles", "hf": "hf"}.get(key, key)
        monkeypatch.setenv(f"FLEETSERVE_{name.upper()}", str(d[key]))
    monkeypatch.setenv("FLEETSERVE_HARDWARE_CLASS", "")
    return d


def files_in(d: Path) -> list[str]:
    return sorted(p.name for p in d.rglob("*") if p.is_file()) if d.exists() else []


def test_a_sentence_transformers_directory_is_added_in_one_command(
    tmp_path: Path, dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model = build_st(tmp_path / "My Embedder", pooling="cls", max_seq_length=24)
    assert main(["add", str(model), "--no-tune"]) == 0
    out = capsys.readouterr().out
    assert "added My-Embedder (dense)" in out.replace("\n", " ")
    spec_file = dirs["catalog"] / "My-Embedder.yaml"
    text = spec_file.read_text()
    fields = yaml.safe_load(text)
    assert fields["family"] == "dense" and fields["pooling"] == "cls"
    assert fields["max_seq_len"] == 24 and fields["sources"] == [str(model.resolve())]
    assert "1_Pooling/config.json" in text  # the evidence, as a comment
    (spec,) = [s for s in Catalog.load((dirs["catalog"],)) if s.id == "My-Embedder"]
    assert spec.pooling == "cls"
    report = json.loads((dirs["tune"] / "reports" / "add-My-Embedder.json").read_text())
    assert report["check"]["status"] == "passed" and report["tuned"] is None
    assert report["check"]["library"] == "sentence-transformers"
    assert "--no-tune" in report["not_tuned"] and report["spec_file"] == str(spec_file)
    md = (dirs["tune"] / "reports" / "add-My-Embedder.md").read_text()
    assert "## Reference check" in md and '| pooling | `"cls"` |' in md
    # it serves, as the catalog directory says
    srv = ServerThread(tiny_settings(dirs["catalog"], models="My-Embedder")).start()
    try:
        r = httpx.post(f"{srv.url}/v1/encode/My-Embedder", json={"inputs": ["hello world"]})
        assert r.status_code == 200, r.text
        assert np.isclose(np.linalg.norm(r.json()["embeddings"][0]), 1.0, atol=1e-4)
    finally:
        srv.stop()


def test_a_gliner_model_is_checked_against_gliner_and_a_stanford_colbert_against_colbert_ai(
    tmp_path: Path, dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A family's library decides: gliner checks a GLiNER checkpoint, colbert-ai a ColBERT
    in the stanford-nlp layout. Where colbert-ai is not installed (``--reference-dir``),
    the ColBERT is added with a warning, and the report says it was not checked."""
    gliner = Path(__file__).parent / "families" / "data" / "gliner-tiny" / "bert"
    assert main(["add", str(gliner), "--id", "tiny/gliner", "--no-tune"]) == 0
    report = json.loads((dirs["tune"] / "reports" / "add-tiny--gliner.json").read_text())
    assert (report["check"]["status"], report["check"]["library"]) == ("passed", "gliner")
    colbert = build_hf_colbert(tmp_path / "colbert")
    assert main(["add", str(colbert), "--id", "tiny/colbert", "--no-tune"]) == 0
    report = json.loads((dirs["tune"] / "reports" / "add-tiny--colbert.json").read_text())
    assert (report["check"]["status"], report["check"]["library"]) == ("passed", "colbert-ai")
    capsys.readouterr()
    nowhere = ["--reference-dir", str(tmp_path / "none")]
    assert main(["add", str(colbert), "--id", "tiny/colbert2", "--no-tune", *nowhere]) == 0
    got = capsys.readouterr()
    out = " ".join((got.out + got.err).split())
    assert "warning: tiny/colbert2 was not checked against a reference library" in out
    report = json.loads((dirs["tune"] / "reports" / "add-tiny--colbert2.json").read_text())
    assert report["check"]["status"] == "unchecked"
    assert "colbert-ai, which is not installed" in report["check"]["reason"]
    assert (dirs["catalog"] / "tiny__colbert2.yaml").is_file()


@pytest.mark.parametrize(
    ("make", "extra", "code", "named"),
    [
        (lambda p: p / "absent", [], 2, "no such directory"),
        (lambda p: (p / "empty").mkdir() or p / "empty", [], 2, "no weights"),
        (lambda p: build_bert(p / "bare"), [], 2, "candidates: "),  # a bare BertModel
        (lambda p: build_st(p / "st"), ["--family", "cross_encoder"], 2, "cross_encoder"),
        (lambda p: build_st(p / "st"), ["--id", "bad id!"], 2, "bad id!"),
    ],
    ids=["absent", "no-weights", "undecided", "family-mismatch", "bad-id"],
)
def test_what_cannot_be_added_is_one_line_and_nothing_is_written(
    tmp_path: Path,
    dirs: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    make: object,
    extra: list[str],
    code: int,
    named: str,
) -> None:
    assert callable(make)
    source = make(tmp_path)
    assert main(["add", str(source), "--no-tune", *extra]) == code
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]  # one line
    assert named in line and err.rstrip().endswith(line), err
    assert files_in(dirs["catalog"]) == [] and files_in(dirs["tune"]) == []


def test_a_remote_code_checkpoint_is_refused(
    tmp_path: Path, dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model = build_st(tmp_path / "m")
    cfg = json.loads((model / "config.json").read_text())
    cfg["auto_map"] = {"AutoModel": "modeling_custom.CustomModel"}
    (model / "config.json").write_text(json.dumps(cfg))
    assert main(["add", str(model), "--no-tune"]) == 2
    assert "trust_remote_code" in capsys.readouterr().err
    assert files_in(dirs["catalog"]) == []


def test_an_id_the_catalog_has_is_refused(
    tmp_path: Path, dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    write_spec(dirs["catalog"], "acme/taken", build_bert(tmp_path / "other"))
    before = files_in(dirs["catalog"])
    assert main(["add", str(build_st(tmp_path / "m")), "--id", "acme/taken", "--no-tune"]) == 2
    assert "'acme/taken' exists" in capsys.readouterr().err
    assert files_in(dirs["catalog"]) == before


def test_server_makes_it_servable_on_a_running_server_without_a_restart(
    tmp_path: Path, dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    models, served = tmp_path / "models", tmp_path / "served"
    write_spec(served, TINY, build_bert(models / "base"))
    ring = f"- sha256: {hash_key(ADMIN)}\n  tenant: ops\n  scopes: [admin]\n"
    settings = tiny_settings(served, model_roots=str(models), keys=ring, auth="keys")
    srv = ServerThread(settings).start()
    try:
        monkeypatch.setenv("FLEETSERVE_API_KEY", ADMIN)
        model = build_st(models / "late")
        assert main(["add", str(model), "--no-tune", "--server", srv.url]) == 0
        r = httpx.post(
            f"{srv.url}/v1/encode/late",
            json={"inputs": ["hello"]},
            headers={"authorization": f"Bearer {ADMIN}"},
        )
        assert r.status_code == 200, r.text
    finally:
        srv.stop()


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--budget", "5"], "too small to measure anything"),
        (["--hardware-class", "cpu-generic"], "a profile for cpu-generic must be measured"),
    ],
)
def test_a_tune_that_cannot_run_is_refused_before_anything_is_checked(
    tmp_path: Path,
    dirs: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    named: str,
) -> None:
    assert main(["add", str(build_st(tmp_path / "m")), *extra]) == 2
    err = capsys.readouterr().err
    assert named in err and "check against the reference library" not in err, err
    assert files_in(dirs["catalog"]) == [] and files_in(dirs["tune"]) == []
