"""The added-models view: ``GET /v1/added/models`` lists the reports ``fleetserve add``
wrote (newest first), ``GET /v1/added/models/{id}`` gives one whole; a broken report
is left out, an unknown id is a 404 naming it; and the tab renders in Chromium."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleetserve.add.report import AddReport, Tuned
from fleetserve.bench.tune.runs import RunStore

from ..browser import Browser, find_chromium
from ..conftest import ServerThread

CHROMIUM = find_chromium()


def report(model: str, tuned: bool) -> AddReport:
    r = AddReport(
        model=model,
        source=f"/models/{model}",
        path=f"/models/{model}",
        hardware_class="cpu-amx",
        fields={"id": model, "family": "dense", "pooling": "mean"},
        evidence={"family": "modules.json: 1_Pooling (a Pooling module)"},
        check={"status": "passed", "library": "sentence-transformers", "checks": []},
        weights_bytes=90 << 20,
        spec_file=f"/catalog/{model.replace('/', '__')}.yaml",
        seconds={"total": 42.0},
    )
    if tuned:
        r.tuned = Tuned("openvino-bf16-t2-p1-b32x2048", 3000.0, 1200.0, "/p.yaml", "/r.md")
        r.resident_bytes = 100 << 20
    else:
        r.not_tuned = "--no-tune: the rules choose its engine and batch until it is tuned"
    return r


@pytest.fixture(scope="module")
def reports(store: RunStore) -> Iterator[Path]:
    d = store.root / "reports"
    report("acme/old", tuned=False).write(d)
    _, js = report("acme/new", tuned=True).write(d)
    os.utime(js, (js.stat().st_atime + 10, js.stat().st_mtime + 10))  # the newest
    (d / "add-broken.json").write_text('{"model": "acme/broken", "fields": [')
    yield d


def test_the_list_is_newest_first_and_leaves_broken_reports_out(
    dash_server: ServerThread, reports: Path
) -> None:
    body = httpx.get(dash_server.url + "/v1/added/models").json()
    assert [m["model"] for m in body["data"]] == ["acme/new", "acme/old"]
    new, old = body["data"]
    assert new["vs_torch_fp32"] == pytest.approx(2.5) and new["check"] == "passed"
    assert new["family_why"].startswith("modules.json") and new["resident_bytes"] == 100 << 20
    assert old["winner"] is None and old["not_tuned"].startswith("--no-tune")


def test_one_report_whole_and_an_unknown_one_is_a_404(
    dash_server: ServerThread, reports: Path
) -> None:
    doc = httpx.get(dash_server.url + "/v1/added/models/acme/new").json()
    assert doc["model"] == "acme/new" and doc["tuned"]["winner"].startswith("openvino")
    for model in ("acme/absent", "acme/broken", "..%2Fx"):
        r = httpx.get(f"{dash_server.url}/v1/added/models/{model}")
        assert r.status_code == 404 and r.json()["error"]["field"] == "id", model


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; make test does)"
)
def test_the_tab_shows_each_added_model(dash_server: ServerThread, reports: Path) -> None:
    assert CHROMIUM is not None
    with Browser(CHROMIUM, width=1280, height=900) as b:
        b.goto(dash_server.url + "/dashboard#/added")
        b.wait_for("!!document.querySelector(\"tr[data-model='acme/new']\")")
        row = b.text("tr[data-model='acme/new']")
        assert "2.50x torch fp32" in row and "passed (sentence-transformers)" in row
        assert "not tuned" not in row and "100.0 MiB" in row
        assert "--no-tune" in b.text("tr[data-model='acme/old']")
        assert b.errors == []
