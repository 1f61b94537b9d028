"""docs/models.md documents every spec and profile field, no other, and its example parses."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from fleetserve.catalog import ModelSpec
from fleetserve.catalog.spec import COST_FIELDS, PROFILE_FIELDS, SPEC_FIELDS

DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"


def table_fields(section: str) -> list[str]:
    """The backticked names in the first column of the table under ``## section``."""
    text = DOC.read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", body, flags=re.MULTILINE)


def test_every_spec_field_has_a_row_and_no_row_is_invented() -> None:
    rows = table_fields("Spec fields")
    assert sorted(rows) == sorted(SPEC_FIELDS)
    assert len(rows) == len(set(rows))


def test_every_profile_field_has_a_row_and_no_row_is_invented() -> None:
    rows = table_fields("Profile fields")
    want = [*PROFILE_FIELDS, *(f"cost.{k}" for k in COST_FIELDS)]
    assert sorted(rows) == sorted(want)


def test_the_example_spec_parses() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert blocks
    spec = ModelSpec.from_dict(yaml.safe_load(blocks[0]))
    assert spec.id == "acme/my-embedder" and spec.keep_alive == 300.0
    assert spec.sources[0] == "/models/my-embedder" and "cuda" in spec.profiles


def test_the_doc_names_the_source_forms_and_links_tuning() -> None:
    text = DOC.read_text()
    for form in ("package:", "hf:", "s3://", "file://", "gguf:", "models--", "refs/main"):
        assert form in text, form
    assert "(tuning.md)" in text
