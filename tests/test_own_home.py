"""The suite's own home (tests/own_home.py): fleetserve's defaults land in it, and a
session that writes into the developer's home all the same fails, naming the file
(tests/home_guard.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetserve.runtimes.cache import DEFAULT_CACHE
from fleetserve.settings import Settings

from .own_home import REAL_HOME, REAL_VAR, VAR

ROOT = Path(__file__).resolve().parents[1]


def test_fleetserve_s_folders_default_into_the_run_s_home() -> None:
    home = Path(os.environ[VAR])
    assert Path.home() == home and home != REAL_HOME
    s = Settings.load()
    for value in (s.cache_dir, s.tune_dir, s.profile_dir, s.hf_cache):
        assert Path(value).expanduser().is_relative_to(home), value
    assert DEFAULT_CACHE.is_relative_to(home)  # expanded at import, after the switch


WRITES = """
import os
from pathlib import Path

def test_writes():
    target = Path(os.environ[{var!r}]) / ".cache" / "fleetserve" / "gate" / "x.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("{{}}")
"""


@pytest.mark.slow  # two pytest processes
@pytest.mark.parametrize(("where", "fails"), [("HOME", False), ("DEVELOPER", True)])
def test_a_session_that_writes_into_the_developer_s_home_fails(
    tmp_path: Path, where: str, fails: bool
) -> None:
    developer = tmp_path / "developer"
    developer.mkdir()
    test = tmp_path / "t" / "test_writes.py"
    test.parent.mkdir()
    test.write_text(WRITES.format(var=where))
    # a pytest of its own: not the run's home, nor the options this one was given
    env = {k: v for k, v in os.environ.items() if k not in (VAR, REAL_VAR, "PYTEST_ADDOPTS")}
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env |= {"HOME": str(developer), "DEVELOPER": str(developer), "PYTHONPATH": str(ROOT),
            "TMPDIR": str(tmp)}  # fmt: skip
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.home_guard", "-p", "no:cacheprovider",
         "--rootdir", str(test.parent), "-c", os.devnull, str(test)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert "1 passed" in out, out
    assert (r.returncode == 1) is fails, out
    assert ("written into the developer's home" in out) is fails, out
    if fails:
        assert str(developer / ".cache" / "fleetserve" / "gate" / "x.json") in out
    assert not list(tmp.glob("fleetserve-tests-home-*"))  # made, used and removed
    assert not (tmp_path / ".cache").exists()
