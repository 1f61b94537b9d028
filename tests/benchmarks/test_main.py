"""``python -m benchmarks``: the team's dispatcher, runnable from the repository root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]


def test_no_name_lists_the_benchmarks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    out = capsys.readouterr().out
    assert all(name in out for name in ("embed", "dist", "http", "families"))
    assert all(len(line) <= 80 for line in out.splitlines())
    assert main(["--help"]) == 0
    assert main(["frobnicate"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_has_its_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([name, "--help"])
    assert info.value.code == 0
    assert f"python -m benchmarks {name}" in capsys.readouterr().out


def test_python_dash_m_from_the_root() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks", "embed", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "--infinity-venv" in r.stdout


def test_nothing_in_the_package_imports_it() -> None:
    src = ROOT / "src" / "fleetserve"
    texts = {p: p.read_text() for p in src.rglob("*.py")}
    assert not [p for p, t in texts.items() if "import benchmarks" in t or "from benchmarks" in t]
