"""The spec text written from an inference: it parses back to the inferred fields,
and says where each came from."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleetserve.catalog import Catalog, ModelSpec
from fleetserve.catalog.infer import Inferred, infer
from fleetserve.catalog.spec_yaml import render_spec

from ..tiny_extract import build_token_classifier
from ..tiny_st import build_st


def _parsed(text: str) -> ModelSpec:
    return ModelSpec.from_dict(yaml.safe_load(text))


def test_a_dense_spec_parses_to_what_was_inferred_and_cites_its_files(tmp_path: Path) -> None:
    prompts = {"query": 'ask: "', "document": "doc #1: "}  # quotes and a '#' survive
    m = build_st(tmp_path / "st", pooling="cls", max_seq_length=384, prompts=prompts)
    found = infer(m)
    text = render_spec("user/st", [str(m)], found, description="a test: model")
    spec = _parsed(text)
    assert (spec.id, spec.sources, spec.description) == ("user/st", (str(m),), "a test: model")
    assert (spec.family, spec.pooling, spec.normalize, spec.max_seq_len, spec.dimensions) == (
        "dense",
        "cls",
        True,
        384,
        32,
    )
    assert spec.options == {"query_prefix": 'ask: "', "document_prefix": "doc #1: "}
    lines = text.splitlines()
    assert "max_seq_len: 384  # sentence_bert_config.json: max_seq_length" in lines
    assert 'pooling: "cls"  # 1_Pooling/config.json: pooling_mode_cls_token' in lines
    assert any(
        line.strip().startswith("query_prefix:") and "prompts.query" in line for line in lines
    )


def test_labels_and_notes_are_comments(tmp_path: Path) -> None:
    found = infer(build_token_classifier(tmp_path / "ner"))
    text = render_spec("user/ner", [str(tmp_path / "ner")], found)
    assert "# labels (config.json: id2label): O, B-PER, I-PER" in text
    noted = Inferred(family="generate", max_seq_len=64, notes=("no chat\ntemplate",))
    assert "# note: no chat template\n" in render_spec("g/x", ["/w"], noted)
    assert _parsed(render_spec("g/x", ["/w"], noted)).max_seq_len == 64


def test_the_written_file_serves_from_a_catalog_directory(tmp_path: Path) -> None:
    m = build_st(tmp_path / "st", max_seq_length=100)
    cat = tmp_path / "catalog"
    cat.mkdir()
    (cat / "st.yaml").write_text(render_spec("user/st", [str(m)], infer(m)))
    spec = Catalog.load([cat], bundled=False).get("user/st")
    assert (spec.max_seq_len, spec.pooling) == (100, "mean")


@pytest.mark.parametrize("model_id", ["org/name", "we:ird"])
def test_the_id_is_quoted(model_id: str) -> None:
    text = render_spec(model_id, ["/w"], Inferred(family="dense"))
    assert yaml.safe_load(text)["id"] == model_id
