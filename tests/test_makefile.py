"""The Makefile's lists that name tests stay true to the tests."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from .conftest import BACKGROUND_TUNES

ROOT = Path(__file__).resolve().parents[1]


def _make_list(name: str) -> set[str]:
    text = ROOT.joinpath("Makefile").read_text().replace("\\\n", " ")
    (line,) = [ln for ln in text.splitlines() if re.match(rf"{name}\s*:?=", ln)]
    return set(line.split("=", 1)[1].split())


def _marked(marker: str) -> set[str]:
    """The test files that name ``pytest.mark.<marker>``."""
    return {
        path.relative_to(ROOT).as_posix()
        for path in ROOT.joinpath("tests").rglob("test_*.py")
        if re.search(rf"\bmark\.{marker}\b", path.read_text())
    }


def test_the_tunes_pytest_collects_every_file_that_holds_a_tune() -> None:
    """`make test` runs the tests marked ``tunes`` in a pytest of their own that collects
    only TUNE_TESTS: a file left out there would never run its tunes."""
    holding = {f"tests/{f}" for f in BACKGROUND_TUNES} | _marked("tunes")
    assert _make_list("TUNE_TESTS") == holding


def test_the_soak_pytest_collects_every_file_that_only_computes() -> None:
    """The tests marked ``soaks`` run beside the parallel part and the tunes in a pytest
    that collects only SOAK_TESTS, and the parallel part leaves them out."""
    assert _make_list("SOAK_TESTS") == _marked("soaks")


def test_colbert_ai_is_installed_with_the_pins_its_unchecked_reason_names() -> None:
    """`make serve` installs colbert-ai where the reference check looks for it, with the
    list the check prints where it is not there."""
    from fleetserve.bench.tune.reference_colbert import INSTALL, library_dir

    assert _make_list("REFERENCE_COLBERT") == set(INSTALL.split())
    text = ROOT.joinpath("Makefile").read_text()
    assert "--target $(VENV)/reference/colbert-ai $(REFERENCE_COLBERT)" in text
    assert library_dir("") == Path(sys.prefix) / "reference" / "colbert-ai"
    assert _make_list("VENV") == {".venv"}
