"""Facts kept on disk: keyed by everything they depend on, written whole, and a file
that is not this key's whole fact counts as none."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from fleetserve.catalog.facts import Facts, fact_key, library_version


def test_keys_delimit_their_parts() -> None:
    assert fact_key("ab", "c") != fact_key("a", "bc")
    assert fact_key("a", b"b") == fact_key("a", "b") != fact_key("a", "b", "")
    assert len(fact_key("x")) == 32


def test_a_fact_reads_back_only_whole_and_for_its_key(tmp_path: Path) -> None:
    facts = Facts(tmp_path / "peak", "activation peaks")
    assert facts.get("k1") is None  # none yet
    facts.put("k1", {"bytes": 7})
    assert facts.get("k1") == {"key": "k1", "bytes": 7}
    (tmp_path / "peak" / "k2.json").write_text(json.dumps({"key": "k1", "bytes": 9}))
    assert facts.get("k2") is None  # another key's
    for torn in ("", "{", "[1]", "null"):
        (tmp_path / "peak" / "k1.json").write_text(torn)
        assert facts.get("k1") is None
    facts.put("k1", {"bytes": 8})
    assert facts.get("k1") == {"key": "k1", "bytes": 8}
    assert sorted(p.name for p in (tmp_path / "peak").iterdir()) == ["k1.json", "k2.json"]


def test_a_disk_that_refuses_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "file").write_text("")
    facts = Facts(tmp_path / "file" / "peak", "activation peaks")
    with caplog.at_level(logging.WARNING, logger="fleetserve.catalog"):
        facts.put("k", {"bytes": 1})
        facts.put("k", {"bytes": 1})
    assert facts.get("k") is None
    assert caplog.text.count("cannot keep activation peaks") == 1


def test_the_versions_name_fleetserve_and_the_runtimes_library() -> None:
    ours, openvino = library_version("openvino").split("/")
    assert ours and openvino
    assert library_version("external").endswith("/")  # no library of its own
