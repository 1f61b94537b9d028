"""``POST /v1/models``'s checks before anything is read: the id's form, and that each
source is one an API caller may make the server read (``--model-roots``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetserve.catalog.names import id_for_source
from fleetserve.gateway.model_checks import check_model_id, check_sources
from fleetserve.wire import InvalidInput


@pytest.mark.parametrize("model", ["tiny", "org/tiny-v1.5", "a_b/C-9", "x" * 128])
def test_well_formed_ids_pass(model: str) -> None:
    assert check_model_id(model) == model


@pytest.mark.parametrize(
    "model",
    ["", "a/b/c", "../x", "a/..", "a..b", "-x", "a b", "a:b", "/x", "x/", "x" * 129, 3, None],
)
def test_malformed_ids_are_a_400_naming_them(model: object) -> None:
    with pytest.raises(InvalidInput) as err:
        check_model_id(model)
    assert err.value.field == "id"
    assert repr(model) in err.value.message


def test_sources_under_the_roots_and_named_packages_pass(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "m").mkdir(parents=True)
    roots = [str(root), "s3://bucket/models"]
    check_sources(
        [
            str(root / "m"),
            f"file://{root / 'm'}",
            str(root),
            "package:fleetserve_tiny/model",
            "hf:org/name",
            "s3://bucket/models/m",
            f"gguf:{root / 'm' / 'x.gguf'}",
        ],
        roots,
    )


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("/etc", "outside the directories"),
        ("{root}/../other", "'..'"),
        ("{root}/m/../../other", "'..'"),
        ("package:fleetserve/../../etc", "'..'"),
        ("hf:../x", "'..'"),
        ("relative/dir", "relative path"),
        ("https://example.com/model", "URL scheme"),
        ("ftp://host/m", "URL scheme"),
        ("s3://other-bucket/m", "s3:// prefix"),
        ("s3://bucket/models-evil/m", "s3:// prefix"),
        ("gguf:/etc/x.gguf", "outside the directories"),
        ("{root}-sibling/m", "outside the directories"),
        ("{link}/m", "outside the directories"),
    ],
)
def test_other_sources_are_a_400_naming_them(tmp_path: Path, source: str, why: str) -> None:
    root = tmp_path / "models"
    root.mkdir()
    outside = tmp_path / "outside"
    (outside / "m").mkdir(parents=True)
    (root / "link").symlink_to(outside)  # a symlink out of the root is outside it
    src = source.format(root=root, link=root / "link")
    with pytest.raises(InvalidInput) as err:
        check_sources([str(root / "fine"), src], [str(root), "s3://bucket/models"])
    assert err.value.field == "sources"
    assert repr(src) in err.value.message and why in err.value.message


def test_no_roots_allow_no_local_path(tmp_path: Path) -> None:
    check_sources(["hf:org/name"], [])
    with pytest.raises(InvalidInput, match="outside the directories"):
        check_sources([str(tmp_path)], [])


def test_a_source_alone_names_the_model() -> None:
    assert id_for_source("hf:org/name") == "org/name"
    assert id_for_source("/models/minilm/") == "minilm"
    assert id_for_source("s3://bucket/models/e5") == "e5"
    assert id_for_source("/models/my model v2") == "my-model-v2"
