"""The supervisor's two ways to start a child answer alike (``children.Proc``): a
fresh interpreter (``subprocess.Popen``) and a fork of the zygote (``ZygoteChild``).
And what only the zygote has: it refuses an environment its imports may have read,
its children end with it, and it ends with its client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest

from fleetserve.cluster.children import Proc
from fleetserve.cluster.zygote import Zygote, ZygoteChild, _running

from ..waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
CHILD = "tests.zygote_child"


class Start(Protocol):
    def __call__(self, args: list[str], env: dict[str, str], stdout: int) -> Proc: ...


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    z = Zygote(ENV, preload=["json"])
    z.start()
    yield z
    z.close()


@pytest.fixture(params=["popen", "zygote"])
def start(request: pytest.FixtureRequest, zygote: Zygote) -> Start:
    def popen(args: list[str], env: dict[str, str], stdout: int) -> Proc:
        return subprocess.Popen(
            [sys.executable, "-m", CHILD, *args], env=env, stdout=stdout, start_new_session=True
        )

    def fork(args: list[str], env: dict[str, str], stdout: int) -> Proc:
        child = zygote.spawn(CHILD, args, env, fds=(0, stdout, 2))
        assert isinstance(child, ZygoteChild)
        return child

    return popen if request.param == "popen" else fork


def run(start: Start, args: list[str], env: dict[str, str] = ENV) -> tuple[Proc, str]:
    r, w = os.pipe()
    try:
        proc = start(args, env, w)
    finally:
        os.close(w)
    with os.fdopen(r) as out:
        line = out.readline()
    return proc, line.strip()


def test_the_exit_code_is_the_childs(start: Start) -> None:
    proc, _ = run(start, ["exit", "3"])
    assert proc.wait(30) == 3 and proc.poll() == 3 and proc.returncode == 3


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_signal_reads_as_its_negative_number(start: Start, sig: int) -> None:
    proc, said = run(start, ["sleep"])
    assert said == "sleeping" and proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.05)
    os.kill(proc.pid, sig)
    assert proc.wait(30) == -sig


def test_the_child_has_its_environment_directory_and_session(
    start: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    proc, said = run(
        start, ["show", "FLEETSERVE_WORKER_ID"], {**ENV, "FLEETSERVE_WORKER_ID": "w-7"}
    )
    assert said == f"w-7 {tmp_path} True"
    assert proc.wait(30) == 0


def test_a_child_runs_in_the_directory_asked_for(zygote: Zygote, tmp_path: Path) -> None:
    r, w = os.pipe()
    try:
        child = zygote.spawn(CHILD, ["show", "-"], ENV, fds=(0, w, 2), cwd=str(tmp_path))
    finally:
        os.close(w)
    with os.fdopen(r) as out:
        said = out.readline().split()
    assert child is not None and said[1] == str(tmp_path) and child.wait(30) == 0


@pytest.mark.parametrize("quiet", [True, False])
def test_a_quiet_zygotes_own_stdio_is_dev_null(quiet: bool) -> None:
    """(Its children's are what ``spawn`` passes, as above.)"""
    z = Zygote(ENV, preload=["json"], quiet=quiet)
    z.start()
    try:
        assert z._wait_ready() and z.proc is not None
        theirs = [os.readlink(f"/proc/{z.proc.pid}/fd/{fd}") for fd in (0, 1, 2)]
    finally:
        z.close()
    ours = [os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)]
    assert theirs == (["/dev/null"] * 3 if quiet else ours)


def test_the_interpreter_ends_the_child_as_usual(start: Start, tmp_path: Path) -> None:
    flag = tmp_path / "atexit"
    proc, _ = run(start, ["atexit", str(flag)])
    assert proc.wait(30) == 0 and flag.read_text() == "ran"


def test_an_environment_its_imports_may_have_read_is_refused(zygote: Zygote) -> None:
    assert zygote.spawn(CHILD, ["exit", "0"], {**ENV, "HF_HOME": "/elsewhere"}) is None
    other = {k: v for k, v in ENV.items() if k != "PYTHONPATH"}
    assert zygote.spawn(CHILD, ["exit", "0"], other) is None  # one missing is a difference
    child = zygote.spawn(CHILD, ["exit", "0"], {**ENV, "FLEETSERVE_PORT": "1"})
    assert child is not None and child.wait(30) == 0


def test_the_children_end_with_the_zygote_and_it_forks_no_more() -> None:
    z = Zygote(ENV, preload=[])
    z.start()
    try:
        child = z.spawn(CHILD, ["sleep"], ENV)
        assert child is not None and child.poll() is None
        assert z.proc is not None
        os.kill(z.proc.pid, signal.SIGKILL)
        child.wait(30)  # it died with its parent (its exit is the zygote's to tell: gone)
        assert not _running(child.pid)
        wait_for(lambda: not z.alive, 10)
        assert z.spawn(CHILD, ["exit", "0"], ENV) is None  # the caller starts a fresh one
    finally:
        z.close()


def test_the_zygote_ends_when_its_client_closes() -> None:
    z = Zygote(ENV, preload=[])
    z.start()
    child = z.spawn(CHILD, ["exit", "0"], ENV)
    assert child is not None and child.wait(30) == 0
    z.close()
    assert z.proc is not None and z.proc.returncode == 0


def test_each_fork_draws_its_own_random_numbers() -> None:
    """torch's generator is copied by a fork: each child seeds its own (a sampling
    generator in two workers would otherwise draw the same numbers)."""
    z = Zygote(ENV, preload=["torch"])
    z.start()
    try:
        draws = []
        for _ in range(2):
            r, w = os.pipe()
            child = z.spawn(CHILD, ["rand"], ENV, fds=(0, w, 2))
            os.close(w)
            assert child is not None
            with os.fdopen(r) as out:
                draws.append(out.readline().strip())
            assert child.wait(30) == 0
        assert draws[0] != draws[1] and all(draws)
    finally:
        z.close()


def test_a_process_holding_the_imports_forks_its_zygote(tmp_path: Path) -> None:
    """``Zygote.forks``: only one thread (numpy's BLAS pool, one thread per core, is
    held to none), its environment the children's, every preload imported. The fork's
    children end as a fresh interpreter's: exit codes, tracebacks, SystemExit's message,
    their own exit handlers and not the parent's, and a Ctrl-C."""
    flag = tmp_path / "flag"
    out = subprocess.run(
        [sys.executable, "-m", "tests.zygote_forker", str(flag)],
        env={**ENV, "OPENBLAS_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "forks True",
        "forks with an import missing False",
        "forks for another HF_HOME False",
        "forks beside a thread False",
        "zygote is our child True",
        "exit 3",
        "raise 1 RuntimeError: boom",
        "say 1 a message",
        "atexit 0 ran",
        "sigint -2",
        "parent's handler ran in a child False",
        "zygote ended 0",
    ]
    assert flag.read_text() == "the parent's"  # at the parent's own end
