"""The quality gate's tiny model, shared by test_gate.py and test_verdicts.py
(test_tune_cli.py has a ``catalog`` of its own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ...tinymodels import build_bert, write_spec

MODEL = "tiny/gate-bert"


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A catalog of the tiny BERT at ``MODEL``, with no profile: built once per module."""
    root = tmp_path_factory.mktemp("gate")
    cat = root / "catalog"
    write_spec(cat, MODEL, build_bert(root / "model"), profiles={}, max_seq_len=64)
    return cat
