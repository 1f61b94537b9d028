"""A cache entry is built once per host: a second builder waits for the first and
reads its entry; a builder that dies leaves the lock to the next one."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fleetserve.catalog.entries import build_entry

from ..waiting import wait_for


def complete(entry: Path) -> bool:
    return (entry / "done").is_file()


def test_a_second_builder_waits_for_the_first_and_reads_its_entry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entry = tmp_path / "cache" / "model-1234"
    building, release = threading.Event(), threading.Event()
    builds: list[str] = []

    def build(tmp: Path) -> None:
        builds.append(threading.current_thread().name)
        building.set()
        assert release.wait(30)
        (tmp / "done").write_text("1")

    got: dict[str, Path] = {}

    def builder() -> None:
        got[threading.current_thread().name] = build_entry(entry, complete, build)

    first = threading.Thread(target=builder, name="first")
    second = threading.Thread(target=builder, name="second")
    with caplog.at_level(logging.INFO, logger="fleetserve.catalog"):
        first.start()
        assert building.wait(30)
        second.start()
        wait_for(lambda: "waiting for another process building" in caplog.text, 30)
        assert not complete(entry)  # the second waits on the lock, not on the entry
        release.set()
        first.join(30)
        second.join(30)
    assert builds == ["first"]  # built once
    assert got == {"first": entry, "second": entry} and complete(entry)
    assert list(entry.parent.iterdir()) == [entry]  # no temporary directory, no lock file


HOLD = """
import sys, time
from pathlib import Path
from fleetserve.catalog.entries import entry_lock
with entry_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_builder_that_dies_leaves_the_entry_to_the_next(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entry = tmp_path / "model-1234"
    builds: list[Path] = []
    done = threading.Event()

    def build(tmp: Path) -> None:
        builds.append(tmp)
        (tmp / "done").write_text("1")

    argv = [sys.executable, "-c", HOLD, str(entry)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            t = threading.Thread(target=lambda: (build_entry(entry, complete, build), done.set()))
            with caplog.at_level(logging.INFO, logger="fleetserve.catalog"):
                t.start()
                wait_for(lambda: "waiting for another process building" in caplog.text, 30)
            assert builds == [] and not done.is_set()  # the live holder keeps it waiting
            holder.kill()  # killed mid-build: the kernel drops its lock
            assert done.wait(30)
            t.join(5)
        finally:
            holder.kill()
    assert len(builds) == 1 and complete(entry)


def test_an_incomplete_entry_is_rebuilt_and_a_failed_build_leaves_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entry = tmp_path / "model-1234"
    entry.mkdir()
    (entry / "half").write_text("x")  # no "done": a crash's leftover

    def fail(tmp: Path) -> None:
        (tmp / "part").write_text("x")
        raise RuntimeError("the conversion failed")

    with pytest.raises(RuntimeError, match="the conversion failed"):
        build_entry(entry, complete, fail)
    assert "is incomplete; rebuilding it" in caplog.text
    assert list(tmp_path.iterdir()) == []  # no temporary directory, no lock file
    assert build_entry(entry, complete, lambda tmp: (tmp / "done").write_text("1")) == entry
    assert sorted(p.name for p in entry.iterdir()) == ["done"]
