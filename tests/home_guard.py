"""The suite writes nothing into the developer's own fleetserve folders
(``~/.cache/fleetserve``, ``~/.config/fleetserve``): it runs in a home of its own
(tests/own_home.py), and this plugin fails the session, naming what appeared there,
where a path was built from the real home all the same.

It began with the adapter store alone: tests whose servers kept uploads there piled
adapters up, run after run, on the CI machine as here, until the per-tenant limit (100)
refused the README's ``lora add``."""

from __future__ import annotations

from pathlib import Path

import pytest

from .own_home import REAL_HOME

WATCHED = (REAL_HOME / ".cache" / "fleetserve", REAL_HOME / ".config" / "fleetserve")
BEFORE = pytest.StashKey[frozenset[Path]]()
WROTE = pytest.StashKey[list[Path]]()


def _files() -> frozenset[Path]:
    return frozenset(p for d in WATCHED for p in d.rglob("*") if p.is_file())


def _controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")  # an xdist worker's part is the controller's


def pytest_sessionstart(session: pytest.Session) -> None:
    if _controller(session.config):
        session.config.stash[BEFORE] = _files()


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    before = config.stash.get(BEFORE, None)
    if _controller(config) and before is not None:
        new = sorted(_files() - before)
        if new:
            config.stash[WROTE] = new
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    new = terminalreporter.config.stash.get(WROTE, [])
    if new:
        terminalreporter.section("written into the developer's home", red=True)
        terminalreporter.write_line(
            f"under {REAL_HOME}: a path built from the real home rather than from ~"
        )
        for path in new[:10]:
            terminalreporter.write_line(f"  {path}")
        if len(new) > 10:
            terminalreporter.write_line(f"  and {len(new) - 10} more")
