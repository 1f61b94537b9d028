"""Sleep before evict in a runner and a server: a runner on torch sleeps (its weights
out of memory, the loaded model kept) and its next load wakes it; a wake that fails
loads again; a copy that cannot be written leaves it to be evicted as before."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import httpx
import numpy as np
import pytest

from fleetserve.assembly import build_runner
from fleetserve.catalog import Catalog
from fleetserve.metrics import Metrics
from fleetserve.runtimes import Sleeps, mapped
from fleetserve.worker.loadable import Loadable

from ..conftest import ServerThread, tiny_settings
from ..hangup import metric
from ..tinymodels import build_bert, write_spec

COPIES = [f"copy/{i}" for i in range(3)]


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sleep")
    cat = root / "catalog"
    for i, m in enumerate(COPIES):  # about 4 MiB of weights each
        write_spec(cat, m, build_bert(root / f"m{i}", seed=i, hidden=256, layers=2), dimensions=256)
    return cat


def runner(catalog: Path, cache: Path) -> Loadable:
    settings = tiny_settings(catalog, cache_dir=str(cache), models="")
    spec = Catalog.load([catalog], bundled=False).get(COPIES[0])
    made = build_runner(spec, settings, Metrics())
    assert isinstance(made, Loadable)
    return made


async def test_a_runner_sleeps_and_wakes_its_own_model(catalog: Path, tmp_path: Path) -> None:
    r = runner(catalog, tmp_path)
    assert r.may_sleep
    held = await r.load()
    family = r.family
    assert r.sleep() > 0
    assert r.sleeping and not r.loaded and r.family_or_none is family
    assert await r.load() == held  # woken: the footprint its load measured
    assert r.loaded and not r.sleeping and r.family is family


async def test_a_wake_that_fails_loads_the_model_again(
    catalog: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = runner(catalog, tmp_path)
    await r.load()
    family = r.family
    assert r.sleep() > 0
    rt = family.runtime
    assert isinstance(rt, Sleeps)

    def broken() -> None:
        raise OSError(errno.EIO, "the page cache and the disk both failed")

    monkeypatch.setattr(rt, "wake", broken)
    with caplog.at_level(logging.WARNING, "fleetserve.fleet"):
        await r.load()
    assert "the wake failed" in caplog.text and "loading it again" in caplog.text
    assert r.loaded and not r.sleeping and r.family is not family


async def test_a_copy_that_cannot_be_written_leaves_the_model_awake(
    catalog: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mapped.torch, "save", full)
    r = runner(catalog, tmp_path)
    with caplog.at_level(logging.WARNING, "fleetserve.fleet"):
        await r.load()  # it loads, and serves
    said = [rec.getMessage() for rec in caplog.records if "cannot sleep" in rec.getMessage()]
    assert len(said) == 1 and "No space left" in said[0], caplog.text
    assert r.loaded and r.sleep() == 0 and r.loaded  # so the fleet evicts it instead


def test_a_server_puts_models_to_sleep_and_wakes_them_with_the_same_answers(
    catalog: Path, tmp_path: Path
) -> None:
    """Three copies with room for one or two: each miss wakes a sleeper, and every
    answer equals the first; ``GET /v1/models`` shows the states and the host tier."""
    settings = tiny_settings(
        catalog, cache_dir=str(tmp_path), models="", memory_budget="12MiB", host_tier="64MiB"
    )
    srv = ServerThread(settings, Catalog.load([catalog], bundled=False)).start()
    try:
        first: dict[str, list[float]] = {}
        for m in COPIES * 3:
            body = {"model": m, "input": ["asleep, then awake"]}
            r = httpx.post(srv.url + "/v1/embeddings", json=body, timeout=60)
            assert r.status_code == 200, r.text
            got = r.json()["data"][0]["embedding"]
            np.testing.assert_array_equal(got, first.setdefault(m, got))
        listing = httpx.get(srv.url + "/v1/models").json()
        states = {d["id"]: d["state"] for d in listing["data"]}
        assert "sleeping" in states.values() and "cold" not in states.values(), states
        memory = listing["memory"]
        assert memory["host_tier_budget"] == 64 << 20 and memory["sleeping"] >= 1
        assert 0 < memory["host_tier_used"] <= memory["host_tier_budget"]
        woken = [
            metric(srv.url, "fleetserve_model_loads_total", model=m, outcome="woken")
            for m in COPIES
        ]
        slept = [metric(srv.url, "fleetserve_model_sleeps_total", model=m) for m in COPIES]
        assert sum(woken) >= 3 and sum(slept) >= 3, (woken, slept)
    finally:
        srv.stop()
