"""Servers whose run store (``tune_dir``) is a temporary directory of run documents."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetserve.bench.tune.runs import RunStore

from ..conftest import ServerThread, tiny_settings
from . import rundocs

KEY = "dash-s3cret"


def seed(store: RunStore) -> None:
    """A running run, an older succeeded one, a failed one, a bare one, a broken file."""
    rundocs.write(
        store, rundocs.running_run(), rundocs.older_run(), rundocs.failed_run(), rundocs.bare_run()
    )
    (store.root / "broken.json").write_text('{"id": "broken", "candidates": [')


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> RunStore:
    runs = RunStore(tmp_path_factory.mktemp("tune"))
    seed(runs)
    return runs


@pytest.fixture(scope="module")
def dash_server(tiny_catalog: Path, store: RunStore) -> Iterator[ServerThread]:
    srv = ServerThread(tiny_settings(tiny_catalog, tune_dir=str(store.root))).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def keyed_store(tmp_path_factory: pytest.TempPathFactory) -> RunStore:
    runs = RunStore(tmp_path_factory.mktemp("tune-keyed"))
    seed(runs)
    return runs


@pytest.fixture(scope="module")
def keyed_dash_server(tiny_catalog: Path, keyed_store: RunStore) -> Iterator[ServerThread]:
    settings = tiny_settings(tiny_catalog, tune_dir=str(keyed_store.root), api_key=KEY)
    srv = ServerThread(settings).start()
    yield srv
    srv.stop()
