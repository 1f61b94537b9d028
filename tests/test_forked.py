"""tests/forked.py answers as ``subprocess`` does, for the children the suite forks
from its zygote; and a child whose environment the zygote's imports may have read is
a fresh interpreter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from . import forked

pytestmark = pytest.mark.slow  # the zygote's imports take seconds

PY = sys.executable
SHOW = "import os, sys; print(sys.argv[1:], os.getcwd(), os.environ.get('WHO')); sys.exit(3)"


@pytest.fixture(autouse=True)
def _forking(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever TESTS_FRESH_CHILDREN says, with this process's zygote for its own
    environment started (by the first child that asks: it runs fresh)."""
    monkeypatch.setattr(forked, "FRESH", False)
    forked.run([PY, "-c", "pass"], timeout=120)


def test_a_program_gets_its_arguments_directory_environment_and_exit_code(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "WHO": "me"}
    r = forked.run([PY, "-c", SHOW, "a", "b"], capture_output=True, text=True, env=env,
                   cwd=tmp_path, timeout=120)  # fmt: skip
    assert (r.returncode, r.stdout, r.stderr) == (3, f"['a', 'b'] {tmp_path} me\n", "")


def test_it_is_forked_and_a_module_runs_as_with_dash_m() -> None:
    with forked.popen([PY, "-m", "fleetserve", "--help"], stdout=subprocess.PIPE) as p:
        assert isinstance(p, forked.Forked)
        out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and b"usage: fleetserve" in out and err is None


def test_stdin_stdout_and_stderr_as_subprocess_takes_them() -> None:
    code = "import sys; print(sys.stdin.read().upper(), flush=True); print('e', file=sys.stderr)"
    r = forked.run([PY, "-c", code], input="abc", capture_output=True, text=True, timeout=120)
    assert (r.stdout, r.stderr) == ("ABC\n", "e\n")
    merged = forked.popen([PY, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)  # fmt: skip
    out, _ = merged.communicate(b"x", timeout=120)
    assert out == b"X\ne\n"


def test_a_signal_and_a_timeout_end_it() -> None:
    code = "import time; print('up', flush=True); time.sleep(60)"
    p = forked.popen([PY, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "up\n"
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == -signal.SIGTERM
    p.stdout.close()
    with pytest.raises(subprocess.TimeoutExpired):
        forked.run([PY, "-c", "import time; time.sleep(60)"], timeout=0.5)


def test_an_environment_read_at_import_gets_a_zygote_of_its_own_the_second_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(forked, "_zygotes", {})
    monkeypatch.setattr(forked, "_asked", {})
    code = "import huggingface_hub.constants as c; print(c.HF_HOME)"
    env = {**os.environ, "HF_HOME": "/elsewhere"}
    kinds, said = [], []
    for _ in range(2):
        with forked.popen([PY, "-c", code], env=env, stdout=subprocess.PIPE, text=True) as p:
            kinds.append(type(p))
            out, _ = p.communicate(timeout=120)
        said.append(out.strip())
    assert kinds == [subprocess.Popen, forked.Forked] and said == ["/elsewhere"] * 2
    with forked.popen([PY, "-c", "pass"], env={**env, "FLEETSERVE_X": "1"}) as q:
        assert isinstance(q, forked.Forked)  # (read when it runs, not at import)
    assert q.returncode == 0


def test_past_the_last_zygote_a_child_runs_fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forked, "MAX_ZYGOTES", 0)
    monkeypatch.setattr(forked, "_zygotes", {})
    for _ in range(2):
        with forked.popen([PY, "-c", "pass"]) as p:
            assert isinstance(p, subprocess.Popen)
        assert p.returncode == 0
