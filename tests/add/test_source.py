"""``fleetserve add``'s first stage refuses what cannot be a model, in one line naming
the file, before anything is read further or written; and the spec file it writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetserve.add.source import Refused, check_files, locate
from fleetserve.add.spec_file import file_for, write
from fleetserve.settings import Settings

from ..tinymodels import build_bert


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings.load(
        overrides={"hf_cache": str(tmp_path / "hf"), "cache_dir": str(tmp_path / "cache")}
    )


def test_a_directory_is_found_and_named_after_itself(tmp_path: Path, settings: Settings) -> None:
    model = build_bert(tmp_path / "my model")
    found = locate(str(model), settings)
    assert found.path == model and found.source == str(model.resolve())
    assert found.default_id == "my-model"


def test_an_hf_cache_id_is_found_in_the_cache_layout(tmp_path: Path, settings: Settings) -> None:
    snap = tmp_path / "hf" / "models--acme--tiny" / "snapshots" / "abc"
    build_bert(snap)
    found = locate("hf:acme/tiny", settings)
    assert found.path == snap and found.source == "hf:acme/tiny"
    assert found.default_id == "acme/tiny"


@pytest.mark.parametrize("source", ["", "/nonexistent/model", "hf:acme/absent"])
def test_a_source_that_does_not_exist_is_one_line(source: str, settings: Settings) -> None:
    with pytest.raises(Refused) as info:
        locate(source, settings)
    assert info.value.code == 2 and "\n" not in info.value.message
    assert (source or "SOURCE") in info.value.message


def test_a_directory_without_weights_is_refused(tmp_path: Path, settings: Settings) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(Refused, match="no weights"):
        locate(str(tmp_path / "empty"), settings)


@pytest.mark.parametrize("name", ["config.json", "1_Pooling/config.json", "tokenizer.json"])
def test_a_corrupt_describing_file_is_named(tmp_path: Path, name: str) -> None:
    model = build_bert(tmp_path / "m")
    (model / name).parent.mkdir(exist_ok=True)
    (model / name).write_text('{"architectures": [')
    with pytest.raises(Refused) as info:
        check_files(model)
    assert str(model / name) in info.value.message and "not valid JSON" in info.value.message


def test_a_truncated_safetensors_file_is_named(tmp_path: Path) -> None:
    model = build_bert(tmp_path / "m")
    (weights,) = model.glob("*.safetensors")
    weights.write_bytes(b"\x01")
    with pytest.raises(Refused, match="truncated"):
        check_files(model)


def test_the_spec_is_written_at_once_and_never_over_another(tmp_path: Path) -> None:
    text = "# family: modules.json\nid: acme/tiny\nfamily: dense\n"
    path = file_for(tmp_path / "catalog", "acme/tiny")
    write(path, text)
    assert path.name == "acme__tiny.yaml" and path.read_text() == text
    with pytest.raises(Refused, match="exists"):
        write(path, "id: other\n")
    assert path.read_text() == text
    assert [p.name for p in path.parent.iterdir()] == ["acme__tiny.yaml"]  # no leftovers
