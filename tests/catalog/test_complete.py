"""Spec completion: what a spec leaves out comes from its model's own files, what it
gives always wins, and the bundled specs come out as written."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import yaml

from fleetserve.assembly import build_catalog
from fleetserve.catalog import Catalog, ModelSpec
from fleetserve.catalog.complete import complete, nowhere
from fleetserve.settings import Settings

from ..tiny_rerank import build_cross_encoder
from ..tiny_st import build_st
from ..tinymodels import build_bert


def _catalog(tmp_path: Path, *specs: dict[str, object]) -> Catalog:
    cat = tmp_path / "catalog"
    cat.mkdir(exist_ok=True)
    for i, s in enumerate(specs):
        (cat / f"m{i}.yaml").write_text(yaml.safe_dump(s))
    return Catalog.load([cat], bundled=False)


def test_from_dict_remembers_the_keys_given() -> None:
    spec = ModelSpec.from_dict({"id": "a/b", "source": "/w", "pooling": "cls"})
    assert spec.given == {"id", "sources", "pooling"}
    built = ModelSpec(id="a/b", family="dense", runtime="torch", sources=("/w",))
    assert "max_seq_len" in built.given  # built in code: everything given, never completed
    assert dataclasses.replace(spec, given=frozenset()) == spec  # not part of equality


def test_a_two_line_spec_gets_the_models_limit_pooling_and_prefixes(tmp_path: Path) -> None:
    prompts = {"query": "q: ", "document": "d: "}
    m = build_st(tmp_path / "st", pooling="cls", max_seq_length=384, prompts=prompts)
    spec = _catalog(tmp_path, {"id": "user/st", "sources": [str(m)]}).get("user/st")
    assert (spec.family, spec.pooling, spec.max_seq_len, spec.normalize) == (
        "dense",
        "cls",
        384,
        True,
    )
    assert spec.options == {"query_prefix": "q: ", "document_prefix": "d: "}
    assert spec.dimensions is None  # not filled: the family measures it at load


def test_the_same_spec_without_weights_keeps_the_defaults(tmp_path: Path) -> None:
    spec = _catalog(tmp_path, {"id": "user/st", "sources": [str(tmp_path / "absent")]}).get(
        "user/st"
    )
    assert (spec.pooling, spec.max_seq_len, spec.options) == ("mean", 512, {})


def test_a_given_key_always_wins(tmp_path: Path) -> None:
    m = build_st(tmp_path / "st", pooling="cls", max_seq_length=384, prompts={"query": "q: "})
    given = {
        "id": "user/st",
        "sources": [str(m)],
        "pooling": "mean",
        "max_seq_len": 100,
        "normalize": False,
        "options": {"query_prefix": ""},
    }
    spec = _catalog(tmp_path, given).get("user/st")
    assert (spec.pooling, spec.max_seq_len, spec.normalize) == ("mean", 100, False)
    assert spec.options == {"query_prefix": ""}


def test_a_given_family_is_never_overridden(tmp_path: Path) -> None:
    m = build_st(tmp_path / "st", max_seq_length=64)
    cat = _catalog(
        tmp_path,
        {"id": "user/mv", "family": "multivector", "sources": [str(m)]},
        {"id": "user/ce", "family": "cross_encoder", "sources": [str(m)]},
        {"id": "user/dense", "family": "dense", "sources": [str(m)]},
    )
    mv = cat.get("user/mv")
    assert (mv.family, mv.max_seq_len) == ("multivector", 64)
    ce = cat.get("user/ce")  # does not fit: left as written, its load says why
    assert (ce.family, ce.max_seq_len, ce.pooling) == ("cross_encoder", 512, "mean")
    assert cat.get("user/dense").max_seq_len == 64


def test_an_omitted_family_comes_from_the_files(tmp_path: Path) -> None:
    m = build_cross_encoder(tmp_path / "ce", max_positions=96)
    spec = _catalog(tmp_path, {"id": "user/ce", "sources": [str(m)]}).get("user/ce")
    assert (spec.family, spec.max_seq_len) == ("cross_encoder", 96)


def test_an_undecided_family_stays_dense_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    m = build_bert(tmp_path / "bare", max_positions=64)
    with caplog.at_level(logging.WARNING, "fleetserve.catalog"):
        spec = _catalog(tmp_path, {"id": "user/bare", "sources": [str(m)]}).get("user/bare")
    assert (spec.family, spec.max_seq_len) == ("dense", 64)
    said = [r.getMessage() for r in caplog.records]
    assert any("user/bare" in s and "candidates: dense, multivector, zero_shot" in s for s in said)


def test_a_corrupt_checkpoint_leaves_the_spec_as_written(tmp_path: Path) -> None:
    m = build_st(tmp_path / "st", max_seq_length=64)
    (m / "config.json").write_text("{not json")
    spec = _catalog(tmp_path, {"id": "user/st", "sources": [str(m)]}).get("user/st")
    assert spec.max_seq_len == 512


def test_build_catalog_finds_weights_in_the_settings_caches(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    snap = hub / "models--org--st" / "snapshots" / "abc"
    build_st(snap, max_seq_length=200)
    cat = tmp_path / "catalog"
    cat.mkdir()
    (cat / "st.yaml").write_text(yaml.safe_dump({"id": "org/st", "sources": ["hf:org/st"]}))
    settings = Settings(catalog=str(cat), hf_cache=str(hub), cache_dir=str(tmp_path / "c"))
    assert build_catalog(settings).get("org/st").max_seq_len == 200
    assert Catalog.load([cat], weights=nowhere).get("org/st").max_seq_len == 512


def test_the_bundled_specs_come_out_as_written() -> None:
    completed, written = Catalog.load(), Catalog.load(weights=nowhere)
    assert [s.id for s in completed] == [s.id for s in written]
    for spec in completed:
        assert spec == written.get(spec.id), spec.id


def test_complete_fills_only_what_the_family_reads(tmp_path: Path) -> None:
    m = build_st(tmp_path / "st", pooling="cls", max_seq_length=64)
    spec = ModelSpec.from_dict({"id": "g/x", "family": "generate", "sources": [str(m)]})
    assert complete(spec, m) == spec  # a text encoder does not fit generate: unchanged
    mv = ModelSpec.from_dict({"id": "m/x", "family": "multivector", "sources": [str(m)]})
    done = complete(mv, m)
    assert (done.pooling, done.max_seq_len) == ("mean", 64)  # multivector reads no pooling
