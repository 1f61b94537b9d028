"""The suite writes nothing into the developer's own adapter store
(``~/.cache/fleetserve/adapter-store``, where a server with the default
``--cache-dir`` keeps uploads, fine-tuning files and jobs).

Tests that did piled adapters up there run after run, on the CI machine as here,
until the per-tenant limit (100) refused the README's ``lora add``. A server in a
test names its own ``adapter_store`` (or ``cache_dir``); this plugin fails the
session, naming what appeared, where one did not."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetserve.settings import Settings

USER_STORE = Path(Settings().cache_dir).expanduser() / "adapter-store"
BEFORE = pytest.StashKey[frozenset[Path]]()
WROTE = pytest.StashKey[list[Path]]()


def _files() -> frozenset[Path]:
    return frozenset(p for p in USER_STORE.rglob("*") if p.is_file())


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
        terminalreporter.section("written into the user's adapter store", red=True)
        terminalreporter.write_line(
            f"{USER_STORE}: give the test's server its own adapter_store or cache_dir"
        )
        for path in new[:10]:
            terminalreporter.write_line(f"  {path}")
        if len(new) > 10:
            terminalreporter.write_line(f"  and {len(new) - 10} more")
